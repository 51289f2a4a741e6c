"""neurocrf.parsing: discontinuous trees, treebanks, tree transforms, LCFRS supertag parsing, evaluation.

Imports nothing else of neurocrf (pure python; torch only where the parser needs it).

Typical preparation of a treebank for supertagging::

    sents = read_treebank(data_root() / "alpino" / "cdb")          # list[TreebankSentence]
    sents = [move_punctuation_sentence(s) for s in sents]
    split = split_treebank(sents)                                    # train / dev / test
    binary = prepare_tree(sent.tree, h=0, v=1)                       # ... restore_tree(binary)
"""

from neurocrf.parsing.evaluate import EvalParams, evaluate, format_report, load_params
from neurocrf.parsing.punctuation import PUNCT_TAGS, move_punctuation, move_punctuation_sentence
from neurocrf.parsing.transforms import prepare_tree, restore_tree
from neurocrf.parsing.tree import Tree, TreebankFormatError, TreebankSentence, random_tree
from neurocrf.parsing.treebank import data_root, read_treebank, split_treebank, write_treebank

__all__ = [
    "Tree", "TreebankSentence", "TreebankFormatError", "random_tree",
    "read_treebank", "write_treebank", "split_treebank", "data_root",
    "PUNCT_TAGS", "move_punctuation", "move_punctuation_sentence",
    "prepare_tree", "restore_tree",
    "EvalParams", "evaluate", "format_report", "load_params",
]

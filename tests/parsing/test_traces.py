"""Penn Treebank traces resolved into discontinuous constituents (neurocrf/parsing/traces.py): one
hand-made tree per trace kind, with the exact expected tree and the blocks of its discontinuous
constituents."""

from __future__ import annotations

from collections import Counter

import pytest

from neurocrf.parsing.bracket import parse_penn, read_penn
from neurocrf.parsing.traces import penn_label
from neurocrf.parsing.tree import Tree


def resolve(text: str) -> tuple[Tree, list[str], Counter]:
    counts: Counter = Counter()
    (sentence,) = parse_penn(text, traces="resolve", counts=counts)
    sentence.tree.validate(len(sentence.words))
    return sentence.tree, sentence.words, +counts


def discontinuous(tree: Tree) -> list[tuple[str, list[tuple[int, int]]]]:
    return sorted((node.label, node.blocks()) for node in tree.subtrees() if node.fanout() > 1)


WH = """( (SBARQ (WHNP-1 (WP What)) (SQ (VBD did) (NP-SBJ (PRP you)) (VP (VB see) (NP (-NONE- *T*-1))))
   (. ?)) )"""


def test_wh_trace_moves_the_filler_into_the_verb_phrase() -> None:
    tree, words, counts = resolve(WH)
    assert words == ["What", "did", "you", "see", "?"]
    assert tree == Tree.parse("(ROOT (SBARQ (SQ (VBD 1) (NP (PRP 2)) (VP (VB 3) (WHNP (WP 0)))) (. 4)))")
    assert discontinuous(tree) == [("VP", [(0, 1), (3, 4)])]
    assert counts == Counter({"resolved *T*": 1})


def test_remove_keeps_the_trees_continuous() -> None:
    (sentence,) = parse_penn(WH)  # traces="remove" is the default
    assert sentence.tree == Tree.parse("(ROOT (SBARQ (WHNP (WP 0)) (SQ (VBD 1) (NP (PRP 2)) (VP (VB 3))) (. 4)))")
    with pytest.raises(ValueError, match="traces must be one of"):
        parse_penn(WH, traces="keep")


def test_ich_extraposed_relative_clause_returns_to_its_noun_phrase() -> None:
    tree, _, counts = resolve("""( (S (NP-SBJ (NP (DT A) (NN man)) (SBAR (-NONE- *ICH*-1)))
        (VP (VBD came) (SBAR-1 (WHNP-2 (WP who)) (S (NP-SBJ (-NONE- *T*-2)) (VP (VBD knew)))))
        (. .)) )""")
    # the *T*-2 inside the moved clause is resolved too: "who" replaces the empty subject
    assert tree == Tree.parse("(ROOT (S (NP (NP (DT 0) (NN 1)) (SBAR (S (WHNP (WP 3)) (VP (VBD 4)))))"
                              " (VP (VBD 2)) (. 5)))")
    assert discontinuous(tree) == [("NP", [(0, 2), (3, 5)])]
    assert counts == Counter({"resolved *ICH*": 1, "resolved *T*": 1})


def test_exp_extraposed_clause_joins_the_expletive() -> None:
    tree, _, counts = resolve("""( (S (NP-SBJ (NP (PRP It)) (S (-NONE- *EXP*-1)))
        (VP (VBZ is) (ADJP-PRD (JJ hard)) (S-1 (NP-SBJ (-NONE- *)) (VP (TO to) (VP (VB say)))))
        (. .)) )""")
    assert tree == Tree.parse("(ROOT (S (NP (NP (PRP 0)) (S (VP (TO 3) (VP (VB 4)))))"
                              " (VP (VBZ 1) (ADJP (JJ 2))) (. 5)))")
    assert discontinuous(tree) == [("NP", [(0, 1), (3, 5)])]
    assert counts == Counter({"resolved *EXP*": 1})


def test_rnr_filler_goes_to_the_last_of_its_traces() -> None:
    tree, _, counts = resolve("""( (S (NP-SBJ (PRP They))
        (VP (VP (VBD bought) (NP (-NONE- *RNR*-1))) (CC and) (VP (VBD sold) (NP (-NONE- *RNR*-1)))
            (, ,) (ADVP (RB today)) (, ,) (NP-1 (NNS shares)))
        (. .)) )""")
    assert tree == Tree.parse("(ROOT (S (NP (PRP 0)) (VP (VP (VBD 1)) (CC 2) (VP (VBD 3) (NP (NNS 7)))"
                              " (, 4) (ADVP (RB 5)) (, 6)) (. 8)))")
    assert discontinuous(tree) == [("VP", [(3, 4), (7, 8)])]
    assert counts == Counter({"resolved *RNR*": 1, "extra *RNR*": 1})


def test_across_the_board_wh_trace_goes_to_the_first_trace() -> None:
    tree, _, counts = resolve("""( (SBAR (WHNP-1 (WP what)) (S (NP-SBJ (PRP they)) (VP
        (VP (VBD bought) (NP (-NONE- *T*-1))) (CC and) (VP (VBD sold) (NP (-NONE- *T*-1)))))) )""")
    assert tree == Tree.parse("(ROOT (SBAR (S (NP (PRP 1)) (VP (VP (VBD 2) (WHNP (WP 0))) (CC 3)"
                              " (VP (VBD 4))))))")
    assert discontinuous(tree) == [("VP", [(0, 1), (2, 3)]), ("VP", [(0, 1), (2, 5)])]
    assert counts == Counter({"resolved *T*": 1, "extra *T*": 1})


PARENTHETICAL = """( (S-1 (NP-SBJ (NNS Yields)) (PRN (, ,) (S (NP-SBJ (PRP she)) (VP (VBD said)
    (SBAR (-NONE- 0) (S (-NONE- *T*-1))))) (, ,)) (VP (MD may) (VP (VB rise))) (. .)) )"""
PARENTHETICAL_TREE = ("(ROOT (S (NP (NNS 0)) (PRN (, 1) (S (NP (PRP 2)) (VP (VBD 3))) (, 4))"
                      " (VP (MD 5) (VP (VB 6))) (. 7)))")


def test_trace_inside_its_own_filler_is_left_unresolved() -> None:
    tree, _, counts = resolve(PARENTHETICAL)
    assert tree == Tree.parse(PARENTHETICAL_TREE)
    assert counts == Counter({"cycle *T*": 1})


def test_missing_and_empty_fillers_keep_the_tree() -> None:
    tree, _, counts = resolve("( (S (NP-SBJ (PRP I)) (VP (VBD saw) (NP (-NONE- *T*-9)))) )")
    assert tree == Tree.parse("(ROOT (S (NP (PRP 0)) (VP (VBD 1))))")
    assert counts == Counter({"missing *T*": 1})
    tree, _, counts = resolve("""( (NP (NP (DT the) (NN man)) (SBAR (WHNP-1 (-NONE- 0))
        (S (NP-SBJ (PRP I)) (VP (VBD saw) (NP (-NONE- *T*-1)))))) )""")
    assert tree == Tree.parse("(ROOT (NP (NP (DT 0) (NN 1)) (SBAR (S (NP (PRP 2)) (VP (VBD 3))))))")
    assert counts == Counter({"empty filler *T*": 1})


def test_other_empty_elements_and_gapping_are_removed_without_moving() -> None:
    text = """( (S (S (NP-SBJ-1 (NNS Prices)) (VP (VBD were) (VP (VBN raised) (NP (-NONE- *-1))
        (PP-2 (IN by) (NP (CD 5) (NN %) (-NONE- *U*))) (ADVP (-NONE- *PPA*-2)) (SBAR (-NONE- *?*)))))
        (CC and) (S (NP-SBJ=3 (NNS costs)) (NP=4 (CD 2) (NN %)))
        (S (NP-SBJ-3 (-NONE- 0)) (NP-4 (-NONE- *NOT*)))) )"""
    tree, _, counts = resolve(text)
    expected = ("(ROOT (S (S (NP (NNS 0)) (VP (VBD 1) (VP (VBN 2) (PP (IN 3) (NP (CD 4) (NN 5))))))"
                " (CC 6) (S (NP (NNS 7)) (NP (CD 8) (NN 9)))))")
    assert tree == Tree.parse(expected)
    assert counts == Counter()
    assert parse_penn(text)[0].tree == tree


def test_labels_lose_function_tags_indices_and_alternatives() -> None:
    assert [penn_label(x) for x in ("NP-SBJ-1", "NP=2", "S-TPC-1=3", "ADVP|PRT", "ADVP-TMP|PRT", "-NONE-",
                                    "-LRB-", "PRP$")] == ["NP", "NP", "S", "ADVP", "ADVP", "-NONE-", "-LRB-", "PRP$"]
    (sentence,) = parse_penn("( (S (VP (VB give) (ADVP|PRT (RB up))) (-LRB- -LRB-)) )")
    assert sentence.tree == Tree.parse("(ROOT (S (VP (VB 0) (ADVP (RB 1))) (-LRB- 2)))")


def test_reader_counts_and_logs_unresolved_traces_with_file_and_tree(tmp_path, caplog) -> None:
    path = tmp_path / "wsj_0004.mrg"
    path.write_text(WH + "\n" + PARENTHETICAL + "\n", encoding="utf-8")
    counts: Counter = Counter()
    with caplog.at_level("INFO", logger="neurocrf.parsing.bracket"):
        first, second = read_penn(path, traces="resolve", counts=counts)
    assert second.id == "wsj_0004:2" and second.tree == Tree.parse(PARENTHETICAL_TREE)
    assert +counts == Counter({"resolved *T*": 1, "cycle *T*": 1})
    assert f"{path}: traces left unresolved" in caplog.text and "'wsj_0004:2': {'cycle *T*': 1}" in caplog.text

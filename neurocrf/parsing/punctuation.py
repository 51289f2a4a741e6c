"""Re-attach punctuation inside the tree (the treebank's own placement is not kept).

Which tokens are punctuation: those whose POS tag (preterminal label) is in :data:`PUNCT_TAGS`
(Alpino ``punct`` / ``let`` / ``LET()`` in lower and upper case, as disco-dop's ``proper.prm``
lists them; NeGra/Tiger ``$,`` ``$(`` ``$.``; Penn ``,`` ``.`` ``:`` `````` ``''``, the EVALB set)
and, if ``word_regex`` is given, tokens whose word matches it in full. The same tag set is the
punctuation ``DELETE_LABEL`` list of ``proper.prm``, so what is moved here is what the evaluation
ignores.

Strategy (:func:`move_punctuation`):

1. Remove every punctuation preterminal from the tree; phrases left empty are removed (the root
   is kept).
2. For each punctuation token ``p``, let ``l`` be the nearest non-punctuation token to its left
   and ``r`` the nearest to its right. If both exist, the preterminal of ``p`` becomes a child of
   the lowest common ancestor of ``l`` and ``r``; otherwise (sentence-initial or -final
   punctuation, or a sentence without ``l``/``r``) a child of the root.

Guarantee: no new discontinuity. A node receives ``p`` only if it dominates both ``l`` and ``r``,
and then it also receives every other punctuation token between them, so for every node the
number of blocks of its yield equals the number of blocks of its non-punctuation yield counted
on the sentence with punctuation removed. Gaps consisting only of punctuation are thereby closed;
a punctuation token is never the cause of a gap.
"""

from __future__ import annotations

import bisect
import re
from typing import Sequence

from neurocrf.parsing.tree import Tree, TreebankSentence

__all__ = ["PUNCT_TAGS", "punctuation_indices", "move_punctuation", "move_punctuation_sentence"]

PUNCT_TAGS: frozenset[str] = frozenset({
    "punct", "PUNCT",                 # Alpino pos (upper case in some conversions, and UD)
    "let", "LET", "let()", "LET()",   # Alpino pt (disco-dop's Alpino reader) / CGN postag
    "$,", "$(", "$.",                 # NeGra, Tiger (STTS)
    ",", ".", ":", "``", "''",        # Penn Treebank (EVALB's deleted tags)
})
"""POS tags of punctuation in the treebanks neurocrf reads (Alpino, NeGra / Tiger, Penn)."""


def punctuation_indices(tree: Tree, words: Sequence[str] | None = None, *,
                        tags: frozenset[str] | set[str] = PUNCT_TAGS,
                        word_regex: str | None = None) -> set[int]:
    """Terminal indices that count as punctuation (by POS tag, optionally by word regex)."""
    pattern = re.compile(word_regex) if word_regex else None
    if pattern is not None and words is None:
        raise ValueError("word_regex needs the words")
    out = set()
    for i, tag in tree.pos():
        if tag in tags or (pattern is not None and pattern.fullmatch(words[i])):  # type: ignore[index]
            out.add(i)
    return out


def move_punctuation(tree: Tree, words: Sequence[str] | None = None, *,
                     tags: frozenset[str] | set[str] = PUNCT_TAGS,
                     word_regex: str | None = None) -> Tree:
    """Return a copy of ``tree`` with punctuation re-attached (see the module docstring)."""
    punct = punctuation_indices(tree, words, tags=tags, word_regex=word_regex)
    if not punct or tree.is_preterminal:
        return tree.copy()
    pts = {i: Tree(tag, [i]) for i, tag in tree.pos() if i in punct}
    stripped = _strip(tree, punct)
    if stripped is None or not stripped.children:
        return Tree(tree.label, [pts[i] for i in sorted(pts)])

    parent: dict[int, Tree] = {}
    preterminal: dict[int, Tree] = {}
    for node in stripped.subtrees():
        for c in node.children:
            if isinstance(c, Tree):
                parent[id(c)] = node
            else:
                preterminal[c] = node
    content = sorted(stripped.leaves())
    position = {i: k for k, i in enumerate(content)}
    targets: list[tuple[Tree, Tree]] = []
    for p in sorted(punct):
        k = bisect.bisect_left(content, p)
        if k == 0 or k == len(content):
            targets.append((stripped, pts[p]))
            continue
        left, right = content[k - 1], content[k]
        assert position[left] + 1 == position[right]
        targets.append((_lowest_common_ancestor(preterminal[left], preterminal[right], parent,
                                                stripped), pts[p]))
    for node, pt in targets:
        node.children.append(pt)
    return stripped.sort()


def _strip(node: Tree, punct: set[int]) -> Tree | None:
    """Copy without punctuation preterminals (and without phrases left empty)."""
    if node.is_preterminal:
        return None if node.children[0] in punct else Tree(node.label, list(node.children))
    kids: list[Tree | int] = []
    for c in node.children:
        if isinstance(c, Tree):
            s = _strip(c, punct)
            if s is not None:
                kids.append(s)
        elif c not in punct:
            kids.append(c)
    return Tree(node.label, kids) if kids else None


def _lowest_common_ancestor(a: Tree, b: Tree, parent: dict[int, Tree], root: Tree) -> Tree:
    ancestors = set()
    node: Tree | None = a
    while node is not None:
        ancestors.add(id(node))
        node = parent.get(id(node))
    node = b
    while node is not None:
        if id(node) in ancestors:
            return node
        node = parent.get(id(node))
    return root


def move_punctuation_sentence(sentence: TreebankSentence, **kwargs) -> TreebankSentence:
    """:func:`move_punctuation` on a :class:`TreebankSentence` (returns a new one)."""
    tree = move_punctuation(sentence.tree, sentence.words, **kwargs)
    return TreebankSentence(sentence.id, list(sentence.words), tree,
                            {name: list(values) for name, values in sentence.annotations.items()},
                            comment=sentence.comment)

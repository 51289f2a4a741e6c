"""Supertag extraction: binarized discontinuous trees -> one lexical LCFRS rule per token.

After :func:`~neurocrf.parsing.transforms.prepare_tree` (unary chains collapsed, binarized, fanout
markers), every node is a preterminal or has exactly two children. Read as an LCFRS derivation,
each binary node ``A`` with children ordered by smallest token, ``B`` (first) and ``C``
(second), is a rule ``A -> B C``; preterminals are rules without children.

**Terminal transport** (lexicalization, after Ruprecht & Mörbitz 2021, Section 3): a binary node
takes the *smallest token of its second child*. Every token except token 0 is taken exactly once:
going up from a token, the token is the smallest of the subtree until the first node where the
other child holds a smaller token, and there it is the smallest token of the second child. Token 0
never moves. So the ``n - 1`` binary nodes get one token each, the preterminals of tokens
``1 .. n-1`` lose theirs and vanish from the derivation, and the preterminal of token 0 stays as
the rule ``@pt 1 t - -``. A node's derived yield is its tree yield minus its smallest token
(which went up), except on the path from token 0 to the root.

The supertag of token ``p`` is the rule of the node that took ``p``, with ``p`` written ``t``
(:class:`~neurocrf.parsing.grammar.Supertag`); a vanished preterminal leaves its child slot
empty (``-``). The roles *first* / *second* are the markers that undo the transport: ``p`` goes
back down into the second child, along its first children, to the empty slot at the bottom; if
the second child vanished, ``p`` is that child. Each tag also records whether its node is the
first or the second child of its parent (root: 2); without that mark, ``X(h, X(X(..), D))`` and
``X(X(h, X(..)), D)`` would get the same tags. The derivation (hence the tree) is recovered by
parsing the tag sequence (:func:`supertags_to_tree`); the preterminal labels are a second tag per
token.

Round trip: on every Alpino tree (7,136, with and without punctuation moved) tree -> supertags
-> tree is the identity. It is not injective on all conceivable trees: when several constituents
with the *same* label attach to the same chain in an order that the rules' compositions do not
fix (e.g. ``X_2(X_2(X_2(..), a), b)`` vs ``X_2(X_2(X_2(..), b), a)`` adding one token to different
blocks), both trees give the same tags, as they give the same unlexicalized LCFRS rules; the
reconstruction then returns one of them (about 0.2% of random trees with a single phrase label).

>>> from neurocrf.parsing.tree import Tree
>>> tree = Tree.parse("(S (A 0) (X (VP_2 (V 1) (N 3)) (B 2)))")
>>> tags = [str(t) for t in extract_from_prepared(tree)]
>>> tags
['@pt 1 t - -', 'S 2 x0ty0 @pt X', 'X 2 tx0 VP_2 -', 'VP_2 1 t - -']
>>> supertags_to_tree(tags, ["A", "V", "B", "N"], restore=False) == tree
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from neurocrf.parsing.deduction import deduce, derivation_to_tree
from neurocrf.parsing.grammar import PT, PT_TAG, TERMINAL, Supertag
from neurocrf.parsing.tree import Tree, TreebankSentence

__all__ = [
    "SentenceSupertags",
    "Supertag",
    "extract_from_prepared",
    "extract_supertags",
    "supertags_to_tree",
]


def _composition(first: int, second: int, bit: int) -> tuple[tuple[str, ...], ...]:
    """Components of the union of ``first`` / ``second`` masks and ``bit``, as rule symbols."""
    union = first | second | bit
    comps: list[list[str]] = []
    counts = {"x": 0, "y": 0}
    prev_src = None
    pos = 0
    prev_in = False
    while union >> pos:
        b = 1 << pos
        if union & b:
            src = "x" if first & b else ("y" if second & b else TERMINAL)
            if not prev_in:
                comps.append([])
                prev_src = None
            if src != prev_src:
                if src == TERMINAL:
                    comps[-1].append(TERMINAL)
                else:
                    comps[-1].append(f"{src}{counts[src]}")
                    counts[src] += 1
            prev_src = src
            prev_in = True
        else:
            prev_in = False
        pos += 1
    return tuple(tuple(c) for c in comps)


def extract_from_prepared(tree: Tree, num_words: int | None = None) -> list[Supertag]:
    """Supertags (one per token, in token order) of a prepared (binarized, unary-free) tree.

    Raises ValueError if a node is neither a preterminal nor binary, or the yield is not
    ``0 .. n-1``."""
    leaves = tree.leaves()
    n = len(leaves) if num_words is None else num_words
    if leaves != list(range(n)):
        raise ValueError(f"yield {leaves} of the tree is not 0..{n - 1}: {tree}")
    tags: list[Supertag | None] = [None] * n
    tags[0] = PT_TAG
    # postorder: (mask, smallest token) of every node
    info: dict[int, tuple[int, int]] = {}
    attach: dict[int, int] = {}  # node id -> 1 (first child) or 2 (second child)
    rules: dict[int, tuple] = {}
    nodes = list(tree.postorder())
    for node in nodes:
        if node.label == PT:
            raise ValueError(f"label {PT!r} is reserved: {tree}")
        if node.is_preterminal:
            tok = node.children[0]
            info[id(node)] = (1 << tok, tok)  # type: ignore[operator]
            continue
        if len(node.children) != 2 or not all(isinstance(c, Tree) for c in node.children):
            raise ValueError(f"node {node.label!r} is neither a preterminal nor binary "
                             f"(prepare the tree first): {node}")
        (m1, lo1), (m2, lo2) = sorted((info[id(c)] for c in node.children), key=lambda i: i[1])
        c1, c2 = sorted(node.children, key=lambda c: info[id(c)][1])  # type: ignore[arg-type]
        # derived yields: the smallest token went up (unless it is token 0)
        d1 = m1 if lo1 == 0 else m1 & ~(1 << lo1)
        d2 = m2 & ~(1 << lo2)
        first = None
        if d1:
            first = PT if c1.is_preterminal else c1.label  # type: ignore[union-attr]
        second = c2.label if d2 else None  # type: ignore[union-attr]
        attach[id(c1)] = 1
        attach[id(c2)] = 2
        info[id(node)] = (m1 | m2, lo1)
        rules[id(node)] = (node.label, _composition(d1, d2, 1 << lo2), first, second, lo2)
    for node in nodes:
        if id(node) in rules:
            label, comp, first, second, tok = rules[id(node)]
            tags[tok] = Supertag(label, comp, first, second, attach.get(id(node), 2))
    if tree.is_preterminal and n == 1:
        return [PT_TAG]
    assert all(t is not None for t in tags)
    return tags  # type: ignore[return-value]


@dataclass
class SentenceSupertags:
    """What :func:`extract_supertags` reads off one sentence: per token its supertag and its
    preterminal (the collapsed POS chain) ``[n]``, and the root label of the prepared tree (a goal
    label of the parser)."""

    supertags: list[Supertag]
    preterminals: list[str]
    root: str

    @property
    def tags(self) -> list[str]:
        """The supertags as strings ``[n]``."""
        return [str(t) for t in self.supertags]


def extract_supertags(sentence: TreebankSentence, h: int = 0, v: int = 1) -> SentenceSupertags:
    """The supertags and preterminals of a treebank sentence, and the root of its prepared tree.

    The tree is prepared here (:func:`~neurocrf.parsing.transforms.prepare_tree` with ``h``,
    ``v``); move punctuation before, if wanted. Raises ValueError naming the sentence id if the
    tree cannot be prepared or read as a derivation."""
    from neurocrf.parsing.transforms import prepare_tree

    n = len(sentence.words)
    try:
        prepared = prepare_tree(sentence.tree, h=h, v=v)
        tags = extract_from_prepared(prepared, n)
    except ValueError as err:
        raise ValueError(f"sentence {sentence.id}: {err}") from None
    preterminals = [""] * n
    for i, label in prepared.pos():
        preterminals[i] = label
    return SentenceSupertags(tags, preterminals, prepared.label)


def supertags_to_tree(
    supertags: Sequence[str | Supertag],
    preterminals: Sequence[str],
    words: Sequence[str] | None = None,
    *,
    roots: Iterable[str] | None = None,
    restore: bool = True,
) -> Tree:
    """Rebuild the tree from one supertag per token by deduction (each tag weight 0).

    ``roots``: allowed root labels (default: any label). ``restore``: undo the tree preparation
    (:func:`~neurocrf.parsing.transforms.restore_tree`); with False the binarized tree is returned.
    Raises ValueError if the tags do not combine into a tree over all tokens."""
    n = len(supertags)
    if len(preterminals) != n or (words is not None and len(words) != n):
        raise ValueError(f"{n} supertags but {len(preterminals)} preterminals"
                         + ("" if words is None else f" and {len(words)} words"))
    tags = [t if isinstance(t, Supertag) else Supertag.parse(t) for t in supertags]
    root_set = set(roots) if roots is not None else {t.lhs for t in tags}
    result = deduce([[(t, 0.0)] for t in tags], root_set)
    if result.derivation is None:
        raise ValueError(f"supertags do not combine into a tree ({result.status}): {supertags}")
    tree = derivation_to_tree(result.derivation, preterminals)
    if restore:
        from neurocrf.parsing.transforms import restore_tree

        tree = restore_tree(tree)
    return tree

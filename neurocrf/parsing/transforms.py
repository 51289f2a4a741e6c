"""Invertible tree transforms that turn treebank trees into binary LCFRS derivations and back.

Pipeline (:func:`prepare_tree`, undone by :func:`restore_tree`)::

    collapse_unaries  ->  binarize(h, v)  ->  add_fanout_markers

Label syntax produced (base labels must not contain the reserved characters ``+ | ^ < >`` nor end
in ``_<digits>``; :func:`check_labels` enforces this):

* unary chains: ``S+VP`` is a node ``S`` whose only child was ``VP``. Chains ending in a
  preterminal collapse into the preterminal: ``(NP (NN 3))`` becomes ``(NP+NN 3)``, so every
  preterminal label is the (collapsed) POS chain of its word.
* binarization: right-factored; a node ``X`` with children ``c1..cn`` (n > 2, ordered by their
  smallest terminal, the usual LCFRS convention for discontinuous nodes) becomes
  ``X -> c1 X|<..>``, ``X|<..> -> c2 X|<..>``, ..., ``X|<..> -> c(n-1) cn``. The ``<..>`` holds
  the horizontal context: the labels of the first ``h`` children the intermediate node covers
  (``h=0``: ``X|<>``). Vertical markovization ``v > 1`` appends ``^<P1,..,P(v-1)>`` (the nearest
  ``v-1`` ancestors of the original tree) to every non-preterminal node except the root;
  ``v=1`` adds nothing.
* fanout: a node whose yield has ``k > 1`` blocks gets ``_k`` appended: ``VP_2``, ``VP|<>_2``.

The inverses are driven by the labels alone, so they also work on parser output.
"""

from __future__ import annotations

import re

from neurocrf.parsing.tree import Tree, _child_key

__all__ = [
    "UNARY_SEP",
    "check_labels",
    "collapse_unaries",
    "expand_unaries",
    "binarize",
    "debinarize",
    "add_fanout_markers",
    "remove_fanout_markers",
    "base_label",
    "is_intermediate",
    "prepare_tree",
    "restore_tree",
]

UNARY_SEP = "+"
"""Joins the labels of a collapsed unary chain (``S+VP``)."""
_RESERVED = set("+|^<>")
_FANOUT_RE = re.compile(r"_(\d+)$")


def check_labels(tree: Tree) -> None:
    """Raise ValueError if a label would be ambiguous after the transforms."""
    for node in tree.subtrees():
        bad = _RESERVED.intersection(node.label)
        if bad or _FANOUT_RE.search(node.label):
            what = f"reserved character(s) {''.join(sorted(bad))!r}" if bad else "a '_<digits>' ending"
            raise ValueError(f"label {node.label!r} contains {what}, which the tree transforms "
                             f"use as markers; rename it before transforming: {tree}")


# ---------------------------------------------------------------------------- unary chains
def collapse_unaries(tree: Tree, sep: str = UNARY_SEP) -> Tree:
    """Merge every chain of unary nodes into one node labeled ``A+B+..`` (outermost first).

    Returns a new tree; a chain ending in a preterminal becomes a preterminal."""
    labels = [tree.label]
    node = tree
    while len(node.children) == 1 and isinstance(node.children[0], Tree):
        node = node.children[0]
        labels.append(node.label)
    return Tree(sep.join(labels), [collapse_unaries(c, sep) if isinstance(c, Tree) else c
                                   for c in node.children])


def expand_unaries(tree: Tree, sep: str = UNARY_SEP) -> Tree:
    """Inverse of :func:`collapse_unaries`: ``A+B`` becomes ``A`` over a single ``B``."""
    children = [expand_unaries(c, sep) if isinstance(c, Tree) else c for c in tree.children]
    labels = tree.label.split(sep)
    node = Tree(labels[-1], children)
    for label in reversed(labels[:-1]):
        node = Tree(label, [node])
    return node


# ---------------------------------------------------------------------------- binarization
def binarize(tree: Tree, h: int = 0, v: int = 1) -> Tree:
    """Right-factored binarization with horizontal (``h``) / vertical (``v``) markovization.

    Returns a new tree in which every node has at most two children (see the module docstring
    for the labels of the intermediate nodes)."""
    if h < 0 or v < 1:
        raise ValueError(f"need h >= 0 and v >= 1, got h={h}, v={v}")
    return _binarize(tree, [], h, v)


def _binarize(node: Tree, ancestors: list[str], h: int, v: int) -> Tree:
    if node.is_preterminal:
        return Tree(node.label, list(node.children))
    context = ancestors[: v - 1]
    suffix = f"^<{','.join(context)}>" if context else ""
    kids = sorted(node.children, key=_child_key)
    below = [node.label] + ancestors
    new = [_binarize(c, below, h, v) if isinstance(c, Tree) else c for c in kids]
    if len(new) <= 2:
        return Tree(node.label + suffix, new)

    def intermediate(first: int, children: list[Tree | int]) -> Tree:
        covered = [c.label if isinstance(c, Tree) else str(c) for c in kids[first:first + h]]
        return Tree(f"{node.label}|<{','.join(covered)}>{suffix}", children)

    current = intermediate(len(new) - 2, new[-2:])
    for i in range(len(new) - 3, 0, -1):
        current = intermediate(i, [new[i], current])
    return Tree(node.label + suffix, [new[0], current])


def is_intermediate(label: str) -> bool:
    """True for a label made by :func:`binarize` for an intermediate node (``X|<..>``)."""
    return "|<" in label


def base_label(label: str) -> str:
    """Strip the fanout marker, parent annotation and intermediate context: ``VP|<>^<S>_2`` -> ``VP``."""
    label = _FANOUT_RE.sub("", label)
    return label.split("^<", 1)[0].split("|<", 1)[0]


def debinarize(tree: Tree) -> Tree:
    """Inverse of :func:`binarize`: splice intermediate nodes into their parent and drop the
    markovization annotations. An intermediate root (only in malformed parser output) keeps its
    base label."""
    children: list[Tree | int] = []
    for c in tree.children:
        if isinstance(c, Tree):
            d = debinarize(c)
            if is_intermediate(_strip_parent(c.label)):
                children.extend(d.children)
            else:
                children.append(d)
        else:
            children.append(c)
    return Tree(_strip_parent(tree.label).split("|<", 1)[0], children)


def _strip_parent(label: str) -> str:
    return label.split("^<", 1)[0]


# ---------------------------------------------------------------------------- fanout markers
def add_fanout_markers(tree: Tree) -> Tree:
    """Append ``_k`` to the label of every node of fanout ``k > 1``; returns a new tree."""
    k = tree.fanout()
    label = f"{tree.label}_{k}" if k > 1 else tree.label
    return Tree(label, [add_fanout_markers(c) if isinstance(c, Tree) else c for c in tree.children])


def remove_fanout_markers(tree: Tree) -> Tree:
    """Strip a trailing ``_<digits>`` from every label; returns a new tree."""
    return Tree(_FANOUT_RE.sub("", tree.label),
                [remove_fanout_markers(c) if isinstance(c, Tree) else c for c in tree.children])


# ---------------------------------------------------------------------------- pipeline
def prepare_tree(tree: Tree, h: int = 0, v: int = 1) -> Tree:
    """Treebank tree -> binary tree with collapsed unaries and fanout markers (a new tree).

    Punctuation placement is a separate, earlier step (:mod:`neurocrf.parsing.punctuation`)."""
    check_labels(tree)
    return add_fanout_markers(binarize(collapse_unaries(tree), h=h, v=v))


def restore_tree(tree: Tree) -> Tree:
    """Exact inverse of :func:`prepare_tree` (a new tree)."""
    return expand_unaries(debinarize(remove_fanout_markers(tree)))

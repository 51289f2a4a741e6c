"""Penn Treebank trees with empty elements -> :class:`Tree`, resolving traces into discontinuity.

A Penn tree marks displaced material with an empty element (``(-NONE- *T*-1)``) at the place
where it is interpreted and a co-index on the displaced constituent, the *filler*
(``(WHNP-1 what)``). Following Evang & Kallmeyer's discontinuous Penn Treebank (DPTB), with
``traces="resolve"`` every co-indexed trace of these kinds is resolved by moving its filler to the
trace's position, so that the words keep their order and the new ancestors of the filler become
discontinuous constituents:

* ``*T*-n``   wh-movement, topicalisation, fronted quotations;
* ``*ICH*-n`` "interpret constituent here": extraposed and otherwise split material;
* ``*EXP*-n`` expletive ``it`` with an extraposed clause;
* ``*RNR*-n`` right node raising: one filler shared by two or more traces.

The filler replaces the highest node that dominates nothing but the trace (``(NP (-NONE- *T*-1))``
as a whole), so the trace's own wrapper label disappears and the filler keeps its label. When
several traces share a filler (``*RNR*``, across-the-board ``*T*``), the filler goes to one of
them: the last trace in word order for ``*RNR*`` (the filler follows the conjuncts, so the last
trace is the nearest and the least discontinuous attachment), the first one for the other kinds
(the filler precedes them). Not moved, counted instead of failing:

* ``missing``: no node carries the index (the tree is kept as if the trace were unindexed);
* ``empty filler``: the filler holds only empty elements (``(WHNP-1 (-NONE- 0))`` of a relative
  clause without a wh-word): nothing to move;
* ``cycle``: the trace lies inside its own filler; moving would make the filler its own ancestor.

Left in place and removed as plain empty elements: ``*`` and ``*-n`` (PRO, passive and raising
NP-movement: the moved NP sits in a position of its own, as in the DPTB), ``*U*`` (units),
``*?*`` (ellipsis: there is no overt antecedent), ``*PPA*-n`` (permanent predictable ambiguity:
the annotators' attachment is kept, the alternative one is not a movement), ``*NOT*`` and ``0``
(null complementizer / operator). Gapping co-indices ``=n`` (``NP=2`` parallel to ``NP-2``) mark
parallel structure, not displacement, and are only stripped.

After resolution (or directly with ``traces="remove"``) every ``-NONE-`` leaf and every
constituent left without words is removed and labels lose their function tags and indices
(:func:`penn_label`: ``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``, ``-LRB-`` kept); a label with
alternatives (``ADVP|PRT``, the annotators' undecided choice) keeps the first, as PARSEVAL-style
evaluators and grammar extractors for the Penn Treebank do.

>>> from neurocrf.parsing.bracket import parse_penn
>>> text = "(SBAR (WHNP-1 (WP what)) (S (NP (PRP I)) (VP (VBD saw) (NP (-NONE- *T*-1)))))"
>>> tree = parse_penn(text, traces="resolve")[0].tree
>>> tree.discbracket()
'(SBAR (S (VP (WHNP (WP 0)) (VBD 2)) (NP (PRP 1))))'
>>> [(node.label, node.blocks()) for node in tree.subtrees() if node.fanout() > 1]
[('VP', [(0, 1), (2, 3)])]
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from neurocrf.parsing.tree import Tree

__all__ = ["RESOLVED_TRACES", "TRACE_MODES", "PennNode", "penn_label", "penn_node", "penn_to_tree",
           "resolve_traces", "strip_function_tags"]

#: Trace kinds whose filler is moved to the trace (``traces="resolve"``).
RESOLVED_TRACES = ("*T*", "*ICH*", "*EXP*", "*RNR*")
#: Values of the ``traces`` option of the Penn reader.
TRACE_MODES = ("resolve", "remove")

_EMPTY = "-NONE-"
_TRACE = re.compile(r"^(\*T\*|\*ICH\*|\*EXP\*|\*RNR\*)-(\d+)$")
_INDEX = re.compile(r"-(\d+)(?:=\d+)?$")
_FUNCTION = re.compile(r"^([^-=]+)[-=].*$")


def strip_function_tags(label: str) -> str:
    """``NP-SBJ-1`` -> ``NP``, ``PP=2`` -> ``PP``; ``-NONE-``, ``-LRB-`` unchanged."""
    if label.startswith("-"):
        return label
    match = _FUNCTION.match(label)
    return match.group(1) if match else label


def penn_label(label: str) -> str:
    """The plain category of a Penn label: the first of ``|``-separated alternatives, without
    function tags and indices (``ADVP-TMP|PRT`` -> ``ADVP``, ``NP-SBJ-1`` -> ``NP``)."""
    if "|" in label and not label.startswith("-"):
        label = label.split("|", 1)[0]
    return strip_function_tags(label)


@dataclass(eq=False)
class PennNode:
    """A mutable Penn tree node: ``word`` is set for a preterminal (with ``index`` its position
    among the overt words, -1 for an empty element), ``children`` otherwise."""

    label: str
    children: list[PennNode] = field(default_factory=list)
    word: str | None = None
    index: int = -1
    parent: PennNode | None = field(default=None, repr=False)

    @property
    def is_empty_element(self) -> bool:
        return self.word is not None and self.label == _EMPTY

    def nodes(self) -> list[PennNode]:
        """This node and all below it, preorder."""
        out, stack = [], [self]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    def has_words(self) -> bool:
        return any(n.word is not None and not n.is_empty_element for n in self.nodes())

    def dominates(self, other: PennNode) -> bool:
        """True if ``other`` is this node or below it."""
        node: PennNode | None = other
        while node is not None:
            if node is self:
                return True
            node = node.parent
        return False


def penn_node(raw: tuple, words: list[str]) -> PennNode:
    """A ``(label, children, offset)`` tuple of the bracket reader (a child is a tuple or a word)
    -> :class:`PennNode`; overt words are appended to ``words`` and numbered in reading order."""
    label, children, _ = raw
    if len(children) == 1 and isinstance(children[0], str):
        if label == _EMPTY:
            return PennNode(label, word=children[0])
        words.append(children[0])
        return PennNode(label, word=children[0], index=len(words) - 1)
    node = PennNode(label, [penn_node(c, words) for c in children])
    for child in node.children:
        child.parent = node
    return node


def resolve_traces(root: PennNode) -> Counter[str]:
    """Move the filler of every co-indexed ``*T*``/``*ICH*``/``*EXP*``/``*RNR*`` trace to the
    trace's position, in place (see the module docstring).

    Returns counts: ``resolved <kind>`` per moved filler, ``missing <kind>``,
    ``empty filler <kind>``, ``cycle <kind>`` for traces left unresolved, and ``extra <kind>``
    for further traces of a filler that went to another of its traces."""
    counts: Counter[str] = Counter()
    fillers: dict[str, list[PennNode]] = {}
    traces: dict[tuple[str, str], list[PennNode]] = {}
    for node in root.nodes():
        if node.is_empty_element:
            match = _TRACE.match(node.word or "")
            if match:
                traces.setdefault((match.group(2), match.group(1)), []).append(node)
        elif not node.label.startswith("-"):
            match = _INDEX.search(node.label)
            if match:
                fillers.setdefault(match.group(1), []).append(node)
    for (index, kind), group in traces.items():
        candidates = [f for f in fillers.get(index, []) if f.has_words()]
        if not candidates:
            counts[("empty filler " if index in fillers else "missing ") + kind] += len(group)
            continue
        filler = candidates[0]
        trace = group[-1] if kind == "*RNR*" else group[0]
        counts[f"extra {kind}"] += len(group) - 1
        site = trace
        while site.parent is not None and len(site.parent.children) == 1:
            site = site.parent
        if filler.dominates(site):
            counts[f"cycle {kind}"] += 1
            continue
        _detach(filler)
        parent = site.parent
        assert parent is not None  # site dominates only the trace, the filler lies elsewhere
        parent.children[parent.children.index(site)] = filler
        filler.parent = parent
        site.parent = None
        counts[f"resolved {kind}"] += 1
    return counts


def _detach(node: PennNode) -> None:
    parent = node.parent
    if parent is not None:
        parent.children.remove(node)
        node.parent = None


def penn_to_tree(node: PennNode) -> Tree | None:
    """:class:`PennNode` -> :class:`Tree` over the overt words' indices, without empty elements,
    constituents left without words, function tags and indices; None if no word is left."""
    if node.word is not None:
        return None if node.is_empty_element else Tree(penn_label(node.label), [node.index])
    kids = [t for t in (penn_to_tree(c) for c in node.children) if t is not None]
    return Tree(penn_label(node.label), kids) if kids else None

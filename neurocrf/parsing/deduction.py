"""Weighted deduction over instantiated supertags (agenda-based, A*-like, bit-vector spans).

Every token ``p`` has a few candidate supertags with weights (``-log`` probabilities). A candidate
instantiated at ``p`` is a rule whose terminal is ``p``. Items are ``(label, mask, kind)``:

* ``mask``: int bit vector of the covered tokens (bit ``i`` = token ``i``); its maximal runs of set
  bits are the item's blocks, so the fanout is the number of runs;
* ``kind``: which slot of a parent rule the item may fill (the rule's attachment mark) and whether
  its chain of first children ends in a hole (a rule without a first child) that a token from
  above has to fill: first child without / with hole, second child (always with hole: the parent's
  token fills it), root (no hole; only a goal).

A rule at ``p`` combines a first child ``X`` (the result inherits its hole) and a second child
``Y`` (all of ``Y`` right of ``p``) if the runs of ``X``, ``Y`` and ``p`` appear, left to right,
exactly as the rule's composition lists them, with gaps exactly between components. The first
token's ``@pt`` rule is the only axiom without a hole; it is instantiated at token 0 only.

Search: each derivation uses every token's rule once, so with weights shifted per token by the
best candidate's weight (``w - min_w[p]`` >= 0) the shifted inside weight of an item equals its
true inside weight plus the best-tag outside estimate minus a constant. Ordering the agenda by
shifted inside weight is therefore A* with that (consistent) estimate: the first goal popped is a
best derivation. Goal: a root item with a label in ``roots`` over all tokens (a one-token sentence
may also end in its ``@pt`` item).

Complexity is exponential in the worst case (LCFRS); the time and item limits bound it.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from neurocrf.parsing.grammar import PT, TERMINAL, Supertag
from neurocrf.parsing.tree import Tree

__all__ = ["DeductionResult", "Derivation", "deduce", "derivation_to_tree"]

_X, _Y, _T = 0, 1, 2
_SOURCE = {"x": _X, "y": _Y, TERMINAL: _T}


class Derivation(NamedTuple):
    """A derivation node: the rule ``tag`` instantiated at token ``pos`` and its children."""

    tag: Supertag
    pos: int
    first: Derivation | None
    second: Derivation | None


@dataclass
class DeductionResult:
    """Outcome of :func:`deduce`.

    ``status``: ``"ok"`` (``derivation`` set, ``weight`` = its total weight), ``"noparse"`` (the
    agenda ran empty), ``"timeout"`` or ``"item_limit"``. ``items``: distinct items built."""

    derivation: Derivation | None
    weight: float
    items: int
    status: str


class _Rule(NamedTuple):
    tag: Supertag
    pos: int
    bit: int
    weight: float          # shifted weight (>= 0)
    lhs: str
    first: str | None
    second: str | None
    fx: int
    fy: int
    need_x: int            # bits X must contain (token neighbours of t that are x blocks)
    forbid_x: int          # bits X must not contain
    need_y: int
    forbid_y: int
    codes: tuple[int, ...]  # per run: 2 * source + starts_component
    attach: int
    kinds: tuple[int, int]  # kind of the result given the first child's kind (_FIRST/_FIRST_HOLE)


# item kinds: which slot an item may fill, and whether it still has a hole
_FIRST, _FIRST_HOLE, _SECOND, _ROOT = 0, 1, 2, 3


def _kind(attach: int, hole: bool) -> int:
    if attach == 1:
        return _FIRST_HOLE if hole else _FIRST
    return _SECOND if hole else _ROOT


@lru_cache(maxsize=1 << 16)
def _static(tag: Supertag) -> tuple[str | None, str | None, tuple[int, ...], tuple[int, int]]:
    """Position-independent part of a rule: neighbours of ``t``, run codes, result kinds."""
    left = right = None
    for comp in tag.composition:
        if TERMINAL in comp:
            i = comp.index(TERMINAL)
            left = comp[i - 1][0] if i > 0 else None
            right = comp[i + 1][0] if i + 1 < len(comp) else None
    codes = tuple(2 * _SOURCE[src] + int(start) for src, start in tag.runs())
    if tag.first is None:  # the node's first child is a hole
        kinds = (_kind(tag.attach, True), _kind(tag.attach, True))
    else:
        kinds = (_kind(tag.attach, False), _kind(tag.attach, True))
    return left, right, codes, kinds


def _compile(tag: Supertag, pos: int, weight: float) -> _Rule:
    left, right, codes, kinds = _static(tag)
    bit = 1 << pos
    lbit = bit >> 1  # 0 for token 0
    rbit = bit << 1
    need_x = (lbit if left == "x" else 0) | (rbit if right == "x" else 0)
    forbid_x = bit | (0 if left == "x" else lbit) | (0 if right == "x" else rbit)
    need_y = rbit if right == "y" else 0
    # all of Y lies right of the token
    forbid_y = ((bit << 1) - 1) | (0 if right == "y" else rbit)
    return _Rule(tag, pos, bit, weight, tag.lhs, tag.first, tag.second, tag.fanout_first,
                 tag.fanout_second, need_x, forbid_x, need_y, forbid_y, codes, tag.attach, kinds)


def _fits(x: int, y: int, bit: int, codes: tuple[int, ...]) -> bool:
    """Do the blocks of ``x``, ``y`` and token ``bit`` line up as ``codes`` says?

    ``x``, ``y``, ``bit`` must be pairwise disjoint (checked by the caller)."""
    u = x | y | bit
    gaps = u & ~(u << 1)
    starts = (x & ~(x << 1)) | (y & ~(y << 1)) | bit
    if starts.bit_count() != len(codes):
        return False
    for code in codes:
        low = starts & -starts
        starts ^= low
        src = 0 if low & x else (2 if low & y else 4)
        if src + (1 if low & gaps else 0) != code:
            return False
    return True


def _fanout(mask: int) -> int:
    return (mask & ~(mask << 1)).bit_count()


def deduce(
    candidates: Sequence[Sequence[tuple[Supertag, float]]],
    roots: set[str] | frozenset[str],
    *,
    time_limit: float | None = None,
    max_items: int | None = None,
) -> DeductionResult:
    """Best derivation over ``candidates[p]`` = ``[(supertag, weight), ...]`` for each token ``p``.

    Weights are costs (``-log p``); lower is better. ``time_limit`` (seconds) and ``max_items``
    stop the search early (status ``"timeout"`` / ``"item_limit"``)."""
    n = len(candidates)
    if n == 0:
        raise ValueError("cannot parse an empty sentence")
    full = (1 << n) - 1
    start = time.perf_counter()

    rules: list[_Rule] = []
    by_first: dict[str, list[_Rule]] = {}
    by_second: dict[str, list[_Rule]] = {}
    axioms: list[_Rule] = []
    base = 0.0
    for pos, cands in enumerate(candidates):
        best_w: dict[Supertag, float] = {}
        for tag, w in cands:
            w = float(w)
            if tag not in best_w or w < best_w[tag]:
                best_w[tag] = w
        if not best_w:
            return DeductionResult(None, float("inf"), 0, "noparse")
        shift = min(best_w.values())
        base += shift
        for tag, w in best_w.items():
            if tag.lhs == PT and pos != 0:
                continue
            rule = _compile(tag, pos, w - shift)
            rules.append(rule)
            if rule.first is not None:
                by_first.setdefault(rule.first, []).append(rule)
            if rule.second is not None:
                by_second.setdefault(rule.second, []).append(rule)
            if rule.first is None and rule.second is None:
                axioms.append(rule)

    Key = tuple[str, int, int]
    best: dict[Key, float] = {}
    back: dict[Key, tuple[_Rule, Key | None, Key | None]] = {}
    done: set[Key] = set()
    # (label, fanout, kind) -> [(mask, key, inside)] of popped items
    finished: dict[tuple[str, int, int], list[tuple[int, Key, float]]] = {}
    agenda: list[tuple[float, int, Key]] = []
    counter = 0

    def push(key: Key, weight: float, trace: tuple[_Rule, Key | None, Key | None]) -> None:
        nonlocal counter
        if key in done:
            return
        old = best.get(key)
        if old is None or weight < old:
            best[key] = weight
            back[key] = trace
            counter += 1
            heapq.heappush(agenda, (weight, counter, key))

    for rule in axioms:
        push((rule.lhs, rule.bit, _kind(rule.attach, rule.lhs != PT)), rule.weight,
             (rule, None, None))

    pops = 0
    status = "noparse"
    goal: Key | None = None
    while agenda:
        inside, _, key = heapq.heappop(agenda)
        if key in done:
            continue
        done.add(key)
        label, mask, kind = key
        if mask == full and (kind == _ROOT and label in roots or n == 1 and label == PT):
            goal = key
            status = "ok"
            break
        pops += 1
        if (pops & 255 == 0 and time_limit is not None
                and time.perf_counter() - start > time_limit):
            status = "timeout"
            break
        if max_items is not None and len(best) > max_items:
            status = "item_limit"
            break
        if kind == _ROOT:
            continue
        fan = _fanout(mask)
        finished.setdefault((label, fan, kind), []).append((mask, key, inside))

        if kind != _SECOND:  # a first child: kind _FIRST or _FIRST_HOLE
            for r in by_first.get(label, ()):
                if r.fx != fan or mask & r.forbid_x or (mask & r.need_x) != r.need_x:
                    continue
                out = r.kinds[kind]
                if r.second is None:
                    if _fits(mask, 0, r.bit, r.codes):
                        push((r.lhs, mask | r.bit, out), inside + r.weight, (r, key, None))
                    continue
                for other, okey, oinside in finished.get((r.second, r.fy, _SECOND), ()):
                    if other & mask or other & r.forbid_y or (other & r.need_y) != r.need_y:
                        continue
                    if _fits(mask, other, r.bit, r.codes):
                        push((r.lhs, mask | other | r.bit, out), inside + oinside + r.weight,
                             (r, key, okey))
            continue
        for r in by_second.get(label, ()):
            if r.fy != fan or mask & r.forbid_y or (mask & r.need_y) != r.need_y:
                continue
            if r.first is None:
                if _fits(0, mask, r.bit, r.codes):
                    push((r.lhs, mask | r.bit, r.kinds[_FIRST_HOLE]), inside + r.weight,
                         (r, None, key))
                continue
            for okind in (_FIRST, _FIRST_HOLE):
                out = r.kinds[okind]
                for other, okey, oinside in finished.get((r.first, r.fx, okind), ()):
                    if other & mask or other & r.forbid_x or (other & r.need_x) != r.need_x:
                        continue
                    if _fits(other, mask, r.bit, r.codes):
                        push((r.lhs, other | mask | r.bit, out), inside + oinside + r.weight,
                             (r, okey, key))

    if goal is None:
        return DeductionResult(None, float("inf"), len(best), status)

    def build(key: Key) -> Derivation:
        rule, xkey, ykey = back[key]
        return Derivation(rule.tag, rule.pos, build(xkey) if xkey else None,
                          build(ykey) if ykey else None)

    return DeductionResult(build(goal), best[goal] + base, len(best), status)


def derivation_to_tree(derivation: Derivation, preterminals: Sequence[str]) -> Tree:
    """Undo terminal transport: derivation -> binarized tree with ``preterminals[i]`` over token i.

    A rule at ``p`` becomes a node ``lhs`` with children (first, second): the first child is the
    tree of the first child, or a preterminal over the token handed down from above (the hole);
    the second child is the tree of the second child with ``p`` handed down into its hole, or a
    preterminal over ``p``. The ``@pt`` rule is just a preterminal over its token.
    Raises ValueError for a derivation whose holes and handed-down tokens do not match."""

    def leaf(pos: int) -> Tree:
        return Tree(preterminals[pos], [pos])

    def build(node: Derivation, hole: int | None) -> Tree:
        tag = node.tag
        if tag.lhs == PT:
            if hole is not None:
                raise ValueError(f"token {hole} handed down to the {PT} rule at {node.pos}")
            return leaf(node.pos)
        if node.first is not None:
            first = build(node.first, hole)
        elif hole is None:
            raise ValueError(f"rule {tag} at token {node.pos} has a hole but no token fills it")
        else:
            first = leaf(hole)
        second = build(node.second, node.pos) if node.second is not None else leaf(node.pos)
        return Tree(tag.lhs, [first, second])

    return build(derivation, None)

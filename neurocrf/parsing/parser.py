"""The k-best supertag parser: supertagger output -> discontinuous constituent tree.

Input per token: up to ``k`` candidate supertags (strings, see
:class:`~neurocrf.parsing.grammar.Supertag`) with weights ``-log p`` (lower is better), and one
predicted preterminal. :func:`~neurocrf.parsing.deduction.deduce` finds the best derivation
(A* with the best-tag outside estimate); it is turned into the binarized tree, then
:func:`~neurocrf.parsing.transforms.restore_tree` undoes fanout markers, binarization and unary
collapsing. If the candidates do not combine (or a limit is hit), the result is a flat
``NOPARSE`` tree over the predicted preterminals with ``fallback=True``.

Renormalising the ``k`` probabilities of a token adds the same constant to all its weights, which
does not change the best derivation, so the parser accepts normalised or raw ``-log p``.

>>> parser = Parser({"S"}, k=2)
>>> cands = [[("@pt 1 t - -", 0.1)], [("S 2 x0t @pt -", 0.2), ("S 2 tx0 @pt -", 0.3)]]
>>> result = parser.parse(["a", "b"], cands, ["D", "N"])
>>> str(result.tree), result.fallback
('(S (D 0) (N 1))', False)
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neurocrf.parsing.deduction import deduce, derivation_to_tree
from neurocrf.parsing.grammar import Supertag
from neurocrf.parsing.transforms import restore_tree
from neurocrf.parsing.tree import Tree

__all__ = [
    "NOPARSE",
    "ParseResult",
    "Parser",
    "candidates_from_topk",
    "noparse_tree",
]

NOPARSE = "NOPARSE"
"""Root label of the flat fallback tree of a sentence whose supertags do not combine."""


@dataclass
class ParseResult:
    """``tree``: the parse (restored); ``fallback``: True if it is the flat ``NOPARSE`` tree;
    ``skipped``: candidates dropped because the string is not a valid supertag or the weight is
    not finite; ``items``: chart items built;
    ``status``: ``ok`` / ``noparse`` / ``timeout`` / ``item_limit``; ``weight``: total weight of
    the derivation (inf for a fallback); ``seconds``: parse time."""

    tree: Tree
    fallback: bool
    skipped: int
    items: int
    status: str = "ok"
    weight: float = math.inf
    seconds: float = 0.0


def noparse_tree(preterminals: Sequence[str]) -> Tree:
    """Flat ``NOPARSE`` tree over the (restored) preterminals."""
    flat = Tree(NOPARSE, [Tree(p, [i]) for i, p in enumerate(preterminals)])
    return restore_tree(flat)


def candidates_from_topk(indices: Any, log_probs: Any, tags: Sequence[str],
                         renormalize: bool = True) -> list[list[tuple[str, float]]]:
    """Supertagger top-k output of one sentence -> parser candidates.

    Args:
        indices: tag ids ``[n, k]`` (tensor, array or nested lists) into ``tags``.
        log_probs: their log-probabilities ``[n, k]``.
        tags: the supertag vocabulary (id -> string).
        renormalize: renormalise the ``k`` probabilities of each token (as in the paper).

    Returns per token ``[(supertag, -log p), ...]``; ids outside ``tags`` are dropped.
    """
    ids = indices.tolist() if hasattr(indices, "tolist") else indices
    lps = log_probs.tolist() if hasattr(log_probs, "tolist") else log_probs
    if len(ids) != len(lps):
        raise ValueError(f"{len(ids)} rows of indices but {len(lps)} rows of log-probabilities")
    out = []
    for row_ids, row_lp in zip(ids, lps):
        norm = 0.0
        if renormalize and row_lp:
            top = max(row_lp)
            norm = top + math.log(sum(math.exp(lp - top) for lp in row_lp))
        out.append([(tags[i], norm - lp) for i, lp in zip(row_ids, row_lp) if 0 <= i < len(tags)])
    return out


class Parser:
    """Parse sentences from k-best supertags.

    Args:
        roots: labels allowed at the root of the binarized tree (the ``root`` of
            :func:`~neurocrf.parsing.supertags.extract_supertags` over the training trees).
        k: use at most the ``k`` lowest-weight candidates per token.
        time_limit: seconds per sentence before falling back (None: no limit).
        max_items: chart items per sentence before falling back (None: no limit).
    """

    def __init__(self, roots: set[str] | Sequence[str], k: int = 10, time_limit: float | None = 5.0,
                 max_items: int | None = 1_000_000) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.roots = frozenset(roots)
        if not self.roots:
            raise ValueError("need at least one root label")
        self.k = k
        self.time_limit = time_limit
        self.max_items = max_items
        self._cache: dict[str, Supertag | None] = {}

    def supertag(self, text: str) -> Supertag | None:
        """Parsed supertag, or None if ``text`` is not a valid supertag (cached)."""
        try:
            return self._cache[text]
        except KeyError:
            pass
        try:
            tag: Supertag | None = Supertag.parse(text)
        except (ValueError, TypeError, AttributeError):
            tag = None
        self._cache[text] = tag
        return tag

    def parse(self, words: Sequence[str], candidates: Sequence[Sequence[tuple[str, float]]],
              preterminals: Sequence[str]) -> ParseResult:
        """Parse one sentence.

        Args:
            words: the tokens ``[n]`` (only their number is used).
            candidates: per token, ``(supertag string, weight)`` pairs; weights ``-log p``
                (floats or 0-d tensors).
            preterminals: predicted preterminal (collapsed POS) per token ``[n]``.
        """
        n = len(words)
        if len(candidates) != n or len(preterminals) != n:
            raise ValueError(f"{n} words but {len(candidates)} candidate lists and "
                             f"{len(preterminals)} preterminals")
        start = time.perf_counter()
        if n == 0:
            return ParseResult(Tree(NOPARSE, []), True, 0, 0, "noparse", math.inf, 0.0)
        skipped = 0
        cands: list[list[tuple[Supertag, float]]] = []
        for token_cands in candidates:
            parsed: list[tuple[Supertag, float]] = []
            for text, weight in token_cands:
                tag = self.supertag(text)
                w = float(weight)
                if tag is None or not math.isfinite(w):  # unparseable, or probability 0
                    skipped += 1
                    continue
                parsed.append((tag, w))
            if len(parsed) > self.k:
                parsed.sort(key=lambda c: c[1])
                parsed = parsed[: self.k]
            cands.append(parsed)
        result = deduce(cands, self.roots, time_limit=self.time_limit, max_items=self.max_items)
        if result.derivation is None:
            return ParseResult(noparse_tree(preterminals), True, skipped, result.items,
                               result.status, math.inf, time.perf_counter() - start)
        tree = restore_tree(derivation_to_tree(result.derivation, preterminals))
        return ParseResult(tree, False, skipped, result.items, "ok", result.weight,
                           time.perf_counter() - start)

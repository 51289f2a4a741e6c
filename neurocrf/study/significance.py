"""Paired significance of a span-F1 difference: approximate randomisation over sentences.

Two systems tagged the same test sentences. Each sentence (more generally, each *unit*: with
several seeds pooled, a unit is one (seed, sentence) pair) contributes span counts to each
system's micro F1: true positives, predicted spans and gold spans, with seqeval's strict span
matching in the run's scheme (the reading :func:`neurocrf.models.metrics.span_scores` uses, so
that the pooled F1 of one run equals its reported test F1). Under the null hypothesis the two
systems are exchangeable on every unit; approximate randomisation (Noreen 1989; Yeh 2000) swaps
the two systems' outputs of each unit with probability 1/2, recomputes the difference of micro
F1, and counts the shuffles whose absolute difference is at least the observed one (two-sided).
The p-value is ``(r + 1) / (n + 1)`` for ``r`` such shuffles out of ``n``.

>>> gold = [["B-PER", "E-PER", "O"], ["S-LOC", "O", "O"]]
>>> a = sentence_counts(gold, gold, "BIOES")
>>> b = sentence_counts(gold, [["B-PER", "E-PER", "O"], ["O", "O", "O"]], "BIOES")
>>> a.f1(), b.f1()
(1.0, 0.6666666666666666)
>>> approximate_randomization(a, b, shuffles=100).p_value  # one differing sentence: every swap is as extreme
1.0
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from neurocrf.models.metrics import seqeval_scheme

TEST_NAME = (
    "two-sided paired approximate randomisation test over test sentences (seeds pooled: the unit"
    " swapped is one (seed, sentence) pair); statistic: difference of micro span F1 (seqeval strict)"
)


@dataclass(frozen=True)
class UnitCounts:
    """Span counts per unit of one system, each an int64 array ``[n]``: correctly predicted spans
    (``tp``), predicted spans (``pred``), gold spans (``gold``)."""

    tp: np.ndarray
    pred: np.ndarray
    gold: np.ndarray

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def f1(self) -> float:
        """Micro span F1 over all units (0 when there are no spans at all)."""
        return micro_f1(int(self.tp.sum()), int(self.pred.sum()), int(self.gold.sum()))

    @staticmethod
    def concatenate(parts: Sequence[UnitCounts]) -> UnitCounts:
        """The units of several parts one after another (e.g. the seeds of a pooled test)."""
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return UnitCounts(empty, empty, empty)
        return UnitCounts(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("tp", "pred", "gold")))


@dataclass(frozen=True)
class RandomizationResult:
    """Observed statistic ``F1(a) - F1(b)`` over all units, the shuffles with an absolute statistic
    at least as large (``extreme``) out of ``shuffles``, and ``p_value = (extreme + 1) / (shuffles + 1)``."""

    statistic: float
    p_value: float
    extreme: int
    shuffles: int
    units: int
    seed: int


def micro_f1(tp: int, pred: int, gold: int) -> float:
    """``2 tp / (pred + gold)``: the harmonic mean of precision and recall, 0 without spans."""
    total = pred + gold
    return 2.0 * tp / total if total else 0.0


def sentence_counts(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], scheme: str) -> UnitCounts:
    """Span counts per sentence under seqeval's strict matching in ``scheme`` (IOB1, IOB2, BIOES).

    Args:
        gold, pred: tag strings per sentence; sentence ``i`` of both has the same length.

    Returns:
        :class:`UnitCounts` with one unit per sentence.
    """
    from seqeval.scheme import Entities

    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted ones")
    cls = seqeval_scheme(scheme)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gold_entities = Entities([list(s) for s in gold], cls).entities
        pred_entities = Entities([list(s) for s in pred], cls).entities
    tp = np.zeros(len(gold), dtype=np.int64)
    n_pred = np.zeros(len(gold), dtype=np.int64)
    n_gold = np.zeros(len(gold), dtype=np.int64)
    for i, (g, p) in enumerate(zip(gold_entities, pred_entities)):
        gold_set = {e.to_tuple() for e in g}
        pred_set = {e.to_tuple() for e in p}
        tp[i], n_pred[i], n_gold[i] = len(gold_set & pred_set), len(pred_set), len(gold_set)
    return UnitCounts(tp, n_pred, n_gold)


def approximate_randomization(
    a: UnitCounts, b: UnitCounts, shuffles: int = 10_000, seed: int = 0, chunk_elements: int = 2_000_000
) -> RandomizationResult:
    """Paired approximate randomisation test of ``F1(a) - F1(b)`` (see the module docstring).

    Args:
        a, b: the two systems' counts over the same units (``gold`` must agree unit by unit).
        shuffles: random swap patterns drawn (each unit swapped with probability 1/2).
        seed: seed of the random generator (numpy PCG64): the same inputs give the same p-value.
        chunk_elements: swap patterns are drawn ``chunk_elements // units`` at a time (memory).
    """
    if len(a) != len(b):
        raise ValueError(f"the systems have {len(a)} and {len(b)} units: a paired test needs the same units")
    if not np.array_equal(a.gold, b.gold):
        unit = int(np.flatnonzero(a.gold != b.gold)[0])
        raise ValueError(f"unit {unit}: {a.gold[unit]} gold spans for one system, {b.gold[unit]} for the other")
    if shuffles < 1:
        raise ValueError(f"shuffles must be >= 1, got {shuffles}")
    gold = float(a.gold.sum())
    tp_a, pred_a, tp_b, pred_b = (float(x.sum()) for x in (a.tp, a.pred, b.tp, b.pred))
    observed = _f1(tp_a, pred_a, gold) - _f1(tp_b, pred_b, gold)
    # swapping unit i moves (tp_b - tp_a, pred_b - pred_a) of it from b to a and back
    delta = np.stack([b.tp - a.tp, b.pred - a.pred], axis=1).astype(np.float64)  # [n, 2]
    rng = np.random.default_rng(seed)
    rows = max(1, chunk_elements // max(len(a), 1))
    extreme, done = 0, 0
    tolerance = 1e-12
    while done < shuffles:
        count = min(rows, shuffles - done)
        swaps = rng.random((count, len(a))) < 0.5  # [count, n]
        moved = swaps.astype(np.float64) @ delta  # [count, 2], exact: integers below 2**53
        f1_a = _f1(tp_a + moved[:, 0], pred_a + moved[:, 1], gold)
        f1_b = _f1(tp_b - moved[:, 0], pred_b - moved[:, 1], gold)
        stats = f1_a - f1_b
        extreme += int(np.count_nonzero(np.abs(stats) >= abs(observed) - tolerance))
        done += count
    return RandomizationResult(
        statistic=float(observed), p_value=(extreme + 1) / (shuffles + 1), extreme=extreme,
        shuffles=shuffles, units=len(a), seed=seed,
    )


def _f1(tp: np.ndarray | float, pred: np.ndarray | float, gold: float) -> np.ndarray | float:
    total = np.asarray(pred, dtype=np.float64) + gold
    safe = np.where(total > 0, total, 1.0)
    return np.where(total > 0, 2.0 * np.asarray(tp, dtype=np.float64) / safe, 0.0)

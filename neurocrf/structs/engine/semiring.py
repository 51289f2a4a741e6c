"""The semiring reductions of the chain scans, and the score of an impossible path.

A chain scan repeatedly combines the scores of the previous position with the transition scores
("times", which is ``+`` in every semiring here) and reduces over the previous state ("plus"). The
semiring decides what "plus" is:

- :class:`LogSemiring` (``logsumexp``): log partition function; its gradient gives the marginals.
  The reference's log-space scans (:mod:`~neurocrf.structs.engine.reference`) and the parallel
  scan use it wherever a reduction must stay differentiable to any order.
- :class:`KMaxSemiring` (top-k over a flattened ``(previous state, rank)`` axis): the k best
  paths (:func:`~neurocrf.structs.engine.reference.kmax_scan`). Ties keep the lower index first,
  as ``max`` does, so rank 0 follows exactly the Viterbi path.

The max semiring (Viterbi) is ``Tensor.max`` itself, and the hot sequential loops of the fast
scans call ``torch.logsumexp`` with an ``out=`` buffer; both reduce exactly as the classes here.

All reductions take ``scores`` shaped ``[batch, source, *rest]`` and reduce ``source`` (dim 1).
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")
"""The zero of the log and max semirings: the score of a path that cannot be taken (constraints,
padding, rows without a valid path)."""


class LogSemiring:
    """(logsumexp, +): sums over paths in log space."""

    zero = NEG_INF

    @staticmethod
    def plus(scores: Tensor, dim: int) -> Tensor:
        """Reduce ``dim`` with logsumexp. All ``-inf`` inputs give ``-inf`` with a zero gradient
        of every order (``torch.logsumexp`` gives a NaN gradient there)."""
        peak = scores.amax(dim=dim, keepdim=True).detach()
        peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
        total = torch.exp(scores - peak).sum(dim=dim)
        some = total > 0
        # log(1) on the empty sums: finite derivatives of every order, zeroed by the where
        log_total = torch.where(some, torch.log(torch.where(some, total, torch.ones_like(total))),
                                torch.full_like(total, NEG_INF))
        return log_total + peak.squeeze(dim)


class KMaxSemiring:
    """(top-k, +): the k best paths.

    Scores carry a trailing rank axis of size ``k``. ``plus`` reduces the source axis and the rank
    axis jointly and returns the new top-k with back-pointers into the flattened
    ``source * k + rank`` axis.
    """

    zero = NEG_INF

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.k = k

    def plus_with_argmax(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """``scores`` ``[batch, source, *rest, k]`` -> values, pointers ``[batch, *rest, k]``."""
        flat = scores.movedim(1, -2).flatten(-2)  # [batch, *rest, source * k]
        return top_first(flat, self.k)


def top_first(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest of ``scores`` ``[..., n]`` along the last dim and their indices, best
    first; equal values keep the lower index first (the index ``max`` returns), and ``-inf``
    values with index 0 pad the result where ``n < k``.

    >>> top_first(torch.tensor([1.0, 3.0, 3.0]), 4)
    (tensor([3., 3., 1., -inf]), tensor([1, 2, 0, 0]))
    """
    values, indices = scores.sort(dim=-1, descending=True, stable=True)
    values, indices = values[..., :k], indices[..., :k]
    pad = k - values.shape[-1]
    if pad > 0:
        values = torch.cat([values, values.new_full((*values.shape[:-1], pad), NEG_INF)], -1)
        indices = torch.cat([indices, indices.new_zeros((*indices.shape[:-1], pad))], -1)
    return values, indices

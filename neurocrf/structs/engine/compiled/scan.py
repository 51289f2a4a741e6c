"""The compiled kernel's scans behind torch's interfaces: the certified forward-backward pass (a
certified scan in the sense of :mod:`~neurocrf.structs.engine.certified`, so that
:class:`~neurocrf.structs.engine.certified.CertifiedLogPartition` drives it) and the gold-path
score as one autograd node. Inputs are CPU tensors of a first-order chain with shared transitions:
``start [S]``, ``transitions [S, S]``, ``end [S]``, compacted ``emissions [B, T, C]``, ``lengths [B]``
and optionally ``columns [S]``, the emission column of each state (see
:mod:`~neurocrf.structs.engine.columns`; None: ``C = S``, each state its own).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neurocrf.structs.engine import columns as shared
from neurocrf.structs.engine import reference
from neurocrf.structs.engine.certified import DROPPED_ERROR
from neurocrf.structs.engine.compiled import kernel

_TINY = math.exp(-700.0)  # a normal float64 number with a margin above the smallest one
_FLOOR = math.exp(-600.0)  # normalisers of the marginals must exceed this (see kernel.c)


class KernelForwardBackward:
    """The forward scan on construction (``ok``: certified; ``log_z`` ``[B]`` float64) and the backward
    scan for gradients and marginals.

    When the forward scan dropped values, certifying ``log_z`` takes the backward pass at once: it
    then runs per row (node and per-row edge marginals, combined with any gradient weights later),
    so that training still runs it only once."""

    def __init__(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                 columns: Tensor | None = None) -> None:
        f64 = torch.float64
        self.dtype, self.columns = emissions.dtype, columns
        self.emissions = emissions.detach().to(f64).contiguous()
        shift = self.emissions.amax(-1, keepdim=True)
        self.probs = (self.emissions - shift).exp_()
        self.shift = shift.squeeze(-1)
        self.moves, self.end = transitions.detach().to(f64).contiguous(), end.detach().to(f64).contiguous()
        self.lengths = lengths.to(torch.long).contiguous()
        self.log_z, self.alphas, status = kernel.fb_forward(
            start.detach().to(f64).contiguous(), self.moves, self.end, self.emissions, self.probs, self.shift,
            self.lengths, _TINY, columns)
        self._per_row: tuple[Tensor, Tensor] | None = None
        self.ok = status == 1 or status == 2 and self._marginals() is not None

    def _backward(self, grad: Tensor | None) -> tuple[Tensor, ...] | None:
        *out, error, ok = kernel.fb_backward(self.moves, self.end, self.emissions, self.probs, self.shift,
                                             self.lengths, self.alphas, _TINY, _FLOOR, grad, self.columns)
        return tuple(out) if ok and bool((error <= DROPPED_ERROR).all()) else None

    def _marginals(self) -> tuple[Tensor, Tensor] | None:
        """Node marginals ``[B, T, S]`` and per-row summed edge marginals ``[B, S, S]`` (computed
        once), or None if the backward scan (or the dropped values' error bound) is not certified."""
        if self._per_row is None:
            self._per_row = self._backward(None) or ()
        return self._per_row or None

    def gradients(self, grad_log_z: Tensor, need_moves: bool
                  ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor] | None:
        """Gradients of ``sum_b grad_log_z[b] log Z[b]``: start ``[S]``, transitions ``[S, S]``, end
        ``[S]`` (float64), emissions ``[B, T, C]`` (the emissions' dtype), or None if not certified."""
        weight = grad_log_z.to(torch.float64).contiguous()
        num_columns = self.emissions.shape[-1]
        if self._per_row is None:  # the common case: the kernel weights and sums
            out = self._backward(weight)
            if out is None:
                return None
            grad_start, grad_moves, grad_end, nodes = out
            return grad_start, grad_moves, grad_end, kernel.fold(nodes, self.dtype, num_columns, self.columns)
        marginals = self._marginals()
        if marginals is None:
            return None
        nodes, edges = marginals
        grad_start = weight @ nodes[:, 0]
        last = (self.lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, nodes.shape[-1])
        grad_end = (weight * (self.lengths > 0)) @ nodes.gather(1, last).squeeze(1)
        grad_moves = (weight @ edges.flatten(1)).view_as(edges[0])
        return grad_start, grad_moves, grad_end, kernel.fold(nodes, self.dtype, num_columns, self.columns, weight)

    def node_marginals(self) -> Tensor | None:
        """``[B, T, S]`` float64 posteriors, or None if not certified."""
        marginals = self._marginals()
        return None if marginals is None else marginals[0]


class GoldScore(torch.autograd.Function):
    """Score of given state paths, summed in float64 by the kernel; the backward pass scatters the
    path's counts (with torch operations when it must itself be differentiable: ``create_graph``)."""

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, states, lengths, columns):  # type: ignore[override]
        states, lengths = states.contiguous(), lengths.to(torch.long).contiguous()
        ctx.columns = columns
        ctx.save_for_backward(start, transitions, end, emissions, states, lengths)
        return kernel.gold_score(*(x.detach().contiguous() for x in (start, transitions, end, emissions)), states,
                                 lengths, columns)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        *potentials, states, lengths = ctx.saved_tensors
        needed = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():
            leaves = [x.detach().requires_grad_(need) for x, need in zip(potentials, needed)]
            with torch.enable_grad():
                emissions = leaves[3] if ctx.columns is None else shared.expand(leaves[3], ctx.columns)
                score = reference.path_score(*leaves[:3], emissions, states, lengths)
                chosen = [x for x, need in zip(leaves, needed) if need]
                grads = iter(torch.autograd.grad(score, chosen, grad, create_graph=True))
            return (*(next(grads) if need else None for need in needed), None, None, None)
        grads = kernel.gold_backward(states, lengths, grad.contiguous(), potentials[0].shape[0],
                                     potentials[3].shape[-1], ctx.columns)
        return (*(g if need else None for g, need in zip(grads, needed)), None, None, None)

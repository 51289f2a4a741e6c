"""The log partition function on the Triton kernels, its gradient, and the node marginals.

:class:`LogPartition` runs :func:`~.kernels.forward_kernel` (one launch) and, in its backward
pass, :func:`~.kernels.backward_kernel` (one launch): d log Z / d potentials are the node and edge
marginals, so the backward pass *is* the forward-backward algorithm. The number of launches per
call does not depend on the batch size or the sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from neurocrf.structs.engine.triton import runtime
from neurocrf.structs.engine.triton.inputs import Inputs, prepare


def _forward(x: Inputs, store: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``log_z [B]`` float64 and, with ``store``, the rescaled forward scores ``[B, T, N]`` and
    their float64 log scales ``[B, T]`` (empty otherwise)."""
    device = x.emissions.device
    log_z = torch.empty(x.batch, dtype=torch.float64, device=device)
    shape = (x.batch, x.seq_len) if store else (0, 0)
    alphas = torch.empty(*shape, x.num_states, dtype=x.dtype, device=device)
    scales = torch.empty(*shape, dtype=torch.float64, device=device)
    name, blocked, constants = x.plan("forward_kernel")
    work = (torch.empty(x.batch, 2, x.num_states, dtype=x.dtype, device=device),) if blocked else ()
    runtime.launch(name, x.batch, x.start, x.moves, x.end, x.emissions, x.lengths, log_z, alphas, scales, *work,
                   *x.scalars(), STORE=store, **constants)
    return log_z, alphas, scales


def _backward(x: Inputs, log_z: Tensor, alphas: Tensor, scales: Tensor, weights: Tensor, moves: bool
              ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Gradients of ``sum_b weights[b] log Z[b]``: ``start [*S]``, ``end [*S]``, transitions
    (``[*S, C]`` or per position ``[B, T, *S, C]``; None unless ``moves``) and emissions
    ``[B, T, *S]``, in the compute dtype."""
    device, dtype = x.emissions.device, x.dtype
    states, size = x.num_states, x.size
    d_emissions = torch.zeros(x.batch, x.seq_len, states, dtype=dtype, device=device)
    d_start = torch.empty(x.batch, states, dtype=dtype, device=device)
    d_end = torch.empty(x.batch, states, dtype=dtype, device=device)
    name, blocked, constants = x.plan("backward_kernel")
    if not moves:
        d_moves = torch.empty(0, dtype=dtype, device=device)
    elif x.per_position:
        d_moves = torch.zeros(x.batch, x.seq_len, states, size, dtype=dtype, device=device)
    else:  # the blocked kernel adds the edge marginals of each position into it
        d_moves = (torch.zeros if blocked else torch.empty)(x.batch, states, size, dtype=torch.float64, device=device)
    work = (torch.empty(x.batch, 2, states, dtype=dtype, device=device),) if blocked else ()
    runtime.launch(name, x.batch, x.moves, x.end, x.emissions, x.lengths, log_z, weights.to(torch.float64).contiguous(),
                   alphas, scales, d_emissions, d_start, d_end, d_moves, *work, *x.scalars(), MOVES=moves,
                   **constants)
    state_shape = (size,) * x.order
    grad_moves = None
    if moves:
        grad_moves = d_moves if x.per_position else d_moves.sum(0).to(dtype)
        grad_moves = grad_moves.view(*grad_moves.shape[:-2], *state_shape, size)
    return (d_start.sum(0, dtype=torch.float64).to(dtype).view(state_shape),
            d_end.sum(0, dtype=torch.float64).to(dtype).view(state_shape), grad_moves,
            d_emissions.view(x.batch, x.seq_len, *state_shape))


class LogPartition(torch.autograd.Function):
    """``[B]`` log Z with the fused forward-backward kernels as its gradient (first derivatives:
    for gradients of gradients use the torch engine)."""

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, lengths):  # type: ignore[override]
        x = prepare(start, transitions, end, emissions, lengths)
        ctx.dtypes = tuple(t.dtype for t in (start, transitions, end, emissions))
        ctx.inputs = x
        if x.batch == 0 or x.seq_len == 0:
            ctx.empty = True
            return torch.zeros(x.batch, dtype=x.out_dtype, device=emissions.device)
        ctx.empty = False
        store = any(ctx.needs_input_grad[:4])
        log_z, alphas, scales = _forward(x, store)
        ctx.save_for_backward(log_z, alphas, scales)
        return log_z.to(x.out_dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_z):  # type: ignore[override]
        x: Inputs = ctx.inputs
        needed = ctx.needs_input_grad
        if ctx.empty:
            zeros = (torch.zeros_like(t, dtype=dtype) if need else None
                     for t, dtype, need in zip((x.start, x.moves, x.end, x.emissions), ctx.dtypes, needed))
            return *zeros, None
        log_z, alphas, scales = ctx.saved_tensors
        d_start, d_end, d_moves, d_emissions = _backward(x, log_z, alphas, scales, grad_log_z,
                                                         moves=needed[1])
        grads = (d_start, d_moves, d_end, d_emissions)
        return *(g.to(dtype) if need else None for g, dtype, need in zip(grads, ctx.dtypes, needed)), None


def log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[B]`` log partition function (0 for rows of length 0, ``-inf`` for rows without a path,
    whose gradients are 0), float64 for float64 potentials, else float32; differentiable w.r.t.
    all four potentials (gradients in each potential's dtype)."""
    return LogPartition.apply(start, transitions, end, emissions, lengths)


def node_marginals(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[B, T, |S|]`` posteriors of the flat states (0 past each length and in rows without a
    path), float64 for float64 potentials, float32 otherwise; no gradient."""
    x = prepare(start, transitions, end, emissions, lengths)
    if x.batch == 0 or x.seq_len == 0:
        return torch.zeros(x.batch, x.seq_len, x.num_states, dtype=x.out_dtype, device=x.emissions.device)
    with torch.no_grad():
        log_z, alphas, scales = _forward(x, store=True)
        ones = torch.ones(x.batch, dtype=torch.float64, device=x.emissions.device)
        marginals = _backward(x, log_z, alphas, scales, ones, moves=False)[3]
    return marginals.reshape(x.batch, x.seq_len, x.num_states).to(x.out_dtype)

"""The log partition function on the Triton kernels, its gradient, the node marginals, and the
fused negative log-likelihood.

:class:`LogPartition` runs :func:`~.kernels.forward_kernel` (one launch) and, in its backward
pass, :func:`~.kernels.backward_kernel` (one launch): d log Z / d potentials are the node and edge
marginals, so the backward pass *is* the forward-backward algorithm. :class:`MaskedNLL` does the
same for the NLL of given tags on uncompacted emissions and a mask: the kernels compact each row,
score the gold path and subtract its counts from the marginals, so a loss and its gradients take
two launches and a few allocations, and nothing on the host reads a device value. The number of
launches per call does not depend on the batch size or the sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from neurocrf.structs.engine.triton import runtime
from neurocrf.structs.engine.triton.inputs import Inputs, prepare


def _forward(x: Inputs, store: bool, tags: Tensor | None = None, normalize: Tensor | None = None
             ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """``log_z [B]`` float64 and, with ``store``, the rescaled forward scores ``[B, T, N]`` and
    their float64 log scales ``[B, T]`` (empty otherwise); with ``tags``, the NLL ``[B]`` (in
    ``x.out_dtype``) and the compacted gold states ``[B, T]`` (int32, positions ``[B, T]`` of a
    mask ahead of them in the same buffer). ``normalize`` ``[B, K]``: path scores turned into
    log-probabilities in place."""
    device, batch, seq_len = x.emissions.device, x.batch, x.seq_len
    stored = seq_len if store else 0
    name, blocked, constants = x.plan("forward_kernel")
    indexed = tags is not None or x.mask is not None
    log_z, scales, alphas, index, nll, *work = runtime.carve(
        device, ((batch,), torch.float64), ((batch, stored), torch.float64), ((batch, stored, x.num_states), x.dtype),
        ((2 if tags is not None else 1, batch, seq_len if indexed else 0), torch.int32),
        ((batch if tags is not None else 0,), x.out_dtype), *([((batch, 2, x.num_states), x.dtype)] if blocked else []))
    pos, gold = (index[0], index[-1] if tags is not None else None) if indexed else (x.lengths, None)
    nll = nll if tags is not None else None
    spare = x.lengths
    runtime.launch(name, batch, x.start, x.moves, x.end, x.emissions, x.lengths, log_z, alphas, scales,
                   *x.masking(pos), spare if tags is None else tags, spare if x.automaton is None else x.automaton,
                   spare if gold is None else gold, spare if nll is None else nll,
                   spare if normalize is None else normalize, *work,
                   *x.scalars(labels=True, k=0 if normalize is None else normalize.shape[1]), STORE=store,
                   GOLD=0 if tags is None else 1 if x.automaton is None else 2, NORMALIZE=normalize is not None,
                   **constants)
    return log_z, alphas, scales, nll, (pos if x.mask is not None else None, gold)


def _backward(x: Inputs, log_z: Tensor, alphas: Tensor, scales: Tensor, weights: Tensor, moves: bool,
              index: tuple[Tensor | None, Tensor | None] = (None, None)
              ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Gradients of ``sum_b weights[b] log Z[b]`` (``index``: the positions and gold states of
    :func:`_forward`, whose gold counts are then subtracted): ``start [*S]``, ``end [*S]``,
    transitions (``[*S, C]`` or per position ``[B, T, *S, C]``; None unless ``moves``) and the
    emissions (``[B, T, *S]``, or ``[B, T, C']`` with shared columns), in the compute dtype."""
    device, dtype = x.emissions.device, x.dtype
    states, size = x.num_states, x.size
    name, blocked, constants = x.plan("backward_kernel")
    shared = 2 * states + (states * size if moves and not x.per_position else 0)
    per_position = (x.batch, x.seq_len, states, size) if moves and x.per_position else (0,)
    # zero-initialised (the kernels add into them), one allocation; the scratch is overwritten anyway
    d_emissions, d_params, d_moves, *work = runtime.carve(
        device, ((x.batch, x.seq_len, x.gradient_width), dtype), ((shared,), torch.float64), (per_position, dtype),
        *([((x.batch, 2, states), dtype)] if blocked else []), zero=True)
    d_start, d_end = d_params[:states], d_params[states:2 * states]
    if not (moves and x.per_position):
        d_moves = d_params[2 * states:]
    pos, gold = index
    spare = x.lengths
    runtime.launch(name, x.batch, x.start, x.moves, x.end, x.emissions, x.lengths, log_z, weights, alphas, scales,
                   d_emissions, d_start, d_end, d_moves, x.mask if x.mask is not None else spare,
                   spare if pos is None else pos, spare if x.columns is None else x.columns,
                   spare if gold is None else gold, *work, *x.scalars(gradient=True), weights.stride(0),
                   MOVES=moves, MASKED=2 if pos is not None else 0, COLUMNS=x.columns is not None,
                   GOLD=gold is not None, **{k: v for k, v in constants.items()})
    state_shape = (size,) * x.order
    params = d_params.to(dtype)
    grad_moves = None
    if moves:
        grad_moves = d_moves if x.per_position else params[2 * states:]
        grad_moves = grad_moves.view(*grad_moves.shape[:-2], *state_shape, size) if x.per_position else \
            grad_moves.view(*state_shape, size)
    emissions_shape = (x.batch, x.seq_len, *((x.gradient_width,) if x.columns is not None else state_shape))
    return (params[:states].view(state_shape), params[states:2 * states].view(state_shape), grad_moves,
            d_emissions.view(emissions_shape))


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
        log_z, alphas, scales, _, _ = _forward(x, store)
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
        d_start, d_end, d_moves, d_emissions = _backward(x, log_z, alphas, scales, grad_log_z, moves=needed[1])
        grads = (d_start, d_moves, d_end, d_emissions)
        return *(g.to(dtype) if need else None for g, dtype, need in zip(grads, ctx.dtypes, needed)), None


class MaskedNLL(torch.autograd.Function):
    """``[B]`` negative log-likelihood of ``tags`` on uncompacted emissions and a mask (see
    :func:`masked_nll`), with the fused forward-backward kernels as its gradient."""

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, mask, lengths, tags, automaton, columns):  # type: ignore[override]
        x = prepare(start, transitions, end, emissions, lengths, mask=mask, columns=columns, automaton=automaton)
        ctx.dtypes = tuple(t.dtype for t in (start, transitions, end, emissions))
        ctx.inputs = x
        store = any(ctx.needs_input_grad[:4])
        log_z, alphas, scales, nll, index = _forward(x, store, tags=tags.contiguous())
        ctx.index = index
        ctx.save_for_backward(log_z, alphas, scales)
        return nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_nll):  # type: ignore[override]
        x: Inputs = ctx.inputs
        needed = ctx.needs_input_grad
        log_z, alphas, scales = ctx.saved_tensors
        d_start, d_end, d_moves, d_emissions = _backward(x, log_z, alphas, scales, grad_nll, moves=needed[1],
                                                         index=ctx.index)
        grads = (d_start, d_moves, d_end, d_emissions)
        return *(g.to(dtype) if need else None for g, dtype, need in zip(grads, ctx.dtypes, needed)), \
            None, None, None, None, None


def log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[B]`` log partition function (0 for rows of length 0, ``-inf`` for rows without a path,
    whose gradients are 0), float64 for float64 potentials, else float32; differentiable w.r.t.
    all four potentials (gradients in each potential's dtype)."""
    return LogPartition.apply(start, transitions, end, emissions, lengths)


def masked_nll(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, mask: Tensor, lengths: Tensor,
               tags: Tensor, automaton: Tensor | None = None, columns: Tensor | None = None) -> Tensor:
    """``[B]`` negative log-likelihood ``log Z - score(gold)`` of the tag ids ``tags [B, T]`` on
    uncompacted ``emissions [B, T, *S]`` (or ``[B, T, C']`` read through ``columns``), the chain
    running over the True positions of ``mask [B, T]`` (``lengths = mask.sum(1)``), shared
    transitions only. The gold states: the tags themselves, or ``automaton [|S| + 1, L]`` int32
    maps (previous state, or ``|S|`` at the first position; tag) to the next state. Rows of length
    0 give 0, rows without a path +inf (zero gradients), a tag outside ``[0, L)`` at a True
    position NaN. Differentiable w.r.t. the four potentials (first derivatives)."""
    return MaskedNLL.apply(start, transitions, end, emissions, mask, lengths, tags, automaton, columns)


def node_marginals(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[B, T, |S|]`` posteriors of the flat states (0 past each length and in rows without a
    path), float64 for float64 potentials, float32 otherwise; no gradient."""
    x = prepare(start, transitions, end, emissions, lengths)
    if x.batch == 0 or x.seq_len == 0:
        return torch.zeros(x.batch, x.seq_len, x.num_states, dtype=x.out_dtype, device=x.emissions.device)
    with torch.no_grad():
        log_z, alphas, scales, _, _ = _forward(x, store=True)
        ones = torch.ones(x.batch, dtype=torch.float64, device=x.emissions.device)
        marginals = _backward(x, log_z, alphas, scales, ones, moves=False)[3]
    return marginals.reshape(x.batch, x.seq_len, x.num_states).to(x.out_dtype)

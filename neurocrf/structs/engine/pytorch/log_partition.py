"""The torch backend's log partition function of a chain and its gradient, two ways.

- :class:`LogPartition`: the training path. A ``torch.autograd.Function`` whose backward pass is a
  hand-written forward-backward (d log Z / d potentials = marginals): the rescaled exp-space scan
  (:class:`~neurocrf.structs.engine.pytorch.exp_scan.ExpScan`) when it is certified exact, else the float64
  log-space scan of :mod:`~neurocrf.structs.engine.reference`. Memory O(B T |S|): no graph of
  ``[B, T, |S|, C]`` intermediates is kept. Derivatives of any order (``create_graph=True``) and
  empty batches take the reference's differentiable scan instead.
- :func:`parallel_log_partition`: a log-depth tree of log-semiring matrix products (first-order
  state spaces), for long sequences on a GPU.

All take the original potentials (``start [*S]``, ``transitions [*S, C]`` or per position ``[B, T,
*S, C]``, ``end [*S]``, compacted ``emissions [B, T, *S]``, ``lengths [B]``) and return ``[B]``.
The torch backend (:mod:`neurocrf.structs.engine.pytorch`) chooses among them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine import reference
from neurocrf.structs.engine.augmented import augment, is_per_position, original_gradients
from neurocrf.structs.engine.pytorch.exp_scan import ExpScan
from neurocrf.structs.engine.semiring import NEG_INF, LogSemiring

# Edge-marginal blocks above this many elements are computed in time chunks.
_EDGE_CHUNK_ELEMENTS = 1 << 24


def _edge_marginal_sum(transitions: Tensor, emissions: Tensor, alphas: Tensor, betas: Tensor, log_z: Tensor,
                       weights: Tensor) -> Tensor:
    """``sum_{b, t} weights[b] * P(transition into position t)``, shape ``[*S', C']``; for
    per-position transitions the weighted edge marginals of every position, ``[T + 1, B, *S', C']``
    (0 at ``t = 0``)."""
    steps, batch = emissions.shape[:2]
    nd = emissions.dim() - 2
    per_position = is_per_position(transitions, emissions)
    safe, finite = reference.safe_log_z(log_z), torch.isfinite(log_z)
    weights = torch.where(finite, weights, torch.zeros_like(weights))
    following_all = emissions + betas
    total = torch.zeros_like(transitions)
    step_elements = transitions[0].numel() if per_position else batch * transitions.numel()
    chunk = max(1, _EDGE_CHUNK_ELEMENTS // max(step_elements, 1))
    for lo in range(1, steps, chunk):
        hi = min(steps, lo + chunk)
        prev = alphas[lo - 1:hi - 1].unsqueeze(-1)  # [t, B, A, *R, 1]
        following = following_all[lo:hi].unsqueeze(2)  # [t, B, 1, *R, C]
        moves = transitions[lo:hi] if per_position else transitions
        edge = torch.exp(prev + moves + following - safe.view(1, -1, *([1] * (nd + 1))))
        if per_position:
            total[lo:hi] = edge * weights.view(1, -1, *([1] * (nd + 1)))
        else:
            total = total + torch.einsum("tb...,b->...", edge, weights)
    return total


class LogPartition(torch.autograd.Function):
    """log Z with a hand-written forward-backward gradient: d log Z / d potentials = marginals.

    Runs the rescaled exp-space scan when :class:`~neurocrf.structs.engine.pytorch.exp_scan.ExpScan` can certify
    it exact, else the log-space scan. Both compute in float64: the log-space scan is taken exactly
    when scores are large, where float32 would lose the marginals' precision.

    The hand-written gradient is a constant of the graph. When the backward pass itself is
    differentiated (``create_graph=True``: gradients of marginals, Hessian-vector products), the
    gradient is instead taken by autograd through :func:`~neurocrf.structs.engine.reference.log_partition`, whose
    graph supports any order of differentiation.
    """

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, lengths, step_spread):  # type: ignore[override]
        ctx.input_dtype = emissions.dtype
        ctx.shape = (transitions.shape[-1], start.dim())
        ctx.lengths = lengths
        originals = (start, transitions, end, emissions)
        start, transitions, emissions = augment(start, transitions, end, emissions, lengths)
        scan = ExpScan.attempt(start, transitions, emissions, step_spread)
        ctx.scan = scan
        if scan is not None:
            ctx.save_for_backward(*originals, start, transitions, emissions)
            return scan.log_z.to(ctx.input_dtype)
        start, transitions, emissions = (x.to(torch.float64) for x in (start, transitions, emissions))
        alphas = reference.forward_scores(start, transitions, emissions, differentiable=False)
        log_z = reference.log_z_from(alphas)
        ctx.save_for_backward(*originals, transitions, emissions, alphas, log_z)
        return log_z.to(ctx.input_dtype)

    @staticmethod
    def backward(ctx, grad_log_z):  # type: ignore[override]
        originals, saved = ctx.saved_tensors[:4], ctx.saved_tensors[4:]
        if torch.is_grad_enabled():  # create_graph: the gradient must itself be differentiable
            return *_differentiable_gradients(originals, ctx.needs_input_grad[:4], ctx.lengths, grad_log_z), None, None
        scan = ctx.scan
        need_moves = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        grads = None
        if scan is not None:
            start, transitions, emissions = saved
            if scan.backward_ok():
                grads = scan.gradients(grad_log_z.to(torch.float64), need_moves)
            else:
                start, transitions, emissions = (x.to(torch.float64) for x in (start, transitions, emissions))
                alphas = reference.forward_scores(start, transitions, emissions, differentiable=False)
                log_z = reference.log_z_from(alphas)
        else:
            transitions, emissions, alphas, log_z = saved
        if grads is None:
            nd = emissions.dim() - 2
            grad_log_z = grad_log_z.to(torch.float64)
            betas = reference.backward_scores(transitions, emissions, differentiable=False)
            weighted = reference.state_posteriors(alphas, betas, log_z) * grad_log_z.view(1, -1, *([1] * nd))
            grad_moves = None
            if need_moves:
                grad_moves = _edge_marginal_sum(transitions, emissions, alphas, betas, log_z, grad_log_z)
            grads = (weighted[0].sum(0), grad_moves, weighted)
        originals = original_gradients(*ctx.shape, *grads)
        return *(None if g is None else g.to(ctx.input_dtype) for g in originals), None, None


def _differentiable_gradients(originals: tuple[Tensor, ...], needed: tuple[bool, ...], lengths: Tensor,
                              grad_log_z: Tensor) -> list[Tensor | None]:
    """Gradients of ``sum_b grad_log_z[b] * log Z[b]`` for start, transitions, end and emissions
    (None where not ``needed``) as a graph that autograd differentiates again."""
    wanted = [x for x, need in zip(originals, needed) if need]
    grads = iter(torch.autograd.grad(reference.log_partition(*originals, lengths), wanted, grad_log_z,
                                     create_graph=True, allow_unused=True) if wanted else ())
    out = []
    for x, need in zip(originals, needed):
        grad = next(grads) if need else None
        out.append(torch.zeros_like(x) if need and grad is None else grad)
    return out


def parallel_log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
                           ) -> Tensor:
    """``[batch]`` log Z by a log-depth tree of log-semiring matrix products (first-order chains only).

    Depth O(log T) instead of T sequential steps, at O(B T S^3) work and O(B T S^2) memory:
    it pays off for long sequences on a GPU. Computed in float64 (float32 sums over a tree of
    thousands of positions lose the gradients' digits: 8e-4 relative error at T = 20,000), returned
    in the input dtype. Gradients flow through autograd.
    """
    if start.dim() != 1:
        raise ValueError("the parallel scan supports first-order state spaces only")
    batch, dtype = emissions.shape[0], emissions.dtype
    start, transitions, end, emissions = (x.to(torch.float64) for x in (start, transitions, end, emissions))
    start, moves, emissions = augment(start, transitions, end, emissions, lengths)
    into = moves[1:] if is_per_position(moves, emissions) else moves
    steps = into + emissions[1:].unsqueeze(2)  # [T, B, S', S']
    width = steps.shape[-1]
    identity = torch.full((width, width), NEG_INF, dtype=steps.dtype, device=steps.device)
    identity.fill_diagonal_(0.0)
    while steps.shape[0] > 1:
        if steps.shape[0] % 2 == 1:
            steps = torch.cat([steps, identity.expand(1, batch, width, width)], dim=0)
        steps = _log_matmul(steps[0::2], steps[1::2])
    alpha = start + emissions[0]
    if steps.shape[0]:  # none at seq_len 0, where every row starts in END
        alpha = LogSemiring.plus(alpha.unsqueeze(-1) + steps[0], dim=1)
    log_z = LogSemiring.plus(alpha, dim=1)
    return torch.where(lengths > 0, log_z, torch.zeros_like(log_z)).to(dtype)


def _log_matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product in the log semiring over the last two dims: ``[..., n, m] x [..., m, p]``."""
    return LogSemiring.plus(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2)

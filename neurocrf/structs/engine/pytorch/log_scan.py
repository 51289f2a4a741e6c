"""Log-space forward-backward over augmented chains, and an exact sampler.

The forward and backward scores come in two forms. ``differentiable=True`` builds them from
:meth:`~neurocrf.structs.engine.semiring.LogSemiring.plus`, so autograd differentiates them to any order:
node and edge marginals, entropies and divergences built on them have exact gradients and exact
second derivatives. ``differentiable=False`` runs ``torch.logsumexp`` into one preallocated buffer:
faster and without a graph, for the hand-written backward pass of
:mod:`~neurocrf.structs.engine.pytorch.log_partition` and the window partition functions of
the torch backend (:mod:`neurocrf.structs.engine.pytorch`). They run on the augmented, time-major potentials of
:func:`~neurocrf.structs.engine.augmented.augment` (an absorbing END value on every component), so every
row takes the same number of steps and needs no masking.

Shapes: ``start`` ``[*S']``, ``moves`` ``[*S', C']`` (or per position ``[T + 1, B, *S', C']``),
``emissions`` ``[T + 1, B, *S']`` with ``S' = (C',) * order``. Time O(T |S'| C') per row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine.augmented import moves_into
from neurocrf.structs.engine.semiring import NEG_INF, LogSemiring


def forward_scores(start: Tensor, moves: Tensor, emissions: Tensor, differentiable: bool = True) -> Tensor:
    """Forward (alpha) log scores ``[T + 1, B, *S']`` (see the module docstring for
    ``differentiable``)."""
    if not differentiable:
        alphas = torch.empty_like(emissions)
        torch.add(start, emissions[0], out=alphas[0])
        for t in range(1, emissions.shape[0]):
            torch.logsumexp(alphas[t - 1].unsqueeze(-1) + moves_into(moves, emissions, t), dim=1, out=alphas[t])
            alphas[t] += emissions[t]
        return alphas
    alpha = start + emissions[0]
    alphas = [alpha]
    for t in range(1, emissions.shape[0]):
        alpha = LogSemiring.plus(alpha.unsqueeze(-1) + moves_into(moves, emissions, t), dim=1) + emissions[t]
        alphas.append(alpha)
    return torch.stack(alphas)


def backward_scores(moves: Tensor, emissions: Tensor, differentiable: bool = True) -> Tensor:
    """Backward (beta) log scores ``[T + 1, B, *S']``: everything after each position."""
    if not differentiable:
        betas = torch.empty_like(emissions)
        betas[-1] = 0.0
        for t in range(emissions.shape[0] - 2, -1, -1):
            following = (emissions[t + 1] + betas[t + 1]).unsqueeze(1)  # [B, 1, *R, C]
            torch.logsumexp(moves_into(moves, emissions, t + 1) + following, dim=-1, out=betas[t])
        return betas
    beta = torch.zeros_like(emissions[-1])
    betas = [beta]
    for t in range(emissions.shape[0] - 2, -1, -1):
        following = (emissions[t + 1] + beta).unsqueeze(1)  # [B, 1, *R, C']
        beta = LogSemiring.plus(moves_into(moves, emissions, t + 1) + following, dim=-1)
        betas.append(beta)
    return torch.stack(betas[::-1])


def log_partition(alphas: Tensor) -> Tensor:
    """``[B]`` log partition from the forward scores."""
    return LogSemiring.plus(alphas[-1].flatten(1), dim=1)


def safe_log_z(log_z: Tensor) -> Tensor:
    """``log_z`` with ``-inf`` (no valid path) replaced by 0, so that differences stay NaN-free."""
    return torch.where(torch.isfinite(log_z), log_z, torch.zeros_like(log_z))


def node_marginals(alphas: Tensor, betas: Tensor, log_z: Tensor) -> Tensor:
    """``[T + 1, B, *S']`` state posteriors (all 0 in rows whose log partition is not finite)."""
    finite = torch.isfinite(log_z).view(1, -1, *([1] * (alphas.dim() - 2)))
    marginals = torch.exp(alphas + betas - safe_log_z(log_z).view_as(finite))
    return torch.where(finite, marginals, torch.zeros_like(marginals))


def edge_marginals(moves: Tensor, emissions: Tensor, alphas: Tensor, betas: Tensor, log_z: Tensor) -> Tensor:
    """``[T, B, *S', C']``: entry ``t - 1`` is the posterior of each move into position ``t``."""
    steps = emissions.shape[0]
    into = moves[1:] if moves.dim() > emissions.dim() else moves
    following = (emissions + betas)[1:].unsqueeze(2)  # [T, B, 1, *R, C']
    shift = safe_log_z(log_z).view(1, -1, *([1] * (alphas.dim() - 1)))
    return torch.exp(alphas[: steps - 1].unsqueeze(-1) + into + following - shift)


def expectation(weights: Tensor, scores: Tensor, dims: tuple[int, ...]) -> Tensor:
    """``sum(weights * scores)`` over ``dims`` with ``0 * -inf = 0``; ``-inf`` wherever a positive
    weight meets a ``-inf`` score (the expectation of a score that is ``-inf`` with positive
    probability)."""
    finite = torch.isfinite(scores)
    total = (weights * torch.where(finite, scores, torch.zeros_like(scores))).sum(dims)
    lost = ((weights > 0) & ~finite).sum(dims) > 0
    return total.masked_fill(lost, NEG_INF)


def _gumbel_argmax(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """Index of ``argmax(logits + Gumbel noise)`` over the last dim: an exact draw from
    ``softmax(logits)`` that never picks a ``-inf`` entry while a finite one exists."""
    tiny = torch.finfo(torch.float64).tiny
    uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
    noise = -torch.log(-torch.log(uniform.clamp(min=tiny)))
    return (logits + noise).argmax(-1)


def sample_states(moves: Tensor, emissions: Tensor, alphas: Tensor, num: int,
                  generator: torch.Generator | None = None) -> Tensor:
    """Forward filtering, backward sampling: ``[num, B, T + 1]`` flat augmented states.

    The last state is drawn from the final forward scores, then each earlier state from
    ``alpha_t(s) + W(s -> s_{t+1})``: exact draws from the chain's distribution. Rows without a
    valid path return arbitrary states (callers mask them).
    """
    steps, batch = alphas.shape[:2]
    order = alphas.dim() - 2
    width = emissions.shape[-1]
    flat = width ** order
    rest = width ** (order - 1)
    scores = alphas.detach().reshape(steps, 1, batch, flat)
    state = _gumbel_argmax(scores[-1].expand(num, batch, flat), generator)
    path = [state]
    for t in range(steps - 2, -1, -1):
        step_moves = moves_into(moves, emissions, t + 1).detach()
        step_moves = step_moves.reshape(*step_moves.shape[: step_moves.dim() - order - 1], flat * width)
        step_moves = step_moves.expand(num, batch, flat * width)
        # the sources (a, *r) of the destination (*r, c)
        kept = torch.div(state, width, rounding_mode="floor").unsqueeze(-1)
        sources = torch.arange(width, device=state.device) * rest + kept  # [num, B, C']
        component = (state % width).unsqueeze(-1)
        logits = scores[t].expand(num, batch, flat).gather(2, sources)
        logits = logits + step_moves.gather(2, sources * width + component)
        state = sources.gather(2, _gumbel_argmax(logits, generator).unsqueeze(-1)).squeeze(-1)
        path.append(state)
    return torch.stack(path[::-1], dim=-1)

"""The batched chain engine shared by every CRF layer.

A chain is a first-order Markov chain over a state space of shape ``S = (A, *R)``. A transition
goes from a source state ``(a, *r)`` to a destination state ``(*r, c)``: for a first-order CRF
``S = (L,)`` and a state is a tag; for the second-order CRF ``S = (L', L')`` and a state is a pair
of tags ``(previous, current)``, so a transition ``(a, b) -> (b, c)`` reads one new tag ``c``. Both
are one engine: transition scores are a tensor ``[*S, C]`` indexed by the source state and the new
destination component ``c``, and every scan step is ``plus_{a}(alpha[a, *r] + W[a, *r, c])``.

Inputs are *compacted*: every row's valid positions come first and ``lengths`` says how many there
are (the layers compact arbitrary masks before calling in). Positions at or past a row's length
are ignored; rows of length 0 have log partition 0 and an empty path.

Potentials (all in one dtype):

- ``start`` ``[*S]``: score of the state at position 0,
- ``transitions`` ``[*S, C]``: score of moving from a source state to a destination component,
- ``end`` ``[*S]``: score of the state at the last position,
- ``emissions`` ``[batch, seq_len, *S]``: score of each state at each position,
- ``lengths`` ``[batch]`` long.

Time: O(T * |S| * C) per row for every quantity; memory O(B * T * |S|) for training (the hand-written
backward pass keeps only the forward scores, never a ``[B, T, |S|, C]`` graph).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neurocrf.structs.semiring import KMaxSemiring, LogSemiring, MaxSemiring

# Edge-marginal blocks above this many elements are computed in time chunks.
_EDGE_CHUNK_ELEMENTS = 1 << 24


def _active(lengths: Tensor, seq_len: int) -> Tensor:
    """``[batch, seq_len]`` bool: position < length."""
    return torch.arange(seq_len, device=lengths.device) < lengths.unsqueeze(1)


def _as_state(x: Tensor, num_state_dims: int) -> Tensor:
    """Append singleton dims so a ``[batch]`` tensor broadcasts against ``[batch, *S]``."""
    return x.view(*x.shape, *([1] * num_state_dims))


def _safe_log_partition(log_z: Tensor, lengths: Tensor) -> Tensor:
    return torch.where(lengths > 0, log_z, torch.zeros_like(log_z))


def forward_scores(start: Tensor, transitions: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """Forward (alpha) scores in the log semiring.

    Returns ``[batch, seq_len, *S]``: alpha at each position; past a row's length the last valid
    alpha is carried forward, so ``alphas[:, -1]`` is every row's final alpha.
    """
    batch, seq_len = emissions.shape[:2]
    nd = emissions.dim() - 2
    active = _as_state(_active(lengths, seq_len), nd)
    alphas = torch.empty_like(emissions)
    alpha = start + emissions[:, 0] if seq_len > 0 else emissions.new_zeros(batch, *emissions.shape[2:])
    if seq_len > 0:
        alphas[:, 0] = alpha
    for t in range(1, seq_len):
        step = LogSemiring.plus(alpha.unsqueeze(-1) + transitions, dim=1) + emissions[:, t]
        alpha = torch.where(active[:, t], step, alpha)
        alphas[:, t] = alpha
    return alphas


def backward_scores(transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """Backward (beta) scores ``[batch, seq_len, *S]``: log-sum of everything after each position,
    including the end score; ``beta[len - 1] = end``."""
    batch, seq_len = emissions.shape[:2]
    nd = emissions.dim() - 2
    active = _as_state(_active(lengths, seq_len), nd)
    end_b = end.expand(batch, *end.shape)
    betas = torch.empty_like(emissions)
    beta = end_b
    if seq_len > 0:
        betas[:, seq_len - 1] = beta
    for t in range(seq_len - 2, -1, -1):
        following = (emissions[:, t + 1] + beta).unsqueeze(1)  # [B, 1, *R, C]
        step = LogSemiring.plus(transitions + following, dim=-1)  # [B, A, *R]
        beta = torch.where(active[:, t + 1], step, end_b)
        betas[:, t] = beta
    return betas


def _log_partition_from_alphas(alphas: Tensor, end: Tensor, lengths: Tensor) -> Tensor:
    batch = alphas.shape[0]
    if alphas.shape[1] == 0:
        return alphas.new_zeros(batch)
    log_z = LogSemiring.plus((alphas[:, -1] + end).reshape(batch, -1), dim=1)
    return _safe_log_partition(log_z, lengths)


def _node_marginals(alphas: Tensor, betas: Tensor, log_z: Tensor, lengths: Tensor) -> Tensor:
    nd = alphas.dim() - 2
    finite = torch.isfinite(log_z) & (lengths > 0)
    log_z = torch.where(finite, log_z, torch.zeros_like(log_z))
    marg = torch.exp(alphas + betas - _as_state(log_z, nd + 1))
    keep = _as_state(_active(lengths, alphas.shape[1]) & finite.unsqueeze(1), nd)
    return torch.where(keep, marg, torch.zeros_like(marg))


class _LogPartition(torch.autograd.Function):
    """log Z with a hand-written forward-backward gradient: d log Z / d potentials = marginals."""

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, lengths):  # type: ignore[override]
        alphas = forward_scores(start, transitions, emissions, lengths)
        log_z = _log_partition_from_alphas(alphas, end, lengths)
        ctx.save_for_backward(transitions, end, emissions, lengths, alphas, log_z)
        return log_z

    @staticmethod
    def backward(ctx, grad_log_z):  # type: ignore[override]
        transitions, end, emissions, lengths, alphas, log_z = ctx.saved_tensors
        batch, seq_len = emissions.shape[:2]
        nd = emissions.dim() - 2
        if seq_len == 0:
            return (torch.zeros_like(end), torch.zeros_like(transitions), torch.zeros_like(end),
                    torch.zeros_like(emissions), None)
        betas = backward_scores(transitions, end, emissions, lengths)
        marg = _node_marginals(alphas, betas, log_z, lengths)  # [B, T, *S]
        weighted = marg * _as_state(grad_log_z, nd + 1)
        grad_emissions = weighted
        grad_start = weighted[:, 0].sum(0)
        last = (lengths - 1).clamp(min=0).view(batch, 1, *([1] * nd)).expand(batch, 1, *emissions.shape[2:])
        grad_end = weighted.gather(1, last).squeeze(1).sum(0)
        grad_transitions = _edge_marginal_sum(
            transitions, emissions, alphas, betas, log_z, lengths, grad_log_z
        ) if ctx.needs_input_grad[1] else None
        return grad_start, grad_transitions, grad_end, grad_emissions, None


def _edge_marginal_sum(
    transitions: Tensor,
    emissions: Tensor,
    alphas: Tensor,
    betas: Tensor,
    log_z: Tensor,
    lengths: Tensor,
    weights: Tensor,
) -> Tensor:
    """Sum over batch and positions of ``weights[b] * P(transition at t)``: shape ``[*S, C]``."""
    batch, seq_len = emissions.shape[:2]
    nd = emissions.dim() - 2
    finite = torch.isfinite(log_z) & (lengths > 0)
    log_z = torch.where(finite, log_z, torch.zeros_like(log_z))
    active = _active(lengths, seq_len) & finite.unsqueeze(1)
    total = torch.zeros_like(transitions)
    per_step = batch * transitions.numel()
    chunk = max(1, _EDGE_CHUNK_ELEMENTS // max(per_step, 1))
    following_all = emissions + betas
    for lo in range(1, seq_len, chunk):
        hi = min(seq_len, lo + chunk)
        prev = alphas[:, lo - 1:hi - 1].unsqueeze(-1)  # [B, t, A, *R, 1]
        following = following_all[:, lo:hi].unsqueeze(2)  # [B, t, 1, *R, C]
        log_edge = prev + transitions + following - _as_state(log_z, nd + 2)
        edge = torch.exp(log_edge)
        scale = torch.where(active[:, lo:hi], weights.unsqueeze(1), torch.zeros_like(weights).unsqueeze(1))
        edge = torch.where(_as_state(scale != 0, nd + 1), edge, torch.zeros_like(edge))
        total = total + torch.einsum("bt...,bt->...", edge, scale)
    return total


def log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[batch]`` log partition function, differentiable through the hand-written backward."""
    return _LogPartition.apply(start, transitions, end, emissions, lengths)


def marginals(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[batch, seq_len, *S]`` state posteriors (0 past each row's length)."""
    alphas = forward_scores(start, transitions, emissions, lengths)
    log_z = _log_partition_from_alphas(alphas, end, lengths)
    betas = backward_scores(transitions, end, emissions, lengths)
    return _node_marginals(alphas, betas, log_z, lengths)


def _log_matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product in the log semiring over the last two dims: ``[..., n, m] x [..., m, p]``."""
    return LogSemiring.plus(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2)


def parallel_log_partition(
    start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
) -> Tensor:
    """log Z by a log-depth tree of log-semiring matrix products (first-order state spaces only).

    Depth O(log T) instead of T sequential steps, at O(B T S^3) work and O(B T S^2) memory, so it
    pays off for long sequences on a GPU. Gradients flow through autograd.
    """
    if emissions.dim() != 3:
        raise ValueError("the parallel scan supports first-order state spaces [batch, seq_len, S] only")
    batch, seq_len, num_states = emissions.shape
    if seq_len == 0:
        return emissions.new_zeros(batch)
    identity = torch.full((num_states, num_states), float("-inf"), dtype=emissions.dtype, device=emissions.device)
    identity.fill_diagonal_(0.0)
    steps = transitions + emissions[:, 1:].unsqueeze(2)  # [B, T-1, S, S]
    active = _active(lengths, seq_len)[:, 1:, None, None]
    steps = torch.where(active, steps, identity)
    while steps.shape[1] > 1:
        if steps.shape[1] % 2 == 1:
            steps = torch.cat([steps, identity.expand(batch, 1, num_states, num_states)], dim=1)
        steps = _log_matmul(steps[:, 0::2], steps[:, 1::2])
    alpha = start + emissions[:, 0]
    if steps.shape[1] == 1:
        alpha = LogSemiring.plus(alpha.unsqueeze(-1) + steps[:, 0], dim=1)
    log_z = LogSemiring.plus(alpha + end, dim=1)
    return _safe_log_partition(log_z, lengths)


def _previous_state(pointer_source: Tensor, state: Tensor, rest_size: int, num_components: int) -> Tensor:
    """Flat source state ``(a, *r)`` of a transition into flat destination ``(*r, c)``."""
    return pointer_source * rest_size + torch.div(state, num_components, rounding_mode="floor")


def viterbi(
    start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor]:
    """Best state path. Returns flat states ``[batch, seq_len]`` (-1 past each length) and scores ``[batch]``."""
    batch, seq_len = emissions.shape[:2]
    nd = emissions.dim() - 2
    num_states = math.prod(emissions.shape[2:])
    num_components = transitions.shape[-1]
    rest_size = num_states // transitions.shape[0]
    if seq_len == 0:
        return emissions.new_full((batch, 0), -1, dtype=torch.long), emissions.new_zeros(batch)
    active_bt = _active(lengths, seq_len)
    active = _as_state(active_bt, nd)
    pointers = torch.zeros((batch, seq_len, num_states), dtype=torch.long, device=emissions.device)
    score = start + emissions[:, 0]
    for t in range(1, seq_len):
        best, pointer = MaxSemiring.plus_with_argmax(score.unsqueeze(-1) + transitions, dim=1)
        score = torch.where(active[:, t], best + emissions[:, t], score)
        pointers[:, t] = pointer.reshape(batch, num_states)
    best_score, state = (score + end).reshape(batch, num_states).max(dim=1)
    path = torch.empty((batch, seq_len), dtype=torch.long, device=emissions.device)
    for t in range(seq_len - 1, 0, -1):
        path[:, t] = state
        source = pointers[:, t].gather(1, state.unsqueeze(1)).squeeze(1)
        previous = _previous_state(source, state, rest_size, num_components)
        state = torch.where(active_bt[:, t], previous, state)
    path[:, 0] = state
    path = path.masked_fill(~active_bt, -1)
    return path, torch.where(lengths > 0, best_score, torch.zeros_like(best_score))


def kbest(
    start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor, k: int
) -> tuple[Tensor, Tensor]:
    """The k best state paths. Returns flat states ``[batch, k, seq_len]`` and scores ``[batch, k]``.

    Where fewer than k paths exist the missing ones have score ``-inf`` and states -1.
    """
    semiring = KMaxSemiring(k)
    batch, seq_len = emissions.shape[:2]
    nd = emissions.dim() - 2
    num_states = math.prod(emissions.shape[2:])
    num_components = transitions.shape[-1]
    rest_size = num_states // transitions.shape[0]
    if seq_len == 0:
        scores = emissions.new_full((batch, k), float("-inf"))
        scores[:, 0] = 0.0
        return emissions.new_full((batch, k, 0), -1, dtype=torch.long), scores
    active_bt = _active(lengths, seq_len)
    active = _as_state(active_bt, nd + 1)
    pointers = torch.zeros((batch, seq_len, num_states, k), dtype=torch.long, device=emissions.device)
    score = emissions.new_full((batch, *emissions.shape[2:], k), float("-inf"))
    score[..., 0] = start + emissions[:, 0]
    trans_k = transitions.unsqueeze(-1)  # [A, *R, C, 1]
    for t in range(1, seq_len):
        best, pointer = semiring.plus_with_argmax(score.unsqueeze(-2) + trans_k)  # [B, *R, C, k]
        score = torch.where(active[:, t], best + emissions[:, t].unsqueeze(-1), score)
        pointers[:, t] = pointer.reshape(batch, num_states, k)
    final = (score + end.unsqueeze(-1)).reshape(batch, num_states * k)
    top = min(k, final.shape[1])
    best_scores, flat = final.topk(top, dim=1)
    if top < k:
        best_scores = torch.cat([best_scores, best_scores.new_full((batch, k - top), float("-inf"))], 1)
        flat = torch.cat([flat, flat.new_zeros((batch, k - top))], 1)
    state = torch.div(flat, k, rounding_mode="floor")
    rank = flat % k
    paths = torch.empty((batch, k, seq_len), dtype=torch.long, device=emissions.device)
    flat_pointers = pointers.reshape(batch, seq_len, num_states * k)
    for t in range(seq_len - 1, 0, -1):
        paths[:, :, t] = state
        pointer = flat_pointers[:, t].gather(1, state * k + rank)
        source = torch.div(pointer, k, rounding_mode="floor")
        previous = _previous_state(source, state, rest_size, num_components)
        keep = active_bt[:, t].unsqueeze(1)
        state = torch.where(keep, previous, state)
        rank = torch.where(keep, pointer % k, rank)
    paths[:, :, 0] = state
    valid = torch.isfinite(best_scores)
    paths = paths.masked_fill(~(active_bt.unsqueeze(1) & valid.unsqueeze(2)), -1)
    empty = lengths == 0
    if bool(empty.any()):
        # An empty row has exactly one (empty) path, of score 0.
        first = torch.zeros_like(best_scores)
        first[:, 1:] = float("-inf")
        best_scores = torch.where(empty.unsqueeze(1), first, best_scores)
    return paths, best_scores


def path_score(
    start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor, lengths: Tensor
) -> Tensor:
    """``[batch]`` unnormalised score of the flat state paths ``states`` ``[batch, seq_len]``.

    Entries of ``states`` past a row's length are ignored (they must still be valid indices).
    """
    batch, seq_len = states.shape
    if seq_len == 0:
        return emissions.new_zeros(batch)
    num_components = transitions.shape[-1]
    active = _active(lengths, seq_len)
    zero = emissions.new_zeros(())
    emitted = emissions.reshape(batch, seq_len, -1).gather(2, states.unsqueeze(-1)).squeeze(-1)
    total = torch.where(active, emitted, zero).sum(1)
    has_any = lengths > 0
    total = total + torch.where(has_any, start.reshape(-1)[states[:, 0]], zero)
    if seq_len > 1:
        flat_trans = transitions.reshape(-1, num_components)
        moved = flat_trans[states[:, :-1], states[:, 1:] % num_components]
        total = total + torch.where(active[:, 1:], moved, zero).sum(1)
    last = states.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return total + torch.where(has_any, end.reshape(-1)[last], zero)

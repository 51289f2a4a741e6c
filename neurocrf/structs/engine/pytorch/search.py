"""The torch backend's Viterbi: one max scan for every state space (first order, pair states,
shared or per-position transitions), on any device.

It computes what :func:`~neurocrf.structs.engine.reference.max_scan` computes, with as few tensor
operations per position as possible (at CRF sizes time goes to dispatching operations, not to
arithmetic):

* each step is three operations into preallocated buffers: an ``add`` of the previous scores and
  the moves, a ``max`` (or ``amax``) over the source, an ``add`` of the destination's emission
  (which does not depend on the source); the sums and so the ties (the lower source index wins)
  are the reference's;
* small first-order steps (``B |S'| C'`` below :data:`SCORES_ONLY_ELEMENTS`) keep the
  back-pointers of ``max`` and follow them by pointer doubling (``log2 T`` batched gathers instead
  of ``T`` small ones); larger steps and pair states keep only ``amax`` (a max with indices over
  the source costs up to three times as much there) and recompute the back-pointer along the best
  path only, from the stored scores with the same sums.

Inputs are the augmented, time-major potentials of
:func:`~neurocrf.structs.engine.augmented.augment` in float64 (see
:data:`~neurocrf.structs.engine.SEARCH_DTYPE`); outputs are flat augmented states of positions
``0 .. T - 1`` and the best scores. Memory O(B T |S'|).
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine.augmented import is_per_position

SCORES_ONLY_ELEMENTS = 1 << 15
"""From this many elements per step (``B |S'| C'``) a first-order scan keeps scores only (see the
module docstring; measured on one CPU thread: pointer doubling is 30% faster at 8 x 256 x 30, amax
10-20% faster from 32 x 40 x 17 on, and three times faster for pair states at 32 x 40 x 9)."""


def viterbi(start: Tensor, moves: Tensor, emissions: Tensor) -> tuple[Tensor, Tensor]:
    """The best path: flat augmented states ``[B, T]`` and its score ``[B]`` (``-inf`` for rows
    without a path, whose states are then arbitrary)."""
    batch, order, width = emissions.shape[1], start.dim(), start.shape[0]
    if order == 1 and batch * width ** 2 < SCORES_ONLY_ELEMENTS:
        return _by_pointers(start, moves, emissions)
    return _by_scores(start, moves, emissions)


def _steps(moves: Tensor, emissions: Tensor) -> list[Tensor]:
    """The move scores into each position ``1 .. T``: ``[*S', C']`` or, per position, ``[B, *S', C']``."""
    steps = emissions.shape[0] - 1
    return list(moves.unbind(0)[1:]) if is_per_position(moves, emissions) else [moves] * steps


def _by_pointers(start: Tensor, moves: Tensor, emissions: Tensor) -> tuple[Tensor, Tensor]:
    """Max with back-pointers at every position, followed by pointer doubling."""
    steps, batch = emissions.shape[0] - 1, emissions.shape[1]
    order, width = start.dim(), start.shape[0]
    num_states, rest = width ** order, width ** (order - 1)
    pointers = torch.empty((steps, batch) + (width,) * order, dtype=torch.long, device=emissions.device)
    scores = emissions.new_empty((2, batch) + (width,) * order)  # two alternating buffers
    torch.add(start, emissions[0], out=scores[0])
    rows, sources, pointer_rows = scores.unbind(0), scores.unsqueeze(-1).unbind(0), pointers.unbind(0)
    buffer = emissions.new_empty((batch,) + (width,) * (order + 1))
    for t, (step, emission) in enumerate(zip(_steps(moves, emissions), emissions.unbind(0)[1:]), 1):
        torch.add(sources[(t - 1) % 2], step, out=buffer)
        torch.max(buffer, 1, out=(rows[t % 2], pointer_rows[t - 1]))
        rows[t % 2].add_(emission)
    best, state = scores[steps % 2].reshape(batch, num_states).max(dim=1)
    if steps == 0:
        return state.new_zeros(batch, 0), best
    # maps[t] sends a state (*r, c) at position t + 1 to its best predecessor (a, *r) at t; after
    # doubling, a state at position T to the state at t on the best path into it
    kept = torch.div(torch.arange(num_states, device=state.device), width, rounding_mode="floor")
    maps = pointers.view(steps, batch, num_states).mul(rest).add_(kept)
    span = 1
    while span < steps:
        maps = torch.cat([torch.gather(maps[:-span], 2, maps[span:]), maps[-span:]])
        span *= 2
    return maps.gather(2, state.view(1, batch, 1).expand(steps, batch, 1)).squeeze(2).t(), best


def _by_scores(start: Tensor, moves: Tensor, emissions: Tensor) -> tuple[Tensor, Tensor]:
    """``amax`` over the source at every position, then the back-pointers recomputed along the best
    path only, from the stored scores with the same sums (so the same ties)."""
    steps, batch = emissions.shape[0] - 1, emissions.shape[1]
    order, width = start.dim(), start.shape[0]
    num_states, rest = width ** order, width ** (order - 1)
    scores = emissions.new_empty((steps + 1, batch) + (width,) * order)
    torch.add(start, emissions[0], out=scores[0])
    rows, sources = scores.unbind(0), scores.unsqueeze(-1).unbind(0)
    buffer = emissions.new_empty((batch,) + (width,) * (order + 1))
    for t, (step, emission) in enumerate(zip(_steps(moves, emissions), emissions.unbind(0)[1:]), 1):
        torch.add(sources[t - 1], step, out=buffer)
        torch.amax(buffer, 1, out=rows[t])
        rows[t].add_(emission)
    flat_scores = scores.view(steps + 1, batch, num_states)
    # into[..., (*r, c), a]: the move (a, *r) -> (*r, c), one row per destination
    per_position = is_per_position(moves, emissions)
    into = moves.reshape(*moves.shape[:-order - 1], width, num_states).transpose(-1, -2).contiguous()
    best, state = flat_scores[steps].max(dim=1)
    source = torch.arange(width, device=state.device) * rest  # flat (a, 0, ..)
    path = torch.empty(batch, steps, dtype=torch.long, device=state.device)
    for t in range(steps, 0, -1):  # the state at t - 1 on the best path into `state` at t
        kept = torch.div(state, width, rounding_mode="floor")
        if per_position:
            move = into[t].gather(1, state.view(batch, 1, 1).expand(batch, 1, width)).squeeze(1)
        else:
            move = into.index_select(0, state)
        candidates = flat_scores[t - 1].gather(1, source + kept.unsqueeze(1)) + move  # [B, A]
        state = torch.add(kept, candidates.argmax(-1), alpha=rest)
        path[:, t - 1] = state
    return path, best

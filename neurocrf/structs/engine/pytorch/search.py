"""The max and k-max scans: the best path (Viterbi) and the k best paths of an augmented chain.

Both compare whole path scores, which on a long sentence reach magnitudes where float32 numbers are
far apart (1e-3 at 1e4): paths that differ in a position or two would tie or swap. The chain engine
therefore always runs them in :data:`~neurocrf.structs.engine.SEARCH_DTYPE` (float64), where sums of float32 scores are
exact for any practical length, so the Viterbi path is the first of the k best.

Inputs are the augmented, time-major potentials of :func:`~neurocrf.structs.engine.augmented.augment`:
``start [*S']``, ``moves [*S', C']`` (or per position ``[T + 1, B, *S', C']``), ``emissions
[T + 1, B, *S']`` with ``S' = (C',) * order``; outputs are flat augmented states of positions
``0 .. T - 1`` (the backend maps them back to the original states).
Time O(T |S'| C') per row (k best: O(T |S'| C' k log(C' k))).
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine.augmented import moves_into
from neurocrf.structs.engine.semiring import NEG_INF, KMaxSemiring, top_first


def _previous(source: Tensor, state: Tensor, width: int, order: int) -> Tensor:
    """Flat source ``(a, *r)`` of a transition into flat destination ``(*r, c)``."""
    return source * width ** (order - 1) + torch.div(state, width, rounding_mode="floor")


def viterbi(start: Tensor, moves: Tensor, emissions: Tensor) -> tuple[Tensor, Tensor]:
    """The best path: flat augmented states ``[B, T]`` and its score ``[B]`` (``-inf`` for rows
    without a path of finite score, whose states are then arbitrary)."""
    batch, order, width = emissions.shape[1], start.dim(), start.shape[0]
    # the emission E[t, b, *r, c] of the destination does not depend on the source a, so it is
    # added after the max over a: no [T, B, |S'|, C'] tensor of summed scores is built
    score = start + emissions[0]
    pointers = []
    for t in range(1, emissions.shape[0]):
        score, pointer = (score.unsqueeze(-1) + moves_into(moves, emissions, t)).max(dim=1)
        score = score + emissions[t]
        pointers.append(pointer.reshape(batch, -1))
    best_score, state = score.reshape(batch, -1).max(dim=1, keepdim=True)
    if not pointers:
        return state.new_zeros(batch, 0), best_score.squeeze(1)
    kept = torch.arange(width ** order, device=state.device)
    previous = _previous(torch.stack(pointers), kept, width, order)  # [T, B, |S'|]
    path = []
    for t in range(previous.shape[0] - 1, -1, -1):
        state = previous[t].gather(1, state)
        path.append(state)
    return torch.cat(path[::-1], dim=1), best_score.squeeze(1)


def kbest(start: Tensor, moves: Tensor, emissions: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best paths: flat augmented states ``[B, k, T]`` and scores ``[B, k]``, best first
    (the first path is :func:`viterbi`'s); missing paths have score ``-inf`` and arbitrary states."""
    semiring = KMaxSemiring(k)
    steps, batch = emissions.shape[:2]
    order, width = start.dim(), start.shape[0]
    num_states = width ** order
    pointers = torch.empty((steps, batch, num_states, k), dtype=torch.long, device=emissions.device)
    score = emissions.new_full(emissions.shape[1:] + (k,), NEG_INF)
    score[..., 0] = start + emissions[0]
    ranked_moves = moves.unsqueeze(-1)
    for t in range(1, steps):
        best, pointer = semiring.plus_with_argmax(score.unsqueeze(-2) + moves_into(ranked_moves, emissions, t))
        score = best + emissions[t].unsqueeze(-1)
        pointers[t] = pointer.reshape(batch, num_states, k)
    best_scores, flat = top_first(score.reshape(batch, num_states * k), k)
    state, rank = torch.div(flat, k, rounding_mode="floor"), flat % k
    pointers = pointers.reshape(steps, batch, num_states * k)
    paths = torch.empty((batch, k, steps - 1), dtype=torch.long, device=state.device)
    for t in range(steps - 1, 0, -1):
        pointer = pointers[t].gather(1, state * k + rank)
        state = _previous(torch.div(pointer, k, rounding_mode="floor"), state, width, order)
        rank = pointer % k
        paths[:, :, t - 1] = state
    return paths, best_scores

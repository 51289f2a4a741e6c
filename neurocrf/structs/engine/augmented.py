"""Chains with an absorbing END value: the potentials every scan of the engine runs on.

The engine (:class:`~neurocrf.structs.engine.chain.Chain`) takes *compacted* inputs (each row's valid positions first,
``lengths`` says how many) over a state space of shape ``S = (C,) * n``. To run every row over the
same number of steps with no per-step masking, :func:`augment` adds an absorbing END value to every
component (``S' = (C + 1,) * n``): a row moves to END after its last position (paying the end score)
and stays there through the padding and one extra final step. Rows of length 0 start in END, so
their log partition is 0.

Shapes: original ``start`` ``[*S]``, ``transitions`` ``[*S, C]`` (or per position ``[B, T, *S,
C]``), ``end`` ``[*S]``, ``emissions`` ``[B, T, *S]``; augmented ``start`` ``[*S']``, ``moves``
``[*S', C']`` (or per position, time-major ``[T + 1, B, *S', C']``), ``emissions`` time-major
``[T + 1, B, *S']``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from neurocrf.structs.engine.semiring import NEG_INF


def augment(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
             ) -> tuple[Tensor, Tensor, Tensor]:
    """Potentials with an absorbing END value on every component; emissions come out time-major
    ``[T + 1, B, *S']``."""
    batch, seq_len = emissions.shape[:2]
    order, size = start.dim(), transitions.shape[-1]
    end_index = size
    inner = (slice(0, size),) * order
    full = (size + 1,) * order

    aug_start = start.new_full(full, NEG_INF)
    aug_start[inner] = start
    aug_start[(end_index,) * order] = 0.0

    # per-position moves are time-major [T + 1, B, *S', C']; row t holds the moves into position t
    lead = (seq_len + 1, batch) if is_per_position(transitions, emissions) else ()
    every = (slice(None),) * len(lead)
    aug_moves = transitions.new_full(lead + full + (size + 1,), NEG_INF)
    if lead:
        aug_moves[(slice(0, seq_len), slice(None)) + inner + (slice(0, size),)] = transitions.transpose(0, 1)
    else:
        aug_moves[inner + (slice(0, size),)] = transitions
    aug_moves[every + inner + (end_index,)] = end
    aug_moves[every + (slice(None),) * (order - 1) + (end_index, end_index)] = 0.0  # ended rows stay ended

    active = active_positions(lengths, seq_len).t()  # [T, B]
    aug_emissions = emissions.new_full((seq_len + 1, batch) + full, NEG_INF)
    aug_emissions[(slice(0, seq_len), slice(None)) + inner] = torch.where(
        active.view(seq_len, batch, *([1] * order)), emissions.transpose(0, 1), emissions.new_full((), NEG_INF))
    ended = torch.cat([~active, active.new_ones(1, batch)], dim=0)
    aug_emissions[(slice(None), slice(None)) + (slice(None),) * (order - 1) + (end_index,)] = torch.where(
        ended.view(seq_len + 1, batch, *([1] * (order - 1))), emissions.new_zeros(()), emissions.new_full((), NEG_INF))
    return aug_start, aug_moves, aug_emissions


def original_gradients(size: int, order: int, grad_start: Tensor, grad_moves: Tensor | None, grad_emissions: Tensor
                        ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
    """Gradients of the augmented potentials -> gradients of start, transitions, end, emissions."""
    inner = (slice(0, size),) * order
    steps = grad_emissions.shape[0] - 1
    moves = end = None
    if grad_moves is not None and is_per_position(grad_moves, grad_emissions):  # [T + 1, B, *S', C']
        moves = grad_moves[(slice(0, steps), slice(None)) + inner + (slice(0, size),)].transpose(0, 1)
        end = grad_moves[(slice(None), slice(None)) + inner + (size,)].sum((0, 1))
    elif grad_moves is not None:
        moves = grad_moves[inner + (slice(0, size),)]
        end = grad_moves[inner + (size,)]
    emissions = grad_emissions[(slice(0, steps), slice(None)) + inner].transpose(0, 1)
    return grad_start[inner], moves, end, emissions


@functools.lru_cache(maxsize=64)
def state_map(size: int, order: int, device: torch.device) -> Tensor:
    """Augmented flat state -> original flat state, or -1 for states with an END component."""
    grid = torch.stack(torch.meshgrid(*[torch.arange(size + 1)] * order, indexing="ij"), -1).reshape(-1, order)
    weights = torch.tensor([size ** (order - 1 - i) for i in range(order)])
    original = (grid * weights).sum(-1)
    return torch.where((grid < size).all(-1), original, -1).to(device)


def is_per_position(transitions: Tensor, emissions: Tensor) -> bool:
    """Per-position transitions (``[B, T, *S, C]``, or augmented ``[T + 1, B, *S', C']``) have
    one dimension more than the emissions (``[B, T, *S]``); shared ones (``[*S, C]``) one less."""
    return transitions.dim() > emissions.dim()


def moves_into(moves: Tensor, emissions: Tensor, t: int) -> Tensor:
    """The augmented transition scores into position ``t``: ``[*S', C']`` or, per position, ``[B, *S', C']``."""
    return moves[t] if is_per_position(moves, emissions) else moves


def active_positions(lengths: Tensor, seq_len: int) -> Tensor:
    """``[batch, seq_len]`` bool: position < length."""
    return torch.arange(seq_len, device=lengths.device) < lengths.unsqueeze(1)


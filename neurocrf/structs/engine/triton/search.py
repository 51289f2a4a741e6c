"""Viterbi and the k best paths on the Triton kernels: one launch of
:func:`~.kernels.search_kernel` computes the k-max scan, stores its back-pointers and walks them
back, in float64 with the torch engine's order of additions and ties, so the paths and scores are
the torch engine's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine.triton import runtime
from neurocrf.structs.engine.triton.inputs import prepare


def kbest(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor, k: int
          ) -> tuple[Tensor, Tensor]:
    """The ``k`` best paths, best first: flat states ``[B, k, T]`` (-1 past each length and for
    missing paths) and float64 scores ``[B, k]`` (``-inf`` for missing paths; a row of length 0
    has one path of score 0)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    x = prepare(start, transitions, end, emissions, lengths, k)
    device = x.emissions.device
    states = torch.full((x.batch, k, x.seq_len), -1, dtype=torch.long, device=device)
    scores = torch.empty(x.batch, k, dtype=torch.float64, device=device)
    if x.batch == 0:
        return states, scores
    if x.seq_len == 0:
        scores.fill_(float("-inf"))
        scores[:, 0] = 0.0
        return states, scores
    with torch.no_grad():
        pointers = torch.empty(x.batch, x.seq_len, x.num_states, k, dtype=torch.int32, device=device)
        name, blocked, constants = x.plan("search_kernel", k)
        work = (torch.empty(x.batch, 2, x.num_states, k, dtype=torch.float64, device=device),) if blocked else ()
        runtime.launch(name, x.batch, x.start, x.moves, x.end, x.emissions, x.lengths, pointers, states, scores,
                       *work, x.seq_len, x.size, x.size ** (x.order - 1), k, *x.scalars()[3:], **constants)
    return states, scores


def viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
            ) -> tuple[Tensor, Tensor]:
    """The best path: flat states ``[B, T]`` (-1 past each length and for rows without a path)
    and float64 scores ``[B]`` (``-inf`` without a path)."""
    states, scores = kbest(start, transitions, end, emissions, lengths, 1)
    return states[:, 0], scores[:, 0]

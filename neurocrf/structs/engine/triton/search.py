"""Viterbi and the k best paths on the Triton kernels: one launch of
:func:`~.kernels.search_kernel` computes the k-max scan, stores its back-pointers and walks them
back, in float64 with the torch engine's order of additions and ties, so the paths and scores are
the torch engine's. :func:`masked_kbest` does the same on uncompacted emissions and a mask, maps
states to labels and (one more launch) turns the scores into log-probabilities, in a handful of
allocations and no host read of a device value.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine.triton import runtime
from neurocrf.structs.engine.triton.inputs import Inputs, prepare


def _search(x: Inputs, k: int, labels: Tensor | None = None, normalize: bool = False) -> tuple[Tensor, Tensor]:
    """States (or labels) ``[B, k, T]`` and float64 scores ``[B, k]`` (log-probabilities with
    ``normalize``) of the k best paths."""
    device = x.emissions.device
    states = torch.empty(x.batch, k, x.seq_len, dtype=torch.long, device=device)
    wide = torch.empty(x.batch * (k + (1 if normalize else 0)), dtype=torch.float64, device=device)
    scores = wide[:x.batch * k].view(x.batch, k)
    if x.batch == 0:
        return states, scores
    if x.seq_len == 0:  # one empty path per row, of score (and log-probability) 0
        scores.fill_(float("-inf"))
        scores[:, 0] = 0.0
        return states, scores
    name, blocked, constants = x.plan("search_kernel", k)
    forward, forward_blocked, forward_constants = x.plan("forward_kernel")
    masked = x.mask is not None
    pointers, pos, work, forward_work = runtime.carve(
        device, ((x.batch, x.seq_len, x.num_states, k), torch.int32),
        ((x.batch, x.seq_len if masked else 0), torch.int32),
        ((x.batch, 2, x.num_states, k) if blocked else (0,), torch.float64),
        ((x.batch, 2, x.num_states) if normalize and forward_blocked else (0,), x.dtype))
    pos = pos if masked else x.lengths
    work = (work,) if blocked else ()
    spare = x.lengths
    runtime.launch(name, x.batch, x.start, x.moves, x.end, x.emissions, x.lengths, pointers, states, scores,
                   *x.masking(pos), spare if labels is None else labels, *work, *x.scalars(k=k),
                   LABELS=labels is not None, **constants)
    if normalize:
        log_z = wide[x.batch * k:]
        runtime.launch(forward, x.batch, x.start, x.moves, x.end, x.emissions, x.lengths, log_z, scores, log_z,
                       *x.masking(pos), spare, spare, spare, spare, scores,
                       *((forward_work,) if forward_blocked else ()), *x.scalars(labels=True, k=k), STORE=False,
                       NORMALIZE=True, **forward_constants)
    return states, scores


def kbest(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor, k: int
          ) -> tuple[Tensor, Tensor]:
    """The ``k`` best paths, best first: flat states ``[B, k, T]`` (-1 past each length and for
    missing paths) and float64 scores ``[B, k]`` (``-inf`` for missing paths; a row of length 0
    has one path of score 0)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    x = prepare(start, transitions, end, emissions, lengths, k)
    with torch.no_grad():
        return _search(x, k)


def masked_kbest(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, mask: Tensor, lengths: Tensor,
                 k: int, labels: Tensor | None = None, columns: Tensor | None = None, normalize: bool = False
                 ) -> tuple[Tensor, Tensor]:
    """The ``k`` best paths of the chain over the True positions of ``mask [B, T]`` (``lengths =
    mask.sum(1)``) on uncompacted ``emissions [B, T, *S]`` (or ``[B, T, C']`` read through
    ``columns``, see :func:`.partition.masked_nll`): states, or their ``labels [|S|]``, at the
    original positions ``[B, k, T]`` (-1 elsewhere and for missing paths), and float64 scores
    ``[B, k]`` (log-probabilities with ``normalize``). Shared transitions only."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    x = prepare(start, transitions, end, emissions, lengths, k, mask=mask, columns=columns)
    with torch.no_grad():
        return _search(x, k, labels, normalize)


def viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
            ) -> tuple[Tensor, Tensor]:
    """The best path: flat states ``[B, T]`` (-1 past each length and for rows without a path)
    and float64 scores ``[B]`` (``-inf`` without a path)."""
    states, scores = kbest(start, transitions, end, emissions, lengths, 1)
    return states[:, 0], scores[:, 0]

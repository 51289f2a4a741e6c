"""The score of given state paths (the gold path of the NLL), accumulated in float64.

A handful of gathers and one float64 sum per term: a constant number of launches whatever the
batch size and the sequence length; differentiable through autograd (the gradient of a path score
is a one-hot scatter, which torch's gather backward already is).
"""

from __future__ import annotations

import torch
from torch import Tensor


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor) -> Tensor:
    """``[B]`` unnormalised score of the flat state paths ``states [B, T]`` (entries past a row's
    length are ignored but must be valid indices), summed in float64 and returned in the
    emissions' dtype (float32 for float16 and bfloat16 emissions).

    ``transitions`` is ``[*S, C]`` or per position ``[B, T, *S, C]`` (entry ``[b, t]`` scores the
    move into position ``t``); a move from flat state ``s`` into state ``s'`` reads the new
    component ``s' % C``.
    """
    batch, seq_len = states.shape
    out_dtype = emissions.dtype if emissions.dtype in (torch.float32, torch.float64) else torch.float32
    if seq_len == 0 or batch == 0:
        return torch.zeros(batch, dtype=out_dtype, device=emissions.device) + 0 * emissions.sum()
    wide = torch.float64
    size = transitions.shape[-1]
    active = torch.arange(seq_len, device=states.device) < lengths.unsqueeze(1)  # [B, T]
    has_any = lengths > 0
    emitted = emissions.reshape(batch, seq_len, -1).gather(2, states.unsqueeze(-1)).squeeze(-1).to(wide)
    total = emitted.masked_fill(~active, 0.0).sum(1)
    first, last = states[:, 0], states.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    total = total + (start.reshape(-1)[first].to(wide) + end.reshape(-1)[last].to(wide)).masked_fill(~has_any, 0.0)
    if seq_len > 1:
        into = states[:, 1:] % size
        if transitions.dim() > emissions.dim():
            flat = transitions.reshape(batch, seq_len, -1, size)[:, 1:]
            moved = flat.gather(2, states[:, :-1, None, None].expand(-1, -1, 1, size)).squeeze(2)
            moved = moved.gather(2, into.unsqueeze(-1)).squeeze(-1)
        else:
            moved = transitions.reshape(-1)[states[:, :-1] * size + into]
        total = total + moved.to(wide).masked_fill(~active[:, 1:], 0.0).sum(1)
    return total.to(out_dtype)

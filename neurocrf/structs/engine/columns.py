"""Emission columns shared by several states.

A first-order chain may have more states than emission columns: state ``s`` scores
``emissions[..., columns[s]]`` (all O states of the precursor-induced CRF read the O column). The
first ``C`` states read their own column (``columns[:C] = 0 .. C - 1`` for ``emissions [B, T, C]``)
and the others repeat columns. Backends that list a quantity in their ``SHARED_COLUMNS`` read such
emissions in place (the compiled kernel: ``C`` columns to convert and exponentiate instead of
``S``, and the gradient of a shared column summed inside the kernel); every other consumer takes
the ``[B, T, S]`` state emissions of :func:`expand`.

>>> import torch
>>> columns = torch.tensor([0, 1, 2, 0, 0])
>>> expand(torch.tensor([[[1.0, 2.0, 3.0]]]), columns).tolist()
[[[1.0, 2.0, 3.0, 1.0, 1.0]]]
"""

from __future__ import annotations

import torch
from torch import Tensor


def check(columns: Tensor, num_columns: int) -> None:
    """ValueError unless ``columns`` is an int64 ``[S]`` tensor that starts with ``0 .. num_columns - 1``
    and repeats columns below ``num_columns`` after that (reads the values: a device synchronisation
    on CUDA)."""
    if columns.dtype != torch.long or columns.dim() != 1 or columns.shape[0] < num_columns:
        raise ValueError(f"columns must be an int64 [S] tensor with S >= {num_columns} (the emission columns), "
                         f"got {columns.dtype} {tuple(columns.shape)}")
    values = columns.tolist()
    if values[:num_columns] != list(range(num_columns)) or not all(0 <= c < num_columns for c in values):
        raise ValueError(f"columns must start with 0 .. {num_columns - 1} and repeat columns of that range, "
                         f"got {values}")


class _Expand(torch.autograd.Function):
    """:func:`expand` with a backward that adds the repeated columns' gradients into a copy of the
    first ``C`` (about half the cost of ``index_select``'s), made of differentiable operations, so
    double backward works."""

    @staticmethod
    def forward(ctx, emissions: Tensor, extra: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(extra)
        return torch.cat([emissions, emissions.index_select(-1, extra)], dim=-1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (extra,) = ctx.saved_tensors
        size = grad.shape[-1] - extra.shape[0]
        return grad[..., :size].index_add(-1, extra, grad[..., size:]), None


def expand(emissions: Tensor, columns: Tensor) -> Tensor:
    """``[B, T, C]`` emissions -> ``[B, T, S]`` state emissions ``emissions[..., columns]``,
    differentiable to any order (plain tensor operations without a gradient, which ``torch.export``
    records)."""
    extra = columns[emissions.shape[-1]:]
    if emissions.requires_grad:
        return _Expand.apply(emissions, extra)
    return torch.cat([emissions, emissions.index_select(-1, extra)], dim=-1)

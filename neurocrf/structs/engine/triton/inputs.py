"""Checked, kernel-ready potentials of one call of the triton backend.

Conventions of the chain engine: ``start [*S]``, ``transitions [*S, C]`` (or per position ``[B, T,
*S, C]``, entry ``[b, t]`` scoring the move into compacted position ``t``), ``end [*S]``,
compacted ``emissions [B, T, *S]``, ``lengths [B]``, with ``S = (C,) * order``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from neurocrf.structs.engine.triton import runtime

LONG_SEQUENCE = 512
"""From this many positions the kernels run their recurrences in float64 whatever the inputs'
dtype. In float32 each step's log-sum-exp carries a rounding error of about 1e-7 (relative to
scores of order 1), and over T steps these add up like a random walk: measured on Triton's
interpreter at T = 20,000, float32 recurrences gave gradient errors of 2e-5 to 5e-5, float64 ones
(and float32 up to a few hundred positions) stay below 1e-5."""


@dataclass
class Inputs:
    """Contiguous potentials in the kernels' compute dtype; emissions keep their dtype and strides
    (the kernels upcast them on load and read expanded views without copying). ``out_dtype`` is
    the dtype of the results: float64 for float64 inputs, float32 otherwise."""

    start: Tensor
    moves: Tensor
    end: Tensor
    emissions: Tensor
    lengths: Tensor
    order: int
    size: int
    per_position: bool
    out_dtype: torch.dtype
    mask: Tensor | None = None
    """``[B, T]`` bool: the kernels compact the rows themselves (emissions uncompacted)."""
    columns: Tensor | None = None
    """``[C]`` int: the emission column the last state component reads (-1: none, score 0)."""
    automaton: Tensor | None = None
    """``[|S| + 1, L]`` int32: the gold state after (state, tag) (see :func:`.partition.masked_nll`)."""

    @property
    def batch(self) -> int:
        return self.emissions.shape[0]

    @property
    def seq_len(self) -> int:
        return self.emissions.shape[1]

    @property
    def num_states(self) -> int:
        return self.size ** self.order

    @property
    def dtype(self) -> torch.dtype:
        return self.start.dtype

    @property
    def gradient_width(self) -> int:
        """Last dimension of the emissions' gradient: emission columns or flat states."""
        return self.emissions.shape[-1] if self.columns is not None else self.num_states

    @property
    def tags(self) -> int:
        """Number of tags the gold path reads (the automaton's columns, else the states)."""
        return self.automaton.shape[1] if self.automaton is not None else self.size

    def scalars(self, labels: bool = False, k: int | None = None, gradient: bool = False) -> tuple[int, ...]:
        """The scalar arguments of a kernel: ``T, C, NB``, then ``L`` (``labels``: the tags of the
        gold path), ``K`` (``k``) or ``DW`` (``gradient``: :attr:`gradient_width`), then the
        emission strides."""
        extra = ((self.tags,) if labels else ()) + ((k,) if k is not None else ()) + (
            (self.gradient_width,) if gradient else ())
        return (self.seq_len, self.size, self.size ** (self.order - 1), *extra,
                *runtime.emission_strides(self.emissions, self.order))

    def masking(self, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The ``mask``, ``pos`` and ``col`` pointer arguments (the lengths stand in for unused ones)."""
        return (self.lengths if self.mask is None else self.mask, pos,
                self.lengths if self.columns is None else self.columns)

    def options(self) -> dict[str, int]:
        """The ``MASKED`` (positions computed) and ``COLUMNS`` constants."""
        return {"MASKED": int(self.mask is not None), "COLUMNS": int(self.columns is not None)}

    def plan(self, kernel: str, k: int = 1) -> tuple[str, bool, dict[str, int]]:
        """The kernel function to launch for ``kernel`` (see :func:`.runtime.plan`), whether it is
        a blocked one (it takes a scratch buffer after its outputs) and its constants: block
        sizes, ``PER_POSITION`` and ``num_warps``."""
        name, constants = runtime.plan(kernel, self.size, self.order, k, wide=self.dtype == torch.float64)
        constants = {**constants, "PER_POSITION": self.per_position, "BT": runtime.position_block(self.seq_len)}
        if kernel != "backward_kernel":
            constants.update(self.options())
        return name, name != kernel, constants


def result_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 when any potential is float64, float32 otherwise (float16 and bfloat16 included)."""
    return torch.float64 if any(x.dtype == torch.float64 for x in tensors) else torch.float32


def prepare(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor, k: int = 1,
            mask: Tensor | None = None, columns: Tensor | None = None, automaton: Tensor | None = None) -> Inputs:
    """Check shapes and support (ValueError naming the problem) and build :class:`Inputs`
    (``mask``, ``columns``, ``automaton``: see :class:`Inputs`; with ``columns`` the emissions are
    ``[B, T, C']`` tag emissions)."""
    if emissions.dim() < 3:
        raise ValueError(f"emissions must be [batch, seq_len, *S], got {tuple(emissions.shape)}")
    batch, seq_len = emissions.shape[:2]
    order, size = start.dim(), transitions.shape[-1]
    state_shape = (size,) * order
    if tuple(start.shape) != state_shape or tuple(end.shape) != state_shape:
        raise ValueError(f"start {tuple(start.shape)} and end {tuple(end.shape)} must have the state shape "
                         f"{state_shape} of transitions {tuple(transitions.shape)}")
    if columns is not None:
        if emissions.dim() != 3 or tuple(columns.shape) != (size,):
            raise ValueError(f"columns {tuple(columns.shape)} must be [C] = ({size},) for emissions [batch, seq_len, "
                             f"columns], got emissions {tuple(emissions.shape)}")
    elif tuple(emissions.shape[2:]) != state_shape:
        raise ValueError(f"emissions {tuple(emissions.shape)} must be [batch, seq_len, *S] with S = {state_shape}")
    per_position = transitions.dim() > len(state_shape) + 1
    expected = ((batch, seq_len) if per_position else ()) + state_shape + (size,)
    if tuple(transitions.shape) != expected:
        raise ValueError(f"transitions {tuple(transitions.shape)} must be [*S, C] = {state_shape + (size,)} or per "
                         f"position [batch, seq_len, *S, C] = {(batch, seq_len) + state_shape + (size,)}")
    if tuple(lengths.shape) != (batch,):
        raise ValueError(f"lengths {tuple(lengths.shape)} must be [batch] = ({batch},)")
    if mask is not None and (tuple(mask.shape) != (batch, seq_len) or per_position):
        raise ValueError(f"a mask {tuple(mask.shape)} must be [batch, seq_len] = {(batch, seq_len)}, with shared "
                         "transitions")
    reason = runtime.unsupported(start, transitions, end, emissions, lengths, k)
    if reason is not None:
        raise ValueError(f"the triton backend cannot run this input: {reason}")
    out_dtype = result_dtype(start, transitions, end, emissions)
    dtype = torch.float64 if seq_len >= LONG_SEQUENCE else out_dtype
    return Inputs(start.detach().to(dtype).contiguous(), transitions.detach().to(dtype).contiguous(),
                  end.detach().to(dtype).contiguous(), emissions.detach(), lengths.to(torch.int64).contiguous(),
                  order, size, per_position, out_dtype, None if mask is None else mask.contiguous(),
                  columns, automaton)

"""An exportable Viterbi decoder for the CRF layers.

:meth:`ChainCRF.decode <neurocrf.structs.base.ChainCRF.decode>` steps through the positions in a
Python loop and moves each row's True mask positions to the front with data-dependent indexing:
fast in eager mode, but a tracer records one fixed length. :class:`ViterbiDecoder` computes the
same tags with tensor operations whose shapes follow the input: the mask is compacted by a
scatter, and both the max-product forward pass and the backtracking are ``scan`` loops (the
``torch.ops.higher_order.scan`` operator), which ``torch.export`` keeps as one loop over a
symbolic length and the ONNX exporter (``dynamo=True``) writes as an ONNX ``Scan``. The exported
program therefore decodes any batch size and any sequence length.

It does the same floating-point operations in the same order as the eager Viterbi of the
compiled kernel (the CPU default), ``score + (move + emission)`` with ties to the lower source, so
the tags are identical, not merely close: ``crf.decoder()(emissions, mask)`` equals
``crf.decode(emissions, mask)``.

Why this Viterbi is not the engine's: every engine scan, the reference's
(:func:`~neurocrf.structs.engine.reference.max_scan`) included, loops over the positions in
Python on potentials that a data-dependent compaction built, and a backend is chosen at run time
by device and input; ``torch.export`` would unroll such a loop to the one length it traced (and
the C kernel and Triton launches are opaque to it). Here the loop body is a function of tensors
alone, handed to the ``scan`` operator, and the masking is arithmetic (inactive positions keep
their scores) instead of the engine's absorbing END state. The tests hold it to ``crf.decode``
on every layer, mask and constraint (``tests/structs/test_export.py``).

>>> import torch
>>> from neurocrf.structs import LinearChainCRF
>>> crf = LinearChainCRF(3)
>>> emissions, mask = torch.randn(2, 5, 3), torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]]).bool()
>>> torch.equal(crf.decoder()(emissions, mask), crf.decode(emissions, mask))
True
>>> program = torch.export.export(crf.decoder(), (emissions, mask), dynamic_shapes=dynamic_shapes())
>>> longer = torch.randn(3, 9, 3), torch.rand(3, 9) < 0.7
>>> torch.equal(program.module()(*longer), crf.decode(*longer))
True
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import Tensor, nn

from neurocrf.structs.engine import SEARCH_DTYPE
from neurocrf.structs.engine.semiring import NEG_INF

MAX_BATCH = 1 << 20
MAX_SEQ_LEN = 1 << 20

TRACING_ERROR = (
    "{what} cannot be traced with torch.jit.trace or the legacy ONNX exporter "
    "(torch.onnx.export(..., dynamo=False)): a trace records one fixed sequence length and the result "
    "would silently decode other lengths wrongly. Export crf.decoder() with torch.export.export(...) "
    "or torch.onnx.export(..., dynamo=True) instead (see neurocrf.structs.export.dynamic_shapes)."
)


EXPORT_ERROR = (
    "{what} loops over the positions in Python and cannot be exported; export crf.decoder() (Viterbi "
    "tags for any batch size and length) with torch.export.export(...) or torch.onnx.export(..., dynamo=True)."
)


def refuse_tracing(what: str) -> None:
    """Raise RuntimeError under ``torch.jit.trace`` (and the legacy ONNX exporter, which traces)."""
    if torch.jit.is_tracing():
        raise RuntimeError(TRACING_ERROR.format(what=what))


def refuse_capture(what: str) -> None:
    """:func:`refuse_tracing`, and raise RuntimeError under ``torch.export`` too (the eager CRF
    methods; their graph would hold data-dependent Python control flow)."""
    refuse_tracing(what)
    if bool(getattr(torch.compiler, "is_exporting", lambda: False)()):
        raise RuntimeError(EXPORT_ERROR.format(what=what))


def _capturing() -> bool:
    """Whether ``torch.export`` or ``torch.compile`` is capturing a graph."""
    compiler = getattr(torch, "compiler", None)
    return any(bool(getattr(compiler, name, lambda: False)()) for name in ("is_exporting", "is_compiling"))


def _scan(step: Callable[[Tensor, list[Tensor]], tuple[Tensor, Tensor]], init: Tensor, xs: list[Tensor]
          ) -> tuple[Tensor, Tensor]:
    """Loop ``carry, y = step(carry, [x[t] for x in xs])`` over the leading dim of ``xs``: returns
    the last carry and the stacked ``y``.

    Under ``torch.export`` and ``torch.compile`` this is the ``scan`` operator (one loop node over
    a symbolic length); in eager mode, where that operator would compile its body on each call, a
    Python loop runs the same ``step``.
    """
    if _capturing():
        from torch._higher_order_ops.scan import scan

        return scan(step, init, xs)
    carry, ys = init, []
    for t in range(xs[0].shape[0]):
        carry, y = step(carry, [x[t] for x in xs])
        ys.append(y)
    return carry, torch.stack(ys)


class ViterbiDecoder(nn.Module):
    """``forward(emissions, mask)`` -> Viterbi tags ``[batch, seq_len]`` (-1 at masked positions).

    A plain module over a CRF layer (its parameters are the layer's: a decoder made before
    training decodes with the trained weights). Same result as ``crf.decode``, including masks
    with holes, constraints, and the state spaces of the second-order and precursor-induced
    layers (states are mapped back to tags); a row without any allowed path gets -1 everywhere.

    Args:
        crf: a :class:`~neurocrf.structs.base.ChainCRF` layer.

    Inputs:
        emissions: ``[batch, seq_len, num_tags]`` float (or pair emissions ``[batch, seq_len,
            num_tags + 1, num_tags]`` for :class:`~neurocrf.structs.LinearChainCRF`).
        mask: ``[batch, seq_len]`` bool (None: every position).
    """

    def __init__(self, crf: nn.Module) -> None:
        super().__init__()
        self.crf = crf

    def forward(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        refuse_tracing("ViterbiDecoder")
        crf = self.crf
        mask = crf._check(emissions, mask)
        seq_len = emissions.shape[1]
        # one masked position more: the scans never run zero steps, so seq_len 0 needs no branch
        emissions = torch.cat([emissions, emissions.new_zeros(emissions.shape[0], 1, *emissions.shape[2:])], dim=1)
        mask = torch.cat([mask, mask.new_zeros(mask.shape[0], 1)], dim=1)
        # everything entering the scans is detached (decoding has no gradient, and the scan operator
        # refuses inputs that require grad); no torch.no_grad region, which an export would record
        with _autocast_off(emissions.device.type):
            dtype = SEARCH_DTYPE  # as crf.decode: float32 sums lose the order of long paths
            destination = _compaction(mask)
            compact = _scatter_positions(emissions.detach().to(dtype), destination)
            start, transitions, end = (p.detach() for p in crf._potentials(dtype))
            if compact.dim() == 4:
                compact, transitions = crf._split_pair_emissions(compact, transitions)
            state_emissions = crf._state_emissions(compact).detach()
            states, feasible = _viterbi(start, transitions, end, state_emissions, mask.sum(1))
            tags = crf.state_labels[states].gather(1, destination)
            tags = torch.where(mask & feasible.unsqueeze(1), tags, torch.full_like(tags, -1))
            return tags[:, :seq_len]


def _autocast_off(device_type: str) -> Any:
    """Autocast disabled, entered only when it is on (an exported graph then holds no autocast
    region, which ``torch.export.save`` cannot serialise)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def _compaction(mask: Tensor) -> Tensor:
    """``[B, T]`` position each entry moves to: the True positions of a row first, in order, then
    the False ones (a permutation of each row, built without sorting)."""
    on = mask.long()
    lengths = on.sum(1, keepdim=True)
    return torch.where(mask, on.cumsum(1) - 1, (1 - on).cumsum(1) - 1 + lengths)


def _scatter_positions(x: Tensor, destination: Tensor) -> Tensor:
    """``x`` ``[B, T, ...]`` with entry ``t`` of row ``b`` moved to ``destination[b, t]``."""
    index = destination.view(*destination.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return torch.zeros_like(x).scatter(1, index, x)


def _viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
             ) -> tuple[Tensor, Tensor]:
    """Best state path of compacted chains.

    Args:
        start, end: ``[*S]``; transitions ``[*S, C]`` or per position ``[B, T, *S, C]`` (see
            :mod:`neurocrf.structs.engine.chain`); emissions ``[B, T, *S]``; lengths ``[B]``.

    Returns:
        flat states ``[B, T]`` (valid before each row's length) and ``[B]`` whether a row has a
        path of finite score.
    """
    batch, seq_len = emissions.shape[:2]
    order, size = start.dim(), transitions.shape[-1]
    num_states = size ** order
    per_position = transitions.dim() > emissions.dim()
    # moves[t][b, a, *r, c] = W[a, *r, c] + E[t, b, *r, c], added in this order as Chain.viterbi does
    time_major = emissions.transpose(0, 1)  # [T, B, *S]
    if per_position:
        moves = transitions.transpose(0, 1) + time_major.unsqueeze(2)
    else:
        moves = transitions + time_major.unsqueeze(2)
    positions = torch.arange(seq_len, device=emissions.device)
    active = positions.unsqueeze(1) < lengths  # [T, B]
    first = positions == 0  # [T]
    # flat source (a, *r) of flat destination (*r, c) reached from a = pointer
    rest = size ** (order - 1)
    kept = torch.arange(num_states, device=emissions.device) // size
    every = torch.arange(num_states, device=emissions.device)  # pointers of inactive steps stay put

    def forward_step(score: Tensor, x: list[Tensor]) -> tuple[Tensor, Tensor]:
        step_moves, emission, is_first, is_active = x
        best, pointer = (score.unsqueeze(-1) + step_moves).max(dim=1)
        initial = start + emission
        new = torch.where(is_first, initial, best)
        new = torch.where(is_active.view(-1, *([1] * order)), new, score)
        previous = pointer.flatten(1) * rest + kept
        previous = torch.where(is_active.unsqueeze(1) & ~is_first, previous, every)
        return new, previous

    init = emissions.new_full((batch, *start.shape), NEG_INF)
    score, previous = _scan(forward_step, init, [moves, time_major, first, active])  # previous [T, B, |S|]
    final = (score + end).reshape(batch, num_states)
    best_score, last = final.max(dim=1, keepdim=True)

    def backward_step(state: Tensor, x: list[Tensor]) -> tuple[Tensor, Tensor]:
        return x[0].gather(1, state), state.squeeze(1).clone()

    _, path = _scan(backward_step, last, [previous.flip(0)])
    states = path.flip(0).transpose(0, 1)  # [B, T]
    return states, best_score.squeeze(1) > NEG_INF


def dynamic_shapes(max_seq_len: int = MAX_SEQ_LEN, max_batch: int = MAX_BATCH) -> dict[str, Any]:
    """``dynamic_shapes`` for exporting a :class:`ViterbiDecoder` with a free batch size and
    sequence length (``torch.export.export`` and ``torch.onnx.export(..., dynamo=True)``)."""
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    seq_len = torch.export.Dim("seq_len", min=0, max=max_seq_len)
    return {"emissions": {0: batch, 1: seq_len}, "mask": {0: batch, 1: seq_len}}

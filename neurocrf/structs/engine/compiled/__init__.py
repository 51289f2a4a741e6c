"""The compiled backend: the C kernel of :mod:`~neurocrf.structs.engine.compiled.kernel` for
first-order chains with shared transitions on CPU tensors (the CPU default of ``backend="auto"``).

It takes :class:`~neurocrf.structs.LinearChainCRF` (without pair emissions) and
:class:`~neurocrf.structs.PrecursorInducedCRF`; :func:`unsupported` names what it does not take
(pair states of :class:`~neurocrf.structs.SecondOrderCRF`, per-position transitions, CUDA tensors,
other dtypes than float32 and float64).

- log partition and marginals: the kernel's forward-backward pass in float64, certified exact (see
  :mod:`~neurocrf.structs.engine.compiled.kernel`); a batch it cannot certify (scores beyond
  float64's range in exp space, rows without any path) is computed by the log-space scan of
  :mod:`~neurocrf.structs.engine.reference`, which is exact there: a numerical fallback inside this
  backend, not a change of backend (so are second derivatives, which the kernel does not give);
- Viterbi: the kernel, in float64;
- k best: the reference's k-max scan on the same CPU tensors (the kernel has no k-best search);
- gold-path scores: the kernel, summed in float64.

It shares :class:`~neurocrf.structs.engine.certified.CertifiedLogPartition` with the torch
backend's fast scans and imports no other backend.

The log partition, the gold-path scores and Viterbi also read emissions whose columns several
states share (``columns=``, :data:`SHARED_COLUMNS`; see :mod:`~neurocrf.structs.engine.columns`):
the precursor-induced CRF's O states then cost no emission work of their own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine import SEARCH_DTYPE, reference
from neurocrf.structs.engine import columns as shared
from neurocrf.structs.engine.certified import CertifiedLogPartition
from neurocrf.structs.engine.compiled import kernel
from neurocrf.structs.engine.compiled.scan import GoldScore, KernelForwardBackward

_DTYPES = (torch.float32, torch.float64)
SHARED_COLUMNS = ("log_partition", "path_score", "viterbi")
"""The quantities that take ``emissions [B, T, C]`` with ``columns [S]`` (see the module docstring)."""


def available() -> str | None:
    """None when the kernel is built and loaded (building it now if needed), else why not."""
    return kernel.unavailable()


def unsupported(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                k: int = 1) -> str | None:
    """None for first-order chains with shared transitions on float32 / float64 CPU tensors."""
    if start.dim() != 1:
        return ("it runs first-order state spaces (LinearChainCRF, PrecursorInducedCRF), not pair states "
                "(SecondOrderCRF)")
    if transitions.dim() != 2:
        return "it takes shared transitions, not per-position ones (pair emissions)"
    devices = {x.device.type for x in (start, transitions, end, emissions)}
    if devices != {"cpu"}:
        return f"it runs on CPU tensors, got {sorted(devices - {'cpu'})[0]} tensors"
    if emissions.dtype not in _DTYPES:
        return f"it takes float32 or float64 scores, got {emissions.dtype}"
    return None


def _trivial(emissions: Tensor) -> bool:
    """An empty batch or no positions: nothing for the kernel to do (the torch backend's answer)."""
    return emissions.shape[0] == 0 or emissions.shape[1] == 0


def log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                  columns: Tensor | None = None) -> Tensor:
    """``[B]`` log partition, differentiable (first derivatives from the kernel's backward pass;
    higher ones through the reference's log-space scan); ``columns``: see the module docstring."""
    def fallback(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor) -> Tensor:
        states = emissions if columns is None else shared.expand(emissions, columns)
        return reference.log_partition(start, transitions, end, states, lengths)

    if _trivial(emissions):
        return fallback(start, transitions, end, emissions)
    with torch.no_grad():
        scan = KernelForwardBackward(start, transitions, end, emissions, lengths, columns)
    if not scan.ok:
        return fallback(start, transitions, end, emissions)
    return CertifiedLogPartition.apply(start, transitions, end, emissions, scan, fallback)


def node_marginals(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[B, T, S]`` posteriors (0 past each length); no gradient."""
    if not _trivial(emissions):
        with torch.no_grad():
            scan = KernelForwardBackward(start, transitions, end, emissions, lengths)
            marg = scan.node_marginals() if scan.ok else None
        if marg is not None:
            return marg.to(emissions.dtype)
    return reference.node_marginals(start, transitions, end, emissions, lengths)


def viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
            columns: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Best path: states ``[B, T]`` (-1 past each length and without a path), float64 scores ``[B]``;
    ``columns``: see the module docstring."""
    if _trivial(emissions):
        states = emissions if columns is None else shared.expand(emissions, columns)
        return reference.viterbi(start, transitions, end, states, lengths)
    potentials = (x.detach().to(SEARCH_DTYPE).contiguous() for x in (start, transitions, end, emissions))
    return kernel.viterbi(*potentials, lengths.to(torch.long).contiguous(), columns)


def kbest(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor, k: int
          ) -> tuple[Tensor, Tensor]:
    """The k best paths by the reference's k-max scan (see the module docstring)."""
    return reference.kbest(start, transitions, end, emissions, lengths, k)


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor, columns: Tensor | None = None) -> Tensor:
    """``[B]`` score of the state paths ``states [B, T]``, summed in float64, differentiable;
    ``columns``: see the module docstring."""
    if states.shape[1] == 0:
        return emissions.new_zeros(states.shape[0])
    return GoldScore.apply(start, transitions, end, emissions, states, lengths, columns)

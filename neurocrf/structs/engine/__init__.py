"""The chain engine: one batched first-order chain over a state space, behind one small interface.

The layers (:mod:`~neurocrf.structs.linear_chain`, :mod:`~neurocrf.structs.second_order`,
:mod:`~neurocrf.structs.precursor`) build a compacted chain (:class:`~neurocrf.structs.engine.chain.Chain`)
and ask it for a quantity; the chain asks :func:`select` which backend computes it, and this
chooser is the only place that loads a backend: no module outside a backend imports it (layers,
the distribution and the exporter included), and no backend imports another
(``tests/engine/test_backend_imports.py`` checks both).

The engine root holds what is not one backend's:

- :mod:`~neurocrf.structs.engine.reference`: the reference every backend is tested against, the
  plain log-space implementation of every quantity (log Z, marginals, Viterbi, k best, path
  scores), torch only and differentiable to any order. Backends use it as their exact fallback,
  :class:`~neurocrf.structs.engine.chain.Chain` for derivatives of order two and more, and
  :class:`~neurocrf.structs.distribution.ChainDistribution` for everything it computes (edge
  marginals, expectations, samples: quantities no backend's fast scan gives);
- :mod:`~neurocrf.structs.engine.augmented` (the absorbing END value every scan runs on),
  :mod:`~neurocrf.structs.engine.columns` (emission columns shared by states),
  :mod:`~neurocrf.structs.engine.semiring` (the reductions), and
  :mod:`~neurocrf.structs.engine.certified` (log Z of a certified scan as an autograd node, which
  the torch and compiled backends share).

Backends (``backend=``):

- ``"torch"`` (:mod:`~neurocrf.structs.engine.pytorch`): pure torch, any device, every input: the
  certified fast scans, the log-depth parallel scan, the exp-space scans, one Viterbi max scan.
- ``"compiled"`` (:mod:`~neurocrf.structs.engine.compiled`): a C kernel for first-order chains with
  shared transitions (:class:`~neurocrf.structs.LinearChainCRF` without pair emissions and
  :class:`~neurocrf.structs.PrecursorInducedCRF`) on CPU tensors; built at install time (or once at
  first use, then cached). Its scans certify their own exactness and hand the rare uncertified
  batch to the reference's log-space scan: a numerical fallback inside the backend, not a change
  of backend.
- ``"triton"`` (:mod:`~neurocrf.structs.engine.triton`): fused GPU kernels for CUDA tensors.
- ``"auto"``: triton for CUDA tensors when it is installed and takes the input, the compiled
  kernel for CPU tensors when it is built and takes the input, torch otherwise; decided per
  quantity. A layer's ``scan`` other than ``"auto"`` asks for a torch scan, so ``"auto"`` then
  means torch.

Each backend writes Viterbi once (torch: :mod:`~neurocrf.structs.engine.pytorch.search`; compiled:
the kernel; triton: the k-max search kernel with ``k = 1``); every backend is tested against the
reference, and the reference against brute-force enumeration
(``tests/engine/test_against_reference.py``).

A backend asked for by name computes the quantity or raises :class:`BackendError` saying why (not
installed, kernel not built, wrong device, an input it does not take); it never falls back to
another backend. The environment variable ``NEUROCRF_CRF_BACKEND`` sets the backend for a whole
run: it replaces ``"auto"``, while a layer built or set with another name keeps its own.
``NEUROCRF_COMPILED_KERNEL=0`` (the older switch) keeps ``"auto"`` off the compiled kernel.

The contract (:class:`Backend`): a backend is a module with these functions, all on the original,
compacted potentials of :class:`~neurocrf.structs.engine.chain.Chain` (state shape ``S = (C,) *
order``; ``start`` ``[*S]``, ``transitions`` ``[*S, C]`` or per position ``[B, T, *S, C]``, ``end``
``[*S]``, ``emissions`` ``[B, T, *S]``, ``lengths`` ``[B]``; each row's valid positions first).
A backend may also list in ``SHARED_COLUMNS`` the quantities it computes from emissions whose
columns several states share (keyword ``columns``, see :mod:`~neurocrf.structs.engine.columns`);
the chain expands them into state emissions for every other call:

>>> import neurocrf.structs.engine as engine
>>> sorted(engine.QUANTITIES)
['kbest', 'log_partition', 'node_marginals', 'path_score', 'viterbi']
>>> engine.resolve("auto", environ={"NEUROCRF_CRF_BACKEND": "torch"})
'torch'
>>> engine.resolve("compiled", environ={"NEUROCRF_CRF_BACKEND": "torch"})
'compiled'
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

BACKENDS = ("auto", "torch", "compiled", "triton")
"""Names a layer's ``backend`` takes."""
ENV = "NEUROCRF_CRF_BACKEND"
"""Environment variable that replaces ``"auto"`` for a whole run."""
SCANS = ("auto", "sequential", "parallel")
"""The torch backend's scans for the log partition and the marginals (a layer's ``scan``)."""
PARALLEL_THRESHOLD = 512
"""Sequence length from which ``scan="auto"`` takes the torch backend's parallel scan on CUDA."""
QUANTITIES = ("log_partition", "node_marginals", "viterbi", "kbest", "path_score")
"""What a backend computes (the functions of :class:`Backend`)."""
SEARCH_DTYPE = torch.float64
"""dtype of the max and k-max scans of every backend: on long sentences float32 path scores are
too coarse to order the paths (sums of float32 scores are exact in float64 for any practical
length), so the Viterbi path is the first of the k best."""

_MODULES = {"torch": "neurocrf.structs.engine.pytorch", "compiled": "neurocrf.structs.engine.compiled",
            "triton": "neurocrf.structs.engine.triton"}
_AUTO_ORDER = {"cuda": ("triton",), "cpu": ("compiled",)}


class BackendError(RuntimeError):
    """A backend asked for by name cannot compute a quantity (the message says why)."""


@runtime_checkable
class Backend(Protocol):
    """What every backend module provides (shapes in the module docstring above)."""

    def available(self) -> str | None:
        """None when the backend can run on this machine, else the reason it cannot."""

    def unsupported(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor,
                    lengths: Tensor, k: int = 1) -> str | None:
        """None when it takes these inputs (device, dtype, state space, ``k`` paths of ``kbest``),
        else the reason."""

    def log_partition(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor,
                      lengths: Tensor) -> Tensor:
        """``[B]`` log partition (0 for empty rows, ``-inf`` without a path), differentiable with
        respect to the four potentials (first derivatives: the marginals)."""

    def node_marginals(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor,
                       lengths: Tensor) -> Tensor:
        """``[B, T, |S|]`` state posteriors (0 past each length and in rows without a path)."""

    def viterbi(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor,
                lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Best path: flat states ``[B, T]`` long (-1 past each length and for rows without a
        path) and float64 scores ``[B]``."""

    def kbest(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
              k: int) -> tuple[Tensor, Tensor]:
        """The k best paths, best first: states ``[B, k, T]`` (-1 for missing paths) and float64
        scores ``[B, k]`` (``-inf`` where missing)."""

    def path_score(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
                   lengths: Tensor) -> Tensor:
        """``[B]`` score of the flat state paths ``states [B, T]`` (entries past each length ignored),
        differentiable."""


def check_scan(scan: str) -> str:
    """``scan`` if it is one of :data:`SCANS`, else ValueError."""
    if scan not in SCANS:
        raise ValueError(f"scan must be 'auto', 'sequential' or 'parallel', got {scan!r}")
    return scan


def check_backend(name: str) -> str:
    """``name`` if it is one of :data:`BACKENDS`, else ValueError."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return name


def resolve(requested: str, environ: Mapping[str, str] | None = None) -> str:
    """The backend a layer set to ``requested`` runs with: ``requested`` itself unless it is
    ``"auto"``, which :data:`ENV` replaces when set (empty counts as unset)."""
    check_backend(requested)
    if requested != "auto":
        return requested
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not value:
        return "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV}={value!r} is not a CRF backend; expected one of {', '.join(BACKENDS)}")
    return value


def load(name: str) -> ModuleType:
    """The module of backend ``name`` (imported on first use); BackendError if it cannot be imported."""
    try:
        return importlib.import_module(_MODULES[name])
    except ImportError as error:
        raise BackendError(f"the {name!r} CRF backend cannot be imported: {error}") from error


def _reason(name: str, quantity: str, potentials: tuple[Tensor, ...], k: int) -> tuple[ModuleType | None, str | None]:
    """The backend module and None if it computes ``quantity`` on ``potentials``, else the reason."""
    try:
        module = load(name)
    except BackendError as error:
        return None, str(error)
    reason = module.available()
    if reason is None and getattr(module, quantity, None) is None:
        reason = f"it has no {quantity}"
    if reason is None:
        reason = module.unsupported(*potentials, k=k)
    return module, reason


def select(requested: str, quantity: str, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor,
           lengths: Tensor, scan: str = "auto", k: int = 1) -> tuple[str, ModuleType]:
    """``(name, module)`` of the backend that computes ``quantity`` for a layer set to ``requested``
    (``k``: the number of paths ``kbest`` is asked for; a backend may limit it).

    Raises:
        BackendError: the backend named (by the layer or :data:`ENV`) cannot compute it here.
    """
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; expected one of {QUANTITIES}")
    name = resolve(requested)
    potentials = (start, transitions, end, emissions, lengths)
    if name != "auto":
        if scan != "auto" and name != "torch":
            raise BackendError(f"scan={scan!r} chooses a scan of the torch backend; backend {name!r} has its own")
        module, reason = _reason(name, quantity, potentials, k)
        if reason is not None:
            raise BackendError(f"CRF backend {name!r} cannot compute {quantity}: {reason}")
        return name, module
    if scan == "auto":
        for candidate in _AUTO_ORDER.get(emissions.device.type, ()):
            module, reason = _reason(candidate, quantity, potentials, k)
            if reason is None:
                return candidate, module
    return "torch", load("torch")


def describe() -> dict[str, str]:
    """Each backend's state on this machine: ``"available"`` or the reason it is not."""
    out = {}
    for name in BACKENDS[1:]:
        try:
            reason = load(name).available()
        except BackendError as error:
            reason = str(error)
        out[name] = reason or "available"
    return out


__all__ = ["BACKENDS", "ENV", "PARALLEL_THRESHOLD", "QUANTITIES", "SCANS", "SEARCH_DTYPE", "Backend", "BackendError",
           "check_backend", "check_scan", "describe", "load", "resolve", "select"]

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
another backend.

Trust before use. A backend module may define ``auto_reason()`` (why ``"auto"`` does not take it
on this machine: the Triton backend outside the Triton versions its kernels are tested with) and
``self_check(order, per_position, dtype, device)`` (its results against the torch engine on a
small random problem). The first time a quantity of a kind (state order, shared or per-position
transitions), dtype and device would run on such a backend in a process, :func:`select` runs the
check; if it fails, ``"auto"`` warns once (backend, kind, device, the backend's version, what
differed or the error) and uses torch for that kind in that process, while a backend named
explicitly raises :class:`BackendError`. ``NEUROCRF_TRITON_SELF_CHECK=0`` skips the check;
:func:`self_checks` lists the results so far, :func:`auto_choice` says what ``"auto"`` takes on a
device and why. The environment variable ``NEUROCRF_CRF_BACKEND`` sets the backend for a whole
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
import warnings
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
SELF_CHECK_ENV = "NEUROCRF_TRITON_SELF_CHECK"
"""Environment variable: ``0`` (or ``false``, ``off``, ``no``) skips the backends' self-checks."""
_CHECKS: dict[tuple, str | None] = {}


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
        _trust(name, module, start, transitions, emissions, named=True)
        return name, module
    if scan == "auto":
        for candidate in _AUTO_ORDER.get(emissions.device.type, ()):
            module, reason = _reason(candidate, quantity, potentials, k)
            if reason is None and getattr(module, "auto_reason", None) is not None:
                reason = module.auto_reason()
            if reason is None:
                reason = _trust(candidate, module, start, transitions, emissions)
            if reason is None:
                return candidate, module
    return "torch", load("torch")


def _kind(start: Tensor, transitions: Tensor) -> tuple[int, bool]:
    """``(order, per-position transitions)`` of a chain: what a backend's self-check is keyed by."""
    return start.dim(), transitions.dim() > start.dim() + 1


def _trust(name: str, module: ModuleType, start: Tensor, transitions: Tensor, emissions: Tensor,
           named: bool = False) -> str | None:
    """None when backend ``name`` passed its self-check (run once per kind, dtype and device in a
    process; skipped by :data:`SELF_CHECK_ENV` or a backend without one), else why not: ``"auto"``
    warns once and goes on, a backend named explicitly (``named``) raises BackendError."""
    check = getattr(module, "self_check", None)
    if check is None or os.environ.get(SELF_CHECK_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    order, per_position = _kind(start, transitions)
    key = (name, order, per_position, start.dtype, emissions.device)
    if key not in _CHECKS:
        _CHECKS[key] = reason = check(order, per_position, start.dtype, emissions.device)
        if reason is not None and not named:
            warnings.warn(f"the {name!r} CRF backend failed its self-check ({_describe_key(key)}, "
                          f"{_version(module)}): {reason}; 'auto' uses the torch backend for these chains "
                          f"in this process ({SELF_CHECK_ENV}=0 skips the check)", RuntimeWarning, stacklevel=4)
    reason = _CHECKS[key]
    if reason is not None and named:
        raise BackendError(f"CRF backend {name!r} failed its self-check ({_describe_key(key)}): {reason}")
    return None if reason is None else f"failed its self-check: {reason}"


def _describe_key(key: tuple) -> str:
    name, order, per_position, dtype, device = key
    kind = "first-order states" if order == 1 else "pair states"
    return f"{kind}, {'per-position' if per_position else 'shared'} transitions, {dtype}, device {device}"


def _version(module: ModuleType) -> str:
    version = getattr(module, "version", None)
    return version() if callable(version) else "version unknown"


def self_checks() -> dict[str, str]:
    """The self-checks run so far in this process: a description of each -> ``"passed"`` or why
    it failed."""
    return {f"{key[0]}: {_describe_key(key)}": reason or "passed" for key, reason in _CHECKS.items()}


def auto_choice(device: torch.device | str, order: int = 1, dtype: torch.dtype = torch.float32,
                check: bool = False) -> tuple[str, list[str]]:
    """The backend ``"auto"`` takes for a small chain of ``order`` in ``dtype`` on ``device``
    (taking :data:`ENV` into account) and why: one line per backend tried before it. With
    ``check`` the self-checks run (on a GPU: compiles the kernels); without, a backend whose
    self-check has not run yet counts as passing."""
    device = torch.device(device)
    size = 3
    start = torch.zeros((size,) * order, dtype=dtype, device=device)
    potentials = (start, torch.zeros((size,) * (order + 1), dtype=dtype, device=device), start,
                  torch.zeros((1, 2) + (size,) * order, dtype=dtype, device=device),
                  torch.ones(1, dtype=torch.long, device=device))
    name = resolve("auto")
    if name != "auto":
        return name, [f"{ENV}={name} replaces 'auto'"]
    why = []
    for candidate in _AUTO_ORDER.get(device.type, ()):
        module, reason = _reason(candidate, "log_partition", potentials, 1)
        if reason is None and getattr(module, "auto_reason", None) is not None:
            reason = module.auto_reason()
        if reason is None and check:
            reason = _trust(candidate, module, potentials[0], potentials[1], potentials[3])
        elif reason is None:
            key = (candidate, order, False, dtype, potentials[3].device)
            reason = None if _CHECKS.get(key) is None else f"failed its self-check: {_CHECKS[key]}"
        if reason is None:
            return candidate, why + [f"{candidate}: takes the input"]
        why.append(f"{candidate}: {reason}")
    return "torch", why + ["torch: runs everywhere"]


def candidates(requested: str, device: torch.device) -> tuple[str, ...]:
    """The backends a layer set to ``requested`` may run with on ``device``, before looking at its
    inputs: the one named (by the layer or :data:`ENV`), else those ``"auto"`` tries, then torch."""
    name = resolve(requested)
    return (name,) if name != "auto" else (*_AUTO_ORDER.get(device.type, ()), "torch")


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


__all__ = ["BACKENDS", "ENV", "PARALLEL_THRESHOLD", "QUANTITIES", "SCANS", "SEARCH_DTYPE", "SELF_CHECK_ENV", "Backend",
           "BackendError", "auto_choice", "candidates", "check_backend", "check_scan", "describe", "load", "resolve",
           "select", "self_checks"]

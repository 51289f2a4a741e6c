"""The batched chain every CRF layer builds, and the one place that dispatches it to a backend.

A chain is a first-order Markov chain over a state space of shape ``S = (C,) * n``: a state is a
tuple of ``n`` components, and a transition goes from ``(a, *r)`` to ``(*r, c)``, reading one new
component ``c``. A first-order CRF has ``n = 1`` (a state is a tag); the second-order CRF has
``n = 2`` (a state is a pair of tags); the precursor-induced CRF has ``n = 1`` over its expanded
states. Transition scores are a tensor ``[*S, C]`` indexed by the source state and the new
component.

Inputs are *compacted*: each row's valid positions come first and ``lengths`` says how many there
are (the layers compact arbitrary masks before calling in).

Potentials (one dtype): ``start`` ``[*S]``, ``transitions`` ``[*S, C]``, ``end`` ``[*S]``,
``emissions`` ``[batch, seq_len, *S]`` and ``lengths`` ``[batch]``. Transitions may also be given
per position, ``[batch, seq_len, *S, C]`` (observation-dependent transitions): entry ``[b, t]``
scores the move into compacted position ``t`` of row ``b``; entries at ``t = 0`` are unused.
First-order chains may share emission columns between states (``columns``, see
:mod:`~neurocrf.structs.engine.columns`): ``emissions`` is then ``[batch, seq_len, C']``.

:class:`Chain` asks :func:`neurocrf.structs.engine.select` for the backend of each quantity (see
:mod:`neurocrf.structs.engine` for the backends, ``"auto"`` and ``NEUROCRF_CRF_BACKEND``) and
never imports one itself. Derivatives of order two and more (``create_graph=True``,
differentiable marginals) run through the log-space scan of
:mod:`~neurocrf.structs.engine.reference` whatever the backend, and the window partition functions
of span confidences are the torch backend's.

Empty batches and rows of length 0 are valid everywhere. A row without any path of finite score
has log partition ``-inf``, zero marginals and gradients, and Viterbi states -1.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from neurocrf.structs import engine
from neurocrf.structs.engine import PARALLEL_THRESHOLD, check_backend, check_scan
from neurocrf.structs.engine import columns as shared
from neurocrf.structs.engine.augmented import is_per_position

__all__ = ["Chain", "path_score"]

_TORCH_OPTIONS = ("log_partition", "node_marginals")  # the quantities that take scan options


class Chain:
    """A batch of compacted chains, ready for any quantity.

    Args:
        start: ``[*S]`` start scores.
        transitions: ``[*S, C]`` transition scores, or ``[batch, seq_len, *S, C]`` per position.
        end: ``[*S]`` end scores.
        emissions: ``[batch, seq_len, *S]`` state scores at each compacted position.
        lengths: ``[batch]`` number of valid positions per row.
        backend: ``"auto"``, ``"torch"``, ``"compiled"`` or ``"triton"`` (see :mod:`neurocrf.structs.engine`).
        scan: the torch backend's scan, ``"sequential"``, ``"parallel"`` (log-depth matrix products;
            first-order state spaces, others run sequentially) or ``"auto"`` (parallel on CUDA for
            sequences of at least ``parallel_threshold``); anything but ``"auto"`` asks for torch.
        columns: ``[|S|]`` int64, first-order chains with shared transitions only: state ``s``
            scores ``emissions[..., columns[s]]`` and ``emissions`` is ``[batch, seq_len, C']``
            (see :mod:`~neurocrf.structs.engine.columns`); None: ``emissions`` are state scores.
    """

    def __init__(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                 backend: str = "auto", scan: str = "auto", parallel_threshold: int = PARALLEL_THRESHOLD,
                 columns: Tensor | None = None) -> None:
        batch, seq_len = emissions.shape[:2]
        order = start.dim()
        size = transitions.shape[-1]
        self._tag_emissions, self.columns = emissions, columns
        if columns is not None:
            if order != 1 or transitions.dim() != 2 or emissions.dim() != 3:
                raise ValueError("shared emission columns take a first-order chain with shared transitions")
            if tuple(columns.shape) != (size,) or columns.dtype != torch.long:
                raise ValueError(f"columns must be int64 [{size}] (one column per state), got {columns.dtype} "
                                 f"{tuple(columns.shape)}")
            if columns.device.type == "cpu":  # the compiled kernel indexes with them (no CUDA sync here)
                shared.check(columns, emissions.shape[-1])
        if tuple(start.shape) != (size,) * order or tuple(end.shape) != tuple(start.shape):
            raise ValueError(f"start {tuple(start.shape)} and end {tuple(end.shape)} must have the state shape "
                             f"{(size,) * order} of transitions {tuple(transitions.shape)}")
        self.per_position = is_per_position(transitions, emissions)
        expected = ((batch, seq_len) if self.per_position else ()) + (size,) * (order + 1)
        if tuple(transitions.shape) != expected:
            raise ValueError(f"transitions {tuple(transitions.shape)} must be [*S, C] = {(size,) * (order + 1)} or "
                             f"per position [batch, seq_len, *S, C] = {(batch, seq_len) + (size,) * (order + 1)}")
        self.batch, self.seq_len, self.order, self.size = batch, seq_len, order, size
        self.original_states = size ** order
        self.lengths = lengths
        self.backend = check_backend(backend)
        self.scan = check_scan(scan)
        self.parallel_threshold = parallel_threshold
        self._potentials = (start, transitions, end)
        self._state_emissions = None if columns is not None else emissions

    @property
    def _originals(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """start, transitions, end and the ``[batch, seq_len, *S]`` state emissions (expanded once
        from shared columns when needed)."""
        if self._state_emissions is None:
            self._state_emissions = shared.expand(self._tag_emissions, self.columns)
        return (*self._potentials, self._state_emissions)

    def backend_for(self, quantity: str, k: int = 1) -> tuple[str, ModuleType]:
        """``(name, module)`` of the backend that computes ``quantity`` (``k`` paths for ``kbest``)."""
        # backends choose by device, dtype and state shape: the unexpanded emissions tell them as much
        return engine.select(self.backend, quantity, *self._potentials, self._tag_emissions, self.lengths,
                             scan=self.scan, k=k)

    def _run(self, quantity: str, *extra, k: int = 1):
        """``quantity`` of the chosen backend, called with the potentials, then ``extra``."""
        name, module = self.backend_for(quantity, k)
        if self.columns is not None and quantity in getattr(module, "SHARED_COLUMNS", ()):
            return getattr(module, quantity)(*self._potentials, self._tag_emissions, *extra, columns=self.columns)
        options = {}
        if name == "torch" and quantity in _TORCH_OPTIONS:
            options = {"scan": self.scan, "parallel_threshold": self.parallel_threshold}
        return getattr(module, quantity)(*self._originals, *extra, **options)

    def log_partition(self) -> Tensor:
        """``[batch]`` log partition function, differentiable (first derivatives from the backend,
        higher ones through the torch backend's log-space scan)."""
        return self._run("log_partition", self.lengths)

    def marginals(self) -> Tensor:
        """``[batch, seq_len, |S|]`` posteriors of the original flat states (0 past each length);
        no gradient (see ``ChainCRF.marginals`` for differentiable ones)."""
        return self._run("node_marginals", self.lengths)

    def viterbi(self) -> tuple[Tensor, Tensor]:
        """Best path: original flat states ``[batch, seq_len]`` (-1 past each length), float64
        scores ``[batch]``."""
        return self._run("viterbi", self.lengths)

    def kbest(self, k: int) -> tuple[Tensor, Tensor]:
        """The k best paths: original flat states ``[batch, k, seq_len]`` and float64 scores
        ``[batch, k]``, best first (the first path is :meth:`viterbi`'s); missing paths have score
        ``-inf`` and states -1."""
        return self._run("kbest", self.lengths, k, k=k)

    def path_score(self, states: Tensor) -> Tensor:
        """``[batch]`` unnormalised score of the flat state paths ``states`` ``[batch, seq_len]``
        (entries past a row's length are ignored but must be valid indices)."""
        return self._run("path_score", states, self.lengths)

    def state_emissions(self) -> Tensor:
        """``[batch, seq_len, *S]`` state emissions (shared columns expanded)."""
        return self._originals[3]

    def window_log_partition(self, rows: Tensor, starts: Tensor, allowed: Tensor) -> Tensor:
        """``[J]`` log partition of row ``rows[j]`` with the states at positions ``starts[j] ..
        starts[j] + W - 1`` restricted to ``allowed[j]`` (bool ``[J, W, *S]``), by the torch
        backend (float64, no gradient; see its ``window_log_partition``)."""
        return engine.load("torch").window_log_partition(*self._originals, self.lengths, rows, starts, allowed)


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor, backend: str = "auto") -> Tensor:
    """``[batch]`` unnormalised score of the flat state paths ``states`` ``[batch, seq_len]``
    (transitions ``[*S, C]`` or per position ``[batch, seq_len, *S, C]``), by the backend
    ``backend`` selects. Entries past a row's length are ignored (they must still be valid indices).
    """
    return Chain(start, transitions, end, emissions, lengths, backend=backend).path_score(states)

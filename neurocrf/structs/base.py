"""The public CRF interface shared by the three layers.

A layer describes its state space (``_potentials``, ``_state_emissions``, ``_gold_states`` and the
``state_labels`` map); this base class does everything else once: input checks, mask compaction,
dtype and autocast handling, reductions, and mapping states back to tags.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, TypeVar

import torch
from torch import Tensor, nn

from neurocrf.structs import engine
from neurocrf.structs.distribution import ChainDistribution
from neurocrf.structs.engine import PARALLEL_THRESHOLD, SEARCH_DTYPE, check_backend, check_scan
from neurocrf.structs.engine.chain import Chain
from neurocrf.structs.engine.semiring import NEG_INF
from neurocrf.structs.export import ViterbiDecoder, _capturing, refuse_capture

REDUCTIONS = ("none", "sum", "mean", "token_mean")
F = TypeVar("F", bound=Callable)


def _float_math(method: F) -> F:
    """Run ``method`` with autocast off and outside ``torch.compile`` graphs; refuse
    ``torch.jit.trace``, which would freeze the sequence length, and ``torch.export``.

    The scan is a Python loop over positions; keeping it out of compiled graphs means a compiled
    loss or decoder never recompiles for a new sequence length.
    """

    @functools.wraps(method)
    def wrapper(self, emissions: Tensor, *args, **kwargs):
        refuse_capture(f"{type(self).__name__}.{method.__name__}")
        with torch.autocast(device_type=emissions.device.type, enabled=False):
            return method(self, emissions, *args, **kwargs)

    reason = (f"{method.__qualname__} loops over the positions in Python and runs outside compiled graphs; "
              "crf.decoder() is the Viterbi decoder that compiles and exports")
    try:
        return torch.compiler.disable(wrapper, reason=reason)  # type: ignore[return-value]
    except TypeError:  # torch releases without `reason`
        return torch.compiler.disable(wrapper)  # type: ignore[return-value]


class ChainCRF(nn.Module):
    """Base class: a CRF over tags whose exact inference runs on :mod:`neurocrf.structs.engine.chain`.

    Every method takes ``emissions`` ``[batch, seq_len, num_tags]``; layers with
    ``accepts_pair_emissions`` (the first-order CRF) also take pair emissions ``[batch, seq_len,
    num_tags + 1, num_tags]`` that score each (previous tag, tag) pair at each position (see
    :func:`~neurocrf.structs.linear_chain.pair_emissions`). Marginals are per tag either way.

    Args:
        num_tags: number of tags ``L``.
        scan: ``"sequential"``, ``"parallel"`` (log-depth matrix products; first-order state spaces)
            or ``"auto"`` (parallel on CUDA for sequences of at least ``parallel_threshold``): how
            the torch backend computes the log partition and the marginals; anything but ``"auto"``
            asks for the torch backend. Read at every call, so it may be changed on a built layer.
        parallel_threshold: sequence length from which ``"auto"`` uses the parallel scan.
        backend: the engine that computes every quantity: ``"auto"`` (triton for CUDA tensors
            when installed, the compiled kernel for CPU tensors when built, torch otherwise),
            ``"torch"``, ``"compiled"`` or ``"triton"`` (see :mod:`neurocrf.structs.engine`). An
            attribute too, read at every call. The environment variable ``NEUROCRF_CRF_BACKEND``
            replaces ``"auto"`` for a whole run; a name given here wins over it. A backend asked
            for by name that cannot compute a quantity raises
            :class:`~neurocrf.structs.engine.BackendError` saying why.
    """

    state_labels: Tensor  # [num_states] tag of each flat state
    # whether the layer takes pair emissions [B, T, L + 1, L] (observation-dependent transitions)
    accepts_pair_emissions = False

    def __init__(self, num_tags: int, scan: str = "auto", parallel_threshold: int = PARALLEL_THRESHOLD,
                 backend: str = "auto") -> None:
        super().__init__()
        if num_tags < 1:
            raise ValueError(f"num_tags must be positive, got {num_tags}")
        self.num_tags = num_tags
        self.scan = check_scan(scan)
        self.parallel_threshold = parallel_threshold
        self.backend = backend

    @property
    def backend(self) -> str:
        """The backend this layer asks for (see the class docstring)."""
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        self._backend = check_backend(name)

    # --- what a layer defines -------------------------------------------------------------------
    def _potentials(self, dtype: torch.dtype, additive: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """``start [*S]``, ``transitions [*S, C]``, ``end [*S]`` in ``dtype``, forbidden entries
        ``-inf`` (see :meth:`_forbid` for ``additive``)."""
        raise NotImplementedError

    def _forbid(self, x: Tensor, allowed: Tensor | None, additive: bool = False) -> Tensor:
        """``x`` with ``-inf`` where ``allowed`` is False: a masked fill (zero gradients there), or
        with ``additive`` a 0 / ``-inf`` penalty added (built once per mask: one op forward, none
        backward; the gradients there are the marginals, 0 unless a gold path takes a forbidden
        entry, whose NLL is +inf anyway)."""
        if allowed is None:
            return x
        if _capturing():  # fake tensors under torch.export / torch.compile: nothing to cache
            return x.masked_fill(~allowed, NEG_INF)
        cache = self.__dict__.setdefault("_penalties", {})
        key = (id(allowed), additive)
        version = (allowed._version, allowed.data_ptr(), allowed.device)
        cached = cache.get(key)
        if cached is None or cached[0] != version:
            with torch.inference_mode(False), torch.no_grad():  # a tensor that autograd may save later
                penalty = torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, NEG_INF)
                cached = cache[key] = (version, penalty if additive else ~allowed)
        return x + cached[1] if additive else x.masked_fill(cached[1], NEG_INF)

    def _state_emissions(self, emissions: Tensor) -> Tensor:
        """Tag emissions ``[B, T, L]`` -> state emissions ``[B, T, *S]``."""
        raise NotImplementedError

    def _emission_columns(self) -> Tensor | None:
        """``[|S|]`` int64 when each state scores one tag emission column (see
        :mod:`~neurocrf.structs.engine.columns`; ``_state_emissions`` must then equal their
        expansion): backends that can read the tag emissions in place do. Default None."""
        return None

    def _gold_states(self, tags: Tensor) -> Tensor:
        """Compacted tag ids ``[B, T]`` -> flat state ids ``[B, T]`` of the unique state path."""
        raise NotImplementedError

    def _split_pair_emissions(self, pairs: Tensor, transitions: Tensor) -> tuple[Tensor, Tensor]:
        """Compacted pair emissions ``[B, T, L + 1, L]`` -> tag emissions ``[B, T, L]`` and
        per-position transitions ``[B, T, *S, C]`` (layers with ``accepts_pair_emissions``)."""
        raise NotImplementedError

    def _tag_reading(self) -> tuple[Tensor | None, Tensor | None, Tensor | None] | None:
        """How a backend that reads tag emissions and masks in place (see :meth:`_masked`) maps
        this layer's states to tags: ``(columns, automaton, labels)`` or None when it cannot.
        ``columns [C]``: the tag emission column of each last state component (-1: none; None:
        the states are the columns); ``automaton [|S| + 1, L]`` int32: the state after (state, or
        ``|S|`` at the start; tag) (None: states are tags); ``labels [|S|]``: the tag of each
        state (None: states are tags). Default None."""
        return None

    def _masked(self, quantity: str, potentials: tuple[Tensor, Tensor, Tensor], emissions: Tensor, lengths: Tensor,
                k: int = 1):
        """The function ``masked_<quantity>`` of the backend that computes ``quantity`` here, when it
        has one and this layer maps its states to tags (:meth:`_tag_reading`), else None. Such a
        function reads the uncompacted tag emissions and the mask itself: no compaction, state
        emissions or gold states are built on the host and nothing waits for the device."""
        if emissions.dim() != 3 or "triton" not in engine.candidates(self.backend, emissions.device) \
                or self._tag_reading() is None:
            return None
        name, module = engine.select(self.backend, quantity, *potentials, emissions, lengths, scan=self.scan, k=k)
        return getattr(module, "masked_" + ("kbest" if quantity == "kbest" else "nll"), None)

    # --- input handling -------------------------------------------------------------------------
    def _check(self, emissions: Tensor, mask: Tensor | None) -> Tensor:
        pairs = isinstance(emissions, Tensor) and emissions.dim() == 4
        if not isinstance(emissions, Tensor) or emissions.dim() != 3 and not pairs:
            shape = tuple(emissions.shape) if isinstance(emissions, Tensor) else type(emissions).__name__
            raise ValueError(f"emissions must be [batch, seq_len, num_tags], got {shape}")
        if pairs:
            if not self.accepts_pair_emissions:
                raise ValueError(f"{type(self).__name__} takes emissions [batch, seq_len, num_tags]; pair emissions "
                                 f"{tuple(emissions.shape)} (observation-dependent transitions) need LinearChainCRF")
            expected = (self.num_tags + 1, self.num_tags)
            if tuple(emissions.shape[2:]) != expected:
                raise ValueError(f"pair emissions must be [batch, seq_len, num_tags + 1, num_tags] with num_tags = "
                                 f"{self.num_tags}, got {tuple(emissions.shape)}")
        elif emissions.shape[2] != self.num_tags:
            raise ValueError(f"emissions have {emissions.shape[2]} tags in the last dim, the CRF has {self.num_tags}")
        if not emissions.is_floating_point():
            raise ValueError(f"emissions must be a floating point tensor, got {emissions.dtype}")
        batch, seq_len = emissions.shape[:2]
        if mask is None:
            return torch.ones((batch, seq_len), dtype=torch.bool, device=emissions.device)
        if tuple(mask.shape) != (batch, seq_len):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected [batch, seq_len] = {(batch, seq_len)}")
        if mask.dtype != torch.bool:
            if mask.is_floating_point():
                raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
            mask = mask != 0
        return mask.to(emissions.device)

    def _check_tags(self, tags: Tensor, emissions: Tensor, mask: Tensor) -> Tensor:
        batch, seq_len = emissions.shape[:2]
        if tags.dtype == torch.bool:
            if tuple(tags.shape) != (batch, seq_len, self.num_tags):
                raise ValueError(f"a boolean set of allowed tags must be [batch, seq_len, num_tags] = "
                                 f"{(batch, seq_len, self.num_tags)}, got {tuple(tags.shape)}")
            return tags.to(emissions.device)
        if tuple(tags.shape) != (batch, seq_len):
            raise ValueError(f"tags have shape {tuple(tags.shape)}, expected [batch, seq_len] = {(batch, seq_len)}")
        if tags.is_floating_point():
            raise ValueError(f"tags must be an integer tensor, got {tags.dtype}")
        tags = tags.to(device=emissions.device, dtype=torch.long)
        bad = mask & ((tags < 0) | (tags >= self.num_tags))
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"tag id {int(tags[b, t])} at [{b}, {t}] is outside [0, {self.num_tags})")
        return tags.masked_fill(~mask, 0)

    @staticmethod
    def _compute_dtype(emissions: Tensor) -> torch.dtype:
        return torch.float64 if emissions.dtype == torch.float64 else torch.float32

    @staticmethod
    def _compaction(mask: Tensor) -> tuple[Tensor | None, Tensor, int]:
        """Order that moves each row's True positions to the front (None when they already are),
        the lengths, and the longest length."""
        lengths = mask.sum(1)
        width = int(lengths.max()) if lengths.numel() else 0
        prefix = torch.arange(mask.shape[1], device=mask.device) < lengths.unsqueeze(1)
        if bool(torch.equal(prefix, mask)):
            return None, lengths, width
        order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
        return order, lengths, width

    @staticmethod
    def _gather_positions(x: Tensor, order: Tensor | None, width: int) -> Tensor:
        if order is None:
            return x[:, :width]
        index = order[:, :width]
        if x.dim() == 2:
            return x.gather(1, index)
        return x.gather(1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:]))

    @staticmethod
    def _scatter_positions(compact: Tensor, order: Tensor, width: int, fill: float, seq_len: int) -> Tensor:
        """Inverse of ``_gather_positions`` along dim ``-1`` (for ``[B, T]``) or dim 1 (for ``[B, T, L]``)."""
        batch = compact.shape[0]
        if order is None:
            out = compact.new_full((batch, seq_len, *compact.shape[2:]), fill)
            out[:, :width] = compact
            return out
        index = order[:, :width]
        if compact.dim() == 2:
            out = compact.new_full((batch, seq_len), fill)
            return out.scatter(1, index, compact)
        out = compact.new_full((batch, seq_len, *compact.shape[2:]), fill)
        return out.scatter(1, index.view(*index.shape, 1).expand_as(compact), compact)

    def _prepare(self, emissions: Tensor, mask: Tensor | None, dtype: torch.dtype | None = None):
        """Checked mask, compaction order, lengths, width, compacted emissions and potentials, in
        ``dtype`` (default: the compute dtype of ``emissions``)."""
        mask = self._check(emissions, mask)
        dtype = dtype or self._compute_dtype(emissions)
        order, lengths, width = self._compaction(mask)
        compact = self._gather_positions(emissions.to(dtype), order, width)
        start, transitions, end = self._potentials(dtype)
        if compact.dim() == 4:
            compact, transitions = self._split_pair_emissions(compact, transitions)
        return mask, order, lengths, width, compact, (start, transitions, end)

    def _chain(self, potentials: tuple[Tensor, Tensor, Tensor], state_emissions: Tensor, lengths: Tensor,
               backend: str | None = None) -> Chain:
        """The compacted chain, with this layer's backend (or ``backend``) and scan options."""
        return Chain(*potentials, state_emissions, lengths, backend=backend or self.backend, scan=self.scan,
                     parallel_threshold=self.parallel_threshold)

    def _tag_chain(self, potentials: tuple[Tensor, Tensor, Tensor], compact: Tensor, lengths: Tensor) -> Chain:
        """The chain of the compacted tag emissions ``compact``, over shared emission columns where
        the layer has them (:meth:`_emission_columns`), else over :meth:`_state_emissions`."""
        columns = self._emission_columns()
        if columns is None:
            return self._chain(potentials, self._state_emissions(compact), lengths)
        return Chain(*potentials, compact, lengths, backend=self.backend, scan=self.scan,
                     parallel_threshold=self.parallel_threshold, columns=columns)

    def _state_to_tag(self, states: Tensor) -> Tensor:
        return torch.where(states >= 0, self.state_labels[states.clamp(min=0)], states)

    # --- public API -----------------------------------------------------------------------------
    @_float_math
    def log_partition(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """``[batch]`` log partition function over the masked positions.

        Args:
            emissions: ``[batch, seq_len, num_tags]`` scores.
            mask: ``[batch, seq_len]`` bool; the chain runs over the True positions of each row.
        """
        mask, order, lengths, width, compact, potentials = self._prepare(emissions, mask)
        return self._tag_chain(potentials, compact, lengths).log_partition()

    @_float_math
    def score(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None) -> Tensor:
        """``[batch]`` unnormalised score of ``tags`` ``[batch, seq_len]``."""
        mask, order, lengths, width, compact, potentials = self._prepare(emissions, mask)
        tags = self._check_tags(tags, emissions, mask)
        if tags.dtype == torch.bool:
            raise ValueError("score needs tag ids [batch, seq_len], not a set of allowed tags")
        states = self._gold_states(self._gather_positions(tags, order, width))
        return self._tag_chain(potentials, compact, lengths).path_score(states)

    @_float_math
    def forward(
        self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None, reduction: str = "mean"
    ) -> Tensor:
        """Negative log-likelihood of ``tags``.

        Args:
            emissions: ``[batch, seq_len, num_tags]``.
            tags: ``[batch, seq_len]`` tag ids, or a bool ``[batch, seq_len, num_tags]`` set of allowed
                tags per position (partial annotation: the likelihood sums over every sequence they admit).
            mask: ``[batch, seq_len]`` bool.
            reduction: ``"none"`` (``[batch]``), ``"sum"``, ``"mean"`` (over rows) or ``"token_mean"``
                (sum divided by the number of True mask positions). An empty batch gives 0.

        A row that no tag sequence can take (every path meets a ``-inf`` score, e.g. all ``-inf``
        emissions at a position, or emissions that allow only forbidden transitions) has NLL
        ``+inf`` and zero gradients; any reduction over it is ``+inf`` too, while the gradients of
        the other rows stay as they are.
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        masked = self._masked_nll(emissions, tags, mask)
        if masked is not None:
            return self._reduce(masked[0], reduction, masked[1])
        mask, order, lengths, width, compact, potentials = self._prepare(emissions, mask)
        tags = self._check_tags(tags, emissions, mask)
        chain = self._tag_chain(potentials, compact, lengths)
        log_z = chain.log_partition()
        if tags.dtype == torch.bool:
            allowed = self._allowed_states(self._gather_positions(tags, order, width))
            clamped = chain.state_emissions().masked_fill(~allowed, NEG_INF)
            numerator = self._chain(potentials, clamped, lengths).log_partition()
        else:
            states = self._gold_states(self._gather_positions(tags, order, width))
            numerator = chain.path_score(states)
        # no valid path: log Z = numerator = -inf; the where also keeps NaN out of the gradients
        nll = torch.where(torch.isneginf(log_z), torch.full_like(log_z, float("inf")), log_z - numerator)
        return self._reduce(nll, reduction, lengths)

    @staticmethod
    def _reduce(nll: Tensor, reduction: str, lengths: Tensor) -> Tensor:
        if reduction == "none":
            return nll
        if reduction == "sum":
            return nll.sum()
        if reduction == "mean":
            return nll.sum() / max(nll.shape[0], 1)
        return nll.sum() / lengths.sum().clamp(min=1)

    def _masked_nll(self, emissions: Tensor, tags: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """``([B] NLL, lengths)`` from a backend's ``masked_nll`` (see :meth:`_masked`), or None.
        Tag ids are checked for shape and type only: an id outside ``[0, num_tags)`` at a True
        position makes its row's NLL NaN (checking values here would make the host wait)."""
        if not isinstance(tags, Tensor) or tags.dtype == torch.bool or not isinstance(emissions, Tensor) \
                or "triton" not in engine.candidates(self.backend, emissions.device):
            return None
        mask = self._check(emissions, mask)
        potentials = self._potentials(self._compute_dtype(emissions), additive=True)
        lengths = mask.sum(1)
        function = self._masked("log_partition", potentials, emissions, lengths)
        if function is None:
            return None
        batch, seq_len = emissions.shape[:2]
        if tuple(tags.shape) != (batch, seq_len) or tags.is_floating_point():
            raise ValueError(f"tags must be integer ids [batch, seq_len] = {(batch, seq_len)}, got {tags.dtype} "
                             f"{tuple(tags.shape)}")
        columns, automaton, _ = self._tag_reading()
        tags = tags.to(device=emissions.device, dtype=torch.long)
        return function(*potentials, emissions, mask, lengths, tags, automaton, columns), lengths

    @_float_math
    def window_log_partition(
        self, emissions: Tensor, mask: Tensor | None, rows: Tensor, starts: Tensor, allowed: Tensor
    ) -> Tensor:
        """``[J]`` log partition of row ``rows[j]`` with the tags at positions ``starts[j] ..
        starts[j] + W - 1`` restricted to ``allowed[j]``.

        The same value as :meth:`log_partition` of the row with every other tag's emission set to
        ``-inf`` in the window, but the forward and backward scores are computed once for the batch
        and each window costs O(W) steps: the exact confidences of all spans of a sentence take
        time linear in its length.

        Args:
            emissions: ``[batch, seq_len, num_tags]``; mask: ``[batch, seq_len]`` bool.
            rows: ``[J]`` row of each window; starts: ``[J]`` first position of each window,
                counted over the row's True mask positions (the plain position for prefix masks).
            allowed: bool ``[J, W, num_tags]``; positions past a row's length must allow every tag.
        """
        mask, order, lengths, width, compact, potentials = self._prepare(emissions, mask)
        device = emissions.device
        rows, starts, allowed = rows.to(device).long(), starts.to(device).long(), allowed.to(device)
        num, span = allowed.shape[:2]
        if tuple(allowed.shape) != (num, span, self.num_tags) or allowed.dtype != torch.bool:
            raise ValueError(
                f"allowed must be bool [windows, width, num_tags], got {allowed.dtype} {tuple(allowed.shape)}"
            )
        positions = starts.unsqueeze(1) + torch.arange(span, device=device)  # [J, W]
        outside = positions >= lengths[rows].unsqueeze(1)
        if bool((outside.unsqueeze(-1) & ~allowed).any()):
            raise ValueError("a window restricts tags past the end of its row")
        # each window shrinks to its last restricted position (at least one position)
        restricted = (~allowed).any(-1) & ~outside
        last = torch.where(restricted, torch.arange(1, span + 1, device=device), 0).amax(1).clamp(min=1)
        out = torch.empty(num, dtype=torch.float64, device=device)
        with torch.no_grad():
            graph = self._chain(potentials, self._state_emissions(compact), lengths)
            for size in last.unique().tolist():
                chosen = (last == size).nonzero().squeeze(1)
                states = self._allowed_states(allowed[chosen, :size])
                out[chosen] = graph.window_log_partition(rows[chosen], starts[chosen], states)
        return out

    def _allowed_states(self, allowed_tags: Tensor) -> Tensor:
        """Bool ``[B, T, L]`` allowed tags -> bool ``[B, T, *S]`` allowed states."""
        batch, seq_len = allowed_tags.shape[:2]
        padded = torch.cat([allowed_tags, allowed_tags.new_ones(batch, seq_len, 1)], dim=-1)
        flat = padded[..., self.state_labels.clamp(max=self.num_tags)]
        return flat.view(batch, seq_len, *self._state_shape())

    def _state_shape(self) -> tuple[int, ...]:
        start, _, _ = self._potentials(torch.float32)
        return tuple(start.shape)

    @_float_math
    def decode(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """Viterbi tags ``[batch, seq_len]`` (-1 at masked positions), found in float64 whatever
        the emissions' dtype (see :data:`~neurocrf.structs.engine.SEARCH_DTYPE`)."""
        masked = self._masked_kbest(emissions, mask, 1, normalize=False)
        if masked is not None:
            return masked[0][:, 0]
        mask, order, lengths, width, compact, potentials = self._prepare(emissions, mask, SEARCH_DTYPE)
        with torch.no_grad():
            states, _ = self._tag_chain(potentials, compact, lengths).viterbi()
        return self._scatter_positions(self._state_to_tag(states), order, width, -1, emissions.shape[1])

    @_float_math
    def nbest(self, emissions: Tensor, mask: Tensor | None = None, k: int = 5) -> tuple[Tensor, Tensor]:
        """The ``k`` most probable tag sequences, best first: the first is :meth:`decode`'s path.

        Computed in float64 whatever the emissions' dtype: on long sentences float32 path scores
        are too coarse to order the paths (see :data:`~neurocrf.structs.engine.SEARCH_DTYPE`).

        Returns:
            tags ``[batch, k, seq_len]`` (-1 at masked positions and for missing paths) and their
            float64 log-probabilities ``[batch, k]``, non-increasing (``-inf`` where a row has
            fewer than ``k`` paths; all ``-inf`` for a row without any valid path).
        """
        masked = self._masked_kbest(emissions, mask, k, normalize=True)
        if masked is not None:
            return masked
        mask, order, lengths, width, compact, potentials = self._prepare(emissions, mask, SEARCH_DTYPE)
        with torch.no_grad():
            state_emissions = self._state_emissions(compact)
            states, scores = self._chain(potentials, state_emissions, lengths).kbest(k)
            log_z = self._chain(potentials, state_emissions, lengths).log_partition()
        batch = emissions.shape[0]
        tags = self._state_to_tag(states).reshape(batch * k, width)
        order_k = None if order is None else order.repeat_interleave(k, dim=0)
        tags = self._scatter_positions(tags, order_k, width, -1, emissions.shape[1])
        log_probs = torch.where(torch.isneginf(scores), scores, scores - log_z.unsqueeze(1))
        return tags.view(batch, k, emissions.shape[1]), log_probs

    def _masked_kbest(self, emissions: Tensor, mask: Tensor | None, k: int, normalize: bool
                      ) -> tuple[Tensor, Tensor] | None:
        """Tags ``[B, k, T]`` and float64 scores (log-probabilities with ``normalize``) from a
        backend's ``masked_kbest`` (see :meth:`_masked`; it searches in float64 whatever the
        potentials' dtype), or None."""
        mask = self._check(emissions, mask)
        potentials = self._potentials(self._compute_dtype(emissions), additive=True)
        lengths = mask.sum(1)
        function = self._masked("kbest", potentials, emissions, lengths, k)
        if function is None:
            return None
        columns, _, labels = self._tag_reading()
        with torch.no_grad():
            return function(*potentials, emissions, mask, lengths, k, labels=labels, columns=columns,
                            normalize=normalize)

    @_float_math
    def marginals(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """Token posteriors ``P(tag at t)`` ``[batch, seq_len, num_tags]`` (0 at masked positions and
        in rows without a valid path).

        The gradient of :meth:`log_partition` with respect to the emissions. Differentiable when
        grad mode is on and the emissions or the layer's parameters require grad (then computed
        by autograd with ``create_graph=True``: slower, graph memory O(B T |S| C)); under
        ``torch.no_grad()`` it runs the fast forward-backward pass.

        >>> from neurocrf.structs import LinearChainCRF
        >>> crf, emissions = LinearChainCRF(3), torch.randn(2, 4, 3, requires_grad=True)
        >>> crf.marginals(emissions).sum(-1)[0, 0].backward()  # d(sum of probabilities = 1) = 0
        >>> bool(emissions.grad.abs().max() < 1e-5)
        True
        """
        mask, order, lengths, width, compact, potentials = self._prepare(emissions, mask)
        state_emissions = self._state_emissions(compact)
        graph_needed = torch.is_grad_enabled() and any(x.requires_grad for x in (state_emissions, *potentials))
        if graph_needed:
            leaf = state_emissions if state_emissions.requires_grad else state_emissions.detach().requires_grad_()
            # derivatives of the marginals are second derivatives: the torch backend's (see engine.chain)
            log_z = self._chain(potentials, leaf, lengths, backend="torch").log_partition()
            (state_marg,) = torch.autograd.grad(log_z.sum(), leaf, create_graph=True)
        else:
            with torch.no_grad():
                state_marg = self._chain(potentials, state_emissions, lengths).marginals()
        batch = emissions.shape[0]
        flat = state_marg.reshape(batch, width, self.num_states())
        tag_marg = flat.new_zeros(batch, width, self.num_tags + 1)
        tag_marg.index_add_(2, self.state_labels.clamp(max=self.num_tags), flat)
        tag_marg = tag_marg[..., : self.num_tags]
        return self._scatter_positions(tag_marg, order, width, 0.0, emissions.shape[1])

    @_float_math
    def distribution(self, emissions: Tensor, mask: Tensor | None = None) -> ChainDistribution:
        """The distribution over tag sequences as an object: log partition, ``log_prob``, marginals,
        edge marginals, entropy, cross-entropy, KL, exact samples, argmax and top-k (see
        :class:`~neurocrf.structs.distribution.ChainDistribution`).

        Args:
            emissions: ``[batch, seq_len, num_tags]`` scores.
            mask: ``[batch, seq_len]`` bool; the chain runs over the True positions of each row.
        """
        return ChainDistribution(self, emissions, mask)

    def num_states(self) -> int:
        return math.prod(self._state_shape())

    def decoder(self) -> nn.Module:
        """A plain module ``(emissions, mask) -> tags [batch, seq_len]`` (-1 at masked positions)
        with the same result as :meth:`decode`, that ``torch.export.export`` and
        ``torch.onnx.export(..., dynamo=True)`` turn into a program for any batch size and sequence
        length (see :mod:`neurocrf.structs.export`). It shares this layer's parameters."""
        return ViterbiDecoder(self)

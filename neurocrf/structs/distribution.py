"""The distribution a CRF layer defines over the tag sequences of each row, as one object.

``dist = crf.distribution(emissions, mask)`` gathers every exact quantity of ``p(y | x)``: log
partition, log-probabilities, node and edge marginals, entropy, cross-entropy and KL divergence
to another distribution, exact samples, the best path and the k best paths.

Every quantity is over original tag sequences, for every layer. The second-order CRF runs over
label pairs and the precursor-induced CRF over O states that remember the last entity, but in
both the state path follows deterministically from the tag path (a pair state is its two tags; an
O state's memory is fixed by the tags before it) and only consistent state moves are allowed, so
state paths of positive probability and tag paths are in bijection: sums over state paths
(entropy, expected scores) are sums over tag sequences.

Entropy and divergences come from expected scores: ``H(p) = log Z_p - E_p[score_p]`` and
``H(p, q) = log Z_q - E_p[score_q]``, with the expectations taken from p's node and edge marginals.
Torch only, whatever the layer's backend: everything runs in float64 on the engine's reference
(:mod:`neurocrf.structs.engine.reference`, the plain log-space forward-backward built of
differentiable operations), because entropies, divergences and differentiable marginals need
edge marginals, expectations, exact samples and gradients of every order, which no backend's
fast scan gives (their gradients are first derivatives, computed by hand). The paths and their
scores come through :class:`~neurocrf.structs.engine.chain.Chain`, so from the layer's backend.
For the training loss alone, the layer's ``forward`` (its backend's fast scan with a hand-written
backward) is cheaper.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor, nn

from neurocrf.structs.engine import reference
from neurocrf.structs.engine.chain import Chain, path_score
from neurocrf.structs.engine.semiring import NEG_INF

F = TypeVar("F", bound=Callable)
T = TypeVar("T")


def _no_autocast(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: "ChainDistribution", *args, **kwargs):
        with torch.autocast(device_type=self.mask.device.type, enabled=False):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _memo(method: Callable[["ChainDistribution"], T]) -> Callable[["ChainDistribution"], T]:
    """Compute a quantity once per grad mode: a value first built under ``torch.no_grad`` is not
    reused (without its graph) when gradients are wanted later."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: "ChainDistribution") -> T:
        key = (name, torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        if key not in self._cache:
            with torch.autocast(device_type=self.mask.device.type, enabled=False):
                self._cache[key] = method(self)
        return self._cache[key]

    return wrapper


class ChainDistribution:
    """``p(y | x)`` of a CRF layer over the tag sequences of each row (built by ``crf.distribution``).

    Args:
        crf: a :class:`~neurocrf.structs.base.ChainCRF` layer.
        emissions: ``[batch, seq_len, num_tags]`` (or pair emissions for the first-order layer).
        mask: ``[batch, seq_len]`` bool; each row's chain runs over its True positions. Rows with
            no True position hold the empty sequence with probability 1.

    Results come in the layer's compute dtype (float64 for float64 emissions, else float32) and
    are differentiable with respect to the emissions and the layer's parameters. Rows without a
    valid path (every sequence forbidden) have ``log_partition`` ``-inf``, zero marginals, entropy
    0, tags -1 and log-probabilities ``-inf``.

    >>> from neurocrf.structs import LinearChainCRF
    >>> crf = LinearChainCRF(3)
    >>> dist = crf.distribution(torch.randn(2, 4, 3), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool())
    >>> dist.entropy().shape, dist.edge_marginals.shape, dist.sample(5).shape
    (torch.Size([2]), torch.Size([2, 4, 3, 3]), torch.Size([5, 2, 4]))
    >>> bool((dist.log_prob(dist.argmax) >= dist.log_prob(dist.sample(5))).all())
    True
    """

    def __init__(self, crf: nn.Module, emissions: Tensor, mask: Tensor | None = None) -> None:
        mask, order, lengths, width, compact, potentials = crf._prepare(emissions, mask)
        self.crf = crf
        self.mask = mask
        self.lengths = lengths
        self._order, self._width = order, width
        self._potentials = potentials
        self._state_emissions = crf._state_emissions(compact)
        self._dtype = compact.dtype
        self.batch_size, self.seq_len = emissions.shape[:2]
        self._cache: dict[tuple[str, bool, bool], Any] = {}

    @property
    @_memo
    def log_partition(self) -> Tensor:
        """``[batch]`` log partition function (0 for empty rows, ``-inf`` without a valid path)."""
        return self._log_z.to(self._dtype)

    @_no_autocast
    def log_prob(self, tags: Tensor) -> Tensor:
        """Log-probabilities ``[*sample, batch]`` of tag sequences ``[*sample, batch, seq_len]``.

        Values at masked positions are ignored. ``-inf`` for sequences the layer forbids and for
        rows holding -1 at a True position (how :meth:`sample`, :attr:`argmax` and :meth:`topk`
        mark a missing sequence)."""
        if tags.dim() < 2 or tuple(tags.shape[-2:]) != (self.batch_size, self.seq_len):
            raise ValueError(f"tags must be [..., batch, seq_len] with [batch, seq_len] = "
                             f"{(self.batch_size, self.seq_len)}, got {tuple(tags.shape)}")
        if tags.is_floating_point() or tags.dtype == torch.bool:
            raise ValueError(f"tags must be an integer tensor, got {tags.dtype}")
        lead = tags.shape[:-2]
        flat = tags.reshape(math.prod(lead) * self.batch_size, self.seq_len)
        flat = flat.to(device=self.mask.device, dtype=torch.long)
        mask = self.mask.repeat(flat.shape[0] // max(self.batch_size, 1), 1)
        bad = mask & ((flat < -1) | (flat >= self.crf.num_tags))
        if bool(bad.any()):
            row, position = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"tag id {int(flat[row, position])} at position {position} of sequence {row} is "
                             f"outside [0, {self.crf.num_tags})")
        missing = (mask & (flat == -1)).any(1)
        flat = flat.masked_fill(~mask | (flat == -1), 0)
        rows = torch.arange(self.batch_size, device=flat.device).repeat(flat.shape[0] // max(self.batch_size, 1))
        order = None if self._order is None else self._order[rows]
        states = self.crf._gold_states(self.crf._gather_positions(flat, order, self._width))
        log_probs = self._normalised(self._path_scores(states, rows), rows).masked_fill(missing, NEG_INF)
        return log_probs.reshape(lead + (self.batch_size,))

    def _path_scores(self, states: Tensor, rows: Tensor) -> Tensor:
        """``[R]`` float64 unnormalised scores of compacted state paths ``[R, width]`` of batch rows
        ``rows`` (float32 sums of a long path would lose the order of nearly equal paths)."""
        start, moves, end = (x.to(torch.float64) for x in self._potentials)
        if moves.dim() > start.dim() + 1:  # per-position transitions belong to their rows
            moves = moves[rows]
        emissions = self._state_emissions[rows].to(torch.float64)
        return path_score(start, moves, end, emissions, states, self.lengths[rows], self.crf.backend)

    def _normalised(self, scores: Tensor, rows: Tensor) -> Tensor:
        """Path scores ``[R]`` of rows ``rows`` -> log-probabilities in the compute dtype."""
        log_z = self._log_z[rows]
        finite = torch.isfinite(log_z) & ~torch.isneginf(scores)
        value = scores.to(torch.float64) - reference.safe_log_z(log_z)
        return torch.where(finite, value, torch.full_like(value, NEG_INF)).to(self._dtype)

    # --- exact differentiable forward-backward --------------------------------------------------
    @property
    @_memo
    def _augmented(self) -> tuple[Tensor, Tensor, Tensor]:
        """float64 augmented ``start``, ``moves`` and time-major ``emissions`` ``[T + 1, B, *S']``."""
        return reference.augmented(*self._potentials, self._state_emissions, self.lengths)

    @property
    @_memo
    def _alphas(self) -> Tensor:
        return reference.forward_scores(*self._augmented)

    @property
    @_memo
    def _log_z(self) -> Tensor:
        return reference.log_z_from(self._alphas)

    @property
    @_memo
    def _posteriors(self) -> tuple[Tensor, Tensor]:
        """Augmented node ``[T + 1, B, *S']`` and edge ``[T, B, *S', C']`` posteriors."""
        _, moves, emissions = self._augmented
        betas = reference.backward_scores(moves, emissions)
        nodes = reference.state_posteriors(self._alphas, betas, self._log_z)
        edges = reference.edge_posteriors(moves, emissions, self._alphas, betas, self._log_z)
        return nodes, edges

    def _inner(self, x: Tensor, extra: int = 0) -> Tensor:
        """Augmented ``[steps, B, *S', (C')]`` -> compacted original states ``[B, steps, |S|, (C)]``."""
        size = self._potentials[1].shape[-1]
        order = self._potentials[0].dim()
        x = x[(slice(None), slice(None)) + (slice(0, size),) * (order + extra)]
        return x.reshape(x.shape[0], x.shape[1], size ** order, *x.shape[2 + order:]).transpose(0, 1)

    def _scatter(self, compact: Tensor, fill: float) -> Tensor:
        """Compacted ``[B, width, ...]`` -> ``[B, seq_len, ...]`` at each row's True positions."""
        tail = compact.shape[2:]
        flat = compact.reshape(compact.shape[0], compact.shape[1], math.prod(tail))
        out = self.crf._scatter_positions(flat, self._order, self._width, fill, self.seq_len)
        return out.reshape(out.shape[0], self.seq_len, *tail)

    @property
    @_memo
    def marginals(self) -> Tensor:
        """``[batch, seq_len, num_tags]`` tag posteriors (0 at masked positions), differentiable."""
        nodes, _ = self._posteriors
        states = self._inner(nodes[: self._width])  # [B, width, |S|]
        labels = self.crf.state_labels.clamp(max=self.crf.num_tags)
        tags = states.new_zeros(*states.shape[:2], self.crf.num_tags + 1).index_add(2, labels, states)
        return self._scatter(tags[..., : self.crf.num_tags], 0.0).to(self._dtype)

    @property
    @_memo
    def edge_marginals(self) -> Tensor:
        """``[batch, seq_len, num_tags, num_tags]``: entry ``[b, t, i, j]`` is the probability of
        tag ``i`` at the True position before ``t`` and tag ``j`` at ``t`` (0 where ``t`` is masked
        or is its row's first True position), differentiable."""
        _, edges = self._posteriors
        n, size = self.crf.num_tags, self._potentials[1].shape[-1]
        num_states = size ** self._potentials[0].dim()
        states = self._inner(edges[: max(self._width - 1, 0)], extra=1)  # [B, width - 1, |S|, C]
        source = torch.arange(num_states, device=states.device)
        target = (source % (num_states // size)).unsqueeze(1) * size + torch.arange(size, device=states.device)
        labels = self.crf.state_labels.clamp(max=n)
        pairs = (labels[source].unsqueeze(1) * (n + 1) + labels[target]).reshape(-1)
        flat = states.reshape(*states.shape[:2], num_states * size)
        tags = flat.new_zeros(*flat.shape[:2], (n + 1) ** 2).index_add(2, pairs, flat)
        tags = tags.view(*flat.shape[:2], n + 1, n + 1)[..., :n, :n]
        tags = torch.cat([tags.new_zeros(tags.shape[0], min(self._width, 1), n, n), tags], dim=1)
        return self._scatter(tags, 0.0).to(self._dtype)

    def _expected_score(self, other: "ChainDistribution") -> Tensor:
        """``[batch]`` expectation under this distribution of ``other``'s path score (float64)."""
        nodes, edges = self._posteriors
        start, moves, emissions = other._augmented
        total = reference.expectation(nodes[0], start, tuple(range(1, nodes.dim() - 1)))
        node_dims = (0,) + tuple(range(2, nodes.dim()))
        total = total + reference.expectation(nodes, emissions, node_dims)
        into = moves[1:] if moves.dim() > emissions.dim() else moves
        return total + reference.expectation(edges, into, (0,) + tuple(range(2, edges.dim())))

    @_no_autocast
    def entropy(self) -> Tensor:
        """``[batch]`` entropy ``H(p) = -sum_y p(y) log p(y)`` over tag sequences (nats)."""
        log_z = self._log_z
        value = torch.where(torch.isfinite(log_z), log_z - self._expected_score(self), torch.zeros_like(log_z))
        return value.to(self._dtype)

    def _check_other(self, other: "ChainDistribution") -> None:
        if not isinstance(other, ChainDistribution):
            raise TypeError(f"other must be a ChainDistribution, got {type(other).__name__}")
        mine, theirs = self.crf, other.crf
        same = (type(mine) is type(theirs) and mine.num_tags == theirs.num_tags
                and mine._state_shape() == theirs._state_shape()
                and torch.equal(mine.state_labels, theirs.state_labels.to(mine.state_labels.device)))
        memory = getattr(mine, "memory_state", None)
        if same and memory is not None:
            same = torch.equal(memory, theirs.memory_state.to(memory.device))
        if not same:
            raise ValueError(f"cross-entropy and KL need distributions of the same layer kind over the same states: "
                             f"got {mine!r} and {theirs!r}")
        if self.mask.shape != other.mask.shape or not torch.equal(self.mask, other.mask.to(self.mask.device)):
            raise ValueError(f"cross-entropy and KL need the same mask: got masks of shapes {tuple(self.mask.shape)}"
                             f" and {tuple(other.mask.shape)} (or different True positions)")

    @_no_autocast
    def cross_entropy(self, other: "ChainDistribution") -> Tensor:
        """``[batch]`` cross-entropy ``H(p, q) = -sum_y p(y) log q(y)`` with ``q = other`` (``+inf``
        where p gives mass to a sequence q forbids, 0 for rows where p has no valid path)."""
        self._check_other(other)
        expected = self._expected_score(other)
        has_mass = torch.isfinite(self._log_z)
        lost = torch.isneginf(expected) | ~torch.isfinite(other._log_z)
        value = reference.safe_log_z(other._log_z) - expected.masked_fill(lost, 0.0)
        value = torch.where(lost, torch.full_like(value, float("inf")), value)
        return torch.where(has_mass, value, torch.zeros_like(value)).to(self._dtype)

    @_no_autocast
    def kl(self, other: "ChainDistribution") -> Tensor:
        """``[batch]`` KL divergence ``KL(p || q) = H(p, q) - H(p)`` with ``q = other``."""
        cross = self.cross_entropy(other).to(torch.float64)
        value = torch.where(torch.isinf(cross), cross, cross - self.entropy().to(torch.float64))
        return value.to(self._dtype)

    # --- sampling and decoding ------------------------------------------------------------------
    @_no_autocast
    def sample(self, num: int = 1, generator: torch.Generator | None = None) -> Tensor:
        """``num`` exact samples ``[num, batch, seq_len]`` (-1 at masked positions and in rows
        without a valid path) by forward filtering, backward sampling."""
        if num < 0:
            raise ValueError(f"the number of samples must be non-negative, got {num}")
        with torch.no_grad():
            _, moves, emissions = self._augmented
            states = reference.sample_states(moves, emissions, self._alphas, num, generator)
            size, order = self._potentials[1].shape[-1], self._potentials[0].dim()
            original = reference.original_states(states[..., : self._width], size, order)  # [num, B, width]
            tags = self.crf._state_to_tag(original)
            tags = tags.masked_fill(~torch.isfinite(self._log_z).view(1, self.batch_size, 1), -1)
            return self._scatter_rows(tags)

    def _scatter_rows(self, tags: Tensor) -> Tensor:
        """Compacted tags ``[K, B, width]`` -> ``[K, B, seq_len]`` (-1 at masked positions)."""
        copies = tags.shape[0]
        order = None if self._order is None else self._order.repeat(copies, 1)
        compact = tags.reshape(copies * self.batch_size, self._width)
        flat = self.crf._scatter_positions(compact, order, self._width, -1, self.seq_len)
        return flat.view(copies, self.batch_size, self.seq_len)

    @property
    @_memo
    def argmax(self) -> Tensor:
        """``[batch, seq_len]`` most probable tag sequence (-1 at masked positions and in rows
        without a valid path)."""
        return self.topk(1)[0][:, 0]

    @_no_autocast
    def topk(self, k: int) -> tuple[Tensor, Tensor]:
        """The ``k`` most probable tag sequences: tags ``[batch, k, seq_len]`` (-1 at masked positions
        and for missing sequences) and their log-probabilities ``[batch, k]`` (``-inf`` where a row
        has fewer than ``k`` sequences), differentiable. The paths are ranked in float64 and the
        first is the layer's ``decode`` path; the log-probabilities, computed in float64 and
        rounded to the compute dtype, are non-increasing (float32 may round neighbours to one
        value on long sentences: ``crf.nbest`` gives them in float64)."""
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        batch = self.batch_size
        if batch == 0:
            return (torch.zeros(0, k, self.seq_len, dtype=torch.long, device=self.mask.device),
                    self._state_emissions.new_zeros(0, k))
        with torch.no_grad():
            graph = Chain(*self._potentials, self._state_emissions, self.lengths, backend=self.crf.backend)
            states, best = graph.kbest(k)
        found = torch.isfinite(best)  # [B, k]
        rows = torch.arange(batch, device=states.device).repeat_interleave(k)
        scores = self._path_scores(states.clamp(min=0).reshape(batch * k, self._width), rows).view(batch, k)
        log_probs = torch.where(found, self._normalised(scores.reshape(-1), rows).view(batch, k),
                                torch.full_like(scores, NEG_INF))
        tags = self.crf._state_to_tag(states).masked_fill(~found.unsqueeze(-1), -1)
        return self._scatter_rows(tags.transpose(0, 1)).transpose(0, 1), log_probs

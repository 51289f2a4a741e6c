"""The batched chain engine shared by every CRF layer.

A chain is a first-order Markov chain over a state space of shape ``S = (C,) * n``: a state is a
tuple of ``n`` components, and a transition goes from ``(a, *r)`` to ``(*r, c)``, reading one new
component ``c``. A first-order CRF has ``n = 1`` (a state is a tag); the second-order CRF has
``n = 2`` (a state is a pair of tags). Transition scores are a tensor ``[*S, C]`` indexed by the
source state and the new component, and every scan step is ``plus_a(alpha[a, *r] + W[a, *r, c])``.

Inputs are *compacted*: each row's valid positions come first and ``lengths`` says how many there
are (the layers compact arbitrary masks before calling in). To run every row over the same number
of steps with no per-step masking, :class:`Chain` adds an absorbing END value to every component:
a row moves to END after its last position (paying the end score) and stays there through the
padding and one extra final step. Rows of length 0 start in END, so their log partition is 0.

Potentials (one dtype): ``start`` ``[*S]``, ``transitions`` ``[*S, C]``, ``end`` ``[*S]``,
``emissions`` ``[batch, seq_len, *S]`` and ``lengths`` ``[batch]``. Transitions may also be given
per position, ``[batch, seq_len, *S, C]`` (observation-dependent transitions): entry ``[b, t]``
scores the move into compacted position ``t`` of row ``b``; entries at ``t = 0`` are unused.

The log partition and marginals run a rescaled forward-backward in float64 probability space
(matrix products, several times faster than logsumexp) whenever it can be certified to equal the
log-space computation (see :class:`_ExpScan`), and the float64 log-space scan otherwise.

The max and k-max scans (Viterbi, k best) compare whole path scores, which on a long sentence
reach magnitudes where float32 numbers are far apart (1e-3 at 1e4): paths that differ in a
position or two would tie or swap. They always run in float64 (:data:`SEARCH_DTYPE`), where sums of
float32 scores are exact for any practical length, so the Viterbi path is the first of the k best.

Time O(T |S| C) per row for every quantity; training memory O(B T |S|): the hand-written backward
pass keeps the forward scores only, never a graph of ``[B, T, |S|, C]`` intermediates. Only when
that backward pass is itself differentiated (``create_graph=True``: gradients of marginals or of
an entropy, Hessian-vector products) does autograd run through a log-space scan
(:func:`autograd_log_partition`), which gives derivatives of every order at that memory cost.

Empty batches and rows of length 0 are valid everywhere. A row without any path of finite score
has log partition ``-inf``, zero marginals and gradients, and Viterbi states -1.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from neurocrf.structs import fast_first_order, fast_pairs
from neurocrf.structs.semiring import KMaxSemiring, LogSemiring, top_first

NEG_INF = float("-inf")
# dtype of the max and k-max scans, whatever the potentials' dtype (see the module docstring)
SEARCH_DTYPE = torch.float64
# Edge-marginal blocks above this many elements are computed in time chunks.
_EDGE_CHUNK_ELEMENTS = 1 << 24


def _augment(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
             ) -> tuple[Tensor, Tensor, Tensor]:
    """Potentials with an absorbing END value on every component; emissions come out time-major
    ``[T + 1, B, *S']``."""
    batch, seq_len = emissions.shape[:2]
    order, size = start.dim(), transitions.shape[-1]
    end_index = size
    inner = (slice(0, size),) * order
    full = (size + 1,) * order

    aug_start = start.new_full(full, NEG_INF)
    aug_start[inner] = start
    aug_start[(end_index,) * order] = 0.0

    # per-position moves are time-major [T + 1, B, *S', C']; row t holds the moves into position t
    lead = (seq_len + 1, batch) if _per_position(transitions, emissions) else ()
    every = (slice(None),) * len(lead)
    aug_moves = transitions.new_full(lead + full + (size + 1,), NEG_INF)
    if lead:
        aug_moves[(slice(0, seq_len), slice(None)) + inner + (slice(0, size),)] = transitions.transpose(0, 1)
    else:
        aug_moves[inner + (slice(0, size),)] = transitions
    aug_moves[every + inner + (end_index,)] = end
    aug_moves[every + (slice(None),) * (order - 1) + (end_index, end_index)] = 0.0  # ended rows stay ended

    active = _active(lengths, seq_len).t()  # [T, B]
    aug_emissions = emissions.new_full((seq_len + 1, batch) + full, NEG_INF)
    aug_emissions[(slice(0, seq_len), slice(None)) + inner] = torch.where(
        active.view(seq_len, batch, *([1] * order)), emissions.transpose(0, 1), emissions.new_full((), NEG_INF))
    ended = torch.cat([~active, active.new_ones(1, batch)], dim=0)
    aug_emissions[(slice(None), slice(None)) + (slice(None),) * (order - 1) + (end_index,)] = torch.where(
        ended.view(seq_len + 1, batch, *([1] * (order - 1))), emissions.new_zeros(()), emissions.new_full((), NEG_INF))
    return aug_start, aug_moves, aug_emissions


def _original_gradients(size: int, order: int, grad_start: Tensor, grad_moves: Tensor | None, grad_emissions: Tensor
                        ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
    """Gradients of the augmented potentials -> gradients of start, transitions, end, emissions."""
    inner = (slice(0, size),) * order
    steps = grad_emissions.shape[0] - 1
    moves = end = None
    if grad_moves is not None and _per_position(grad_moves, grad_emissions):  # [T + 1, B, *S', C']
        moves = grad_moves[(slice(0, steps), slice(None)) + inner + (slice(0, size),)].transpose(0, 1)
        end = grad_moves[(slice(None), slice(None)) + inner + (size,)].sum((0, 1))
    elif grad_moves is not None:
        moves = grad_moves[inner + (slice(0, size),)]
        end = grad_moves[inner + (size,)]
    emissions = grad_emissions[(slice(0, steps), slice(None)) + inner].transpose(0, 1)
    return grad_start[inner], moves, end, emissions


@functools.lru_cache(maxsize=64)
def _state_map(size: int, order: int, device: torch.device) -> Tensor:
    """Augmented flat state -> original flat state, or -1 for states with an END component."""
    grid = torch.stack(torch.meshgrid(*[torch.arange(size + 1)] * order, indexing="ij"), -1).reshape(-1, order)
    weights = torch.tensor([size ** (order - 1 - i) for i in range(order)])
    original = (grid * weights).sum(-1)
    return torch.where((grid < size).all(-1), original, -1).to(device)


def _per_position(transitions: Tensor, emissions: Tensor) -> bool:
    """Per-position transitions (``[B, T, *S, C]``, or augmented ``[T + 1, B, *S', C']``) have
    one dimension more than the emissions (``[B, T, *S]``); shared ones (``[*S, C]``) one less."""
    return transitions.dim() > emissions.dim()


def _moves_into(moves: Tensor, emissions: Tensor, t: int) -> Tensor:
    """The augmented transition scores into position ``t``: ``[*S', C']`` or, per position, ``[B, *S', C']``."""
    return moves[t] if _per_position(moves, emissions) else moves


def _active(lengths: Tensor, seq_len: int) -> Tensor:
    """``[batch, seq_len]`` bool: position < length."""
    return torch.arange(seq_len, device=lengths.device) < lengths.unsqueeze(1)


class Chain:
    """A batch of chains with absorbing END states, ready for any semiring scan.

    Args:
        start: ``[*S]`` start scores.
        transitions: ``[*S, C]`` transition scores, or ``[batch, seq_len, *S, C]`` per position.
        end: ``[*S]`` end scores.
        emissions: ``[batch, seq_len, *S]`` state scores at each compacted position.
        lengths: ``[batch]`` number of valid positions per row.
    """

    def __init__(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> None:
        batch, seq_len = emissions.shape[:2]
        order = start.dim()
        size = transitions.shape[-1]
        if tuple(start.shape) != (size,) * order or tuple(end.shape) != tuple(start.shape):
            raise ValueError(f"start {tuple(start.shape)} and end {tuple(end.shape)} must have the state shape "
                             f"{(size,) * order} of transitions {tuple(transitions.shape)}")
        self.per_position = _per_position(transitions, emissions)
        expected = ((batch, seq_len) if self.per_position else ()) + (size,) * (order + 1)
        if tuple(transitions.shape) != expected:
            raise ValueError(f"transitions {tuple(transitions.shape)} must be [*S, C] = {(size,) * (order + 1)} or "
                             f"per position [batch, seq_len, *S, C] = {(batch, seq_len) + (size,) * (order + 1)}")
        self.batch, self.seq_len, self.order, self.size = batch, seq_len, order, size
        self.original_states = size ** order
        self.lengths = lengths
        self.to_original = _state_map(size, order, lengths.device)
        self._originals = (start, transitions, end, emissions)
        self._spread: float | None = None
        self._augmented: tuple[Tensor, Tensor, Tensor] | None = None
        self._messages: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None

    def _augmented_potentials(self) -> tuple[Tensor, Tensor, Tensor]:
        """Detached augmented ``start``, ``transitions`` and time-major ``emissions`` (built once)."""
        if self._augmented is None:
            with torch.no_grad():  # log_partition differentiates through its own Function
                self._augmented = _augment(*self._originals, self.lengths)
        return self._augmented

    @property
    def start(self) -> Tensor:
        return self._augmented_potentials()[0]

    @property
    def transitions(self) -> Tensor:
        return self._augmented_potentials()[1]

    @property
    def emissions(self) -> Tensor:
        return self._augmented_potentials()[2]

    def step_spread(self) -> float:
        """Upper bound (nats) on how far one scan step can move any state relative to the best one.

        ``-inf`` scores (constraints, partial labels) are exact zeros and do not count."""
        if self._spread is None:
            self._spread = fast_first_order.step_spread(*self._originals, self.original_states)
        return self._spread

    # --- log semiring ---------------------------------------------------------------------------
    def log_partition(self) -> Tensor:
        """``[batch]`` log partition function (differentiable to any order: a hand-written first
        derivative, and autograd through a log-space scan when a graph of it is asked for)."""
        start, moves, end, emissions = self._originals
        if self.batch == 0:
            return autograd_log_partition(start, moves, end, emissions, self.lengths)
        # >>> fast paths: first order or pair states, shared transitions (fast_first_order, fast_pairs)
        if self._fast_path():
            def fallback(*potentials):
                return _LogPartition.apply(*potentials, self.lengths, self.step_spread())

            if self.order == 1:
                log_z = fast_first_order.log_partition(*self._originals, self.lengths, self.step_spread, fallback)
            else:
                convert = functools.partial(_original_gradients, self.size, self.order)
                log_z = fast_pairs.log_partition(self._originals, self._augmented_potentials(), self.step_spread,
                                                 convert, fallback)
            if log_z is not None:  # exactly 0 for empty rows already
                return log_z
        # <<< fast paths
        log_z = _LogPartition.apply(start, moves, end, emissions, self.lengths, self.step_spread())
        return torch.where(self.lengths > 0, log_z, torch.zeros_like(log_z))  # exactly 0 for empty rows

    def _fast_path(self) -> bool:
        """Whether :mod:`~neurocrf.structs.fast_first_order` (order 1) or
        :mod:`~neurocrf.structs.fast_pairs` (order 2) may be tried on this chain."""
        return fast_first_order.applies(self.order, self.per_position, self.batch, self.seq_len, self.lengths.device)

    def marginals(self) -> Tensor:
        """``[batch, seq_len, |S|]`` posteriors of the original flat states (0 past each length)."""
        if self.batch == 0 or self.seq_len == 0:
            return self._originals[3].new_zeros(self.batch, self.seq_len, self.original_states)
        # >>> fast path: first order with shared transitions (fast_first_order), when certified
        if self.order == 1 and self._fast_path():
            with torch.no_grad():
                fast = fast_first_order.forward_backward(*self._originals, self.lengths, self.step_spread)
                marg = None if fast is None else fast.node_marginals()
                if marg is not None:
                    return marg.to(self._originals[3].dtype)
        # <<< fast path
        scan = _ExpScan.attempt(self.start, self.transitions, self.emissions, self.step_spread())
        if scan is not None and scan.backward_ok():
            marg = scan.node_marginals()
        else:
            start, moves, emissions = (x.to(torch.float64) for x in (self.start, self.transitions, self.emissions))
            alphas = _forward_scores(start, moves, emissions)
            log_z = _log_partition_from(alphas)
            betas = _backward_scores(moves, emissions)
            marg = _node_marginals(alphas, betas, log_z)
        marg = marg[: self.seq_len].to(self.emissions.dtype)  # [T, B, *S']
        inner = (slice(None), slice(None)) + (slice(0, self.size),) * self.order
        return marg[inner].reshape(self.seq_len, self.batch, -1).transpose(0, 1)

    def _log_messages(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """float64 augmented ``start``, ``transitions``, ``emissions`` and the forward and backward
        log scores ``[T + 1, B, *S']`` (computed once per chain)."""
        if self._messages is None:
            start, moves, emissions = (x.to(torch.float64) for x in self._augmented_potentials())
            self._messages = (start, moves, emissions, _forward_scores(start, moves, emissions),
                              _backward_scores(moves, emissions))
        return self._messages

    def window_log_partition(self, rows: Tensor, starts: Tensor, allowed: Tensor) -> Tensor:
        """``[J]`` log partition of row ``rows[j]`` with the states at positions ``starts[j] ..
        starts[j] + W - 1`` restricted to ``allowed[j]`` (bool ``[J, W, *S]``, original states).

        Every window must lie inside its row (``starts + W <= lengths[rows]``). The forward and
        backward scores are computed once per chain; each window then costs O(W |S| C), so the
        restricted partition functions of many short windows (span confidences) take time linear
        in the sentence length instead of one full scan each. float64, no gradient.
        """
        num, width = allowed.shape[:2]
        if num == 0:
            return torch.zeros(0, dtype=torch.float64, device=allowed.device)
        if bool((starts < 0).any()) or bool((starts + width > self.lengths[rows]).any()):
            raise ValueError("every window must lie inside its row: 0 <= start and start + width <= length")
        start, moves, emissions, alphas, betas = self._log_messages()
        inner = (slice(None), slice(None)) + (slice(0, self.size),) * self.order
        keep = allowed.new_ones((num, width) + (self.size + 1,) * self.order)
        keep[inner] = allowed

        def moves_into(positions: Tensor) -> Tensor:  # [J, *S', C'] or the shared [*S', C']
            return moves[positions, rows] if self.per_position else moves

        first = start.expand(num, *start.shape)
        before = alphas[(starts - 1).clamp(min=0), rows]  # [J, *S']
        continued = torch.logsumexp(before.unsqueeze(-1) + moves_into(starts), dim=1)
        nd = start.dim()
        alpha = torch.where((starts == 0).view(-1, *([1] * nd)), first, continued)
        for i in range(width):
            if i > 0:
                alpha = torch.logsumexp(alpha.unsqueeze(-1) + moves_into(starts + i), dim=1)
            alpha = (alpha + emissions[starts + i, rows]).masked_fill(~keep[:, i], NEG_INF)
        after = betas[starts + width - 1, rows]
        return torch.logsumexp((alpha + after).reshape(num, -1), dim=1)

    # --- max and k-max semirings ----------------------------------------------------------------
    def _map_states(self, flat: Tensor) -> Tensor:
        return self.to_original[flat]

    def _previous(self, source: Tensor, state: Tensor) -> Tensor:
        """Flat source ``(a, *r)`` of a transition into flat destination ``(*r, c)``."""
        width = self.size + 1
        rest = width ** (self.order - 1)
        return source * rest + torch.div(state, width, rounding_mode="floor")

    def _for_search(self) -> Chain | None:
        """This chain with its potentials in :data:`SEARCH_DTYPE`, or None if they are already."""
        if self._originals[3].dtype == SEARCH_DTYPE:
            return None
        return Chain(*(x.to(SEARCH_DTYPE) for x in self._originals), self.lengths)

    def viterbi(self) -> tuple[Tensor, Tensor]:
        """Best path: original flat states ``[batch, seq_len]`` (-1 past each length), float64
        scores ``[batch]``."""
        wide = self._for_search()
        if wide is not None:
            return wide.viterbi()
        # >>> fast paths: first order or pair states, shared transitions (fast_first_order, fast_pairs)
        if self.order == 1 and self._fast_path():
            return fast_first_order.viterbi(*self._originals, self.lengths)
        if self.order == 2 and self._fast_path() and fast_pairs.viterbi_pays_off(self.batch, self.size + 1):
            states, best = fast_pairs.viterbi(self.start, self.transitions, self.emissions)
            found = (best > NEG_INF).unsqueeze(1)  # rows without any path: all -1
            return torch.where(found, self._map_states(states), -1), best
        # <<< fast paths
        batch, width = self.batch, self.size + 1
        # the emission E[t, b, *r, c] of the destination does not depend on the source a, so it is
        # added after the max over a: no [T, B, |S'|, C'] tensor of summed scores is built
        score = self.start + self.emissions[0]
        pointers = []
        if batch == 0:
            return self.lengths.new_zeros(0, self.seq_len), score.new_zeros(0)
        for t in range(1, self.emissions.shape[0]):
            score, pointer = (score.unsqueeze(-1) + _moves_into(self.transitions, self.emissions, t)).max(dim=1)
            score = score + self.emissions[t]
            pointers.append(pointer.reshape(batch, -1))
        best_score, state = score.reshape(batch, -1).max(dim=1, keepdim=True)
        if not pointers:
            return self._map_states(state.new_zeros(batch, 0)), best_score.squeeze(1)
        # flat source state (a, *r) of flat destination (*r, c) reached from a
        rest = width ** (self.order - 1)
        kept = torch.arange(width ** self.order, device=state.device) // width
        previous = torch.stack(pointers) * rest + kept  # [T, B, |S'|]
        path = []
        for t in range(previous.shape[0] - 1, -1, -1):
            state = previous[t].gather(1, state)
            path.append(state)
        states = self._map_states(torch.cat(path[::-1], dim=1))
        return states.masked_fill(torch.isneginf(best_score), -1), best_score.squeeze(1)  # -1: no valid path

    def kbest(self, k: int) -> tuple[Tensor, Tensor]:
        """The k best paths: original flat states ``[batch, k, seq_len]`` and float64 scores
        ``[batch, k]``, best first (the first path is :meth:`viterbi`'s).

        Where fewer than k paths exist the missing ones have score ``-inf`` and states -1.
        """
        wide = self._for_search()
        if wide is not None:
            return wide.kbest(k)
        semiring = KMaxSemiring(k)
        steps, batch = self.seq_len + 1, self.batch
        if batch == 0:
            return self.lengths.new_zeros(0, k, self.seq_len), self.emissions.new_zeros(0, k)
        num_states = (self.size + 1) ** self.order
        pointers = torch.empty((steps, batch, num_states, k), dtype=torch.long, device=self.emissions.device)
        score = self.emissions.new_full(self.emissions.shape[1:] + (k,), NEG_INF)
        score[..., 0] = self.start + self.emissions[0]
        moves = self.transitions.unsqueeze(-1)
        for t in range(1, steps):
            best, pointer = semiring.plus_with_argmax(score.unsqueeze(-2) + _moves_into(moves, self.emissions, t))
            score = best + self.emissions[t].unsqueeze(-1)
            pointers[t] = pointer.reshape(batch, num_states, k)
        best_scores, flat = top_first(score.reshape(batch, num_states * k), k)
        state, rank = torch.div(flat, k, rounding_mode="floor"), flat % k
        pointers = pointers.reshape(steps, batch, num_states * k)
        paths = torch.empty((batch, k, self.seq_len), dtype=torch.long, device=state.device)
        for t in range(steps - 1, 0, -1):
            pointer = pointers[t].gather(1, state * k + rank)
            state = self._previous(torch.div(pointer, k, rounding_mode="floor"), state)
            rank = pointer % k
            paths[:, :, t - 1] = state
        paths = self._map_states(paths)
        paths = paths.masked_fill(~torch.isfinite(best_scores).unsqueeze(-1), -1)
        return paths, best_scores

    def parallel_log_partition(self) -> Tensor:
        """log Z by a log-depth tree of log-semiring matrix products (first-order chains only).

        Depth O(log T) instead of T sequential steps, at O(B T S^3) work and O(B T S^2) memory:
        it pays off for long sequences on a GPU. Gradients flow through autograd.
        """
        if self.order != 1:
            raise ValueError("the parallel scan supports first-order state spaces only")
        start, moves, emissions = _augment(*self._originals, self.lengths)
        steps = (moves[1:] if self.per_position else moves) + emissions[1:].unsqueeze(2)  # [T, B, S', S']
        width = steps.shape[-1]
        identity = torch.full((width, width), NEG_INF, dtype=steps.dtype, device=steps.device)
        identity.fill_diagonal_(0.0)
        while steps.shape[0] > 1:
            if steps.shape[0] % 2 == 1:
                steps = torch.cat([steps, identity.expand(1, self.batch, width, width)], dim=0)
            steps = _log_matmul(steps[0::2], steps[1::2])
        alpha = start + emissions[0]
        if steps.shape[0]:  # none at seq_len 0, where every row starts in END
            alpha = LogSemiring.plus(alpha.unsqueeze(-1) + steps[0], dim=1)
        log_z = LogSemiring.plus(alpha, dim=1)
        return torch.where(self.lengths > 0, log_z, torch.zeros_like(log_z))


def _forward_scores(start: Tensor, transitions: Tensor, emissions: Tensor) -> Tensor:
    """Forward (alpha) scores ``[T + 1, B, *S']`` of an augmented, time-major chain."""
    alphas = torch.empty_like(emissions)
    torch.add(start, emissions[0], out=alphas[0])
    for t in range(1, emissions.shape[0]):
        torch.logsumexp(alphas[t - 1].unsqueeze(-1) + _moves_into(transitions, emissions, t), dim=1, out=alphas[t])
        alphas[t] += emissions[t]
    return alphas


def _backward_scores(transitions: Tensor, emissions: Tensor) -> Tensor:
    """Backward (beta) scores ``[T + 1, B, *S']``: log-sum over everything after each position."""
    betas = torch.empty_like(emissions)
    betas[-1] = 0.0
    for t in range(emissions.shape[0] - 2, -1, -1):
        following = (emissions[t + 1] + betas[t + 1]).unsqueeze(1)  # [B, 1, *R, C]
        torch.logsumexp(_moves_into(transitions, emissions, t + 1) + following, dim=-1, out=betas[t])
    return betas


def _log_partition_from(alphas: Tensor) -> Tensor:
    return LogSemiring.plus(alphas[-1].flatten(1), dim=1)


def _finite_log_z(log_z: Tensor) -> tuple[Tensor, Tensor]:
    finite = torch.isfinite(log_z)
    return torch.where(finite, log_z, torch.zeros_like(log_z)), finite


def _node_marginals(alphas: Tensor, betas: Tensor, log_z: Tensor) -> Tensor:
    nd = alphas.dim() - 2
    safe, finite = _finite_log_z(log_z)
    marg = torch.exp(alphas + betas - safe.view(1, -1, *([1] * nd)))
    return torch.where(finite.view(1, -1, *([1] * nd)), marg, torch.zeros_like(marg))


def _edge_marginal_sum(transitions: Tensor, emissions: Tensor, alphas: Tensor, betas: Tensor, log_z: Tensor,
                       weights: Tensor) -> Tensor:
    """``sum_{b, t} weights[b] * P(transition into position t)``, shape ``[*S', C']``; for
    per-position transitions the weighted edge marginals of every position, ``[T + 1, B, *S', C']``
    (0 at ``t = 0``)."""
    steps, batch = emissions.shape[:2]
    nd = emissions.dim() - 2
    per_position = _per_position(transitions, emissions)
    safe, finite = _finite_log_z(log_z)
    weights = torch.where(finite, weights, torch.zeros_like(weights))
    following_all = emissions + betas
    total = torch.zeros_like(transitions)
    step_elements = transitions[0].numel() if per_position else batch * transitions.numel()
    chunk = max(1, _EDGE_CHUNK_ELEMENTS // max(step_elements, 1))
    for lo in range(1, steps, chunk):
        hi = min(steps, lo + chunk)
        prev = alphas[lo - 1:hi - 1].unsqueeze(-1)  # [t, B, A, *R, 1]
        following = following_all[lo:hi].unsqueeze(2)  # [t, B, 1, *R, C]
        moves = transitions[lo:hi] if per_position else transitions
        edge = torch.exp(prev + moves + following - safe.view(1, -1, *([1] * (nd + 1))))
        if per_position:
            total[lo:hi] = edge * weights.view(1, -1, *([1] * (nd + 1)))
        else:
            total = total + torch.einsum("tb...,b->...", edge, weights)
    return total


def autograd_log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
                           ) -> Tensor:
    """``[batch]`` log Z by a float64 log-space scan built from differentiable ops only.

    Autograd differentiates it to any order (rows without a valid path give ``-inf`` and zero
    gradients, never NaN), at the price of a graph of ``[B, T, |S|, C]`` intermediates: the
    layers use it for higher derivatives (``create_graph=True``) and empty batches, not for training.
    """
    from neurocrf.structs import log_scan  # the differentiable scan, built on this module's helpers

    dtype = emissions.dtype
    start, moves, emissions = (x.to(torch.float64) for x in _augment(start, transitions, end, emissions, lengths))
    log_z = log_scan.log_partition(log_scan.forward_scores(start, moves, emissions))
    return torch.where(lengths > 0, log_z, torch.zeros_like(log_z)).to(dtype)


class _LogPartition(torch.autograd.Function):
    """log Z with a hand-written forward-backward gradient: d log Z / d potentials = marginals.

    Runs the rescaled exp-space scan when :class:`_ExpScan` can certify it exact, else the log-space
    scan. Both compute in float64: the log-space scan is taken exactly when scores are large, where
    float32 would lose the marginals' precision.

    The hand-written gradient is a constant of the graph. When the backward pass itself is
    differentiated (``create_graph=True``: gradients of marginals, Hessian-vector products), the
    gradient is instead taken by autograd through :func:`autograd_log_partition`, whose graph
    supports any order of differentiation.
    """

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, lengths, step_spread):  # type: ignore[override]
        ctx.input_dtype = emissions.dtype
        ctx.shape = (transitions.shape[-1], start.dim())
        ctx.lengths = lengths
        originals = (start, transitions, end, emissions)
        start, transitions, emissions = _augment(start, transitions, end, emissions, lengths)
        scan = _ExpScan.attempt(start, transitions, emissions, step_spread)
        ctx.scan = scan
        if scan is not None:
            ctx.save_for_backward(*originals, start, transitions, emissions)
            return scan.log_z.to(ctx.input_dtype)
        start, transitions, emissions = (x.to(torch.float64) for x in (start, transitions, emissions))
        alphas = _forward_scores(start, transitions, emissions)
        log_z = _log_partition_from(alphas)
        ctx.save_for_backward(*originals, transitions, emissions, alphas, log_z)
        return log_z.to(ctx.input_dtype)

    @staticmethod
    def backward(ctx, grad_log_z):  # type: ignore[override]
        originals, saved = ctx.saved_tensors[:4], ctx.saved_tensors[4:]
        if torch.is_grad_enabled():  # create_graph: the gradient must itself be differentiable
            return *_differentiable_gradients(originals, ctx.needs_input_grad[:4], ctx.lengths, grad_log_z), None, None
        scan = ctx.scan
        need_moves = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        grads = None
        if scan is not None:
            start, transitions, emissions = saved
            if scan.backward_ok():
                grads = scan.gradients(grad_log_z.to(torch.float64), need_moves)
            else:
                start, transitions, emissions = (x.to(torch.float64) for x in (start, transitions, emissions))
                alphas = _forward_scores(start, transitions, emissions)
                log_z = _log_partition_from(alphas)
        else:
            transitions, emissions, alphas, log_z = saved
        if grads is None:
            nd = emissions.dim() - 2
            grad_log_z = grad_log_z.to(torch.float64)
            betas = _backward_scores(transitions, emissions)
            weighted = _node_marginals(alphas, betas, log_z) * grad_log_z.view(1, -1, *([1] * nd))
            grad_moves = None
            if need_moves:
                grad_moves = _edge_marginal_sum(transitions, emissions, alphas, betas, log_z, grad_log_z)
            grads = (weighted[0].sum(0), grad_moves, weighted)
        originals = _original_gradients(*ctx.shape, *grads)
        return *(None if g is None else g.to(ctx.input_dtype) for g in originals), None, None


def _differentiable_gradients(originals: tuple[Tensor, ...], needed: tuple[bool, ...], lengths: Tensor,
                              grad_log_z: Tensor) -> list[Tensor | None]:
    """Gradients of ``sum_b grad_log_z[b] * log Z[b]`` for start, transitions, end and emissions
    (None where not ``needed``) as a graph that autograd differentiates again."""
    wanted = [x for x, need in zip(originals, needed) if need]
    grads = iter(torch.autograd.grad(autograd_log_partition(*originals, lengths), wanted, grad_log_z,
                                     create_graph=True, allow_unused=True) if wanted else ())
    out = []
    for x, need in zip(originals, needed):
        grad = next(grads) if need else None
        out.append(torch.zeros_like(x) if need and grad is None else grad)
    return out


_BLOCK_BUDGET = 300.0  # nats that all positions of one block together may move a state
# Devices where blocks of positions pay off: on CPU their O(K S^3) products cost more than the
# per-position kernel launches they save.
_BLOCKED_DEVICES = {"cuda"}
_REPRESENTABLE = 700.0  # nats below the row maximum that float64 still holds as a normal number


class _ExpScan:
    """The forward-backward algorithm in float64 probability space with rescaling.

    Instead of a logsumexp over ``[B, |S|, C]`` per position, first-order chains multiply by
    emission-weighted transition matrices: several times faster than the log-space scan for
    CRF-sized problems. On CUDA, ``K`` positions go per sequential step: products inside blocks of
    ``K`` positions are formed for all blocks at once, the scan runs over block ends, and every
    position inside a block is then recovered in one batched product. Pair state spaces run one
    position per step.

    It is used only when it provably equals the log-space scan. Let ``delta`` bound how far one
    position can move any state relative to the best one (``Chain.step_spread``, from the spreads
    of emissions and scores), and require ``K * delta <= _BLOCK_BUDGET`` (300 nats): no finite entry
    of a block product is then below ``exp(-K delta)`` of its largest entry. If moreover no
    rescaled value at any position lies in ``(0, exp(-(700 - K delta))]`` (checked), no finite
    forward or backward score was ever lost to underflow: from above that threshold one sequential
    step cannot go below ``exp(-700)``, which float64 holds as a normal number. Otherwise the
    caller falls back to the log-space scan.
    """

    def __init__(self, start: Tensor, transitions: Tensor, emissions: Tensor, step_spread: float) -> None:
        self.order = start.dim()
        state_dims = tuple(range(2, emissions.dim()))
        em = emissions.to(torch.float64)
        self.emission_max = em.amax(state_dims)  # [T + 1, B]; every (t, b) has a finite entry
        self.exp_emissions = torch.exp(em - self.emission_max.view(*self.emission_max.shape, *([1] * self.order)))
        self.per_position = _per_position(transitions, emissions)  # first order only (see attempt)
        exp_moves = transitions.to(torch.float64, copy=True)  # own copy: shifted and exponentiated in place
        self.move_max = exp_moves.amax()
        self.exp_moves = exp_moves.sub_(self.move_max).exp_()
        first = start.to(torch.float64) + em[0]
        first_max = first.reshape(first.shape[0], -1).amax(1)
        prob = torch.exp(first - first_max.view(-1, *([1] * self.order)))
        # shift[t] = log-scale taken out of the matrices of position t (t >= 1)
        self.shift = self.emission_max[1:] + self.move_max  # [T, B]
        self.block = 1
        if self.order == 1 and em.device.type in _BLOCKED_DEVICES:
            self.block = max(1, min(16, int(_BLOCK_BUDGET // max(step_spread, 1e-6)), self.shift.shape[0]))
        # one sequential step moves a state by at most block * step_spread nats; a value above the
        # danger threshold therefore stays above exp(-700) after it
        self.danger = math.exp(-(_REPRESENTABLE - self.block * max(step_spread, 0.0)))
        if self.block > 1:
            self.step_matrices = self._blocked_matrices()
            probs, norm_logs = self._forward_blocks(prob)
        elif self.order == 1:
            probs, norm_logs = self._scan_first_order(prob, forward=True)
        else:
            probs, norm_logs = self._scan_pairs(prob)
        self.probs = probs
        zero = first_max.new_zeros(1, first_max.shape[0])
        self.log_scale = first_max + torch.cat([zero, torch.cumsum(self.shift, 0)]) + norm_logs
        self.log_z = torch.log(probs[-1].reshape(probs.shape[1], -1).sum(1)) + self.log_scale[-1]
        self._betas: tuple[Tensor, Tensor] | None = None

    @classmethod
    def attempt(cls, start: Tensor, transitions: Tensor, emissions: Tensor, step_spread: float) -> "_ExpScan | None":
        if not step_spread <= _BLOCK_BUDGET:  # also catches NaN
            return None
        if _per_position(transitions, emissions) and start.dim() != 1:  # per-position pair states
            return None
        scan = cls(start, transitions, emissions, step_spread)
        return None if _in_danger(scan.probs, scan.danger) else scan

    # --- first order, one position per step ---------------------------------------------------------
    def _scan_first_order(self, prob: Tensor, forward: bool) -> tuple[Tensor, Tensor]:
        """Rescaled forward (``P_t = P_{t-1} expW * expE_t``) or backward
        (``Q_t = (Q_{t+1} * expE_{t+1}) expW^T``) products over ``[B, S]`` rows; returns the rows
        ``[T + 1, B, S]`` and their cumulative log normalisers ``[T + 1, B]``."""
        rows = self.exp_emissions.unbind(0)
        steps = len(rows)
        if self.per_position:
            moves = self.exp_moves
        else:
            moves = self.exp_moves if forward else self.exp_moves.t().contiguous()
        probs, scales = [prob], []
        for t in (range(1, steps) if forward else range(steps - 2, -1, -1)):
            if self.per_position:  # one [S, C] matrix per row: batched vector-matrix products
                step = (torch.bmm(prob.unsqueeze(1), moves[t]).squeeze(1).mul_(rows[t]) if forward
                        else torch.bmm(moves[t + 1], (prob * rows[t + 1]).unsqueeze(-1)).squeeze(-1))
            else:
                step = torch.mm(prob, moves).mul_(rows[t]) if forward else torch.mm(prob * rows[t + 1], moves)
            scale = step.amax(1, keepdim=True)
            prob = step.div_(scale)
            probs.append(prob)
            scales.append(scale)
        zero = prob.new_zeros(1, prob.shape[0])
        if not scales:
            return torch.stack(probs), zero
        logs = torch.cumsum(torch.log(torch.cat(scales, 1).t()), 0)
        if forward:
            return torch.stack(probs), torch.cat([zero, logs])
        return torch.stack(probs[::-1]), torch.cat([logs.flip(0), zero])

    # --- first order, blocked (GPU: fewer, larger kernels) ----------------------------------------
    def _blocked_matrices(self) -> Tensor:
        """``[num_blocks, K, B, S, S]``: matrix ``t`` maps position ``t`` to ``t + 1``; identity padding."""
        moves = self.exp_moves[1:] if self.per_position else self.exp_moves
        matrices = moves * self.exp_emissions[1:].unsqueeze(2)  # [T, B, S, S]
        steps, batch, size = matrices.shape[0], matrices.shape[1], matrices.shape[-1]
        pad = -steps % self.block
        if pad:
            eye = torch.eye(size, dtype=matrices.dtype, device=matrices.device)
            matrices = torch.cat([matrices, eye.expand(pad, batch, size, size)])
        return matrices.view(-1, self.block, batch, size, size)

    @staticmethod
    def _normalized(x: Tensor, dims: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        peak = x.amax(dims, keepdim=True)
        return x / peak, torch.log(peak).reshape(peak.shape[: x.dim() - len(dims)])

    def _running_products(self, reverse: bool) -> tuple[Tensor, Tensor]:
        """Products of the first (or last) ``j + 1`` matrices of every block, rescaled to max 1,
        and their log scales: ``[num_blocks, K, B, S, S]``, ``[num_blocks, K, B]``."""
        matrices = self.step_matrices
        products, logs = [matrices[:, -1 if reverse else 0]], [matrices.new_zeros(matrices.shape[:1] + matrices.shape[2:3])]
        for j in range(1, self.block):
            if reverse:
                step = torch.matmul(matrices[:, self.block - 1 - j], products[-1])
            else:
                step = torch.matmul(products[-1], matrices[:, j])
            product, log_peak = self._normalized(step, (-2, -1))
            products.append(product)
            logs.append(logs[-1] + log_peak)
        return torch.stack(products, 1), torch.stack(logs, 1)

    def _forward_blocks(self, prob: Tensor) -> tuple[Tensor, Tensor]:
        steps = self.shift.shape[0]
        products, product_logs = self._running_products(reverse=False)
        whole = products[:, -1]
        starts, start_logs = [prob], [prob.new_zeros(prob.shape[0])]
        for k in range(products.shape[0] - 1):
            u, log_peak = self._normalized(torch.bmm(starts[-1].unsqueeze(1), whole[k]).squeeze(1), (1,))
            starts.append(u)
            start_logs.append(start_logs[-1] + product_logs[k, -1] + log_peak)
        starts_t, start_logs_t = torch.stack(starts), torch.stack(start_logs)  # [nb, B, S], [nb, B]
        inside = torch.matmul(starts_t[:, None, :, None, :], products).squeeze(-2)  # [nb, K, B, S]
        inside, inside_logs = self._normalized(inside, (-1,))
        inside_logs = inside_logs + product_logs + start_logs_t.unsqueeze(1)
        probs = torch.cat([prob.unsqueeze(0), inside.flatten(0, 1)[:steps]])
        norm_logs = torch.cat([start_logs_t[:1] * 0, inside_logs.flatten(0, 1)[:steps]])
        return probs, norm_logs

    def _backward_blocks(self) -> tuple[Tensor, Tensor]:
        steps = self.shift.shape[0]
        products, product_logs = self._running_products(reverse=True)
        num_blocks, whole = products.shape[0], products[:, -1]
        ones = torch.ones_like(self.probs[0])
        ends, end_logs = [ones], [ones.new_zeros(ones.shape[0])]  # at positions (k + 1) K, last block first
        for k in range(num_blocks - 1, 0, -1):
            v, log_peak = self._normalized(torch.bmm(whole[k], ends[-1].unsqueeze(-1)).squeeze(-1), (1,))
            ends.append(v)
            end_logs.append(end_logs[-1] + product_logs[k, -1] + log_peak)
        ends_t, end_logs_t = torch.stack(ends[::-1]), torch.stack(end_logs[::-1])  # block k ends at (k + 1) K
        inside = torch.matmul(products, ends_t[:, None, :, :, None]).squeeze(-1)  # [nb, K, B, S]
        inside, inside_logs = self._normalized(inside, (-1,))
        inside_logs = inside_logs + product_logs + end_logs_t.unsqueeze(1)
        # products[:, m] covers the last m + 1 matrices: it gives position (k + 1) K - m - 1
        inside, inside_logs = inside.flip(1).flatten(0, 1), inside_logs.flip(1).flatten(0, 1)
        padded = num_blocks * self.block
        probs = torch.cat([inside, ones.unsqueeze(0)])[: steps + 1] if padded == steps else inside[: steps + 1]
        norm_logs = (torch.cat([inside_logs, end_logs_t[-1:] * 0])[: steps + 1] if padded == steps
                     else inside_logs[: steps + 1])
        return probs, norm_logs

    # --- pair states, one position per step -----------------------------------------------------
    def _scan_pairs(self, prob: Tensor) -> tuple[Tensor, Tensor]:
        """Forward scan over pair states: ``P'[b, r, c] = sum_a P[b, a, r] expW[a, r, c] expE[b, c]``,
        as one batched product over ``r`` per position."""
        rows = self.exp_emissions.permute(0, 2, 1, 3).unbind(0)  # [R, B, C] per position
        moves = self.exp_moves.permute(1, 0, 2).contiguous()  # [R, A, C]
        current = prob.permute(2, 0, 1).contiguous()  # [R, B, A]
        probs, logs = [prob], [prob.new_zeros(prob.shape[0])]
        for t in range(1, len(rows)):
            step = torch.bmm(current, moves) * rows[t]  # [R, B, C]
            peak = step.amax((0, 2))
            step = step / peak.view(1, -1, 1)
            probs.append(step.permute(1, 0, 2))  # [B, R, C]
            logs.append(logs[-1] + torch.log(peak))
            current = step.permute(2, 1, 0).contiguous()  # next sources: a' = r, r' = c -> [C, B, R]
        return torch.stack(probs), torch.stack(logs)

    def _backward_pairs(self) -> tuple[Tensor, Tensor]:
        """``Q[b, a, r] = sum_c expW[a, r, c] expE[b, c] Q'[b, r, c]`` as one batched product over ``r``."""
        rows = self.exp_emissions.unbind(0)
        moves = self.exp_moves.permute(1, 2, 0).contiguous()  # [R, C, A]
        prob = torch.ones_like(self.probs[-1])
        probs, logs = [prob], [prob.new_zeros(prob.shape[0])]
        for t in range(len(rows) - 2, -1, -1):
            weighted = (prob * rows[t + 1]).permute(1, 0, 2).contiguous()  # [R, B, C]
            step = torch.bmm(weighted, moves)  # [R, B, A]
            peak = step.amax((0, 2))
            prob = (step / peak.view(1, -1, 1)).permute(1, 2, 0)  # [B, A, R]
            probs.append(prob)
            logs.append(logs[-1] + torch.log(peak))
        return torch.stack(probs[::-1]), torch.stack(logs[::-1])

    def backward_ok(self) -> bool:
        """Run the backward scan; False if it cannot be certified exact."""
        if self._betas is None:
            if self.block > 1:
                probs, norm_logs = self._backward_blocks()
            elif self.order == 1:
                probs, norm_logs = self._scan_first_order(torch.ones_like(self.probs[-1]), forward=False)
            else:
                probs, norm_logs = self._backward_pairs()
            after = torch.flip(torch.cumsum(torch.flip(self.shift, [0]), 0), [0])  # sum of shifts after t
            log_scale = norm_logs + torch.cat([after, after.new_zeros(1, after.shape[1])])
            self._betas = (probs.view_as(self.probs), log_scale)
        return not _in_danger(self._betas[0], self.danger)

    def node_marginals(self) -> Tensor:
        """``[T + 1, B, *S']`` node marginals (needs :meth:`backward_ok` first)."""
        beta_probs, beta_scale = self._betas
        safe, finite = _finite_log_z(self.log_z)
        factor = torch.exp(self.log_scale + beta_scale - safe) * finite
        return self.probs * beta_probs * factor.view(*factor.shape, *([1] * self.order))

    def gradients(self, grad_log_z: Tensor, need_transitions: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """Gradients of ``sum_b grad_log_z[b] * log Z[b]`` for start, transitions and emissions."""
        marg = self.node_marginals() * grad_log_z.view(1, -1, *([1] * self.order))
        grad_start = marg[0].sum(0)
        grad_moves = None
        if need_transitions:
            beta_probs, beta_scale = self._betas
            safe, finite = _finite_log_z(self.log_z)
            # edge(t: i -> j) = P_{t-1}(i) expW(i, j) expE_t(j) Q_t(j) * exp(c_t)
            log_c = self.log_scale[:-1] + self.move_max + self.emission_max[1:] + beta_scale[1:] - safe
            weight = torch.exp(log_c) * torch.where(finite, grad_log_z, torch.zeros_like(grad_log_z))
            left = self.probs[:-1] * weight.view(*weight.shape, *([1] * self.order))
            right = (self.exp_emissions * beta_probs)[1:]
            if self.per_position:  # edge marginals of every position, [T + 1, B, S', C']
                edges = torch.empty_like(self.exp_moves)
                edges[0] = 0.0
                torch.mul(left.unsqueeze(-1), right.unsqueeze(-2), out=edges[1:])
                edges[1:].mul_(self.exp_moves[1:])
                return grad_start, edges, marg
            if self.order == 1:
                summed = left.reshape(-1, left.shape[-1]).t() @ right.reshape(-1, right.shape[-1])
            else:
                summed = torch.einsum("tbar,tbrc->arc", left, right)
            grad_moves = summed * self.exp_moves
        return grad_start, grad_moves, marg


def _in_danger(probs: Tensor, threshold: float) -> bool:
    """True if some rescaled value lies in ``(0, threshold]`` or is NaN."""
    smallest = probs.masked_fill(probs == 0, 1.0).amin()
    return not bool(smallest > threshold)


def _log_matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product in the log semiring over the last two dims: ``[..., n, m] x [..., m, p]``."""
    return LogSemiring.plus(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2)


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor) -> Tensor:
    """``[batch]`` unnormalised score of the flat state paths ``states`` ``[batch, seq_len]``
    (transitions ``[*S, C]`` or per position ``[batch, seq_len, *S, C]``).

    Entries of ``states`` past a row's length are ignored (they must still be valid indices).
    """
    batch, seq_len = states.shape
    if seq_len == 0:
        return emissions.new_zeros(batch)
    # >>> fast path: first order with shared transitions (fast_first_order)
    if start.dim() == 1 and transitions.dim() == 2 and emissions.dim() == 3:
        return fast_first_order.path_score(start, transitions, end, emissions, states, lengths)
    # <<< fast path
    num_components = transitions.shape[-1]
    active = _active(lengths, seq_len)
    zero = emissions.new_zeros(())
    emitted = emissions.reshape(batch, seq_len, -1).gather(2, states.unsqueeze(-1)).squeeze(-1)
    total = torch.where(active, emitted, zero).sum(1)
    has_any = lengths > 0
    total = total + torch.where(has_any, start.reshape(-1)[states[:, 0]], zero)
    if seq_len > 1:
        into = states[:, 1:] % num_components
        if _per_position(transitions, emissions):
            flat = transitions.reshape(batch, seq_len, -1, num_components)
            rows = torch.arange(batch, device=states.device).unsqueeze(1)
            positions = torch.arange(1, seq_len, device=states.device).unsqueeze(0)
            moved = flat[rows, positions, states[:, :-1], into]
        else:
            moved = transitions.reshape(-1, num_components)[states[:, :-1], into]
        total = total + torch.where(active[:, 1:], moved, zero).sum(1)
    last = states.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return total + torch.where(has_any, end.reshape(-1)[last], zero)


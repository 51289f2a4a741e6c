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
``emissions`` ``[batch, seq_len, *S]`` and ``lengths`` ``[batch]``.

Time O(T |S| C) per row for every quantity; training memory O(B T |S|): the hand-written backward
pass keeps the forward scores only, never a graph of ``[B, T, |S|, C]`` intermediates.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neurocrf.structs.semiring import KMaxSemiring, LogSemiring

NEG_INF = float("-inf")
# Edge-marginal blocks above this many elements are computed in time chunks.
_EDGE_CHUNK_ELEMENTS = 1 << 24


def _active(lengths: Tensor, seq_len: int) -> Tensor:
    """``[batch, seq_len]`` bool: position < length."""
    return torch.arange(seq_len, device=lengths.device) < lengths.unsqueeze(1)


class Chain:
    """A batch of chains with absorbing END states, ready for any semiring scan.

    Args:
        start: ``[*S]`` start scores.
        transitions: ``[*S, C]`` transition scores.
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
        self.batch, self.seq_len, self.order, self.size = batch, seq_len, order, size
        self.original_states = size ** order
        END = size
        inner = (slice(0, size),) * order
        full = (size + 1,) * order

        aug_start = start.new_full(full, NEG_INF)
        aug_start[inner] = start
        aug_start[(END,) * order] = 0.0

        aug_moves = transitions.new_full(full + (size + 1,), NEG_INF)
        aug_moves[inner + (slice(0, size),)] = transitions
        aug_moves[inner + (END,)] = end
        aug_moves[(slice(None),) * (order - 1) + (END, END)] = 0.0  # ended rows stay ended

        active = _active(lengths, seq_len)
        aug_emissions = emissions.new_full((batch, seq_len + 1) + full, NEG_INF)
        neg_inf = emissions.new_full((), NEG_INF)
        aug_emissions[(slice(None), slice(0, seq_len)) + inner] = torch.where(
            active.view(batch, seq_len, *([1] * order)), emissions, neg_inf)
        ended = torch.cat([~active, active.new_ones(batch, 1)], dim=1)
        aug_emissions[(slice(None), slice(None)) + (slice(None),) * (order - 1) + (END,)] = torch.where(
            ended.view(batch, seq_len + 1, *([1] * (order - 1))), emissions.new_zeros(()), neg_inf)

        self.start = aug_start
        self.transitions = aug_moves
        self.emissions = aug_emissions.transpose(0, 1).contiguous()  # [T + 1, B, *S'] time-major
        self.lengths = lengths
        # augmented flat state -> original flat state, or -1 for states with an END component
        grid = torch.stack(torch.meshgrid(*[torch.arange(size + 1)] * order, indexing="ij"), -1).reshape(-1, order)
        weights = torch.tensor([size ** (order - 1 - i) for i in range(order)])
        original = (grid * weights).sum(-1)
        self.to_original = torch.where((grid < size).all(-1), original, -1).to(lengths.device)

    # --- log semiring ---------------------------------------------------------------------------
    def log_partition(self) -> Tensor:
        """``[batch]`` log partition function (differentiable, hand-written backward)."""
        log_z = _LogPartition.apply(self.start, self.transitions, self.emissions)
        return torch.where(self.lengths > 0, log_z, torch.zeros_like(log_z))  # exactly 0 for empty rows

    def marginals(self) -> Tensor:
        """``[batch, seq_len, |S|]`` posteriors of the original flat states (0 past each length)."""
        scan = _ExpScan.attempt(self.start, self.transitions, self.emissions)
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

    # --- max and k-max semirings ----------------------------------------------------------------
    def _map_states(self, flat: Tensor) -> Tensor:
        return self.to_original[flat]

    def _previous(self, source: Tensor, state: Tensor) -> Tensor:
        """Flat source ``(a, *r)`` of a transition into flat destination ``(*r, c)``."""
        width = self.size + 1
        rest = width ** (self.order - 1)
        return source * rest + torch.div(state, width, rounding_mode="floor")

    def viterbi(self) -> tuple[Tensor, Tensor]:
        """Best path: original flat states ``[batch, seq_len]`` (-1 past each length), scores ``[batch]``."""
        steps, batch = self.seq_len + 1, self.batch
        num_states = (self.size + 1) ** self.order
        pointers = torch.empty((steps, batch) + tuple(self.start.shape), dtype=torch.long,
                               device=self.emissions.device)
        best = torch.empty_like(self.emissions[0])
        score = self.start + self.emissions[0]
        for t in range(1, steps):
            torch.max(score.unsqueeze(-1) + self.transitions, dim=1, out=(best, pointers[t]))
            score = best + self.emissions[t]
        best_score, state = score.reshape(batch, -1).max(dim=1)
        pointers = pointers.reshape(steps, batch, num_states)
        path = torch.empty((batch, self.seq_len), dtype=torch.long, device=state.device)
        for t in range(steps - 1, 0, -1):
            state = self._previous(pointers[t].gather(1, state.unsqueeze(1)).squeeze(1), state)
            path[:, t - 1] = state
        return self._map_states(path), best_score

    def kbest(self, k: int) -> tuple[Tensor, Tensor]:
        """The k best paths: original flat states ``[batch, k, seq_len]`` and scores ``[batch, k]``.

        Where fewer than k paths exist the missing ones have score ``-inf`` and states -1.
        """
        semiring = KMaxSemiring(k)
        steps, batch = self.seq_len + 1, self.batch
        num_states = (self.size + 1) ** self.order
        pointers = torch.empty((steps, batch, num_states, k), dtype=torch.long, device=self.emissions.device)
        score = self.emissions.new_full(self.emissions.shape[1:] + (k,), NEG_INF)
        score[..., 0] = self.start + self.emissions[0]
        moves = self.transitions.unsqueeze(-1)
        for t in range(1, steps):
            best, pointer = semiring.plus_with_argmax(score.unsqueeze(-2) + moves)
            score = best + self.emissions[t].unsqueeze(-1)
            pointers[t] = pointer.reshape(batch, num_states, k)
        final = score.reshape(batch, num_states * k)
        top = min(k, final.shape[1])
        best_scores, flat = final.topk(top, dim=1)
        if top < k:
            best_scores = torch.cat([best_scores, best_scores.new_full((batch, k - top), NEG_INF)], 1)
            flat = torch.cat([flat, flat.new_zeros((batch, k - top))], 1)
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
        steps = self.transitions + self.emissions[1:].unsqueeze(2)  # [T, B, S', S']
        width = steps.shape[-1]
        identity = torch.full((width, width), NEG_INF, dtype=steps.dtype, device=steps.device)
        identity.fill_diagonal_(0.0)
        while steps.shape[0] > 1:
            if steps.shape[0] % 2 == 1:
                steps = torch.cat([steps, identity.expand(1, self.batch, width, width)], dim=0)
            steps = _log_matmul(steps[0::2], steps[1::2])
        alpha = self.start + self.emissions[0]
        alpha = LogSemiring.plus(alpha.unsqueeze(-1) + steps[0], dim=1)
        log_z = LogSemiring.plus(alpha, dim=1)
        return torch.where(self.lengths > 0, log_z, torch.zeros_like(log_z))


def _forward_scores(start: Tensor, transitions: Tensor, emissions: Tensor) -> Tensor:
    """Forward (alpha) scores ``[T + 1, B, *S']`` of an augmented, time-major chain."""
    alphas = torch.empty_like(emissions)
    torch.add(start, emissions[0], out=alphas[0])
    for t in range(1, emissions.shape[0]):
        torch.logsumexp(alphas[t - 1].unsqueeze(-1) + transitions, dim=1, out=alphas[t])
        alphas[t] += emissions[t]
    return alphas


def _backward_scores(transitions: Tensor, emissions: Tensor) -> Tensor:
    """Backward (beta) scores ``[T + 1, B, *S']``: log-sum over everything after each position."""
    betas = torch.empty_like(emissions)
    betas[-1] = 0.0
    for t in range(emissions.shape[0] - 2, -1, -1):
        following = (emissions[t + 1] + betas[t + 1]).unsqueeze(1)  # [B, 1, *R, C]
        torch.logsumexp(transitions + following, dim=-1, out=betas[t])
    return betas


def _log_partition_from(alphas: Tensor) -> Tensor:
    return LogSemiring.plus(alphas[-1].reshape(alphas.shape[1], -1), dim=1)


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
    """``sum_{b, t} weights[b] * P(transition into position t)``, shape ``[*S', C']``."""
    steps, batch = emissions.shape[:2]
    nd = emissions.dim() - 2
    safe, finite = _finite_log_z(log_z)
    weights = torch.where(finite, weights, torch.zeros_like(weights))
    following_all = emissions + betas
    total = torch.zeros_like(transitions)
    chunk = max(1, _EDGE_CHUNK_ELEMENTS // max(batch * transitions.numel(), 1))
    for lo in range(1, steps, chunk):
        hi = min(steps, lo + chunk)
        prev = alphas[lo - 1:hi - 1].unsqueeze(-1)  # [t, B, A, *R, 1]
        following = following_all[lo:hi].unsqueeze(2)  # [t, B, 1, *R, C]
        edge = torch.exp(prev + transitions + following - safe.view(1, -1, *([1] * (nd + 1))))
        total = total + torch.einsum("tb...,b->...", edge, weights)
    return total


class _LogPartition(torch.autograd.Function):
    """log Z with a hand-written forward-backward gradient: d log Z / d potentials = marginals.

    Runs the rescaled exp-space scan when :class:`_ExpScan` can certify it exact, else the log-space
    scan. Both compute in float64: the log-space scan is taken exactly when scores are large, where
    float32 would lose the marginals' precision.
    """

    @staticmethod
    def forward(ctx, start, transitions, emissions):  # type: ignore[override]
        scan = _ExpScan.attempt(start, transitions, emissions)
        ctx.scan = scan
        ctx.input_dtype = emissions.dtype
        if scan is not None:
            ctx.save_for_backward(start, transitions, emissions)
            return scan.log_z.to(emissions.dtype)
        start, transitions, emissions = (x.to(torch.float64) for x in (start, transitions, emissions))
        alphas = _forward_scores(start, transitions, emissions)
        log_z = _log_partition_from(alphas)
        ctx.save_for_backward(transitions, emissions, alphas, log_z)
        return log_z.to(ctx.input_dtype)

    @staticmethod
    def backward(ctx, grad_log_z):  # type: ignore[override]
        scan = ctx.scan
        if scan is not None:
            start, transitions, emissions = ctx.saved_tensors
            if scan.backward_ok():
                grads = scan.gradients(grad_log_z.to(torch.float64), ctx.needs_input_grad[1])
                return tuple(None if g is None else g.to(ctx.input_dtype) for g in grads)
            start, transitions, emissions = (x.to(torch.float64) for x in (start, transitions, emissions))
            alphas = _forward_scores(start, transitions, emissions)
            log_z = _log_partition_from(alphas)
        else:
            transitions, emissions, alphas, log_z = ctx.saved_tensors
        nd = emissions.dim() - 2
        grad_log_z = grad_log_z.to(torch.float64)
        betas = _backward_scores(transitions, emissions)
        weighted = _node_marginals(alphas, betas, log_z) * grad_log_z.view(1, -1, *([1] * nd))
        grad_start = weighted[0].sum(0)
        grad_transitions = None
        if ctx.needs_input_grad[1]:
            grad_transitions = _edge_marginal_sum(transitions, emissions, alphas, betas, log_z, grad_log_z)
        grads = (grad_start, grad_transitions, weighted)
        return tuple(None if g is None else g.to(ctx.input_dtype) for g in grads)


_STEP_SPREAD_LIMIT = 100.0  # nats one scan step may move a state relative to the best one
_DANGER = 1e-260  # about exp(-600): a rescaled value this small could be on its way to underflow


def _finite_spread(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """max - min over the finite entries of ``x`` along ``dims``."""
    finite = torch.isfinite(x)
    high = x.masked_fill(~finite, NEG_INF).amax(dims)
    low = x.masked_fill(~finite, float("inf")).amin(dims)
    return torch.where(high >= low, high - low, torch.zeros_like(high))


class _ExpScan:
    """The forward-backward algorithm in float64 probability space with per-step rescaling.

    Each step is a matrix product instead of a logsumexp over ``[B, |S|, C]``, several times
    faster for CRF-sized problems. It is used only when it provably equals the log-space scan:

    1. one step can move no state by more than ``_STEP_SPREAD_LIMIT`` nats relative to the best
       state (checked from the spreads of the finite emissions, transitions and start scores), and
    2. no rescaled value ever falls in ``(0, _DANGER]``.

    Together they mean no finite log score ever underflowed: a value can only reach the float64
    underflow threshold (about exp(-708)) by passing through the danger zone, since a step moves
    it by at most 100 nats. Otherwise the caller falls back to the log-space scan.
    """

    def __init__(self, start: Tensor, transitions: Tensor, emissions: Tensor) -> None:
        self.order = start.dim()
        dims = tuple(range(2, emissions.dim()))
        em = emissions.to(torch.float64)
        self.shape = em.shape
        self.emission_max = em.amax(dims)  # [T + 1, B]; every (t, b) has a finite entry
        self.exp_emissions = torch.exp(em - self.emission_max.view(*self.emission_max.shape, *([1] * len(dims))))
        moves = transitions.to(torch.float64)
        self.move_max = moves.amax()
        self.exp_moves = torch.exp(moves - self.move_max)
        first = start.to(torch.float64) + em[0]
        first_max = first.reshape(first.shape[0], -1).amax(1)
        state_dims = (1,) * self.order
        prob = torch.exp(first - first_max.view(-1, *state_dims))
        probs, scales = [prob], []
        exp_rows = self.exp_emissions.unbind(0)
        for t in range(1, em.shape[0]):
            step = self._advance(prob).mul_(exp_rows[t])
            scale = step.reshape(step.shape[0], -1).amax(1).clamp_(min=1e-300)
            prob = step.div_(scale.view(-1, *state_dims))
            probs.append(prob)
            scales.append(scale)
        probs = torch.stack(probs)
        scales = torch.stack([torch.ones_like(first_max)] + scales)
        self.probs = probs
        self.log_scale = torch.cumsum(torch.log(scales) + self.emission_max + self.move_max, 0)
        self.log_scale = self.log_scale + (first_max - self.emission_max[0] - self.move_max)  # alpha_t = log P_t + this
        self.log_z = torch.log(probs[-1].reshape(probs.shape[1], -1).sum(1)) + self.log_scale[-1]
        self._betas: tuple[Tensor, Tensor] | None = None

    @classmethod
    def attempt(cls, start: Tensor, transitions: Tensor, emissions: Tensor) -> "_ExpScan | None":
        dims = tuple(range(2, emissions.dim()))
        num_states = math.prod(emissions.shape[2:])
        step = (_finite_spread(emissions, dims).amax() + _finite_spread(transitions, tuple(range(transitions.dim())))
                + math.log(max(num_states, 1)))
        first = _finite_spread(start + emissions[0], tuple(range(1, emissions.dim() - 1))).amax()
        if float(torch.maximum(step, first)) > _STEP_SPREAD_LIMIT:
            return None
        scan = cls(start, transitions, emissions)
        if bool(_in_danger(scan.probs)):
            return None
        return scan

    def _advance(self, probs: Tensor) -> Tensor:
        """``sum_a P[b, a, *r] * expW[a, *r, c]`` -> ``[B, *r, c]``."""
        if self.order == 1:
            return probs @ self.exp_moves
        return torch.einsum("bar,arc->brc", probs, self.exp_moves)

    def _retreat(self, following: Tensor) -> Tensor:
        """``sum_c expW[a, *r, c] * Y[b, *r, c]`` -> ``[B, a, *r]``."""
        if self.order == 1:
            return following @ self.exp_moves.t()
        return torch.einsum("arc,brc->bar", self.exp_moves, following)

    def backward_ok(self) -> bool:
        """Run the backward scan; False if it cannot be certified exact."""
        if self._betas is None:
            state_dims = (1,) * self.order
            prob = torch.ones_like(self.probs[-1])
            probs, scales = [prob], []
            exp_rows = self.exp_emissions.unbind(0)
            for t in range(self.probs.shape[0] - 2, -1, -1):
                step = self._retreat(prob * exp_rows[t + 1])
                scale = step.reshape(step.shape[0], -1).amax(1).clamp_(min=1e-300)
                prob = step.div_(scale.view(-1, *state_dims))
                probs.append(prob)
                scales.append(scale)
            probs = torch.stack(probs[::-1])
            scales = torch.stack(scales[::-1] + [torch.ones_like(scales[0])]) if scales else torch.ones(
                self.probs.shape[:2], dtype=torch.float64, device=self.probs.device)
            increments = torch.log(scales[:-1]) + self.emission_max[1:] + self.move_max
            log_scale = torch.zeros_like(scales)
            log_scale[:-1] = torch.flip(torch.cumsum(torch.flip(increments, [0]), 0), [0])
            self._betas = (probs, log_scale)
        return not bool(_in_danger(self._betas[0]))

    def _finite_log_z(self) -> tuple[Tensor, Tensor]:
        return _finite_log_z(self.log_z)

    def node_marginals(self) -> Tensor:
        """``[T + 1, B, *S']`` node marginals (needs :meth:`backward_ok` first)."""
        beta_probs, beta_scale = self._betas
        safe, finite = self._finite_log_z()
        factor = torch.exp(self.log_scale + beta_scale - safe) * finite
        return self.probs * beta_probs * factor.view(*factor.shape, *([1] * self.order))

    def gradients(self, grad_log_z: Tensor, need_transitions: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """Gradients of ``sum_b grad_log_z[b] * log Z[b]`` for start, transitions and emissions."""
        marg = self.node_marginals() * grad_log_z.view(1, -1, *([1] * self.order))
        grad_start = marg[0].sum(0)
        grad_moves = None
        if need_transitions:
            beta_probs, beta_scale = self._betas
            safe, finite = self._finite_log_z()
            # edge(t: i -> j) = P_{t-1}(i) expW(i, j) expE_t(j) Q_t(j) * exp(c_t)
            log_c = self.log_scale[:-1] + self.move_max + self.emission_max[1:] + beta_scale[1:] - safe
            weight = torch.exp(log_c) * torch.where(finite, grad_log_z, torch.zeros_like(grad_log_z))
            left = self.probs[:-1] * weight.view(*weight.shape, *([1] * self.order))
            right = (self.exp_emissions * beta_probs)[1:]
            if self.order == 1:
                summed = left.reshape(-1, left.shape[-1]).t() @ right.reshape(-1, right.shape[-1])
            else:
                summed = torch.einsum("tbar,tbrc->arc", left, right)
            grad_moves = summed * self.exp_moves
        return grad_start, grad_moves, marg


def _in_danger(probs: Tensor) -> Tensor:
    """True if some rescaled value lies in ``(0, _DANGER]``."""
    return probs.masked_fill(probs == 0, 1.0).amin() <= _DANGER


def _log_matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product in the log semiring over the last two dims: ``[..., n, m] x [..., m, p]``."""
    return LogSemiring.plus(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2)


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor) -> Tensor:
    """``[batch]`` unnormalised score of the flat state paths ``states`` ``[batch, seq_len]``.

    Entries of ``states`` past a row's length are ignored (they must still be valid indices).
    """
    batch, seq_len = states.shape
    if seq_len == 0:
        return emissions.new_zeros(batch)
    num_components = transitions.shape[-1]
    active = _active(lengths, seq_len)
    zero = emissions.new_zeros(())
    emitted = emissions.reshape(batch, seq_len, -1).gather(2, states.unsqueeze(-1)).squeeze(-1)
    total = torch.where(active, emitted, zero).sum(1)
    has_any = lengths > 0
    total = total + torch.where(has_any, start.reshape(-1)[states[:, 0]], zero)
    if seq_len > 1:
        moved = transitions.reshape(-1, num_components)[states[:, :-1], states[:, 1:] % num_components]
        total = total + torch.where(active[:, 1:], moved, zero).sum(1)
    last = states.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return total + torch.where(has_any, end.reshape(-1)[last], zero)


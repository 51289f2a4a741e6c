"""Fast exact inference for first-order chains with shared transitions (the common training case).

At CRF-sized problems (tens of positions, a few dozen rows, ten to twenty tags) a scan step does a
few thousand multiply-adds, so time goes to dispatching tensor operations, not to arithmetic. This
module is the torch backend's scan for first-order chains with one transition matrix on CPU
tensors when it can certify the result, and spends as few operations per position as possible:

* the forward and backward scans are two operations per position (``mm`` with the exponentiated
  transitions, ``mul`` by the exponentiated emissions, taken once for all positions), with the
  absorbing END state of :mod:`~neurocrf.structs.engine.augmented` so that rows of any length run
  the same steps;
* they rescale only every ``K`` positions, and a check after the scan certifies that no value
  underflowed or overflowed (see :func:`_certified`); otherwise the caller's general path runs;
* a value that shrinks out of that range (the precursor CRF's "no entity yet" O state, which only
  its own self-loop enters, on every long sentence) is dropped at a rescaling, and the backward
  pass bounds the relative error of ``Z`` it could have caused (:data:`DROPPED_ERROR`);
* node marginals are normalised per position by ``sum_s alpha_t(s) beta_t(s)``, edge marginals by
  the same sums, so no log-scale bookkeeping is needed for the gradient;
* the gold-path score is one autograd node (:func:`path_score`).

The compiled backend (:mod:`~neurocrf.structs.engine.compiled`) runs the same scans in C; log Z
of both is :class:`~neurocrf.structs.engine.certified.CertifiedLogPartition`.

>>> import torch
>>> from neurocrf.structs import LinearChainCRF
>>> crf = LinearChainCRF(3, backend="torch")
>>> emissions, tags = torch.randn(2, 5, 3), torch.zeros(2, 5, dtype=torch.long)
>>> crf(emissions, tags).shape  # on CPU the torch backend's NLL runs through this module
torch.Size([])
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from neurocrf.structs.engine.certified import DROPPED_ERROR, CertifiedLogPartition

# Largest step spread (nats) this path accepts; see _certified for why 200 keeps a margin.
_SPREAD_LIMIT = 200.0
_SCALE_BUDGET = 200.0  # nats one unrescaled stretch of positions may move the values
_MAX_LOG = 300.0  # stored row maxima must lie in [exp(-300), exp(300)]
_RELATIVE_LOG = 400.0  # nonzero stored values must be >= row max * exp(-(400 - spread))
_TINY = math.exp(-700.0)  # a normal float64 number with a margin above the smallest one
_DROP_MARGIN = 100.0  # a value dropped is at most exp(-100) of its row's largest


def applies(order: int, per_position: bool, batch: int, seq_len: int, device: torch.device) -> bool:
    """Whether a fast path may be tried: first-order or pair states (:mod:`~neurocrf.structs.engine.pytorch.pairs`),
    shared transitions, a nonempty batch, CPU tensors (on CUDA the general engine's blocked scan
    launches fewer, larger kernels)."""
    return order in (1, 2) and not per_position and batch > 0 and seq_len > 0 and device.type == "cpu"


def rescale_interval(step_spread: float) -> int:
    """Positions between two rescalings: values move at most ``step_spread`` nats per position."""
    return max(1, int(_SCALE_BUDGET // max(step_spread, 1e-6)))


def _certified(values: Tensor, step_spread: float) -> bool:
    """Check the stored scan values ``[T + 1, B, S']`` (the inputs of every step).

    If every row maximum ``m`` lies in ``[exp(-300), exp(300)]`` and every nonzero value is at
    least ``m exp(-(400 - d))`` (``d`` the step spread), every product ``value * M_t[i, j]`` with a
    finite potential is at least ``exp(-700)`` (finite matrix entries are at least ``exp(-d)``):
    no term underflows to zero or to a subnormal, and no sum overflows. The scan then equals the
    log-space scan up to float64 rounding. NaN (no valid path at a position) fails the check.
    """
    high = values.amax(-1)
    low = torch.where(values > 0, values, math.inf).amin(-1)
    ok = (high >= math.exp(-_MAX_LOG)) & (high <= math.exp(_MAX_LOG))
    ok &= low >= high * math.exp(-(_RELATIVE_LOG - step_spread))
    return bool(ok.all())


class ForwardBackward:
    """Rescaled forward (and, on demand, backward) scan of a first-order chain in float64.

    Args:
        start, transitions, end: ``[S]``, ``[S, S]``, ``[S]`` scores (any float dtype).
        emissions: ``[B, T, S]`` compacted emissions.
        lengths: ``[B]`` valid positions per row.
        step_spread: :func:`step_spread` of these potentials.

    After construction ``ok`` says whether the forward scan is certified; ``log_z`` is ``[B]``.
    """

    def __init__(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                 step_spread: float) -> None:
        f64 = torch.float64
        batch, steps, size = emissions.shape
        self.size, self.steps, self.spread = size, steps, step_spread
        self.interval = rescale_interval(step_spread)
        em = emissions.detach().to(f64).transpose(0, 1)  # [T, B, S]
        active = torch.arange(steps, device=em.device).unsqueeze(1) < lengths  # [T, B]
        shift = em.amax(-1, keepdim=True)  # [T, B, 1]
        # probs[t, b] = exp(emissions - shift) over the tags and 0 for END while active, else only END
        probs = em.new_zeros(steps + 1, batch, size + 1)
        probs[:steps, :, :size] = torch.where(active.unsqueeze(-1), torch.exp(em - shift), 0.0)
        probs[:steps, :, size] = ~active
        probs[steps, :, size] = 1.0
        moves = em.new_zeros(size + 1, size + 1)  # exp of the END-augmented transition scores
        moves[:size, :size] = transitions.detach().to(f64).exp()
        moves[:size, size] = end.detach().to(f64).exp()
        moves[size, size] = 1.0
        self.probs, self.moves = probs, moves
        self.log_shift = torch.where(active, shift.squeeze(-1), 0.0).sum(0)  # [B]

        # alpha_t = (alpha_{t-1} @ moves) * probs_t, rescaled to row maximum 1 every `interval` steps
        alphas = em.new_empty(steps + 1, batch, size + 1)
        rows, weights = alphas.unbind(0), probs.unbind(0)
        rows[0][:, :size] = start.detach().to(f64).exp()
        rows[0][:, size] = 1.0
        rows[0].mul_(weights[0])
        log_scale = em.new_zeros(batch)
        interval = min(self.interval, steps)
        # a value below drop_bound at a rescaling could leave the certified range (see _certified)
        # before the next one: it is dropped, and the backward pass bounds what it could have
        # carried into Z (no dropping where that would leave less than _DROP_MARGIN nats)
        margin = _RELATIVE_LOG - (interval + 1) * step_spread
        drop_bound = math.exp(-margin) if margin >= _DROP_MARGIN else 0.0
        self.dropped: list[tuple[int, Tensor]] = []
        for t in range(1, steps + 1):
            torch.mm(rows[t - 1], moves, out=rows[t])
            rows[t].mul_(weights[t])
            if t % interval == 0 and t < steps:
                peak = rows[t].amax(-1, keepdim=True)
                rows[t].div_(peak)
                log_scale += torch.log(peak.squeeze(-1))
                small = (rows[t] > 0) & (rows[t] < drop_bound)
                if bool(small.any()):
                    self.dropped.append((t, torch.where(small, rows[t], 0.0)))
                    rows[t].masked_fill_(small, 0.0)
        self.alphas = alphas
        self.betas: Tensor | None = None
        self.log_z = torch.log(alphas[steps, :, size]) + log_scale + self.log_shift
        self.ok = _certified(alphas, step_spread) and (not self.dropped or self.backward_ok())

    def backward_ok(self) -> bool:
        """Run the backward scan; False if it cannot be certified."""
        if self.betas is None:
            steps, interval = self.steps, self.interval
            # beta_t = (beta_{t+1} * probs_{t+1}) @ moves^T; `after` keeps beta_t * probs_t
            betas, after = torch.empty_like(self.alphas), torch.empty_like(self.alphas)
            rows, weighted, weights = betas.unbind(0), after.unbind(0), self.probs.unbind(0)
            back = self.moves.t().contiguous()
            rows[steps].fill_(1.0)
            weighted[steps].copy_(weights[steps])
            divisors = []
            for t in range(steps - 1, -1, -1):
                torch.mm(weighted[t + 1], back, out=rows[t])
                if (steps - t) % interval == 0 and t > 0:
                    peak = rows[t].amax(-1, keepdim=True)
                    rows[t].div_(peak)
                    divisors.append((t, peak.squeeze(-1)))
                torch.mul(rows[t], weights[t], out=weighted[t])
            self.betas, self.after, self._divisors = betas, after, divisors
            self._backward_ok = _certified(betas, self.spread)
            if self._backward_ok:
                # sums[t] = sum_s alpha_t(s) beta_t(s): Z times the rescalings of both scans up to t
                self.sums = (self.alphas * betas).sum(-1)  # [T + 1, B]
                self._backward_ok = bool((self.sums >= math.exp(-2 * _MAX_LOG)).all())
            if self._backward_ok and self.dropped:
                # relative error of Z: each dropped value times its state's backward score, over
                # sum_s alpha beta at its position (both rescaled alike)
                error = sum((value * betas[t]).sum(-1) / self.sums[t] for t, value in self.dropped)
                self._backward_ok = bool((error <= DROPPED_ERROR).all())
        return self._backward_ok

    def node_marginals(self) -> Tensor | None:
        """``[B, T, S]`` float64 posteriors (0 past each length), or None if not certified."""
        if not self.backward_ok():
            return None
        marg = self.alphas * self.betas / self.sums.unsqueeze(-1)
        return marg[: self.steps, :, : self.size].transpose(0, 1)

    def gradients(self, grad_log_z: Tensor, need_moves: bool
                  ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor] | None:
        """Gradients of ``sum_b grad_log_z[b] log Z[b]``: start ``[S]``, transitions ``[S, S]``,
        end ``[S]``, emissions ``[B, T, S]`` (float64); None if the backward scan is not certified."""
        if not self.backward_ok():
            return None
        size, steps = self.size, self.steps
        weight = grad_log_z.to(torch.float64) / self.sums  # [T + 1, B]
        marg = self.alphas * self.betas * weight.unsqueeze(-1)
        grad_emissions = marg[:steps, :, :size].transpose(0, 1)
        grad_start = marg[0, :, :size].sum(0)
        if not need_moves:
            return grad_start, None, None, grad_emissions
        # edge(t: i -> j) = alpha_t(i) moves(i, j) probs_{t+1}(j) beta_{t+1}(j) / (sums_t * divisor_t):
        # beta_t was divided by divisor_t after being computed from beta_{t+1}
        weight = divided(weight[:steps], self._divisors)
        left = (self.alphas[:steps] * weight.unsqueeze(-1)).reshape(-1, size + 1)
        edges = (left.t() @ self.after[1:].reshape(-1, size + 1)).mul_(self.moves)
        return grad_start, edges[:size, :size], edges[:size, size], grad_emissions


def divided(weight: Tensor, divisors: list[tuple[int, Tensor]]) -> Tensor:
    """``weight`` ``[T, B]`` with row ``t`` divided by the rescaling ``peak`` of each ``(t, peak)``
    in ``divisors`` (the backward scores were divided by it after being computed)."""
    if not divisors:
        return weight
    divisor = torch.ones_like(weight)
    for t, peak in divisors:
        divisor[t] = peak
    return weight / divisor


def forward_backward(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                     step_spread: Callable[[], float]) -> ForwardBackward | None:
    """The certified forward scan, or None when it cannot be certified; ``step_spread()`` gives
    :func:`step_spread` of these potentials."""
    with torch.no_grad():
        spread = step_spread()
        if not spread <= _SPREAD_LIMIT:  # also NaN
            return None
        scan = ForwardBackward(start, transitions, end, emissions, lengths, spread)
    return scan if scan.ok else None


def log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                  step_spread: Callable[[], float], fallback: Callable[..., Tensor]) -> Tensor | None:
    """``[B]`` log partition by the fast path, or None when it cannot be certified.

    ``fallback(start, transitions, end, emissions)`` must compute the same log partition
    differentiably (used for double backward and when the backward scan is not certified).
    """
    scan = forward_backward(start, transitions, end, emissions, lengths, step_spread)
    if scan is None:
        return None
    return CertifiedLogPartition.apply(start, transitions, end, emissions, scan, fallback)


def step_spread(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, num_states: int) -> float:
    """Upper bound (nats) on how far one scan step can move any state relative to the best one,
    with one device synchronisation: ``2 * emission spread + score
    range (0 included) + log(num_states + 1)``; ``-inf`` entries do not count, ``+inf`` or NaN give
    a non-finite result."""
    with torch.no_grad():
        parts = []
        if emissions.numel():
            high = emissions.amax(-1)
            low = torch.where(torch.isneginf(emissions), math.inf, emissions).amin(-1)
            parts.append(torch.where(torch.isfinite(high), high - low, 0.0).amax().to(torch.float64).view(1))
        else:
            parts.append(start.new_zeros(1, dtype=torch.float64))
        scores = torch.cat([start.reshape(-1), transitions.reshape(-1), end.reshape(-1)])
        if scores.numel():
            parts.append(scores.amax().to(torch.float64).view(1))
            parts.append(torch.where(torch.isneginf(scores), 0.0, scores).amin().to(torch.float64).view(1))
        spread, high, low = (torch.cat(parts).tolist() + [0.0, 0.0])[:3]
        return 2 * spread + max(high, 0.0) - min(low, 0.0) + math.log(num_states + 1)


class _GoldScore(torch.autograd.Function):
    """Score of given tag paths under a first-order chain with shared transitions; one autograd
    node whose backward scatters the path's counts."""

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, states, lengths):  # type: ignore[override]
        batch, steps, size = emissions.shape
        active = torch.arange(steps, device=states.device) < lengths.unsqueeze(1)  # [B, T]
        has_any = lengths > 0
        last = states.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        pairs = states[:, :-1] * size + states[:, 1:]  # flat (previous, next) ids [B, T - 1]
        ctx.save_for_backward(states, active, has_any, last, pairs)
        ctx.shapes = (start.shape, transitions.shape, end.shape, emissions.shape)
        zero = emissions.new_zeros(())
        emitted = torch.where(active, emissions.gather(2, states.unsqueeze(-1)).squeeze(-1), zero).sum(1)
        moved = torch.where(active[:, 1:], transitions.reshape(-1)[pairs], zero).sum(1)
        ends = torch.where(has_any, start[states[:, 0]] + end[last], zero)
        return emitted + moved + ends

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        states, active, has_any, last, pairs = ctx.saved_tensors
        start_shape, moves_shape, end_shape, em_shape = ctx.shapes
        need = ctx.needs_input_grad
        grads = [None] * 6
        row = torch.where(has_any, grad, 0.0)
        if need[0]:
            grads[0] = grad.new_zeros(start_shape).index_add_(0, states[:, 0], row)
        if need[1]:
            weights = torch.where(active[:, 1:], grad.unsqueeze(1), 0.0)
            grads[1] = grad.new_zeros(moves_shape.numel()).index_add_(0, pairs.reshape(-1), weights.reshape(-1))
            grads[1] = grads[1].view(moves_shape)
        if need[2]:
            grads[2] = grad.new_zeros(end_shape).index_add_(0, last, row)
        if need[3]:
            weights = torch.where(active, grad.unsqueeze(1), 0.0).unsqueeze(-1)
            grads[3] = grad.new_zeros(em_shape).scatter_(2, states.unsqueeze(-1), weights)
        return tuple(grads)


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor) -> Tensor:
    """``[B]`` score of the state paths ``states [B, T]`` (entries past each length ignored) of a
    first-order chain with shared transitions ``[S, S]``; same value as
    :func:`~neurocrf.structs.engine.chain.path_score`."""
    return _GoldScore.apply(start, transitions, end, emissions, states, lengths)

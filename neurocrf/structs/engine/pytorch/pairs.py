"""Fast exact log partition and marginals for pair-state chains (the second-order CRF).

A pair state ``(a, r)`` moves to ``(r, c)``, so one scan step is a batched matrix product over
``r``: ``alpha'[b, r, c] = sum_a alpha[b, a, r] W[a, r, c] * E[b, r, c]``. The general engine
(:class:`~neurocrf.structs.engine.pytorch.exp_scan.ExpScan`) rescales and permutes at every position; this module
keeps every step at two operations on CPU (a ``bmm`` batched over the shared component, with the
rows as the last dimension so that no operand or output needs a copy, and an in-place ``mul`` by
the exponentiated emissions), rescales only every ``K`` positions, and certifies the
result afterwards with :func:`~neurocrf.structs.engine.pytorch.first_order._certified`'s rule (row maxima
within ``exp(+-300)``, nonzero values at least ``exp(-(400 - spread))`` of them, so every product
of a finite score stays above ``exp(-700)``); otherwise the general engine runs. Edge marginals
summed over positions and rows are one batched product.

Inputs are the chain's augmented, time-major potentials (absorbing END component, see
:mod:`~neurocrf.structs.engine.augmented`): ``start [S', S']``, ``moves [S', S', S']``, ``emissions
[T + 1, B, S', S']``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from neurocrf.structs.engine.certified import CertifiedLogPartition
from neurocrf.structs.engine.pytorch.first_order import (
    _MAX_LOG,
    _RELATIVE_LOG,
    _SPREAD_LIMIT,
    divided,
    rescale_interval,
)


def _certified(values: Tensor, step_spread: float) -> bool:
    """The rule of :func:`~neurocrf.structs.engine.pytorch.first_order._certified` on ``[T + 1, X, Y, B]``
    values (per position and row, over the pair states)."""
    high = values.amax((1, 2))
    low = torch.where(values > 0, values, math.inf).amin((1, 2))
    ok = (high >= math.exp(-_MAX_LOG)) & (high <= math.exp(_MAX_LOG))
    ok &= low >= high * math.exp(-(_RELATIVE_LOG - step_spread))
    return bool(ok.all())


class PairForwardBackward:
    """Rescaled forward (and, on demand, backward) scan over pair states in float64.

    Layouts put the rows last so that every step is one ``bmm`` whose operands and output need no
    copy: ``alphas[t, r, c, b] = alpha_t[b, (r, c)]``, ``betas[t, c, r, b] = beta_t[b, (r, c)]``.
    After construction ``ok`` says whether the forward scan is certified; ``log_z`` is ``[B]``.
    """

    def __init__(self, start: Tensor, moves: Tensor, emissions: Tensor, step_spread: float,
                 convert: Callable[..., tuple]) -> None:
        f64 = torch.float64
        self.convert = convert  # augmented gradients -> gradients of the original potentials
        steps, batch, size = emissions.shape[0] - 1, emissions.shape[1], emissions.shape[-1]
        self.steps, self.batch, self.size, self.spread = steps, batch, size, step_spread
        interval = self.interval = rescale_interval(step_spread)
        em = emissions.to(f64)
        shift = em.amax((2, 3))  # [T + 1, B]; -inf where a position admits no state (caught below)
        # probs[t, r, c, b] = exp(E[t, b, r, c] - shift[t, b]): the factor of the move into (r, c)
        self.probs = (em - shift.view(steps + 1, batch, 1, 1)).exp_().permute(0, 2, 3, 1).contiguous()
        self.moves = moves.to(f64).exp()  # W[r, c, d]: (r, c) -> (c, d)
        into = self.moves.permute(1, 2, 0).contiguous()  # [C, D, R]
        alphas = em.new_empty(steps + 1, size, size, batch)
        torch.mul(start.to(f64).exp().unsqueeze(-1), self.probs[0], out=alphas[0])
        log_scale = em.new_zeros(batch)
        for t in range(1, steps + 1):
            # alpha_t[b, (c, d)] = probs_t * sum_r W[r, c, d] alpha_{t-1}[b, (r, c)], batched over c
            torch.bmm(into, alphas[t - 1].transpose(0, 1), out=alphas[t])
            alphas[t].mul_(self.probs[t])
            if t % interval == 0 and t < steps:
                peak = alphas[t].amax((0, 1))
                alphas[t].div_(peak)
                log_scale += torch.log(peak)
        self.alphas = alphas
        self.ok = _certified(alphas, step_spread)
        self.log_z = torch.log(alphas[steps].sum((0, 1))) + log_scale + shift.sum(0)
        self.betas: Tensor | None = None

    def backward_ok(self) -> bool:
        """Run the backward scan; False if it cannot be certified."""
        if self.betas is None:
            steps, interval = self.steps, self.interval
            betas = torch.empty_like(self.alphas)  # betas[t, c, r, b] = beta_t[b, (r, c)]
            after = torch.empty_like(self.alphas)  # after[t, r, c, b] = probs_t(r, c) beta_t[b, (r, c)]
            out_of = self.moves.permute(1, 0, 2).contiguous()  # [C, R, D]
            betas[steps] = 1.0
            divisors = []
            for t in range(steps, 0, -1):
                torch.mul(self.probs[t], betas[t].transpose(0, 1), out=after[t])
                # beta_{t-1}[b, (r, c)] = sum_d W[r, c, d] after_t[b, (c, d)], batched over c
                torch.bmm(out_of, after[t], out=betas[t - 1])
                if (steps - t + 1) % interval == 0 and t > 1:
                    peak = betas[t - 1].amax((0, 1))
                    betas[t - 1].div_(peak)
                    divisors.append((t - 1, peak))
            self.betas, self.after, self._divisors = betas, after, divisors
            self._backward_ok = _certified(betas, self.spread)
            if self._backward_ok:
                self.products = self.alphas * betas.transpose(1, 2)  # [T + 1, R, C, B]
                self.sums = self.products.sum((1, 2))  # [T + 1, B]
                self._backward_ok = bool((self.sums >= math.exp(-2 * _MAX_LOG)).all())
        return self._backward_ok

    def gradients(self, grad_log_z: Tensor, need_moves: bool) -> tuple | None:
        """Gradients of ``sum_b grad_log_z[b] log Z[b]`` for the original start, transitions, end
        and emissions (through ``convert``); None if the backward scan is not certified."""
        if not self.backward_ok():
            return None
        return self.convert(*self._augmented_gradients(grad_log_z, need_moves))

    def _augmented_gradients(self, grad_log_z: Tensor, need_moves: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """Gradients for the augmented start ``[S', S']``, moves ``[S', S', S']`` and time-major
        emissions ``[T + 1, B, S', S']``."""
        steps, batch, size = self.steps, self.batch, self.size
        weight = grad_log_z.to(torch.float64) / self.sums  # [T + 1, B]
        marg = self.products * weight.view(steps + 1, 1, 1, batch)  # [T + 1, R, C, B]
        grad_emissions = marg.permute(0, 3, 1, 2)  # [T + 1, B, R, C]
        grad_start = marg[0].sum(-1)
        if not need_moves:
            return grad_start, None, grad_emissions
        # edge(t: (r, c) -> (c, d)) = alpha_t(r, c) W(r, c, d) after_{t+1}(c, d) / (sums_t * divisor_t)
        weight = divided(weight[:steps], self._divisors)
        left = (self.alphas[:steps] * weight.view(steps, 1, 1, batch)).permute(2, 1, 0, 3)  # [C, R, T, B]
        right = self.after[1:].permute(1, 2, 0, 3)  # [C, D, T, B]
        edges = torch.bmm(left.reshape(size, size, -1), right.reshape(size, size, -1).transpose(1, 2))  # [C, R, D]
        return grad_start, edges.transpose(0, 1) * self.moves, grad_emissions


def log_partition(originals: tuple[Tensor, Tensor, Tensor, Tensor], augmented: tuple[Tensor, Tensor, Tensor],
                  step_spread: Callable[[], float], convert: Callable[..., tuple],
                  fallback: Callable[..., Tensor]) -> Tensor | None:
    """``[B]`` log partition of a pair chain by the fast scan, or None when it cannot be certified.

    ``originals``: start, transitions, end, emissions as the chain got them; ``augmented``: the
    chain's augmented time-major start, moves and emissions; ``convert`` maps augmented gradients
    to gradients of the originals; ``fallback(*originals)`` computes the same log partition
    differentiably (double backward, uncertified backward scan).
    """
    spread = step_spread()
    if not spread <= _SPREAD_LIMIT:  # also NaN
        return None
    with torch.no_grad():
        scan = PairForwardBackward(*augmented, spread, convert)
    if not scan.ok:
        return None
    return CertifiedLogPartition.apply(*originals, scan, fallback)

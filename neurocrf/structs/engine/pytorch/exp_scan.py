"""The forward-backward algorithm in float64 probability space, with rescaling, certified exact.

:class:`ExpScan` is the engine's fast general scan for the log partition and marginals of any
chain (first order, pair states, per-position transitions): matrix products instead of a
``logsumexp`` over ``[B, |S|, C]`` per position. It is taken only when it provably equals the
log-space scan of the reference (:mod:`~neurocrf.structs.engine.reference`); :meth:`ExpScan.attempt`
returns None otherwise and the caller falls back. Inputs are the augmented, time-major potentials of
:func:`~neurocrf.structs.engine.augmented.augment`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neurocrf.structs.engine.augmented import is_per_position
from neurocrf.structs.engine.reference import safe_log_z

_BLOCK_BUDGET = 300.0  # nats that all positions of one block together may move a state
# Devices where blocks of positions pay off: on CPU their O(K S^3) products cost more than the
# per-position kernel launches they save.
_BLOCKED_DEVICES = {"cuda"}
_REPRESENTABLE = 700.0  # nats below the row maximum that float64 still holds as a normal number


class ExpScan:
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
        self.per_position = is_per_position(transitions, emissions)  # first order only (see attempt)
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
    def attempt(cls, start: Tensor, transitions: Tensor, emissions: Tensor, step_spread: float) -> ExpScan | None:
        if not step_spread <= _BLOCK_BUDGET:  # also catches NaN
            return None
        if is_per_position(transitions, emissions) and start.dim() != 1:  # per-position pair states
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
        products = [matrices[:, -1 if reverse else 0]]
        logs = [matrices.new_zeros(matrices.shape[:1] + matrices.shape[2:3])]
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
        safe, finite = safe_log_z(self.log_z), torch.isfinite(self.log_z)
        factor = torch.exp(self.log_scale + beta_scale - safe) * finite
        return self.probs * beta_probs * factor.view(*factor.shape, *([1] * self.order))

    def gradients(self, grad_log_z: Tensor, need_transitions: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """Gradients of ``sum_b grad_log_z[b] * log Z[b]`` for start, transitions and emissions."""
        marg = self.node_marginals() * grad_log_z.view(1, -1, *([1] * self.order))
        grad_start = marg[0].sum(0)
        grad_moves = None
        if need_transitions:
            beta_probs, beta_scale = self._betas
            safe, finite = safe_log_z(self.log_z), torch.isfinite(self.log_z)
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


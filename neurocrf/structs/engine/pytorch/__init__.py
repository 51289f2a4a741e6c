"""The torch backend: pure torch, for every device and every input; fast scans where they apply.

It satisfies :class:`~neurocrf.structs.engine.Backend` and chooses a scan per quantity:

- log partition: the parallel scan (log depth, float64,
  :func:`~neurocrf.structs.engine.pytorch.log_partition.parallel_log_partition`) when ``scan`` asks
  for it (``"parallel"``; ``"auto"``: on CUDA from ``parallel_threshold`` positions; first-order
  state spaces only), else the fast first-order or pair-state scans
  (:mod:`~neurocrf.structs.engine.pytorch.first_order`, :mod:`~neurocrf.structs.engine.pytorch.pairs`)
  where they apply and are certified, else the general scan with a hand-written backward
  (:class:`~neurocrf.structs.engine.pytorch.log_partition.LogPartition`: the rescaled float64
  exp-space scan of :mod:`~neurocrf.structs.engine.pytorch.exp_scan` when certified exact, the
  reference's float64 log-space scan otherwise);
- marginals: the gradient of that log partition, by the same choice;
- Viterbi: one max scan for every state space (:mod:`~neurocrf.structs.engine.pytorch.search`);
  k best: the reference's k-max scan; both in float64 (:data:`~neurocrf.structs.engine.SEARCH_DTYPE`).

Time O(T |S| C) per row for every quantity; training memory O(B T |S|). When the hand-written
backward pass is itself differentiated (``create_graph=True``) autograd runs through the
reference's log-space scan (:func:`~neurocrf.structs.engine.reference.log_partition`), which gives
derivatives of every order. Empty batches and rows of length 0 are valid everywhere; a row without
any path of finite score has log partition ``-inf``, zero marginals and gradients, and states -1.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from neurocrf.structs.engine import PARALLEL_THRESHOLD, SEARCH_DTYPE, reference
from neurocrf.structs.engine.augmented import augment, is_per_position, original_gradients
from neurocrf.structs.engine.pytorch import first_order, pairs, search
from neurocrf.structs.engine.pytorch.exp_scan import ExpScan
from neurocrf.structs.engine.pytorch.log_partition import LogPartition, parallel_log_partition
from neurocrf.structs.engine.semiring import NEG_INF


def available() -> str | None:
    """Always available."""
    return None


def unsupported(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                k: int = 1) -> str | None:
    """Takes every input."""
    return None


def _order_size(start: Tensor, transitions: Tensor) -> tuple[int, int]:
    return start.dim(), transitions.shape[-1]


def uses_parallel_scan(start: Tensor, emissions: Tensor, scan: str, parallel_threshold: int) -> bool:
    """Whether the log partition and the marginals take the parallel scan (see the module docstring)."""
    if start.dim() != 1:
        return False
    if scan == "parallel":
        return True
    return scan == "auto" and emissions.is_cuda and emissions.shape[1] >= parallel_threshold


def _fast_path(start: Tensor, transitions: Tensor, emissions: Tensor) -> bool:
    """Whether the fast first-order (order 1) or pair-state (order 2) scans may be tried."""
    batch, seq_len = emissions.shape[:2]
    return first_order.applies(start.dim(), is_per_position(transitions, emissions), batch, seq_len,
                               emissions.device)


def _spread(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor):
    """A cached ``() -> step spread`` of these potentials (see :func:`first_order.step_spread`)."""
    order, size = _order_size(start, transitions)
    return functools.cache(lambda: first_order.step_spread(start, transitions, end, emissions, size ** order))


def general_log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                          step_spread: float) -> Tensor:
    """``[B]`` log partition by the general scan (:class:`LogPartition`), exactly 0 for empty rows."""
    log_z = LogPartition.apply(start, transitions, end, emissions, lengths, step_spread)
    return torch.where(lengths > 0, log_z, torch.zeros_like(log_z))


def log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                  scan: str = "auto", parallel_threshold: int = PARALLEL_THRESHOLD) -> Tensor:
    """``[B]`` log partition (differentiable to any order)."""
    if uses_parallel_scan(start, emissions, scan, parallel_threshold):
        return parallel_log_partition(start, transitions, end, emissions, lengths)
    if emissions.shape[0] == 0:
        return reference.log_partition(start, transitions, end, emissions, lengths)
    spread = _spread(start, transitions, end, emissions)
    if _fast_path(start, transitions, emissions):
        def fallback(*potentials):
            return LogPartition.apply(*potentials, lengths, spread())

        order, size = _order_size(start, transitions)
        if order == 1:
            log_z = first_order.log_partition(start, transitions, end, emissions, lengths, spread, fallback)
        else:
            with torch.no_grad():
                augmented = augment(start, transitions, end, emissions, lengths)
            convert = functools.partial(original_gradients, size, order)
            log_z = pairs.log_partition((start, transitions, end, emissions), augmented, spread, convert, fallback)
        if log_z is not None:  # exactly 0 for empty rows already
            return log_z
    return general_log_partition(start, transitions, end, emissions, lengths, spread())


def node_marginals(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                   scan: str = "auto", parallel_threshold: int = PARALLEL_THRESHOLD) -> Tensor:
    """``[B, T, |S|]`` posteriors of the flat states (0 past each length); no gradient."""
    batch, seq_len = emissions.shape[:2]
    order, size = _order_size(start, transitions)
    if batch == 0 or seq_len == 0:
        return emissions.new_zeros(batch, seq_len, size ** order)
    if uses_parallel_scan(start, emissions, scan, parallel_threshold):  # the gradient of the parallel log Z
        start, transitions, end, emissions = (x.detach() for x in (start, transitions, end, emissions))
        with torch.enable_grad():
            leaf = emissions.requires_grad_()
            log_z = parallel_log_partition(start, transitions, end, leaf, lengths)
            (marg,) = torch.autograd.grad(log_z.sum(), leaf)
        return marg.reshape(batch, seq_len, -1)
    spread = _spread(start, transitions, end, emissions)
    with torch.no_grad():
        if order == 1 and _fast_path(start, transitions, emissions):
            fast = first_order.forward_backward(start, transitions, end, emissions, lengths, spread)
            marg = None if fast is None else fast.node_marginals()
            if marg is not None:
                return marg.to(emissions.dtype)
        aug_start, moves, aug_emissions = augment(start, transitions, end, emissions, lengths)
        exp_scan = ExpScan.attempt(aug_start, moves, aug_emissions, spread())
        if exp_scan is not None and exp_scan.backward_ok():
            marg = exp_scan.node_marginals()
        else:
            return reference.node_marginals(start, transitions, end, emissions, lengths)
    marg = marg[:seq_len].to(emissions.dtype)  # [T, B, *S']
    inner = (slice(None), slice(None)) + (slice(0, size),) * order
    return marg[inner].reshape(seq_len, batch, -1).transpose(0, 1)


def viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
            ) -> tuple[Tensor, Tensor]:
    """Best path: flat states ``[B, T]`` (-1 past each length and without a path), float64 scores ``[B]``."""
    if emissions.shape[0] == 0:
        return reference.viterbi(start, transitions, end, emissions, lengths)
    with torch.no_grad():
        states, best = search.viterbi(*reference.augmented(start, transitions, end, emissions, lengths, SEARCH_DTYPE))
    states = reference.original_states(states, transitions.shape[-1], start.dim())
    return states.masked_fill(torch.isneginf(best).unsqueeze(1), -1), best  # -1: no valid path


kbest = reference.kbest


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor) -> Tensor:
    """``[B]`` unnormalised score of the flat state paths ``states [B, T]`` (entries past a row's
    length are ignored but must be valid indices): one autograd node for first-order chains with
    shared transitions, the reference's sum otherwise."""
    if states.shape[1] and start.dim() == 1 and transitions.dim() == 2 and emissions.dim() == 3:
        return first_order.path_score(start, transitions, end, emissions, states, lengths)
    return reference.path_score(start, transitions, end, emissions, states, lengths)


def window_log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                         rows: Tensor, starts: Tensor, allowed: Tensor) -> Tensor:
    """``[J]`` log partition of row ``rows[j]`` with the states at positions ``starts[j] .. starts[j]
    + W - 1`` restricted to ``allowed[j]`` (bool ``[J, W, *S]``); float64, no gradient.

    Every window must lie inside its row (``starts + W <= lengths[rows]``). The forward and backward
    log scores are computed once; each window then costs O(W |S| C), so the restricted partition
    functions of many short windows (span confidences) take time linear in the sentence length.
    """
    num, width = allowed.shape[:2]
    if num == 0:
        return torch.zeros(0, dtype=torch.float64, device=allowed.device)
    if bool((starts < 0).any()) or bool((starts + width > lengths[rows]).any()):
        raise ValueError("every window must lie inside its row: 0 <= start and start + width <= length")
    order, size = _order_size(start, transitions)
    per_position = is_per_position(transitions, emissions)
    with torch.no_grad():
        aug_start, moves, aug_emissions = reference.augmented(start, transitions, end, emissions, lengths)
        alphas = reference.forward_scores(aug_start, moves, aug_emissions, differentiable=False)
        betas = reference.backward_scores(moves, aug_emissions, differentiable=False)
        inner = (slice(None), slice(None)) + (slice(0, size),) * order
        keep = allowed.new_ones((num, width) + (size + 1,) * order)
        keep[inner] = allowed

        def moves_into(positions: Tensor) -> Tensor:  # [J, *S', C'] or the shared [*S', C']
            return moves[positions, rows] if per_position else moves

        first = aug_start.expand(num, *aug_start.shape)
        before = alphas[(starts - 1).clamp(min=0), rows]  # [J, *S']
        continued = torch.logsumexp(before.unsqueeze(-1) + moves_into(starts), dim=1)
        alpha = torch.where((starts == 0).view(-1, *([1] * order)), first, continued)
        for i in range(width):
            if i > 0:
                alpha = torch.logsumexp(alpha.unsqueeze(-1) + moves_into(starts + i), dim=1)
            alpha = (alpha + aug_emissions[starts + i, rows]).masked_fill(~keep[:, i], NEG_INF)
        after = betas[starts + width - 1, rows]
        return torch.logsumexp((alpha + after).reshape(num, -1), dim=1)

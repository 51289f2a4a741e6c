"""The batched chain engine shared by every CRF layer.

A chain is a first-order Markov chain over a state space of shape ``S = (C,) * n``: a state is a
tuple of ``n`` components, and a transition goes from ``(a, *r)`` to ``(*r, c)``, reading one new
component ``c``. A first-order CRF has ``n = 1`` (a state is a tag); the second-order CRF has
``n = 2`` (a state is a pair of tags). Transition scores are a tensor ``[*S, C]`` indexed by the
source state and the new component, and every scan step is ``plus_a(alpha[a, *r] + W[a, *r, c])``.

Inputs are *compacted*: each row's valid positions come first and ``lengths`` says how many there
are (the layers compact arbitrary masks before calling in). Every scan runs on the potentials with
an absorbing END value (:mod:`~neurocrf.structs.augmented`), so rows of any length take the same
steps without masking.

Potentials (one dtype): ``start`` ``[*S]``, ``transitions`` ``[*S, C]``, ``end`` ``[*S]``,
``emissions`` ``[batch, seq_len, *S]`` and ``lengths`` ``[batch]``. Transitions may also be given
per position, ``[batch, seq_len, *S, C]`` (observation-dependent transitions): entry ``[b, t]``
scores the move into compacted position ``t`` of row ``b``; entries at ``t = 0`` are unused.

:class:`Chain` chooses the scan for each quantity:

- log partition: the parallel scan (log depth, :func:`~neurocrf.structs.log_partition.parallel_log_partition`)
  when ``scan`` asks for it (``"parallel"``; ``"auto"``: on CUDA from ``parallel_threshold``
  positions; first-order state spaces only), else the fast first-order or pair-state kernels
  (:mod:`~neurocrf.structs.fast_first_order`, :mod:`~neurocrf.structs.fast_pairs`) where they
  apply and are certified, else the general scan with a hand-written backward
  (:class:`~neurocrf.structs.log_partition.LogPartition`: the rescaled float64 exp-space scan of
  :mod:`~neurocrf.structs.exp_scan` when certified exact, the float64 log-space scan otherwise);
- marginals: the gradient of that log partition, by the same choice;
- Viterbi and k best: :mod:`~neurocrf.structs.search`, always in float64 (:data:`SEARCH_DTYPE`).

Time O(T |S| C) per row for every quantity; training memory O(B T |S|): the hand-written backward
pass keeps the forward scores only, never a graph of ``[B, T, |S|, C]`` intermediates. Only when
that backward pass is itself differentiated (``create_graph=True``: gradients of marginals or of
an entropy, Hessian-vector products) does autograd run through a log-space scan
(:func:`~neurocrf.structs.log_partition.autograd_log_partition`), which gives derivatives of every
order at that memory cost.

Empty batches and rows of length 0 are valid everywhere. A row without any path of finite score
has log partition ``-inf``, zero marginals and gradients, and Viterbi states -1.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from neurocrf.structs import fast_first_order, fast_pairs, log_scan, search
from neurocrf.structs.augmented import active_positions, augment, is_per_position, original_gradients, state_map
from neurocrf.structs.exp_scan import ExpScan
from neurocrf.structs.log_partition import LogPartition, autograd_log_partition, parallel_log_partition
from neurocrf.structs.search import SEARCH_DTYPE
from neurocrf.structs.semiring import NEG_INF

SCANS = ("auto", "sequential", "parallel")
PARALLEL_THRESHOLD = 512
"""Sequence length from which ``scan="auto"`` takes the parallel scan on CUDA."""

__all__ = ["PARALLEL_THRESHOLD", "SCANS", "SEARCH_DTYPE", "Chain", "check_scan", "path_score"]


def check_scan(scan: str) -> str:
    """``scan`` if it is one of :data:`SCANS`, else ValueError."""
    if scan not in SCANS:
        raise ValueError(f"scan must be 'auto', 'sequential' or 'parallel', got {scan!r}")
    return scan


class Chain:
    """A batch of chains with absorbing END states, ready for any semiring scan.

    Args:
        start: ``[*S]`` start scores.
        transitions: ``[*S, C]`` transition scores, or ``[batch, seq_len, *S, C]`` per position.
        end: ``[*S]`` end scores.
        emissions: ``[batch, seq_len, *S]`` state scores at each compacted position.
        lengths: ``[batch]`` number of valid positions per row.
        scan: ``"sequential"``, ``"parallel"`` (log-depth matrix products; first-order state spaces,
            others run sequentially) or ``"auto"`` (parallel on CUDA for sequences of at least
            ``parallel_threshold``): how the log partition and the marginals are computed.
    """

    def __init__(self, start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                 scan: str = "auto", parallel_threshold: int = PARALLEL_THRESHOLD) -> None:
        batch, seq_len = emissions.shape[:2]
        order = start.dim()
        size = transitions.shape[-1]
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
        self.scan = check_scan(scan)
        self.parallel_threshold = parallel_threshold
        self.to_original = state_map(size, order, lengths.device)
        self._originals = (start, transitions, end, emissions)
        self._spread: float | None = None
        self._augmented: tuple[Tensor, Tensor, Tensor] | None = None
        self._messages: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None

    def _augmented_potentials(self) -> tuple[Tensor, Tensor, Tensor]:
        """Detached augmented ``start``, ``transitions`` and time-major ``emissions`` (built once)."""
        if self._augmented is None:
            with torch.no_grad():  # log_partition differentiates through its own Function
                self._augmented = augment(*self._originals, self.lengths)
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

    def uses_parallel_scan(self) -> bool:
        """Whether the log partition and the marginals take the parallel scan (see ``scan``)."""
        if self.order != 1:
            return False
        if self.scan == "parallel":
            return True
        return self.scan == "auto" and self._originals[3].is_cuda and self.seq_len >= self.parallel_threshold

    # --- log semiring ---------------------------------------------------------------------------
    def log_partition(self) -> Tensor:
        """``[batch]`` log partition function (differentiable to any order: a hand-written first
        derivative, and autograd through a log-space scan when a graph of it is asked for)."""
        start, moves, end, emissions = self._originals
        if self.uses_parallel_scan():
            return parallel_log_partition(start, moves, end, emissions, self.lengths)
        if self.batch == 0:
            return autograd_log_partition(start, moves, end, emissions, self.lengths)
        # >>> fast paths: first order or pair states, shared transitions (fast_first_order, fast_pairs)
        if self._fast_path():
            def fallback(*potentials):
                return LogPartition.apply(*potentials, self.lengths, self.step_spread())

            if self.order == 1:
                log_z = fast_first_order.log_partition(*self._originals, self.lengths, self.step_spread, fallback)
            else:
                convert = functools.partial(original_gradients, self.size, self.order)
                log_z = fast_pairs.log_partition(self._originals, self._augmented_potentials(), self.step_spread,
                                                 convert, fallback)
            if log_z is not None:  # exactly 0 for empty rows already
                return log_z
        # <<< fast paths
        log_z = LogPartition.apply(start, moves, end, emissions, self.lengths, self.step_spread())
        return torch.where(self.lengths > 0, log_z, torch.zeros_like(log_z))  # exactly 0 for empty rows

    def _fast_path(self) -> bool:
        """Whether :mod:`~neurocrf.structs.fast_first_order` (order 1) or
        :mod:`~neurocrf.structs.fast_pairs` (order 2) may be tried on this chain."""
        return fast_first_order.applies(self.order, self.per_position, self.batch, self.seq_len, self.lengths.device)

    def marginals(self) -> Tensor:
        """``[batch, seq_len, |S|]`` posteriors of the original flat states (0 past each length);
        no gradient (see ``ChainCRF.marginals`` for differentiable ones)."""
        if self.batch == 0 or self.seq_len == 0:
            return self._originals[3].new_zeros(self.batch, self.seq_len, self.original_states)
        if self.uses_parallel_scan():  # the gradient of the parallel log partition
            start, moves, end, emissions = (x.detach() for x in self._originals)
            with torch.enable_grad():
                leaf = emissions.requires_grad_()
                log_z = parallel_log_partition(start, moves, end, leaf, self.lengths)
                (marg,) = torch.autograd.grad(log_z.sum(), leaf)
            return marg.reshape(self.batch, self.seq_len, -1)
        # >>> fast path: first order with shared transitions (fast_first_order), when certified
        if self.order == 1 and self._fast_path():
            with torch.no_grad():
                fast = fast_first_order.forward_backward(*self._originals, self.lengths, self.step_spread)
                marg = None if fast is None else fast.node_marginals()
                if marg is not None:
                    return marg.to(self._originals[3].dtype)
        # <<< fast path
        scan = ExpScan.attempt(self.start, self.transitions, self.emissions, self.step_spread())
        if scan is not None and scan.backward_ok():
            marg = scan.node_marginals()
        else:
            start, moves, emissions = (x.to(torch.float64) for x in (self.start, self.transitions, self.emissions))
            alphas = log_scan.forward_scores(start, moves, emissions, differentiable=False)
            betas = log_scan.backward_scores(moves, emissions, differentiable=False)
            marg = log_scan.node_marginals(alphas, betas, log_scan.log_partition(alphas))
        marg = marg[: self.seq_len].to(self.emissions.dtype)  # [T, B, *S']
        inner = (slice(None), slice(None)) + (slice(0, self.size),) * self.order
        return marg[inner].reshape(self.seq_len, self.batch, -1).transpose(0, 1)

    def _log_messages(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """float64 augmented ``start``, ``transitions``, ``emissions`` and the forward and backward
        log scores ``[T + 1, B, *S']`` (computed once per chain)."""
        if self._messages is None:
            start, moves, emissions = (x.to(torch.float64) for x in self._augmented_potentials())
            self._messages = (start, moves, emissions,
                              log_scan.forward_scores(start, moves, emissions, differentiable=False),
                              log_scan.backward_scores(moves, emissions, differentiable=False))
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
        if self.batch == 0:
            return self.lengths.new_zeros(0, self.seq_len), self.emissions.new_zeros(0)
        states, best = search.viterbi(self.start, self.transitions, self.emissions)
        return self._map_states(states).masked_fill(torch.isneginf(best).unsqueeze(1), -1), best  # -1: no valid path

    def kbest(self, k: int) -> tuple[Tensor, Tensor]:
        """The k best paths: original flat states ``[batch, k, seq_len]`` and float64 scores
        ``[batch, k]``, best first (the first path is :meth:`viterbi`'s).

        Where fewer than k paths exist the missing ones have score ``-inf`` and states -1.
        """
        wide = self._for_search()
        if wide is not None:
            return wide.kbest(k)
        if self.batch == 0:
            return self.lengths.new_zeros(0, k, self.seq_len), self.emissions.new_zeros(0, k)
        states, scores = search.kbest(self.start, self.transitions, self.emissions, k)
        return self._map_states(states).masked_fill(~torch.isfinite(scores).unsqueeze(-1), -1), scores


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
    active = active_positions(lengths, seq_len)
    zero = emissions.new_zeros(())
    emitted = emissions.reshape(batch, seq_len, -1).gather(2, states.unsqueeze(-1)).squeeze(-1)
    total = torch.where(active, emitted, zero).sum(1)
    has_any = lengths > 0
    total = total + torch.where(has_any, start.reshape(-1)[states[:, 0]], zero)
    if seq_len > 1:
        into = states[:, 1:] % num_components
        if is_per_position(transitions, emissions):
            flat = transitions.reshape(batch, seq_len, -1, num_components)
            rows = torch.arange(batch, device=states.device).unsqueeze(1)
            positions = torch.arange(1, seq_len, device=states.device).unsqueeze(0)
            moved = flat[rows, positions, states[:, :-1], into]
        else:
            moved = transitions.reshape(-1, num_components)[states[:, :-1], into]
        total = total + torch.where(active[:, 1:], moved, zero).sum(1)
    last = states.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return total + torch.where(has_any, end.reshape(-1)[last], zero)


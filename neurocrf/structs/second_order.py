"""Second-order linear-chain CRF: transition scores over label triples.

``score(y) = start[y_1] + start_pair[y_1, y_2] + sum_t emit[t, y_t] + sum_t trans[y_{t-1}, y_t]
+ sum_t trans3[y_{t-2}, y_{t-1}, y_t] + end_pair[y_{T-1}, y_T] + end[y_T]``.

Exact inference runs the first-order chain engine over label-pair states ``(previous, current)``
with transitions ``(a, b) -> (b, c)``. A virtual label BOS stands for "no previous tag", so a
sequence of length 1 is the single state ``(BOS, y_1)``. Every quantity costs O(T (L+1)^3) per
sequence and the state space has (L+1)^2 states.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neurocrf.structs.base import ChainCRF
from neurocrf.structs.constraints import Constraints


class SecondOrderCRF(ChainCRF):
    """Second-order CRF over ``num_tags`` labels.

    Args:
        num_tags: number of tags ``L``.
        constraints: optional first-order :class:`Constraints` (start, pair transitions, end); they
            apply to every adjacent pair of the sequence.
        scan: only sequential scans apply to the pair state space.
        parallel_threshold, backend: see :class:`~neurocrf.structs.base.ChainCRF` (the compiled
            backend does not take pair states).

    >>> crf = SecondOrderCRF(3)
    >>> crf.log_partition(torch.randn(2, 5, 3)).shape
    torch.Size([2])
    """

    def __init__(self, num_tags: int, constraints: Constraints | None = None, scan: str = "auto",
                 parallel_threshold: int = 512, backend: str = "auto") -> None:
        super().__init__(num_tags, scan=scan, parallel_threshold=parallel_threshold, backend=backend)
        n = num_tags
        self.start_transitions = nn.Parameter(torch.empty(n))
        self.start_pair_transitions = nn.Parameter(torch.empty(n, n))
        self.transitions = nn.Parameter(torch.empty(n, n))
        self.triple_transitions = nn.Parameter(torch.empty(n, n, n))
        self.end_pair_transitions = nn.Parameter(torch.empty(n, n))
        self.end_transitions = nn.Parameter(torch.empty(n))
        if constraints is not None:
            constraints.validate(n)
            allowed_start, allowed_moves, allowed_end = constraints.start, constraints.transitions, constraints.end
        else:
            allowed_start = torch.ones(n, dtype=torch.bool)
            allowed_moves = torch.ones(n, n, dtype=torch.bool)
            allowed_end = torch.ones(n, dtype=torch.bool)
        self.constrained = constraints is not None
        size = n + 1  # labels plus BOS
        start_ok = torch.zeros(size, size, dtype=torch.bool)
        start_ok[n, :n] = allowed_start
        move_ok = torch.zeros(size, size, size, dtype=torch.bool)
        move_ok[:n, :n, :n] = allowed_moves.unsqueeze(0)
        move_ok[n, :n, :n] = allowed_moves
        end_ok = torch.zeros(size, size, dtype=torch.bool)
        end_ok[:n, :n] = allowed_end.unsqueeze(0)
        end_ok[n, :n] = allowed_end
        self.register_buffer("allowed_start_states", start_ok, persistent=False)
        self.register_buffer("allowed_moves", move_ok, persistent=False)
        self.register_buffer("allowed_end_states", end_ok, persistent=False)
        labels = torch.arange(size * size) % size  # state (b, c) emits c; BOS column -> index n (dropped)
        self.register_buffer("state_labels", labels, persistent=False)
        # read in place: the pair (b, c) reads tag column c (none for BOS); after (pair (a, b), tag y) comes (b, y)
        columns = torch.cat([torch.arange(n), torch.tensor([-1])])
        automaton = torch.cat([(torch.arange(size * size) % size) * size, torch.tensor([n * size])])
        self.register_buffer("tag_columns", columns, persistent=False)
        self.register_buffer("potential_index", self._potential_index(start_ok, move_ok, end_ok), persistent=False)
        self.register_buffer("potential_constants", torch.tensor([0.0, float("-inf")]), persistent=False)
        self.register_buffer("gold_automaton", (automaton[:, None] + torch.arange(n)).to(torch.int32),
                             persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for param in self.parameters():
            nn.init.uniform_(param, -0.1, 0.1)

    def _potential_index(self, start_ok: Tensor, move_ok: Tensor, end_ok: Tensor) -> Tensor:
        """``[|S| + |S| (L + 1) + |S|, 2]``: the two entries of the concatenated parameters (and
        the constants 0 and -inf after them) whose sum is each entry of the pair-state start,
        transition and end scores (see :meth:`_potentials`)."""
        n, size = self.num_tags, self.num_tags + 1
        sizes = [n, n * n, n * n, n ** 3, n * n, n]
        offsets = torch.tensor([0, *sizes]).cumsum(0).tolist()
        o_start, o_pair, o_moves, o_triple, o_end_pair, o_end, zero = offsets
        neg = zero + 1
        b, c = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        real = c < n
        start = torch.stack([torch.where(real & (b == n), o_start + c, neg), torch.full_like(b, zero)], -1)
        first = torch.where(b < n, o_end_pair + b * n + c, zero)
        end = torch.stack([torch.where(real, first, neg), torch.where(real, o_end + c, zero)], -1)
        a, b, c = torch.meshgrid(torch.arange(size), torch.arange(size), torch.arange(size), indexing="ij")
        real = (b < n) & (c < n)
        first = torch.where(a < n, o_triple + (a * n + b) * n + c, o_pair + b * n + c)
        moves = torch.stack([torch.where(real, first, neg), torch.where(real, o_moves + b * n + c, zero)], -1)
        parts = [(start, start_ok), (moves, move_ok), (end, end_ok)]
        return torch.cat([torch.where(ok[..., None] | (part[..., :1] == neg), part, torch.stack(
            [torch.full_like(part[..., 0], neg), part[..., 1]], -1)).reshape(-1, 2) for part, ok in parts])

    def _potentials(self, dtype: torch.dtype, additive: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        # each pair-state score is a sum of two entries of the concatenated parameters (or 0, or
        # -inf: BOS rows and columns, constraints): three ops forward, two backward, any size
        size = self.num_tags + 1
        flat = torch.cat([self.start_transitions, self.start_pair_transitions.reshape(-1), self.transitions.reshape(-1),
                          self.triple_transitions.reshape(-1), self.end_pair_transitions.reshape(-1),
                          self.end_transitions, self.potential_constants])
        values = flat.to(dtype).index_select(0, self.potential_index.view(-1)).view(-1, 2).sum(-1)
        start, moves, end = values.split([size * size, size ** 3, size * size])
        return start.view(size, size), moves.view(size, size, size), end.view(size, size)

    def _state_shape(self) -> tuple[int, ...]:
        return (self.num_tags + 1, self.num_tags + 1)

    def _state_emissions(self, emissions: Tensor) -> Tensor:
        batch, seq_len, n = emissions.shape
        padded = torch.cat([emissions, emissions.new_zeros(batch, seq_len, 1)], dim=-1)
        return padded.unsqueeze(2).expand(batch, seq_len, n + 1, n + 1)

    def _tag_reading(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.tag_columns, self.gold_automaton, self.state_labels

    def _gold_states(self, tags: Tensor) -> Tensor:
        size = self.num_tags + 1
        previous = torch.cat([torch.full_like(tags[:, :1], self.num_tags), tags[:, :-1]], dim=1)
        return previous * size + tags

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}, constrained={self.constrained}"

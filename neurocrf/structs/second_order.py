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
from neurocrf.structs.engine.semiring import NEG_INF


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
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for param in self.parameters():
            nn.init.uniform_(param, -0.1, 0.1)

    def _potentials(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        n = self.num_tags
        size = n + 1
        start = self.start_transitions.new_zeros(size, size, dtype=dtype)
        start[n, :n] = self.start_transitions.to(dtype)
        moves = self.transitions.new_zeros(size, size, size, dtype=dtype)
        pairs = self.transitions.to(dtype)
        moves[:n, :n, :n] = self.triple_transitions.to(dtype) + pairs
        moves[n, :n, :n] = self.start_pair_transitions.to(dtype) + pairs
        end = self.end_transitions.new_zeros(size, size, dtype=dtype)
        end[:n, :n] = self.end_pair_transitions.to(dtype) + self.end_transitions.to(dtype)
        end[n, :n] = self.end_transitions.to(dtype)
        return (start.masked_fill(~self.allowed_start_states, NEG_INF),
                moves.masked_fill(~self.allowed_moves, NEG_INF),
                end.masked_fill(~self.allowed_end_states, NEG_INF))

    def _state_shape(self) -> tuple[int, ...]:
        return (self.num_tags + 1, self.num_tags + 1)

    def _state_emissions(self, emissions: Tensor) -> Tensor:
        batch, seq_len, n = emissions.shape
        padded = torch.cat([emissions, emissions.new_zeros(batch, seq_len, 1)], dim=-1)
        return padded.unsqueeze(2).expand(batch, seq_len, n + 1, n + 1)

    def _gold_states(self, tags: Tensor) -> Tensor:
        size = self.num_tags + 1
        previous = torch.cat([torch.full_like(tags[:, :1], self.num_tags), tags[:, :-1]], dim=1)
        return previous * size + tags

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}, constrained={self.constrained}"

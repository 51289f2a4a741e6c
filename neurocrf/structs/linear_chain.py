"""First-order linear-chain CRF (Lafferty, McCallum and Pereira, 2001)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neurocrf.structs.base import ChainCRF
from neurocrf.structs.constraints import Constraints

NEG_INF = float("-inf")


def _masked(param: Tensor, allowed: Tensor | None, dtype: torch.dtype) -> Tensor:
    param = param.to(dtype)
    return param if allowed is None else param.masked_fill(~allowed, NEG_INF)


class LinearChainCRF(ChainCRF):
    """First-order CRF: ``score(y) = start[y_1] + sum_t (emit[t, y_t] + trans[y_{t-1}, y_t]) + end[y_T]``.

    States are the tags themselves. Every quantity costs O(T L^2) per sequence.

    Args:
        num_tags: number of tags ``L``.
        constraints: optional :class:`~neurocrf.structs.constraints.Constraints`; forbidden starts,
            transitions and ends score ``-inf`` in every method.
        scan, parallel_threshold: see :class:`~neurocrf.structs.base.ChainCRF`.

    >>> crf = LinearChainCRF(3)
    >>> emissions = torch.randn(2, 4, 3)
    >>> crf.decode(emissions).shape
    torch.Size([2, 4])
    """

    def __init__(self, num_tags: int, constraints: Constraints | None = None, scan: str = "auto",
                 parallel_threshold: int = 512) -> None:
        super().__init__(num_tags, scan=scan, parallel_threshold=parallel_threshold)
        self.start_transitions = nn.Parameter(torch.empty(num_tags))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))
        self.end_transitions = nn.Parameter(torch.empty(num_tags))
        if constraints is not None:
            constraints.validate(num_tags)
            self.register_buffer("allowed_start", constraints.start.clone())
            self.register_buffer("allowed_transitions", constraints.transitions.clone())
            self.register_buffer("allowed_end", constraints.end.clone())
        else:
            self.allowed_start = self.allowed_transitions = self.allowed_end = None
        self.register_buffer("state_labels", torch.arange(num_tags), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.start_transitions, -0.1, 0.1)
        nn.init.uniform_(self.transitions, -0.1, 0.1)
        nn.init.uniform_(self.end_transitions, -0.1, 0.1)

    def _potentials(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        return (_masked(self.start_transitions, self.allowed_start, dtype),
                _masked(self.transitions, self.allowed_transitions, dtype),
                _masked(self.end_transitions, self.allowed_end, dtype))

    def _state_emissions(self, emissions: Tensor) -> Tensor:
        return emissions

    def _gold_states(self, tags: Tensor) -> Tensor:
        return tags

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}, constrained={self.allowed_transitions is not None}"

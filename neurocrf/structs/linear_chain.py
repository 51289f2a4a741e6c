"""First-order linear-chain CRF (Lafferty, McCallum and Pereira, 2001)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neurocrf.structs.base import ChainCRF
from neurocrf.structs.constraints import Constraints


def pair_emissions(emissions: Tensor, transition_scores: Tensor) -> Tensor:
    """Tag emissions ``[B, T, L]`` and observation-dependent transition scores ``[B, T, L, L]``
    -> pair emissions ``[B, T, L + 1, L]`` for :class:`LinearChainCRF`.

    ``transition_scores[b, t, a, c]`` is added when tag ``a`` at the previous position is followed
    by tag ``c`` at position ``t`` (on top of the CRF's own transition matrix). In the result, rows
    ``a < L`` hold ``emissions[b, t, c] + transition_scores[b, t, a, c]`` and row ``L`` (no previous
    tag) holds ``emissions[b, t, c]``: the layer reads row ``L`` at each sequence's first position
    and rows ``a < L`` everywhere else.
    """
    if transition_scores.shape != emissions.shape + emissions.shape[-1:]:
        raise ValueError(f"transition scores {tuple(transition_scores.shape)} must be [batch, seq_len, num_tags,"
                         f" num_tags] for emissions {tuple(emissions.shape)}")
    return torch.cat([emissions.unsqueeze(2) + transition_scores, emissions.unsqueeze(2)], dim=2)


class LinearChainCRF(ChainCRF):
    """First-order CRF: ``score(y) = start[y_1] + sum_t (emit[t, y_t] + trans[y_{t-1}, y_t]) + end[y_T]``.

    States are the tags themselves. Every quantity costs O(T L^2) per sequence.

    Observation-dependent transitions (Sha & Pereira 2003's label-pair features): every method also
    takes pair emissions ``P`` ``[batch, seq_len, L + 1, L]`` (built by :func:`pair_emissions`),
    ``score(y) = start[y_1] + P[1, L, y_1] + sum_{t>1} (P[t, y_{t-1}, y_t] + trans[y_{t-1}, y_t])
    + end[y_T]``, positions counted over each row's True mask positions. Same cost.

    Args:
        num_tags: number of tags ``L``.
        constraints: optional :class:`~neurocrf.structs.constraints.Constraints`; forbidden starts,
            transitions and ends score ``-inf`` in every method.
        scan, parallel_threshold, backend: see :class:`~neurocrf.structs.base.ChainCRF`.

    >>> crf = LinearChainCRF(3)
    >>> emissions = torch.randn(2, 4, 3)
    >>> crf.decode(emissions).shape
    torch.Size([2, 4])
    """

    accepts_pair_emissions = True

    def __init__(self, num_tags: int, constraints: Constraints | None = None, scan: str = "auto",
                 parallel_threshold: int = 512, backend: str = "auto") -> None:
        super().__init__(num_tags, scan=scan, parallel_threshold=parallel_threshold, backend=backend)
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

    def _potentials(self, dtype: torch.dtype, additive: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        return (self._forbid(self.start_transitions.to(dtype), self.allowed_start, additive),
                self._forbid(self.transitions.to(dtype), self.allowed_transitions, additive),
                self._forbid(self.end_transitions.to(dtype), self.allowed_end, additive))

    def _state_emissions(self, emissions: Tensor) -> Tensor:
        return emissions

    def _gold_states(self, tags: Tensor) -> Tensor:
        return tags

    def _tag_reading(self) -> tuple[None, None, None]:
        return None, None, None  # states are tags

    def _split_pair_emissions(self, pairs: Tensor, transitions: Tensor) -> tuple[Tensor, Tensor]:
        # row L scores the first position alone; every later position is scored on its incoming edge
        # (one split, not two slices: its backward builds the gradient of `pairs` once)
        edges, alone = pairs.split([self.num_tags, 1], dim=2)
        later = pairs.new_zeros(pairs.shape[0], max(pairs.shape[1] - 1, 0), self.num_tags)
        return torch.cat([alone[:, :1, 0], later], dim=1), transitions + edges

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}, constrained={self.allowed_transitions is not None}"

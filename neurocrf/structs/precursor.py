"""Precursor-induced CRF (Lee and Choi, NEWS 2018; BMC Med Inform Decis Mak 2019, 19:132).

The outside label O is split into states that remember the preceding entity: a plain O (no entity
seen yet in the sentence) and one O state per memory key, entered when an entity ends and kept
until the next entity starts. A first-order chain over this expanded state set therefore carries
entity -> O* -> entity dependencies. All O states share the O emission score (optionally plus a
learned per-state bias), and every output speaks original tags.

The expanded state path follows deterministically from a tag sequence, and only transitions that
respect the memory are allowed, so the layer defines an exact distribution over tag sequences.

Memory keys (``memory``):

- ``"type"`` (default): the entity type. IOB2 with E types: 2E + 1 tags -> 3E + 1 states;
  BIOES: 4E + 1 tags -> 5E + 1 states.
- ``"tag"``: the full last entity tag, as counted in the paper (N - 1 new states for N IOB2 tags):
  IOB2 -> 4E + 1 states; BIOES with constraints (O only follows E-X or S-X) -> 6E + 1 states.

O states that the constraints make unreachable are not created. Every quantity costs
O(T (L + E)^2) per sequence for L tags and E extra O states.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neurocrf.structs.base import ChainCRF
from neurocrf.structs.constraints import OUTSIDE, allowed_transitions, split_tag
from neurocrf.structs.engine import columns as shared


class PrecursorInducedCRF(ChainCRF):
    """CRF over tags with O states that remember the preceding entity.

    Args:
        tags: the tag list (ids are positions in it); must contain ``outside``.
        scheme: ``"IOB1"``, ``"IOB2"`` or ``"BIOES"``; used to read entity types and, when
            ``constrained``, to forbid invalid transitions.
        outside: the outside label.
        memory: ``"type"`` or ``"tag"`` (see the module docstring).
        state_bias: add a learned bias to the emission of each O state.
        constrained: forbid transitions that are invalid in ``scheme``.
        scan, parallel_threshold, backend: see :class:`~neurocrf.structs.base.ChainCRF`.

    >>> crf = PrecursorInducedCRF(["O", "B-PER", "I-PER", "B-ORG", "I-ORG"], "IOB2")
    >>> crf.num_states()
    7
    """

    def __init__(self, tags: list[str], scheme: str = "IOB2", outside: str = OUTSIDE, memory: str = "type",
                 state_bias: bool = False, constrained: bool = True, scan: str = "auto",
                 parallel_threshold: int = 512, backend: str = "auto") -> None:
        super().__init__(len(tags), scan=scan, parallel_threshold=parallel_threshold, backend=backend)
        if outside not in tags:
            raise ValueError(f"the outside label {outside!r} is not in the tag list {tags}")
        if memory not in {"type", "tag"}:
            raise ValueError(f"memory must be 'type' or 'tag', got {memory!r}")
        self.tags = list(tags)
        self.scheme = scheme
        self.memory = memory
        self.constrained = constrained
        n = len(tags)
        o_index = tags.index(outside)
        parts = [split_tag(tag, outside) for tag in tags]
        if constrained:
            c = allowed_transitions(tags, scheme, outside)
            start_ok, move_ok, end_ok = c.start, c.transitions, c.end
        else:
            start_ok = torch.ones(n, dtype=torch.bool)
            move_ok = torch.ones(n, n, dtype=torch.bool)
            end_ok = torch.ones(n, dtype=torch.bool)

        def key_of(i: int) -> str:
            prefix, entity_type = parts[i]
            return str(entity_type) if memory == "type" else tags[i]

        # Extra O states, one per memory key that some entity tag can hand over to O.
        keys: list[str] = []
        for i in range(n):
            if i != o_index and bool(move_ok[i, o_index]) and key_of(i) not in keys:
                keys.append(key_of(i))
        num_states = n + len(keys)
        memory_state = torch.full((n,), o_index, dtype=torch.long)  # O state entered after tag i
        for i in range(n):
            if i != o_index and key_of(i) in keys:
                memory_state[i] = n + keys.index(key_of(i))
        labels = torch.cat([torch.arange(n), torch.full((len(keys),), o_index)])
        o_states = [o_index] + list(range(n, num_states))

        start = torch.zeros(num_states, dtype=torch.bool)
        start[:n] = start_ok  # memory O states cannot start a sentence
        end = end_ok[labels].clone()
        moves = move_ok[labels][:, labels].clone()  # scheme validity of the underlying tags
        into_o = torch.zeros(num_states, num_states, dtype=torch.bool)
        for s in range(num_states):
            target = s if s in o_states else int(memory_state[s])
            into_o[s, target] = True
        moves[:, o_states] &= into_o[:, o_states]

        shared.check(labels, n)  # the O states read the O column: the state labels are the emission columns
        self.register_buffer("state_labels", labels, persistent=False)
        self.register_buffer("memory_state", memory_state, persistent=False)
        self.register_buffer("gold_lookup", torch.cat([memory_state, torch.arange(n)]), persistent=False)
        self.register_buffer("allowed_start", start, persistent=False)
        self.register_buffer("allowed_moves", moves, persistent=False)
        self.register_buffer("allowed_end", end, persistent=False)
        self.register_buffer("o_states", torch.tensor(o_states), persistent=False)
        # the state after (state, tag), the row num_states standing for the start: _gold_states as an automaton
        automaton = torch.arange(n).repeat(num_states + 1, 1)
        automaton[:num_states, o_index] = torch.where(labels == o_index, torch.arange(num_states),
                                                      memory_state[labels.clamp(max=n - 1)])
        automaton[num_states, o_index] = o_index
        self.register_buffer("gold_automaton", automaton.to(torch.int32), persistent=False)
        self.o_index = o_index
        self.memory_keys = keys
        self.start_transitions = nn.Parameter(torch.empty(num_states))
        self.transitions = nn.Parameter(torch.empty(num_states, num_states))
        self.end_transitions = nn.Parameter(torch.empty(num_states))
        self.state_bias = nn.Parameter(torch.zeros(len(o_states))) if state_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.start_transitions, -0.1, 0.1)
        nn.init.uniform_(self.transitions, -0.1, 0.1)
        nn.init.uniform_(self.end_transitions, -0.1, 0.1)
        if self.state_bias is not None:
            nn.init.zeros_(self.state_bias)

    def _state_shape(self) -> tuple[int, ...]:
        return (self.state_labels.shape[0],)

    def _potentials(self, dtype: torch.dtype, additive: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        return (self._forbid(self.start_transitions.to(dtype), self.allowed_start, additive),
                self._forbid(self.transitions.to(dtype), self.allowed_moves, additive),
                self._forbid(self.end_transitions.to(dtype), self.allowed_end, additive))

    def _emission_columns(self) -> Tensor | None:
        return self.state_labels if self.state_bias is None else None

    def _tag_reading(self) -> tuple[Tensor, Tensor, Tensor] | None:
        if self.state_bias is not None:
            return None
        return self.state_labels, self.gold_automaton, self.state_labels

    def _state_emissions(self, emissions: Tensor) -> Tensor:
        expanded = shared.expand(emissions, self.state_labels)
        if self.state_bias is None:
            return expanded
        bias = emissions.new_zeros(self.state_labels.shape[0])
        bias = bias.index_add(0, self.o_states, self.state_bias.to(emissions.dtype))
        return expanded + bias

    def _gold_states(self, tags: Tensor) -> Tensor:
        # An entity tag is its own state; an O takes the memory state of the last entity tag before
        # it. Before any entity, the position found is 0, which holds an O, whose memory state is
        # the plain O. One lookup in gold_lookup = [memory_state, identity] picks either.
        is_entity = tags != self.o_index
        positions = torch.arange(tags.shape[1], device=tags.device)
        last_entity = (positions * is_entity).cummax(dim=1).values
        key = tags.gather(1, last_entity).add_(is_entity, alpha=self.num_tags)
        return self.gold_lookup.index_select(0, key.view(-1)).view_as(key)  # faster than [key] on CPU

    def extra_repr(self) -> str:
        return (f"num_tags={self.num_tags}, num_states={self.state_labels.shape[0]}, memory={self.memory!r}, "
                f"constrained={self.constrained}, state_bias={self.state_bias is not None}")

"""Allowed transitions of the IOB1, IOB2 and BIOES tag schemes.

Tags are ``O`` or ``<prefix>-<type>`` (``B-PER``, ``I-PER``, ``E-PER``, ``S-PER``). A forbidden
transition gets score ``-inf`` in every CRF layer, so no method can ever produce an invalid
sequence. IOB1 is the CoNLL-2003 convention: ``I-X`` may start an entity, ``B-X`` only marks an
entity that directly follows another of the same type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from neurocrf.conventions import OUTSIDE, SCHEMES


@dataclass(frozen=True)
class Constraints:
    """Allowed starts ``[L]``, transitions ``[L, L]`` (from, to) and ends ``[L]`` as bool tensors."""

    start: Tensor
    transitions: Tensor
    end: Tensor

    @property
    def num_tags(self) -> int:
        return self.start.shape[0]

    def validate(self, num_tags: int) -> None:
        shapes = (tuple(self.start.shape), tuple(self.transitions.shape), tuple(self.end.shape))
        if shapes != ((num_tags,), (num_tags, num_tags), (num_tags,)):
            raise ValueError(f"constraints have shapes {shapes}, expected for {num_tags} tags "
                             f"(({num_tags},), ({num_tags}, {num_tags}), ({num_tags},))")


def split_tag(tag: str, outside: str = OUTSIDE) -> tuple[str, str | None]:
    """``"B-PER"`` -> ``("B", "PER")``; the outside tag -> ``("O", None)``."""
    if tag == outside:
        return OUTSIDE, None
    prefix, sep, entity_type = tag.partition("-")
    if not sep or not entity_type or prefix not in {"B", "I", "E", "S"}:
        raise ValueError(f"tag {tag!r} is neither {outside!r} nor PREFIX-TYPE with PREFIX in B, I, E, S")
    return prefix, entity_type


def _start_ok(prefix: str, scheme: str) -> bool:
    if scheme == "IOB1":
        return prefix in {"O", "I"}
    if scheme == "IOB2":
        return prefix in {"O", "B"}
    return prefix in {"O", "B", "S"}


def _end_ok(prefix: str, scheme: str) -> bool:
    if scheme == "BIOES":
        return prefix in {"O", "E", "S"}
    return True


def _move_ok(a: tuple[str, str | None], b: tuple[str, str | None], scheme: str) -> bool:
    (pa, ta), (pb, tb) = a, b
    if scheme == "IOB1":
        if pb == "B":  # B-X only separates two adjacent entities of type X
            return pa in {"B", "I"} and ta == tb
        return True
    if scheme == "IOB2":
        if pb == "I":
            return pa in {"B", "I"} and ta == tb
        return True
    # BIOES: an entity is S, or B I* E.
    inside = pa in {"B", "I"}
    if pb in {"I", "E"}:
        return inside and ta == tb
    return not inside


def allowed_transitions(tags: list[str], scheme: str, outside: str = OUTSIDE) -> Constraints:
    """Constraints for ``tags`` under ``scheme`` (``"IOB1"``, ``"IOB2"`` or ``"BIOES"``).

    >>> c = allowed_transitions(["O", "B-PER", "I-PER"], "IOB2")
    >>> c.transitions.int().tolist()
    [[1, 1, 0], [1, 1, 1], [1, 1, 1]]
    """
    scheme = scheme.upper()
    if scheme == "IOBES":
        scheme = "BIOES"
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tag scheme {scheme!r}; expected one of {SCHEMES}")
    parts = [split_tag(tag, outside) for tag in tags]
    allowed_prefixes = {"IOB1": {"O", "B", "I"}, "IOB2": {"O", "B", "I"}, "BIOES": {"O", "B", "I", "E", "S"}}
    for tag, (prefix, _) in zip(tags, parts):
        if prefix not in allowed_prefixes[scheme]:
            raise ValueError(f"tag {tag!r} is not valid in scheme {scheme}")
    start = torch.tensor([_start_ok(p, scheme) for p, _ in parts], dtype=torch.bool)
    end = torch.tensor([_end_ok(p, scheme) for p, _ in parts], dtype=torch.bool)
    moves = torch.tensor([[_move_ok(a, b, scheme) for b in parts] for a in parts], dtype=torch.bool)
    return Constraints(start=start, transitions=moves, end=end)

"""Span tag schemes (IOB1, IOB2, BIOES): validation, span extraction and conversion.

A tag is ``"O"`` or ``"<prefix>-<type>"``; the type may itself contain hyphens (``B-cell-line``
has type ``cell-line``). The schemes differ in how spans are marked:

- ``IOB2``:  every span starts with ``B-X``; ``I-X`` continues a span of type ``X``.
- ``IOB1``:  spans are written ``I-X ...``; ``B-X`` is used only for the first token of a span
  that directly follows another span of the same type (``I-X I-X B-X``: two spans).
- ``BIOES``: ``S-X`` is a one-token span; longer spans are ``B-X (I-X)* E-X``.

>>> get_spans(["B-PER", "I-PER", "O", "B-LOC"], "IOB2")
[Span(type='PER', start=0, end=2), Span(type='LOC', start=3, end=4)]
>>> convert_tags(["I-PER", "B-PER", "O"], "IOB1", "BIOES")
['S-PER', 'S-PER', 'O']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from neurocrf.conventions import OUTSIDE, SCHEMES

_PREFIXES: dict[str, tuple[str, ...]] = {
    "IOB1": ("B", "I"),
    "IOB2": ("B", "I"),
    "BIOES": ("B", "I", "E", "S"),
}


class InvalidTagError(ValueError):
    """A tag sequence not well formed in its scheme; ``position``: 0-based bad token index."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True)
class Span:
    """A typed span of tokens ``[start, end)`` (end exclusive)."""

    type: str
    start: int
    end: int


def check_scheme(scheme: str) -> str:
    """Return ``scheme`` if it is one of :data:`SCHEMES`, else raise ValueError."""
    if scheme not in _PREFIXES:
        raise ValueError(f"unknown tag scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    return scheme


def scheme_prefixes(scheme: str) -> tuple[str, ...]:
    """The span prefixes a scheme uses, e.g. ``("B", "I", "E", "S")`` for BIOES."""
    return _PREFIXES[check_scheme(scheme)]


def split_tag(tag: str, scheme: str, position: int | None = None) -> tuple[str, str | None]:
    """Split a tag into ``(prefix, type)``; ``"O"`` gives ``("O", None)``.

    Raises InvalidTagError for a tag that is not ``O`` nor ``<prefix>-<type>`` with a prefix of
    ``scheme`` and a non-empty type.
    """
    if tag == OUTSIDE:
        return OUTSIDE, None
    prefix, sep, type_ = tag.partition("-")
    if not sep or not type_ or prefix not in _PREFIXES[scheme]:
        where = f"token {position + 1}: " if position is not None else ""
        allowed = ", ".join(f"{p}-<type>" for p in _PREFIXES[scheme])
        raise InvalidTagError(
            f"{where}tag {tag!r} is not valid in {scheme} (expected O, {allowed})", position
        )
    return prefix, type_


def make_tag(prefix: str, type_: str | None) -> str:
    """Inverse of :func:`split_tag`."""
    return OUTSIDE if prefix == OUTSIDE else f"{prefix}-{type_}"


def validate_tags(tags: Sequence[str], scheme: str) -> None:
    """Raise InvalidTagError unless ``tags`` is a well-formed sequence in ``scheme``.

    The message names the 1-based token position and the problem; ``error.position`` holds the
    0-based index of the offending token.
    """
    check_scheme(scheme)
    prev_prefix, prev_type = OUTSIDE, None
    for i, tag in enumerate(tags):
        prefix, type_ = split_tag(tag, scheme, i)
        problem = _transition_problem(scheme, prev_prefix, prev_type, prefix, type_)
        if problem:
            raise InvalidTagError(f"token {i + 1}: {problem}", i)
        prev_prefix, prev_type = prefix, type_
    if scheme == "BIOES" and prev_prefix in ("B", "I"):
        last = len(tags) - 1
        raise InvalidTagError(
            f"token {last + 1}: span {tags[last]!r} is not closed by E-{prev_type}"
            " at the end of the sentence",
            last,
        )


def _transition_problem(
    scheme: str, prev_prefix: str, prev_type: str | None, prefix: str, type_: str | None
) -> str | None:
    """Why ``prev -> cur`` is not allowed in ``scheme``, or None if it is."""
    prev = "O (or sentence start)" if prev_prefix == OUTSIDE else make_tag(prev_prefix, prev_type)
    cur = make_tag(prefix, type_)
    inside = prev_prefix != OUTSIDE and prev_type == type_
    if scheme == "IOB2":
        if prefix == "I" and not inside:
            return f"{cur} follows {prev}: an IOB2 span must start with B-{type_}"
        return None
    if scheme == "IOB1":
        if prefix == "B" and not inside:
            return (
                f"{cur} follows {prev}: in IOB1, B-{type_} only separates two adjacent"
                f" {type_} spans (use I-{type_})"
            )
        return None
    open_span = prev_prefix in ("B", "I")
    if open_span and not (prefix in ("I", "E") and type_ == prev_type):
        return (
            f"{cur} follows {prev}: the {prev_type} span must continue with I-{prev_type}"
            f" or end with E-{prev_type}"
        )
    if prefix in ("I", "E") and not open_span:
        return f"{cur} follows {prev}: a BIOES span must start with B-{type_}"
    return None


def get_spans(tags: Sequence[str], scheme: str) -> list[Span]:
    """Typed spans of a tag sequence, in order.

    Exact for well-formed sequences. Ill-formed ones (e.g. model output without constraints) are
    read leniently, like conlleval: an ``I-X`` (or BIOES ``E-X``) that does not continue a span of
    type ``X`` starts one, a BIOES span left open ends where the next tag does not continue it.
    Tags that are not of the form ``O`` / ``<prefix>-<type>`` of the scheme raise InvalidTagError.
    """
    check_scheme(scheme)
    spans: list[Span] = []
    start: int | None = None
    cur_type: str | None = None
    closed = True  # BIOES only: the open span was ended by E-/S-

    def close(end: int) -> None:
        nonlocal start, cur_type
        if start is not None:
            spans.append(Span(cur_type, start, end))  # type: ignore[arg-type]
        start, cur_type = None, None

    for i, tag in enumerate(tags):
        prefix, type_ = split_tag(tag, scheme, i)
        if prefix == OUTSIDE:
            close(i)
            continue
        if scheme == "BIOES":
            continues = (
                start is not None and not closed and type_ == cur_type and prefix in ("I", "E")
            )
            if not continues:
                close(i)
                start, cur_type = i, type_
            closed = prefix in ("E", "S")
        else:
            continues = start is not None and type_ == cur_type and prefix == "I"
            if not continues:
                close(i)
                start, cur_type = i, type_
    close(len(tags))
    return spans


def spans_to_tags(spans: Sequence[Span], length: int, scheme: str) -> list[str]:
    """Write non-overlapping spans as a tag sequence of ``length`` tokens in ``scheme``."""
    check_scheme(scheme)
    tags = [OUTSIDE] * length
    prev_end, prev_type = -1, None
    for span in sorted(spans, key=lambda s: s.start):
        if span.start < 0 or span.end > length or span.start >= span.end:
            raise ValueError(f"span {span} does not fit a sentence of {length} tokens")
        if span.start < prev_end:
            raise ValueError(f"span {span} overlaps the previous span")
        n = span.end - span.start
        if scheme == "IOB2":
            tags[span.start : span.end] = [f"B-{span.type}"] + [f"I-{span.type}"] * (n - 1)
        elif scheme == "IOB1":
            tags[span.start : span.end] = [f"I-{span.type}"] * n
            if span.start == prev_end and span.type == prev_type:
                tags[span.start] = f"B-{span.type}"
        elif n == 1:
            tags[span.start] = f"S-{span.type}"
        else:
            tags[span.start : span.end] = (
                [f"B-{span.type}"] + [f"I-{span.type}"] * (n - 2) + [f"E-{span.type}"]
            )
        prev_end, prev_type = span.end, span.type
    return tags


def convert_tags(tags: Sequence[str], source: str, target: str) -> list[str]:
    """Convert a tag sequence from scheme ``source`` to scheme ``target``.

    Goes through :func:`get_spans`, so it is lossless for well-formed input and repairs
    ill-formed input the same way span extraction reads it.
    """
    check_scheme(target)
    return spans_to_tags(get_spans(tags, source), len(tags), target)


def tag_types(tags: Iterable[str]) -> set[str]:
    """The entity types occurring in ``tags`` (whatever the scheme)."""
    return {tag.partition("-")[2] for tag in tags if tag != OUTSIDE and "-" in tag}


def all_tags(types: Sequence[str] | set[str], scheme: str) -> list[str]:
    """Every tag of ``scheme`` over ``types``: ``"O"`` first, then the others sorted."""
    prefixes = scheme_prefixes(scheme)
    return [OUTSIDE] + sorted(f"{p}-{t}" for t in set(types) for p in prefixes)

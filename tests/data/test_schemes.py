"""Tag schemes: validation, span extraction, conversion between IOB1, IOB2 and BIOES."""

import itertools
import random

import pytest

from neurocrf.data.schemes import (
    SCHEMES,
    InvalidTagError,
    Span,
    all_tags,
    convert_tags,
    get_spans,
    spans_to_tags,
    validate_tags,
)

# The same spans written in each scheme; the tricky IOB1 cases are adjacent spans of one type
# (B- marks the second), adjacent spans of different types (no B- needed) and spans at the start.
TABLES = [
    {
        "IOB1": ["I-PER", "B-PER", "I-PER", "I-LOC", "O", "I-ORG"],
        "IOB2": ["B-PER", "B-PER", "I-PER", "B-LOC", "O", "B-ORG"],
        "BIOES": ["S-PER", "B-PER", "E-PER", "S-LOC", "O", "S-ORG"],
    },
    {
        "IOB1": ["O", "I-MISC", "I-MISC", "I-MISC", "B-MISC", "O", "I-PER", "I-PER"],
        "IOB2": ["O", "B-MISC", "I-MISC", "I-MISC", "B-MISC", "O", "B-PER", "I-PER"],
        "BIOES": ["O", "B-MISC", "I-MISC", "E-MISC", "S-MISC", "O", "B-PER", "E-PER"],
    },
    {
        "IOB1": ["I-LOC", "O", "I-LOC", "B-LOC", "B-LOC", "I-ORG", "I-LOC"],
        "IOB2": ["B-LOC", "O", "B-LOC", "B-LOC", "B-LOC", "B-ORG", "B-LOC"],
        "BIOES": ["S-LOC", "O", "S-LOC", "S-LOC", "S-LOC", "S-ORG", "S-LOC"],
    },
    {"IOB1": ["O", "O"], "IOB2": ["O", "O"], "BIOES": ["O", "O"]},
    {"IOB1": [], "IOB2": [], "BIOES": []},
    {
        "IOB1": ["I-cell-line", "I-cell-line", "B-cell-line"],
        "IOB2": ["B-cell-line", "I-cell-line", "B-cell-line"],
        "BIOES": ["B-cell-line", "E-cell-line", "S-cell-line"],
    },
]
SPANS = [
    [Span("PER", 0, 1), Span("PER", 1, 3), Span("LOC", 3, 4), Span("ORG", 5, 6)],
    [Span("MISC", 1, 4), Span("MISC", 4, 5), Span("PER", 6, 8)],
    [Span("LOC", 0, 1), Span("LOC", 2, 3), Span("LOC", 3, 4), Span("LOC", 4, 5),
     Span("ORG", 5, 6), Span("LOC", 6, 7)],
    [],
    [],
    [Span("cell-line", 0, 2), Span("cell-line", 2, 3)],
]


@pytest.mark.parametrize("source,target", list(itertools.product(SCHEMES, SCHEMES)))
@pytest.mark.parametrize("table", range(len(TABLES)))
def test_convert_every_pair_on_tricky_cases(table: int, source: str, target: str) -> None:
    tags = TABLES[table]
    assert convert_tags(tags[source], source, target) == tags[target]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("table", range(len(TABLES)))
def test_spans_valid_and_rendered(table: int, scheme: str) -> None:
    tags = TABLES[table][scheme]
    validate_tags(tags, scheme)
    assert get_spans(tags, scheme) == SPANS[table]
    assert spans_to_tags(SPANS[table], len(tags), scheme) == tags


def _random_spans(rng: random.Random, length: int) -> list[Span]:
    spans, position = [], 0
    while position < length:
        if rng.random() < 0.4:
            position += 1
            continue
        end = min(length, position + rng.randint(1, 3))
        spans.append(Span(rng.choice("AB"), position, end))
        position = end
    return spans


def test_random_spans_round_trip_through_all_schemes() -> None:
    rng = random.Random(0)
    for _ in range(300):
        length = rng.randint(0, 10)
        spans = _random_spans(rng, length)
        rendered = {scheme: spans_to_tags(spans, length, scheme) for scheme in SCHEMES}
        for scheme, tags in rendered.items():
            validate_tags(tags, scheme)
            assert get_spans(tags, scheme) == spans
            for target in SCHEMES:
                assert convert_tags(tags, scheme, target) == rendered[target]


@pytest.mark.parametrize(
    "tags,scheme,position,fragment",
    [
        (["O", "I-PER"], "IOB2", 1, "must start with B-PER"),
        (["I-PER"], "IOB2", 0, "must start with B-PER"),
        (["B-PER", "I-LOC"], "IOB2", 1, "I-LOC follows B-PER"),
        (["B-PER"], "IOB1", 0, "only separates two adjacent PER spans"),
        (["O", "B-PER"], "IOB1", 1, "only separates"),
        (["I-LOC", "B-PER"], "IOB1", 1, "B-PER follows I-LOC"),
        (["B-PER", "O"], "BIOES", 1, "must continue with I-PER or end with E-PER"),
        (["O", "B-PER"], "BIOES", 1, "not closed by E-PER"),
        (["B-PER", "I-PER"], "BIOES", 1, "not closed"),
        (["I-PER", "E-PER"], "BIOES", 0, "must start with B-PER"),
        (["O", "E-PER"], "BIOES", 1, "must start with B-PER"),
        (["S-PER", "E-PER"], "BIOES", 1, "must start with B-PER"),
        (["B-PER", "E-LOC"], "BIOES", 1, "E-LOC follows B-PER"),
        (["B-PER", "S-PER"], "BIOES", 1, "must continue"),
        (["O", "PER"], "IOB2", 1, "not valid in IOB2"),
        (["E-PER"], "IOB2", 0, "not valid in IOB2"),
        (["S-PER"], "IOB1", 0, "not valid in IOB1"),
        (["B-"], "IOB2", 0, "not valid"),
        (["X-PER"], "BIOES", 0, "not valid"),
        (["o"], "BIOES", 0, "not valid"),
    ],
)
def test_validate_names_position_and_problem(
    tags: list[str], scheme: str, position: int, fragment: str
) -> None:
    with pytest.raises(InvalidTagError) as error:
        validate_tags(tags, scheme)
    assert error.value.position == position
    assert f"token {position + 1}:" in str(error.value)
    assert fragment in str(error.value)


def test_invalid_error_is_value_error_and_unknown_scheme() -> None:
    assert issubclass(InvalidTagError, ValueError)
    with pytest.raises(ValueError, match="unknown tag scheme 'BILOU'"):
        validate_tags(["O"], "BILOU")
    with pytest.raises(ValueError, match="unknown tag scheme"):
        convert_tags(["O"], "IOB2", "IOB3")


@pytest.mark.parametrize(
    "tags,scheme,expected",
    [
        (["O", "I-PER", "I-PER"], "IOB2", [Span("PER", 1, 3)]),
        (["B-PER", "I-LOC"], "IOB2", [Span("PER", 0, 1), Span("LOC", 1, 2)]),
        (["B-PER", "O", "E-PER"], "BIOES", [Span("PER", 0, 1), Span("PER", 2, 3)]),
        (["B-PER", "I-PER"], "BIOES", [Span("PER", 0, 2)]),
        (["S-PER", "I-PER", "E-PER"], "BIOES", [Span("PER", 0, 1), Span("PER", 1, 3)]),
        (["B-PER", "B-PER", "E-PER"], "BIOES", [Span("PER", 0, 1), Span("PER", 1, 3)]),
    ],
)
def test_get_spans_reads_ill_formed_sequences_leniently(
    tags: list[str], scheme: str, expected: list[Span]
) -> None:
    with pytest.raises(InvalidTagError):
        validate_tags(tags, scheme)
    assert get_spans(tags, scheme) == expected


def test_convert_repairs_ill_formed_input() -> None:
    assert convert_tags(["O", "I-PER", "I-PER"], "IOB2", "IOB2") == ["O", "B-PER", "I-PER"]
    assert convert_tags(["B-PER", "O"], "BIOES", "BIOES") == ["S-PER", "O"]


def test_get_spans_rejects_malformed_tags() -> None:
    with pytest.raises(InvalidTagError, match="token 2: tag 'PER'"):
        get_spans(["O", "PER"], "IOB2")


def test_spans_to_tags_rejects_overlaps_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        spans_to_tags([Span("A", 0, 2), Span("B", 1, 3)], 3, "IOB2")
    with pytest.raises(ValueError, match="does not fit"):
        spans_to_tags([Span("A", 2, 4)], 3, "BIOES")


def test_all_tags_o_first_then_sorted() -> None:
    assert all_tags({"PER", "LOC"}, "IOB2") == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    assert len(all_tags({"X"}, "BIOES")) == 5

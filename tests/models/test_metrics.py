"""Strict seqeval span scores, the per-type report and its files."""

from __future__ import annotations

import json

import pytest

from neurocrf.models.metrics import (
    format_report,
    seqeval_scheme,
    span_scores,
    write_report,
)


def test_strict_mode_ignores_ill_formed_spans() -> None:
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    # I-PER without B-PER is a span in the lenient (conlleval) reading, none in strict IOB2.
    pred = [["I-PER", "I-PER", "O", "B-LOC"]]
    scores = span_scores(gold, pred, "IOB2")
    assert scores.precision == pytest.approx(1.0)  # the only strict span predicted (LOC) is right
    assert scores.recall == pytest.approx(0.5)
    assert scores.f1 == pytest.approx(2 / 3)
    assert scores.per_type["PER"].recall == 0.0 and scores.per_type["LOC"].f1 == 1.0


def test_bioes_is_seqeval_iobes_and_values_are_python_numbers() -> None:
    gold = [["B-ORG", "E-ORG", "S-PER", "O"], ["S-LOC"]]
    pred = [["B-ORG", "E-ORG", "S-LOC", "O"], ["S-LOC"]]
    scores = span_scores(gold, pred, "BIOES")
    assert type(scores.f1) is float and type(scores.support) is int
    assert scores.support == 3 and scores.sentences == 2
    assert scores.precision == pytest.approx(2 / 3) and scores.recall == pytest.approx(2 / 3)
    assert {name: t.support for name, t in scores.per_type.items()} == {"LOC": 1, "ORG": 1, "PER": 1}
    assert seqeval_scheme("BIOES").__name__ == "IOBES"
    with pytest.raises(ValueError, match="no seqeval scheme"):
        seqeval_scheme("BILOU")


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1"):
        span_scores([["O", "O"]], [["O"]], "IOB2")
    with pytest.raises(ValueError, match="1 gold sentences but 2"):
        span_scores([["O"]], [["O"], ["O"]], "IOB2")


def test_no_entities_gives_zero_not_nan() -> None:
    scores = span_scores([["O", "O"]], [["O", "O"]], "IOB2")
    assert scores.f1 == 0.0 and scores.support == 0 and scores.per_type == {}


def test_report_files(tmp_path) -> None:
    scores = span_scores([["B-PER", "O", "B-LOC"]], [["B-PER", "O", "O"]], "IOB2")
    text = format_report(scores)
    lines = text.splitlines()
    assert lines[0].split() == ["type", "precision", "recall", "f1", "support"]
    per_row = {line.split()[0]: line.split()[1:] for line in lines if line.split()[:1] in (["PER"], ["LOC"])}
    assert per_row["PER"] == ["1.0000", "1.0000", "1.0000", "1"]
    assert per_row["LOC"] == ["0.0000", "0.0000", "0.0000", "1"]
    assert "micro avg" in text and "strict" in text

    written = write_report(scores, tmp_path / "out", prefix="dev")
    assert [p.name for p in written] == ["dev_report.txt", "dev_metrics.json"]
    data = json.loads((tmp_path / "out" / "dev_metrics.json").read_text())
    assert data["f1"] == pytest.approx(2 / 3) and data["per_type"]["LOC"]["support"] == 1

"""Precursor statistics (neurocrf.study.precursor_stats, scripts/precursor_stats.py): exact counts
on hand-made sentences, corpora read through their data configs, and the real corpora."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from neurocrf.data.conll import ConllFormatError
from neurocrf.study.precursor_stats import (
    corpus_stats,
    format_table,
    precursor_stats,
    read_split_tags,
    resolve_data_config,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("NEUROCRF_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT / "scripts"))
from precursor_stats import CORPORA  # noqa: E402
from precursor_stats import main as precursor_script  # noqa: E402


def test_counts_on_hand_made_sentences() -> None:
    sentences = [
        # PER, 0 O tokens, ORG (adjacent), 2 O, ORG, 1 O, PER
        ["B-PER", "I-PER", "B-ORG", "O", "O", "B-ORG", "I-ORG", "O", "B-PER"],
        ["O", "O", "B-LOC", "O"],  # one entity: no precursor
        ["O", "O", "O"],  # none
        # LOC, 3 O, LOC, 5 O, MISC, 6 O, MISC, 10 O, LOC, 11 O, PER
        ["B-LOC", *"OOO", "B-LOC", *"OOOOO", "B-MISC", *"OOOOOO", "B-MISC", *["O"] * 10, "B-LOC",
         *["O"] * 11, "B-PER"],
    ]
    stats = precursor_stats(sentences, "IOB2")
    assert (stats.sentences, stats.entities, stats.preceded) == (4, 11, 8)
    # same type: ORG->ORG, LOC->LOC, MISC->MISC
    assert stats.same_type == 3
    assert dict(stats.gaps) == {0: 1, 2: 1, 1: 1, 3: 1, 5: 1, 6: 1, 10: 1, 11: 1}
    assert stats.buckets() == {"0": 1, "1": 1, "2": 1, "3-5": 2, "6-10": 2, ">10": 1}
    assert stats.share == 8 / 11
    assert stats.to_dict()["gaps"] == {"0": 1, "1": 1, "2": 1, "3": 1, "5": 1, "6": 1, "10": 1, "11": 1}


def test_schemes_and_kept_types() -> None:
    # IOB1: B- only between two adjacent spans of one type
    assert dict(precursor_stats([["I-PER", "I-PER", "B-PER", "O", "I-LOC"]], "IOB1").gaps) == {0: 1, 1: 1}
    bioes = precursor_stats([["S-A", "B-B", "E-B", "O", "S-A"]], "BIOES")
    assert (bioes.entities, bioes.preceded, bioes.same_type, dict(bioes.gaps)) == (3, 2, 0, {0: 1, 1: 1})
    # a dropped type reads as O: A ... A through B's tokens
    kept = precursor_stats([["S-A", "B-B", "E-B", "O", "S-A"]], "BIOES", keep_types=["A"])
    assert (kept.entities, kept.preceded, kept.same_type, dict(kept.gaps)) == (2, 1, 1, {3: 1})
    empty = precursor_stats([["O"]], "IOB2")
    assert (empty.share, empty.buckets()[">10"]) == (0.0, 0)


def write_corpus(folder: Path) -> Path:
    """A tiny corpus in the JNLPBA layout (document lines, tab-separated), and its data config."""
    (folder / "tiny").mkdir(parents=True)
    (folder / "tiny" / "train.iob2").write_text(
        "###MEDLINE:1\n\nIL-2\tB-protein\ngene\tI-protein\nin\tO\nT\tB-cell_type\ncells\tI-cell_type\n\n"
        "###MEDLINE:2\n\nNF-kB\tB-protein\np50\tB-protein\n\n", encoding="utf-8")
    config = folder / "configs" / "tiny.yaml"
    config.parent.mkdir()
    config.write_text(
        "_target_: neurocrf.data.datamodule.SequenceDataModule\n"
        "train_path: ${paths.shared_data}/tiny/train.iob2\ndev_path: null\ntest_path: null\ndev_fraction: 0.5\n"
        "file_scheme: IOB2\nscheme: BIOES\nreader:\n  token_column: 0\n  tag_column: 1\n  delimiter: \"\\t\"\n"
        "  docstart: [\"-DOCSTART-\", \"###MEDLINE:\"]\nseed: ${oc.select:seed,0}\n", encoding="utf-8")
    return config


def test_corpus_read_through_its_data_config_and_the_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_path = write_corpus(tmp_path)
    config = resolve_data_config(config_path, tmp_path)
    assert read_split_tags(config) == [["B-protein", "I-protein", "O", "B-cell_type", "I-cell_type"],
                                       ["B-protein", "B-protein"]]
    stats = corpus_stats(config)
    assert (stats.sentences, stats.entities, stats.preceded, stats.same_type) == (2, 4, 2, 1)
    assert dict(stats.gaps) == {1: 1, 0: 1}
    with pytest.raises(ValueError, match="no dev file"):
        read_split_tags(config, "dev")

    table = precursor_script(["tiny", "--configs", str(config_path.parent), "--data", str(tmp_path),
                              "--json", str(tmp_path / "stats.json")])
    assert capsys.readouterr().out == table
    assert "| tiny | train | 2 | 4 | 2 (50.0%) | 50.0% | 50.0% | 50.0% | 0.0% | 0.0% | 0.0% | 0.0% |" in table
    saved = json.loads((tmp_path / "stats.json").read_text())
    assert saved["tiny"]["buckets"] == {"0": 1, "1": 1, "2": 0, "3-5": 0, "6-10": 0, ">10": 0}
    assert saved["tiny"]["split"] == "train" and saved["tiny"]["share"] == 0.5

    # a bad tag names file and line
    (tmp_path / "tiny" / "train.iob2").write_text("IL-2\tX-protein\n", encoding="utf-8")
    with pytest.raises(ConllFormatError, match=r"train.iob2:1"):
        corpus_stats(config)


def test_the_script_knows_the_study_corpora() -> None:
    assert all((ROOT / "configs" / "data" / f"{name}.yaml").is_file() for name in CORPORA)
    assert format_table({}).startswith("| corpus | split |")


@pytest.mark.slow
def test_real_corpora_entity_counts() -> None:
    if not (SHARED / "jnlpba").is_dir():
        pytest.skip(f"no corpora at {SHARED}")
    configs = ROOT / "configs" / "data"
    # entity totals of shared/data/README.md
    for name, entities in [("jnlpba", 51_301), ("conll2003", 23_499)]:
        stats = corpus_stats(resolve_data_config(configs / f"{name}.yaml", SHARED))
        assert stats.entities == entities
        assert 0 < stats.preceded < stats.entities and sum(stats.buckets().values()) == stats.preceded

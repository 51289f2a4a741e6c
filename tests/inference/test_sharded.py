"""Prediction through Lightning's prediction loop in shards: the output of 2 processes (gloo,
``trainer=ddp_sim``) is byte for byte the output of one, and a re-run after an interrupted run
predicts only the shards not complete (checked: record, size and hash), with the same output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import DictConfig

from neurocrf.cli.predict import predict
from neurocrf.cli.utils import compose_task_config
from neurocrf.inference.sharded import shard_dir
from neurocrf.models.tagger import Tagger
from tests.helpers.sample_data import sample_data_dir, sample_test_text, tiny_tagger_checkpoint

WINDOW = 8  # 61 test sentences + 3 empty lines: 8 shards


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=13, train_size=150, dev_size=20, test_size=61)


@pytest.fixture(scope="module")
def ckpt(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_tagger_checkpoint(tmp_path_factory, data_dir)


@pytest.fixture(scope="module")
def source(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Text with empty lines (a shard of empty sentences only among them)."""
    return sample_test_text(tmp_path_factory, data_dir, empty_after=16, empty=WINDOW)


def config(tmp_path: Path, overrides: list[str]) -> DictConfig:
    return compose_task_config("predict", tmp_path, overrides)


def run(tmp_path: Path, ckpt: Path, source: Path, output: Path, *options: str) -> dict:
    return predict(config(tmp_path, [f"ckpt_path={ckpt}", f"input={source}", f"output={output}", f"window={WINDOW}",
                                     "format=jsonl", "nbest=2", "batch_size=3", *options]))


@pytest.fixture(scope="module")
def single(ckpt: Path, source: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The output of one process, without shards."""
    folder = tmp_path_factory.mktemp("single")
    run(folder, ckpt, source, folder / "out.jsonl")
    return (folder / "out.jsonl").read_bytes()


def test_two_processes_write_the_bytes_of_one(tmp_path: Path, ckpt: Path, source: Path, single: bytes) -> None:
    output = tmp_path / "out.jsonl"
    summary = run(tmp_path, ckpt, source, output, "trainer=ddp_sim")
    assert summary["shards"] == 9 and summary["reused"] == 0
    assert output.read_bytes() == single
    assert not shard_dir(str(output)).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_a_rerun_predicts_only_the_shards_not_complete(tmp_path: Path, ckpt: Path, source: Path, single: bytes,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    output = tmp_path / "out.jsonl"
    # an interrupted run: the loop stops after 7 batches (3 shards of 8 sentences in batches of 3)
    with pytest.raises(RuntimeError, match=r"shard\(s\) \[3\] not complete \(and the last shard not reached\);"
                                           r" 3 complete shard\(s\) kept in .*run the same command again"):
        run(tmp_path, ckpt, source, output, "resumable=true", "+trainer.limit_predict_batches=7")
    assert not output.exists()
    folder = shard_dir(str(output))
    assert sorted(p.name for p in folder.glob("*.done.json")) == [f"{i:08d}.done.json" for i in range(3)]
    # shard 1 altered after its record, shard 2 cut off before its record was written
    with open(folder / "00000001.part", "a", encoding="utf-8") as part:
        part.write("\n")
    (folder / "00000002.done.json").unlink()
    record = json.loads((folder / "00000000.done.json").read_text())
    assert record["sentences"] == WINDOW and record["tokens"] > 0 and len(record["sha256"]) == 64

    predicted: list[list[str]] = []
    predict_batch = Tagger.predict_batch

    def counting(self, tokens, **options):  # noqa: ANN001, ANN202 - Tagger.predict_batch's signature
        predicted.extend(tokens)
        return predict_batch(self, tokens, **options)

    monkeypatch.setattr(Tagger, "predict_batch", counting)
    summary = run(tmp_path, ckpt, source, output, "resumable=true")
    assert summary["reused"] == 1 and summary["shards"] == 9
    assert output.read_bytes() == single
    lines = source.read_text(encoding="utf-8").splitlines()
    assert sorted(map(tuple, predicted)) == sorted(tuple(line.split()) for line in lines[WINDOW:] if line)
    assert not folder.exists()


def test_shards_of_another_job_are_not_reused(tmp_path: Path, ckpt: Path, source: Path, single: bytes) -> None:
    output = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="not complete"):
        run(tmp_path, ckpt, source, output, "resumable=true", "+trainer.limit_predict_batches=3", "nbest=3")
    summary = run(tmp_path, ckpt, source, output, "resumable=true")  # nbest=2 again: another job
    assert summary["reused"] == 0 and output.read_bytes() == single


@pytest.mark.slow
def test_two_processes_resume_a_preempted_run(tmp_path: Path, ckpt: Path, source: Path, single: bytes) -> None:
    output = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="not complete"):
        run(tmp_path, ckpt, source, output, "trainer=ddp_sim", "+trainer.limit_predict_batches=4")
    summary = run(tmp_path, ckpt, source, output, "trainer=ddp_sim")
    assert summary["reused"] >= 2 and output.read_bytes() == single

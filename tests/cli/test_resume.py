"""Interrupted runs: the best checkpoint survives a resume into a new run directory, ``resume=true``
skips finished run directories and continues cut-off ones, ``summary.json`` holds every epoch, and a
run that never validates ends normally, saying that the sweepers' metric is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config
from tests.helpers.sample_data import sample_data_dir

TINY = [
    "encoder.word_dim=16", "encoder.char_dim=8", "encoder.char_hidden=8", "encoder.hidden_size=16",
    "~logger", "trainer.num_sanity_val_steps=0", "encoder.dropout=0.3", "data.batch_size=16",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=5, train_size=300, dev_size=40, test_size=40)


def config(run_dir: Path, data_dir: Path, overrides: list[str]) -> DictConfig:
    return compose_task_config("train", run_dir, [*TINY, *overrides], data_dir)


def _state(path: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def test_resume_into_a_new_directory_keeps_the_best_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    """2 epochs, then 1 more resumed into a new directory == 3 epochs straight: the same epoch is
    chosen and the tested checkpoint holds the same weights. The checkpoint keeps the highest dev
    loss, so that the best epoch is the first one, which a resume that forgets the earlier epochs
    cannot choose."""
    worst_first = ["callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=max",
                   "callbacks.early_stopping.patience=10"]
    _, straight = train(config(tmp_path / "straight", data_dir, ["trainer.max_epochs=3", *worst_first]))
    _, first = train(config(tmp_path / "first", data_dir, ["trainer.max_epochs=2", "test=false", *worst_first]))
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    metrics, resumed = train(config(tmp_path / "resumed", data_dir,
                                    ["trainer.max_epochs=3", f"ckpt_path={last}", *worst_first]))

    epochs = [record["val/f1"] for record in straight["summary"]["epochs"]]
    assert len(epochs) == 3
    assert Path(straight["ckpt_path"]).name == Path(resumed["ckpt_path"]).name == "epoch_000.ckpt"
    assert Path(resumed["ckpt_path"]).parent == tmp_path / "resumed" / "checkpoints"  # a copy
    assert (tmp_path / "first" / "checkpoints" / "epoch_000.ckpt").is_file()  # the earlier run's file stays
    expected, actual = _state(straight["ckpt_path"]), _state(resumed["ckpt_path"])
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=1e-6, msg=key)
    # the epochs before the resume are in the resumed run's summary too, with the same dev scores
    resumed_epochs = [record["val/f1"] for record in resumed["summary"]["epochs"]]
    assert resumed_epochs == pytest.approx(epochs, abs=1e-6)
    assert resumed["summary"]["best_epoch"] == straight["summary"]["best_epoch"]
    assert metrics["test/f1"] == pytest.approx(straight["summary"]["metrics"]["test/f1"], abs=1e-6)


def test_resume_true_continues_a_cut_off_run_and_skips_a_finished_one(data_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "cell"
    train(config(run, data_dir, ["trainer.max_epochs=1", "test=false"]))
    (run / "summary.json").unlink()  # as if cut off after its first epoch

    metrics, objects = train(config(run, data_dir, ["trainer.max_epochs=2", "resume=true"]))
    assert objects["trainer"].current_epoch == 2
    summary = json.loads((run / "summary.json").read_text())
    assert [record["epoch"] for record in summary["epochs"]] == [0, 1]
    assert all(record["seconds"] > 0 for record in summary["epochs"])
    scores = [record["val/f1"] for record in summary["epochs"]]
    assert summary["best_epoch"] == scores.index(max(scores)) and summary["seed"] == 42
    assert summary["test"]["f1"] == pytest.approx(metrics["test/f1"], abs=1e-6)
    assert summary["crf"]["kind"] == "first_order" and summary["device"].startswith("cpu")
    rows = [json.loads(line) for line in (run / "test_tags.jsonl").read_text().splitlines()]
    assert len(rows) == summary["test"]["sentences"] and len(rows[0]["gold"]) == len(rows[0]["pred"])

    skipped_metrics, skipped = train(config(run, data_dir, ["trainer.max_epochs=2", "resume=true"]))
    assert "trainer" not in skipped and skipped_metrics == summary["metrics"]


def test_resume_true_starts_again_when_last_checkpoint_is_truncated(data_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "cell"
    train(config(run, data_dir, ["trainer.max_epochs=1", "test=false"]))
    (run / "summary.json").unlink()
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # cut off while being written
    _, objects = train(config(run, data_dir, ["trainer.max_epochs=1", "resume=true"]))
    assert objects["trainer"].current_epoch == 1
    assert (run / "checkpoints" / "last.ckpt.broken").is_file() and (run / "summary.json").is_file()


@pytest.mark.parametrize("no_validation", [
    ["trainer.check_val_every_n_epoch=3"],  # fewer validations than epochs: none in 2 epochs
    ["+trainer.limit_val_batches=0", "callbacks=none", "+trainer.enable_checkpointing=false"],  # off
])
def test_a_run_without_validation_ends_normally(no_validation: list[str], data_dir: Path, tmp_path: Path) -> None:
    """The entry point itself (a subprocess): exit status 0, outputs written, and a warning that
    the metric sweepers optimise was not logged (it used to end in a KeyError)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [
        sys.executable, "-m", "neurocrf.cli.train", *TINY, "trainer.max_epochs=2",
        f"paths.data_dir={data_dir}", f"paths.log_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}",
        *no_validation,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "optimized_metric 'val/f1_best' was not logged" in result.stderr
    assert "KeyError" not in result.stderr
    assert "test/f1 = " in result.stdout and (tmp_path / "run" / "test_report.txt").is_file()

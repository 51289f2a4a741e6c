"""scripts/crf_transitions.py: transition statistics of a checkpoint, the exact rebuild of the
run's initial scores (a short run's scores move by at most what its Adam steps allow), dev F1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.data.sample import ensure_sample_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from crf_transitions import main as crf_transitions  # noqa: E402


def test_transitions_and_their_distance_from_the_initial_scores(tmp_path: Path) -> None:
    ensure_sample_corpus(tmp_path / "data" / "sample", seed=13, train_size=64, dev_size=16, test_size=16)
    lr = 0.01
    cfg = compose_task_config("train", tmp_path / "run", [
        "encoder.word_dim=8", "encoder.char=null", "encoder.hidden_size=8", "data.batch_size=16",
        f"optimizer.lr={lr}", "trainer.max_epochs=1", "+trainer.limit_train_batches=2", "test=false", "~logger",
        "~callbacks.progress_bar", "+trainer.enable_progress_bar=false"], tmp_path / "data")
    metrics, objects = train(cfg)
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    (row,) = crf_transitions([str(checkpoint), "--initial", "--dev"])

    transitions = objects["model"].head.transitions.detach().double()
    allowed = objects["model"].head.allowed_transitions.bool()
    assert row["allowed"] == int(allowed.sum()) < row["num_tags"] ** 2  # BIOES forbids some
    assert row["norm"] == pytest.approx(float(transitions[allowed].norm()))
    assert row["max"] == pytest.approx(float(transitions[allowed].max()))
    assert row["steps"] == 2 and row["lr"] == lr and row["head_lr"] is None
    # two Adam steps move each score by at most about 2 lr; a wrong rebuild of the initial scores
    # (drawn from U(-0.1, 0.1)) would be off by far more
    assert 0 < row["moved"]["max"] - row["moved"]["min"] and max(-row["moved"]["min"], row["moved"]["max"]) < 2.01 * lr
    assert row["initial"]["norm"] == pytest.approx(row["norm"], abs=0.1)
    # the dev pass reproduces the run's own validation; without transitions it is another decoder
    assert row["dev_f1"] == pytest.approx(metrics["val/f1"]) == pytest.approx(row["best_dev_f1"])
    assert 0.0 <= row["dev_f1_zero_transitions"] <= 1.0

"""Defaults a user expects: predictions in the training corpus's tag scheme, evaluation of a given
file that generates nothing and names the checkpoint's tags, run folders and caches moved by one
setting (``NEUROCRF_HOME``), ``threads=``, checkpoint names counting epochs from 1, a weights-only
best checkpoint beside a resumable ``last.ckpt``, no Lightning tips, and training throughput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from neurocrf.cli.evaluate import evaluate
from neurocrf.cli.predict import predict
from neurocrf.cli.train import train
from neurocrf.cli.utils import CONFIG_DIR, compose_task_config
from neurocrf.data.schemes import validate_tags
from tests.helpers.sample_data import TINY_TAGGER, sample_data_dir


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=7, train_size=80, dev_size=15, test_size=15)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict:
    """Two epochs of the tiny tagger on the IOB2 sample corpus (the model tags in BIOES)."""
    out = tmp_path_factory.mktemp("train")
    cfg = compose_task_config("train", out, [*TINY_TAGGER, "trainer.max_epochs=2", "~callbacks.early_stopping"],
                              data_dir)
    metrics, objects = train(cfg)
    return {"out": out, "metrics": metrics, "objects": objects, "ckpt": out / "checkpoints" / "last.ckpt"}


def test_predictions_come_in_the_training_corpus_scheme_unless_scheme_says(run: dict, data_dir: Path,
                                                                           tmp_path: Path) -> None:
    source = data_dir / "sample" / "test.conll"
    for scheme, expected in ((None, "IOB2"), ("BIOES", "BIOES")):
        output = tmp_path / f"{expected}.jsonl"
        overrides = [f"ckpt_path={run['ckpt']}", f"input={source}", f"output={output}", "format=jsonl"]
        predict(compose_task_config("predict", tmp_path, overrides + ([f"scheme={scheme}"] if scheme else [])))
        records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
        assert len(records) == 15 and {r["scheme"] for r in records} == {expected}
        validate_tags([t for r in records for t in r["tags"]], expected)


def test_evaluating_a_given_file_reads_it_alone_and_names_the_checkpoints_tags(run: dict, tmp_path: Path) -> None:
    mine = tmp_path / "my.conll"
    mine.write_text("Peter\tB-PER\nworks\tO\n\nAcme\tB-FOOD\n\n", encoding="utf-8")
    empty_cache = tmp_path / "cache"
    cfg = compose_task_config("evaluate", tmp_path / "run", [f"ckpt_path={run['ckpt']}", f"data.test_path={mine}",
                                                            "~callbacks.progress_bar"], empty_cache)
    with pytest.raises(ValueError, match=rf"^{mine}:4: gold tag 'S-FOOD' is not one of the checkpoint's tags \["):
        evaluate(cfg)
    assert not empty_cache.exists()  # no sample corpus generated


def test_one_setting_moves_run_folders_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEUROCRF_HOME", str(tmp_path))
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="predict", return_hydra_config=True)
        moved = compose(config_name="predict", overrides=[f"paths.root_dir={tmp_path / 'other'}"],
                        return_hydra_config=True)
    assert cfg.paths.log_dir == f"{tmp_path}/logs" and cfg.paths.data_dir == f"{tmp_path}/data_cache"
    assert cfg.hydra.run.dir.startswith(f"{tmp_path}/logs/predict/runs/")
    assert moved.paths.log_dir == f"{tmp_path / 'other'}/logs"


def test_threads_sets_torchs_threads(run: dict, data_dir: Path, tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        predict(compose_task_config("predict", tmp_path, [f"ckpt_path={run['ckpt']}", "threads=2",
                                                          f"input={data_dir / 'sample' / 'test.conll'}"]))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        predict(compose_task_config("predict", tmp_path, [f"ckpt_path={run['ckpt']}", "threads=0",
                                                          f"input={data_dir / 'sample' / 'test.conll'}"]))


def test_checkpoints_count_epochs_from_one_and_the_best_holds_weights_only(run: dict) -> None:
    folder = run["out"] / "checkpoints"
    best = Path(run["objects"]["trainer"].checkpoint_callback.best_model_path)
    assert best.parent == folder and best.name in ("epoch_001.ckpt", "epoch_002.ckpt")
    assert run["objects"]["best_epoch"] + 1 == int(best.stem.split("_")[1])
    best_state = torch.load(best, map_location="cpu", weights_only=True)
    last_state = torch.load(run["ckpt"], map_location="cpu", weights_only=True)
    assert "optimizer_states" not in best_state and last_state["optimizer_states"]
    assert "hyper_parameters" in best_state and best.stat().st_size < run["ckpt"].stat().st_size


def test_training_throughput_is_logged_each_epoch(run: dict) -> None:
    epochs = run["objects"]["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1]
    for epoch in epochs:
        assert 0 < epoch["train_seconds"] <= epoch["seconds"]
        assert epoch["sentences_per_s"] == pytest.approx(80 / epoch["train_seconds"], rel=0.02)
        assert epoch["tokens_per_s"] > epoch["sentences_per_s"]
    assert run["metrics"]["train/sentences_per_s"] > 0 and run["metrics"]["train/tokens_per_s"] > 0


def test_lightnings_tips_are_silenced(data_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    train(compose_task_config("train", tmp_path, [*TINY_TAGGER, "trainer.max_epochs=1", "train=false",
                                                  "+trainer.limit_val_batches=0"], data_dir))
    captured = capfd.readouterr()
    assert "Tip:" not in captured.err + captured.out

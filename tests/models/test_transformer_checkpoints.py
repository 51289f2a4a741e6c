"""Transformer taggers as users run them: train/eval modes in a Lightning fit, Hub ids through an
offline Hub cache, checkpoints that predict with the model folder gone, and loading that never
imports or reads what a checkpoint names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
import pytest
import pytorch_lightning as pl
import torch

from neurocrf.cli.evaluate import evaluate
from neurocrf.cli.predict import predict
from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.data.conll import read_conll
from neurocrf.encoders.hf_model import load_config, load_tokenizer, model_source, tokenizer_options
from neurocrf.models.building import build_tagger
from neurocrf.models.tagger import Tagger
from tests.helpers.sample_data import sample_data_dir
from tests.helpers.tiny_models import install_in_hub_cache, save_tiny_bert

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[2]
QUICK = ["~logger", "trainer.max_epochs=1", "+trainer.limit_train_batches=3", "+trainer.limit_val_batches=2",
         "data.batch_size=8", "crf=first_order"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=5, train_size=64, dev_size=16, test_size=16)


def _train(tmp_path: Path, data_dir: Path, model_path: str, *overrides: str) -> tuple[dict[str, float], dict[str, Any]]:
    cfg = compose_task_config("train", tmp_path, [*QUICK, "encoder=transformer", f"encoder.model_path={model_path}",
                                                  *overrides], data_dir)
    return train(cfg)


class ModeRecorder(Tagger):
    """A Tagger that records the modes of every Hugging Face submodule inside its steps."""

    seen: list[tuple[str, int, set[bool]]]

    def _record(self, stage: str) -> None:
        self.__dict__.setdefault("seen", []).append(
            (stage, self.current_epoch, {module.training for module in self.encoder.model.modules()})
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        self._record("train")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        self._record("val")
        return super().validation_step(batch, batch_idx)


@pytest.mark.parametrize("fine_tune", [True, False])
def test_fit_runs_the_transformer_in_train_mode_and_validates_in_eval_mode(
    fine_tune: bool, data_dir: Path, tmp_path: Path
) -> None:
    model_dir = save_tiny_bert(tmp_path / "bert", dropout=0.3)
    cfg = compose_task_config("train", tmp_path, [*QUICK, "encoder=transformer", f"encoder.model_path={model_dir}",
                                                  f"encoder.fine_tune={str(fine_tune).lower()}"], data_dir)
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")
    model = ModeRecorder(**build_tagger(cfg, datamodule).hparams)
    datamodule.set_input_builder(model.encoder.preparer)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=2, limit_val_batches=1,
                         num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=datamodule)
    eval_mode_warnings = [str(w.message) for w in caught if "eval mode" in str(w.message)]
    if fine_tune:
        assert not eval_mode_warnings
    stages = [(stage, epoch) for stage, epoch, _ in model.seen]
    assert stages == [("train", 0), ("train", 0), ("val", 0), ("train", 1), ("train", 1), ("val", 1)]
    for stage, _, modes in model.seen:
        assert modes == {fine_tune and stage == "train"}, (stage, modes)
    # dropout really acts in a training step of a fine-tuned model: two passes differ
    inputs = model.encoder.prepare([["the", "cat", "sat"]])
    model.train()
    first, second = model.encoder(inputs), model.encoder(inputs)
    assert (not torch.equal(first, second)) == fine_tune


def test_checkpoint_predicts_with_the_model_folder_gone(data_dir: Path, tmp_path: Path) -> None:
    model_dir = save_tiny_bert(tmp_path / "bert")
    _, objects = _train(tmp_path / "run", data_dir, str(model_dir), "encoder.pooling=last",
                        "callbacks.model_checkpoint.save_weights_only=true")
    test = read_conll(data_dir / "sample" / "test.conll", tag_column=1)
    sentences = [s.tokens for s in test] + [["word"] * 700]  # longer than the model's 128 positions
    trained = objects["model"].eval()
    expected = [p.tags for p in trained.predict(sentences)]
    best, last = Path(objects["ckpt_path"]), tmp_path / "run" / "checkpoints" / "last.ckpt"
    shutil.rmtree(model_dir)

    checkpoint = torch.load(best, map_location="cpu", weights_only=True)
    assert "optimizer_states" not in checkpoint  # inference-only
    assert "optimizer_states" in torch.load(last, map_location="cpu", weights_only=True)
    files = checkpoint["hyper_parameters"]["vocabularies"]["transformer_files"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(files["tokenizer"])
    assert best.stat().st_size < last.stat().st_size

    tagger = Tagger.load(best)
    assert not tagger.encoder.model.training and tagger.encoder.preparer.pooling == "last"
    assert [p.tags for p in tagger.predict(sentences)] == expected
    assert len(expected[-1]) == 700
    bf16 = tagger.predict(sentences, precision="bf16")  # the encoder under bfloat16 autocast
    assert [len(p.tags) for p in bf16] == [len(s) for s in sentences]
    assert all(0.0 <= c <= 1.0 + 1e-6 for p in bf16 for c in p.confidences)
    with pytest.raises(ValueError, match="precision"):
        tagger.predict(sentences[:1], precision="fp8")

    output = tmp_path / "pred.conll"
    predict(compose_task_config("predict", tmp_path / "predict", [
        f"ckpt_path={best}", f"input={data_dir / 'sample' / 'test.conll'}", f"output={output}"]))
    written = read_conll(output, tag_column=None)
    assert [[row[2] for row in s.columns] for s in written] == expected[:-1]
    predict(compose_task_config("predict", tmp_path / "predict_bf16", [
        f"ckpt_path={best}", f"input={data_dir / 'sample' / 'test.conll'}", f"output={output}", "precision=bf16"]))
    assert [len(s.tokens) for s in read_conll(output, tag_column=None)] == [len(s) for s in expected[:-1]]
    metrics, _ = evaluate(compose_task_config("evaluate", tmp_path / "evaluate", [
        f"ckpt_path={best}", f"paths.data_dir={data_dir}"]))
    assert 0.0 <= metrics["test/f1"] <= 1.0


def test_loading_never_imports_a_module_named_in_the_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    model_dir = save_tiny_bert(tmp_path / "bert")
    _train(tmp_path / "run", data_dir, str(model_dir), "test=false")
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)

    marker = tmp_path / "imported"
    package = tmp_path / "site"
    package.mkdir()
    (package / "evil_model_pkg.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\ndef get_model_path():\n"
        f"    return {str(model_dir)!r}\n", encoding="utf-8")
    sys.path.insert(0, str(package))
    try:
        hparams = checkpoint["hyper_parameters"]
        hparams["encoder"]["model_path"] = "pkg:evil_model_pkg"
        hparams["encoder"]["tokenizer_kwargs"] = {"trust_remote_code": True}
        hparams["vocabularies"]["transformer_files"]["config"]["auto_map"] = {"AutoModel": "evil_model_pkg.Model"}
        named = tmp_path / "named.ckpt"
        torch.save(checkpoint, named)
        tagger = Tagger.load(named)  # loads: everything it needs is in the file
        assert tagger.predict(["the cat"])[0].tags
        assert not marker.exists()

        del hparams["vocabularies"]["transformer_files"]  # what an older neurocrf wrote
        torch.save(checkpoint, named)
        with pytest.raises(ValueError, match="holds no transformer config and tokenizer files"):
            Tagger.load(named)
        assert not marker.exists()
    finally:
        sys.path.remove(str(package))
        sys.modules.pop("evil_model_pkg", None)


def test_stored_files_are_checked(tmp_path: Path) -> None:
    from neurocrf.encoders.hf_model import model_files

    files = model_files(save_tiny_bert(tmp_path / "bert"))
    assert load_tokenizer(files).tokenize("cat") == ["c", "##a", "##t"]
    bad_type = {**files, "config": {**files["config"], "model_type": "evil_model_pkg"}}
    with pytest.raises(ValueError, match="not one that transformers implements"):
        load_config(bad_type)
    for name in ("../escape.json", "sub/tokenizer.json", "config.json"):
        with pytest.raises(ValueError, match="not a plain file name"):
            load_tokenizer({**files, "tokenizer": {**files["tokenizer"], name: {"text": "{}"}}})
    with pytest.raises(ValueError, match="not allowed"):
        tokenizer_options({"trust_remote_code": True})
    with pytest.raises(ValueError, match="plain value"):
        tokenizer_options({"do_lower_case": [True]})


def test_model_sources(tmp_path: Path) -> None:
    folder = save_tiny_bert(tmp_path / "bert")
    assert model_source(folder) == (str(folder), {"local_files_only": True})
    assert model_source("bert-base-cased") == ("bert-base-cased", {})
    assert model_source("sentence-transformers/all-MiniLM-L6-v2")[1] == {}
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        model_source(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        model_source(tmp_path / "missing" / "model")
    with pytest.raises(ImportError, match="not installed"):
        model_source("pkg:no_such_model_package")


def test_train_and_predict_by_hub_id_offline(data_dir: Path, tmp_path: Path) -> None:
    hf_home = tmp_path / "hf_home"
    install_in_hub_cache(save_tiny_bert(tmp_path / "bert"), hf_home, "tiny-org/tiny-bert")
    shutil.rmtree(tmp_path / "bert")
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PROJECT_ROOT": str(REPO),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run_dir = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "neurocrf.cli.train", *QUICK, "encoder=transformer",
         "encoder.model_path=tiny-org/tiny-bert", "test=false", f"paths.data_dir={data_dir}",
         f"hydra.run.dir={run_dir}"],
        env=env, check=True, capture_output=True, text=True, timeout=300,
    )
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["encoder"]["model_path"] == "tiny-org/tiny-bert"

    output = tmp_path / "pred.conll"
    done = subprocess.run(
        [sys.executable, "-m", "neurocrf.cli.predict", f"ckpt_path={ckpt}",
         f"input={data_dir / 'sample' / 'dev.conll'}",
         f"output={output}", f"hydra.run.dir={tmp_path / 'predict'}"],
        env={**env, "HF_HOME": str(tmp_path / "empty_home")},  # the checkpoint alone suffices
        check=True, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0
    source = read_conll(data_dir / "sample" / "dev.conll", tag_column=None)
    written = read_conll(output, tag_column=None)
    assert [len(s.tokens) for s in written] == [len(s.tokens) for s in source]


def test_missing_hub_model_offline_fails_clearly(data_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "PROJECT_ROOT": str(REPO),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", "neurocrf.cli.train", *QUICK, "encoder=transformer",
         "encoder.model_path=tiny-org/not-cached", f"paths.data_dir={data_dir}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode != 0
    assert "tiny-org/not-cached" in done.stderr

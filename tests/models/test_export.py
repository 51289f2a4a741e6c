"""Tagger export: a BiLSTM + CRF checkpoint through neurocrf-export, run by onnxruntime and as a
torch.export archive on sentences of other lengths than the export example, against Tagger.predict."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from neurocrf.cli.export import export, run_exported, vocabulary_path
from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.data.conll import read_conll
from neurocrf.data.sample import ensure_sample_corpus
from neurocrf.encoders import build_vocabularies
from neurocrf.models.export import ExportableTagger, TaggerVocabulary
from neurocrf.models.tagger import Tagger

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def train_tiny(tmp_path_factory: pytest.TempPathFactory, overrides: list[str]) -> dict[str, Path]:
    data_dir = tmp_path_factory.mktemp("data")
    ensure_sample_corpus(data_dir / "sample", seed=13, train_size=300, dev_size=20, test_size=40)
    out = tmp_path_factory.mktemp("train")
    train(compose_task_config("train", out, [
        f"paths.data_dir={data_dir}", "~logger", "test=false", "trainer.max_epochs=4", "data.batch_size=16",
        "optimizer.lr=0.02", "encoder.word_dim=16", "encoder.char_dim=8", "encoder.char_hidden=8",
        "encoder.hidden_size=16", *overrides,
    ]))
    return {"ckpt": out / "checkpoints" / "last.ckpt", "test": data_dir / "sample" / "test.conll"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return train_tiny(tmp_path_factory, [])


def export_and_compare(files: dict[str, Path], tmp_path: Path, fmt: str) -> list[list[str]]:
    """Export through the entry point, run the file on the test corpus (lengths 1 to 30+, none
    the example's batch) and return its tags after checking them against Tagger.predict."""
    output = tmp_path / f"tagger.{fmt}"
    result = export(compose_task_config("export", tmp_path, [f"ckpt_path={files['ckpt']}", f"output={output}",
                                                             f"format={fmt}"]))
    assert result["checked"] == 4 and output.is_file() and vocabulary_path(output).is_file()
    sentences = [s.tokens for s in read_conll(files["test"])]
    assert len({len(s) for s in sentences}) > 5
    vocabulary = TaggerVocabulary.load(vocabulary_path(output))
    inputs = vocabulary.encode(sentences)
    exported = vocabulary.decode(run_exported(output, fmt, inputs), inputs["mask"])
    expected = [p.tags for p in Tagger.load(files["ckpt"]).predict(sentences, batch_size=7)]
    assert exported == expected
    return exported


def test_export_onnx_matches_predict(trained: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    tags = export_and_compare(trained, tmp_path, "onnx")
    assert any(tag != "O" for sentence in tags for tag in sentence)  # the model tags entities


@pytest.mark.slow
def test_export_pt2_matches_predict(trained: dict[str, Path], tmp_path: Path) -> None:
    export_and_compare(trained, tmp_path, "pt2")


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["crf=second_order", "encoder.char=lstm"],
                                       ["crf=precursor", "encoder.char=null"]])
def test_export_other_layers_and_char_encoders(tmp_path_factory, tmp_path: Path, overrides: list[str]) -> None:
    pytest.importorskip("onnxruntime")
    export_and_compare(train_tiny(tmp_path_factory, overrides), tmp_path, "onnx")


def test_unexportable_models_raise() -> None:
    sentences = [["Peter", "lives", "in", "Berlin"]]
    features = {"name": "features"}
    tagger = Tagger(features, {"kind": "first_order"}, TAGS, "IOB2", build_vocabularies(features, sentences))
    with pytest.raises(ValueError, match="only BiLSTM taggers"):
        ExportableTagger(tagger)
    bilstm = {"name": "bilstm", "word_dim": 4, "hidden_size": 4, "char": None}
    softmax = Tagger(bilstm, {"kind": "softmax"}, TAGS, "IOB2", build_vocabularies(bilstm, sentences))
    with pytest.raises(ValueError, match="CRF head"):
        ExportableTagger(softmax)


def test_exportable_tagger_leaves_the_tagger_alone() -> None:
    sentences = [["Peter", "lives", "in", "Berlin"], ["x"]]
    bilstm = {"name": "bilstm", "word_dim": 4, "hidden_size": 4, "char": "cnn", "char_dim": 3, "char_hidden": 3}
    tagger = Tagger(bilstm, {"kind": "first_order"}, TAGS, "IOB2", build_vocabularies(bilstm, sentences)).train()
    module = ExportableTagger(tagger)
    assert tagger.training and tagger.encoder.training and not module.training
    inputs = TaggerVocabulary.from_tagger(tagger).encode(sentences)
    tags = module(*(torch.from_numpy(inputs[name]) for name in module.input_names()))
    assert [[TAGS[i] for i in row if i >= 0] for row in tags.tolist()] == [p.tags for p in tagger.predict(sentences)]

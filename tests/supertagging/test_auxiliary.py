"""Auxiliary (multi-task) heads of the Supertagger: per-token treebank annotations as targets,
their batches, their weighted loss, training, weights-only checkpoints, and the Hydra run."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from neurocrf.cli.supertag_train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.encoders import build_vocabularies
from neurocrf.parsing import read_treebank
from neurocrf.parsing.tree import Tree, TreebankSentence
from neurocrf.parsing.treebank import write_sample_treebank
from neurocrf.supertagging.data import SupertagDataModule
from neurocrf.supertagging.supertagger import Supertagger
from tests.helpers.tiny_models import TINY_ENCODER

EXPORT_TREEBANK = {"format": "export", "reader": {"root_label": "ROOT"}}


@pytest.fixture(scope="module")
def export_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_treebank(tmp_path_factory.mktemp("tb") / "tiny.export", sentences=40, seed=3,
                                 fmt="export")


@pytest.fixture(scope="module")
def datamodule(export_path: Path) -> SupertagDataModule:
    dm = SupertagDataModule({"path": str(export_path), **EXPORT_TREEBANK}, batch_size=8,
                            auxiliary=["function"])
    dm.setup()
    return dm


def make_model(dm: SupertagDataModule, weight: float = 1.0, **kwargs) -> Supertagger:
    vocabularies = build_vocabularies(TINY_ENCODER, [s.words for s in dm.corpora["train"]])
    model = Supertagger(TINY_ENCODER, vocabularies, dm.supertags, dm.preterminals, dm.roots,
                        auxiliary_labels=dm.auxiliary_labels, optimizer={"name": "adam", "lr": 0.01},
                        heads={"dropout": 0.0, "auxiliary": {"function": weight}}, **kwargs)
    dm.set_input_builder(model.encoder.preparer)
    return model


def test_sample_export_treebank_carries_the_parent_label_as_function(export_path: Path) -> None:
    sentences = read_treebank(export_path, "export", root_label="ROOT")
    assert len(sentences) == 40
    for s in sentences:
        parent = {c.children[0]: node.label.lower() for node in s.tree.subtrees()
                  for c in node.children if not isinstance(c, int) and c.is_preterminal}
        assert s.annotations["function"] == [parent[i] for i in range(len(s.words))]


def test_annotations_must_have_one_value_per_word() -> None:
    with pytest.raises(ValueError, match="annotation 'function' has 1 values for 2 words"):
        TreebankSentence("x", ["a", "b"], Tree.parse("(S (A 0) (B 1))"), {"function": ["su"]})


def test_batches_hold_auxiliary_ids(datamodule: SupertagDataModule) -> None:
    labels = datamodule.auxiliary_labels["function"]
    assert set(labels) == {a for s in datamodule.corpora["train"] for a in s.annotations["function"]}
    assert datamodule.summary()["auxiliary_function"] == len(labels)
    batch = next(iter(datamodule.dataloader("dev")))
    ids = batch["auxiliary"]["function"]
    assert ids.shape == batch["mask"].shape
    for b, index in enumerate(batch["index"].tolist()):
        sentence = datamodule.corpora["dev"][index]
        n = len(sentence.words)
        expected = [labels.index(a) if a in labels else -1 for a in sentence.annotations["function"]]
        assert ids[b, :n].tolist() == expected
        assert (ids[b, n:] == -1).all()


def test_treebank_without_the_annotation_is_refused(tmp_path: Path) -> None:
    path = write_sample_treebank(tmp_path / "tiny.discbracket", sentences=10, seed=1)
    dm = SupertagDataModule({"path": str(path), "format": "discbracket"}, auxiliary=["function"])
    with pytest.raises(ValueError, match="per-token annotation 'function'.*does not provide"):
        dm.setup()


def test_names_of_heads_and_label_lists_must_match(datamodule: SupertagDataModule) -> None:
    vocabularies = build_vocabularies(TINY_ENCODER, [s.words for s in datamodule.corpora["train"]])
    with pytest.raises(ValueError, match="must match"):
        Supertagger(TINY_ENCODER, vocabularies, datamodule.supertags, datamodule.preterminals,
                    datamodule.roots, auxiliary_labels=datamodule.auxiliary_labels)


def test_loss_adds_the_weighted_auxiliary_cross_entropy(datamodule: SupertagDataModule) -> None:
    model = make_model(datamodule, weight=0.5)
    model.eval()
    batch = next(iter(datamodule.dataloader("train")))
    st, pt, aux = model._scores(batch)
    mask = batch["mask"]
    base = F.cross_entropy(st[mask], batch["supertags"][mask]) + \
        F.cross_entropy(pt[mask], batch["preterminals"][mask])
    gold = batch["auxiliary"]["function"]
    expected = base + 0.5 * F.cross_entropy(aux["function"][mask], gold[mask])
    assert torch.allclose(model.loss(st, pt, batch, aux), expected, atol=1e-6)
    assert torch.allclose(model.loss(st, pt, batch), base, atol=1e-6)
    # the auxiliary head reads the same encoder states: its loss reaches the encoder
    model.zero_grad()
    F.cross_entropy(aux["function"][mask], gold[mask]).backward()
    assert model.supertag_head.weight.grad is None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())


def test_training_learns_the_auxiliary_task_and_checkpoint_loads_weights_only(
        tmp_path: Path, export_path: Path, datamodule: SupertagDataModule) -> None:
    pl.seed_everything(0)
    model = make_model(datamodule)
    trainer = pl.Trainer(max_epochs=30, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    trainer.fit(model, datamodule=datamodule)
    assert "val/function_acc" in trainer.callback_metrics
    trainer.validate(model, dataloaders=datamodule.dataloader("train"), verbose=False)
    assert trainer.callback_metrics["val/function_acc"] > 0.9
    assert trainer.callback_metrics["val/supertag_acc"] > 0.9
    with_labels = float(trainer.callback_metrics["val/supertag_acc"])

    # a data module without the annotation: evaluation scores the main heads only, training refuses
    plain = SupertagDataModule({"path": str(export_path), **EXPORT_TREEBANK}, batch_size=8)
    plain.setup()
    plain.set_input_builder(model.encoder.preparer)
    trainer.validate(model, dataloaders=plain.dataloader("train"), verbose=False)
    assert "val/function_acc" not in trainer.callback_metrics
    assert float(trainer.callback_metrics["val/supertag_acc"]) == pytest.approx(with_labels)
    batch = next(iter(plain.dataloader("train")))
    with pytest.raises(ValueError, match=r"no 'function' labels .* auxiliary=\['function'\]"):
        model.training_step(batch, 0)

    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    loaded = Supertagger.load(path)
    assert loaded.auxiliary_labels == datamodule.auxiliary_labels
    assert torch.equal(loaded.auxiliary_heads["function"].weight, model.auxiliary_heads["function"].weight)
    words = [s.words for s in datamodule.corpora["dev"]]
    assert [s.best for s in loaded.predict_kbest(words, k=3)] == [s.best for s in model.predict_kbest(words, k=3)]


def test_hydra_run_with_an_auxiliary_head(tmp_path: Path) -> None:
    path = tmp_path / "data" / "tiny.export"
    cfg = compose_task_config("supertag", tmp_path / "run", [
        f"treebank.path={path}", "treebank.format=export", "+treebank.reader.root_label=ROOT",
        "+treebank.generate.fmt=export",
        "+heads.auxiliary.function=0.5", "encoder.word_dim=32", "encoder.char=null",
        "encoder.hidden_size=64", "encoder.dropout=0.0", "heads.dropout=0.0", "optimizer.lr=0.01",
        "data.batch_size=8", "trainer.max_epochs=20", "callbacks.model_checkpoint.monitor=null",
        "~callbacks.early_stopping", "~logger", "~callbacks.progress_bar",
        "+trainer.enable_progress_bar=false", "final_parse.splits=[dev]", "parsing.k=4"])
    metrics, objects = train(cfg)
    assert 0.0 <= metrics["val/function_acc"] <= 1.0  # learning it: the test above
    model = Supertagger.load(objects["ckpt_path"])
    assert model.auxiliary_weights == {"function": 0.5}
    assert set(model.auxiliary_labels["function"]) >= {"root"}

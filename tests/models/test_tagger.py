"""The Tagger without Hydra: plain hyperparameters, weights-only checkpoints, prediction, DDP
record gathering, head construction."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.data.sample import generate_sample_corpus
from neurocrf.encoders import build_vocabularies
from neurocrf.models.heads import HEAD_KINDS, SoftmaxHead, TaggingHead, build_head
from neurocrf.models.records import dedupe_records, gather_records, pad_records, unpad_records
from neurocrf.models.tagger import Tagger

ENCODER = {"name": "bilstm", "word_dim": 16, "char_dim": 8, "char_hidden": 8, "hidden_size": 16}


@pytest.fixture(scope="module")
def datamodule() -> SequenceDataModule:
    corpus = generate_sample_corpus(seed=5, sizes={"train": 60, "dev": 20, "test": 20})
    return SequenceDataModule.from_sentences(
        corpus["train"], corpus["dev"], corpus["test"], file_scheme="IOB2", scheme="BIOES",
        batch_size=16, eval_batch_size=16,
    )


def _tagger(dm: SequenceDataModule, kind: str = "first_order") -> Tagger:
    vocabularies = build_vocabularies(ENCODER, [s.tokens for s in dm.train_sentences])
    return Tagger(ENCODER, {"kind": kind, "dropout": 0.1}, dm.tags, dm.scheme, vocabularies,
                  {"name": "adam", "lr": 0.01})


def _is_plain(value: object) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def test_checkpoint_loads_weights_only_and_predicts_the_same(datamodule: SequenceDataModule, tmp_path: Path) -> None:
    model = _tagger(datamodule)
    datamodule.set_input_builder(model.encoder.preparer)
    trainer = pl.Trainer(
        max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, monitor="val/f1", mode="max")],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=datamodule)
    path = tmp_path / "last.ckpt"

    checkpoint = torch.load(path, weights_only=True)  # raises on any pickled object
    hparams = checkpoint["hyper_parameters"]
    assert set(hparams) == {"encoder", "head", "tags", "scheme", "vocabularies", "optimizer", "scheduler", "config"}
    assert _is_plain(hparams) and hparams["tags"] == datamodule.tags
    assert checkpoint["neurocrf"]["val_f1_best"] == pytest.approx(model.best_score)

    loaded = Tagger.load(path)
    assert not loaded.training and loaded.tags == model.tags and loaded.scheme == "BIOES"
    assert loaded.best_score == pytest.approx(model.best_score)
    model.eval()
    sentences = [s.tokens for s in datamodule.test_sentences[:5]]
    for ours, theirs in zip(model.predict(sentences), loaded.predict(sentences)):
        assert ours.tags == theirs.tags
        assert ours.confidences == pytest.approx(theirs.confidences, abs=1e-6)


def test_predict_returns_every_token_for_any_length(datamodule: SequenceDataModule) -> None:
    model = _tagger(datamodule, "second_order")
    long_sentence = ["in", "Paris"] * 150
    inputs = ["Mr. Smith  went\tto  Paris", "", long_sentence, ["one"], "   "]
    predictions = model.predict(inputs, batch_size=2, nbest=2)
    assert [len(p.tokens) for p in predictions] == [5, 0, 300, 1, 0]
    assert predictions[0].tokens == ["Mr.", "Smith", "went", "to", "Paris"]
    for prediction in predictions:
        assert len(prediction.tags) == len(prediction.confidences) == len(prediction.tokens)
        assert all(0.0 <= c <= 1.0 + 1e-6 for c in prediction.confidences)
        probabilities = [p.probability for p in prediction.nbest]
        assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1 + 1e-5
    assert predictions[2].tokens == long_sentence
    assert model.training  # predict restores the previous mode


def test_heads() -> None:
    tags = ["O", "B-X", "I-X", "E-X", "S-X"]
    assert isinstance(build_head({"kind": "softmax"}, tags, "BIOES"), SoftmaxHead)
    for kind in HEAD_KINDS:  # every head keeps the contract the tagger and the predictions rely on
        head = build_head({"kind": kind}, tags, "BIOES")
        assert isinstance(head, TaggingHead) and isinstance(head, torch.nn.Module)
        assert head.accepts_pair_emissions == (kind == "first_order")
    assert not isinstance(torch.nn.Linear(2, 2), TaggingHead)
    with pytest.raises(ValueError, match="unknown head kind 'third_order'"):
        build_head({"kind": "third_order"}, tags, "BIOES")
    with pytest.raises(ValueError, match="softmax head takes no options"):
        build_head({"kind": "softmax", "memory": "type"}, tags, "BIOES")
    constrained = build_head({"kind": "first_order"}, tags, "BIOES")
    emissions = torch.zeros(1, 2, 5)
    emissions[0, :, 2] = 5.0  # I-X everywhere scores best, but O -> I-X is forbidden
    path = constrained.decode(emissions, torch.ones(1, 2, dtype=torch.bool))[0].tolist()
    assert [tags[t] for t in path] != ["I-X", "I-X"]
    free = build_head({"kind": "first_order", "constrained": False}, tags, "BIOES")
    assert free.decode(emissions, torch.ones(1, 2, dtype=torch.bool))[0].tolist() == [2, 2]


def test_records_gather_padding_and_dedupe() -> None:
    """Two simulated ranks with different counts and lengths; the distributed sampler repeated
    sentence 0 on rank 1 to even out the ranks."""
    rank0 = [(2, [1, 2, 3], [1, 2, 0]), (0, [4], [4])]
    rank1 = [(1, [0, 0], [0, 1]), (0, [4], [4]), (3, [], [])]
    rows = max(len(rank0), len(rank1))
    width = max(len(r[1]) for r in rank0 + rank1)
    padded = [pad_records(rank, rows, width) for rank in (rank0, rank1)]
    stacked = [torch.stack([a, b]) for a, b in zip(*padded)]  # what all_gather returns: [world, ...]
    assert stacked[2].shape == (2, 3, 3)
    records = dedupe_records(unpad_records(*stacked))
    assert records == [(0, [4], [4]), (1, [0, 0], [0, 1]), (2, [1, 2, 3], [1, 2, 0]), (3, [], [])]
    with pytest.raises(ValueError, match="do not fit"):
        pad_records(rank1, 2, 3)


def test_gather_records_through_all_gather_of_two_ranks() -> None:
    """``gather_records`` as rank 0 sees it: ``all_gather`` stacks rank 1's tensor of each call,
    sizes first, then the records padded to the largest count and length of any rank."""
    rank0 = [(2, [1, 2, 3], [1, 2, 0]), (0, [4], [4])]
    rank1 = [(1, [0, 0], [0, 1]), (0, [4], [4]), (3, [], [])]
    answers: list[torch.Tensor] = []

    def all_gather(tensor: torch.Tensor) -> torch.Tensor:
        if not answers:  # the first call gathers the sizes; rank 1 then pads to the agreed shapes
            sizes = torch.stack([tensor, torch.tensor([len(rank1), 2])])
            answers.extend([sizes[1], *pad_records(rank1, int(sizes[:, 0].max()), int(sizes[:, 1].max()))])
        theirs = answers.pop(0)
        assert theirs.shape == tensor.shape
        return torch.stack([tensor, theirs])

    records = gather_records(rank0, all_gather)
    assert records == [(0, [4], [4]), (1, [0, 0], [0, 1]), (2, [1, 2, 3], [1, 2, 0]), (3, [], [])]
    assert gather_records(rank1) == [(0, [4], [4]), (1, [0, 0], [0, 1]), (3, [], [])]  # one device


def test_shape_mismatch_names_the_problem(datamodule: SequenceDataModule) -> None:
    model = _tagger(datamodule)
    inputs = model.encoder.prepare([["a", "b", "c"]])
    with pytest.raises(ValueError, match="one vector per word"):
        model._emissions({"inputs": inputs, "mask": torch.ones(1, 2, dtype=torch.bool)})

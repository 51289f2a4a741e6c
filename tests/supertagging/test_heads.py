"""The factored supertag head: parts of supertag strings, scores equal to the summed output
vectors, shared statistics between supertags, and a Supertagger that trains and reloads with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from neurocrf.encoders import build_vocabularies
from neurocrf.parsing.treebank import write_sample_treebank
from neurocrf.supertagging.data import SupertagDataModule
from neurocrf.supertagging.heads import FACTORS, FactoredSupertagHead, build_supertag_head, supertag_parts
from neurocrf.supertagging.supertagger import Supertagger

TAGS = ["@pt 1 t - -", "NP 1 x0t @pt -", "INF|<>_2 2 x0ty0 NP SSUB|<>", "NP|<> 2 ty0 - NP|<>",
        "VP_2 1 t,y0 - NP"]


def test_parts_of_supertag_strings() -> None:
    parts = supertag_parts(TAGS, list(FACTORS))
    values = {name: [vocabulary[i] for i in ids] for name, (vocabulary, ids) in parts.items()}
    assert values["lhs"] == ["@pt", "NP", "INF|<>_2", "NP|<>", "VP_2"]
    assert values["label"] == ["@pt", "NP", "INF", "NP", "VP"]
    assert values["attach"] == ["1", "1", "2", "2", "1"]
    assert values["composition"] == ["t", "x0t", "x0ty0", "ty0", "t,y0"]
    assert values["first"] == ["-", "@pt", "NP", "-", "-"]
    assert values["second"] == ["-", "-", "SSUB|<>", "NP|<>", "NP"]
    assert values["shape"] == ["1 t", "1 x0t", "2 x0ty0", "2 ty0", "1 t,y0"]
    assert parts["label"][0] == ["@pt", "INF", "NP", "VP"]  # distinct values, sorted
    with pytest.raises(ValueError, match="unknown supertag factor"):
        supertag_parts(TAGS, ["lhs", "head"])
    with pytest.raises(ValueError, match="5 space-separated fields"):
        supertag_parts(["NP 1 t"], ["lhs"])


def test_scores_are_products_with_the_summed_vectors() -> None:
    torch.manual_seed(0)
    factors = ["lhs", "label", "composition", "second"]
    head = FactoredSupertagHead(6, TAGS, factors)
    hidden = torch.randn(2, 3, 6)
    parts = supertag_parts(TAGS, factors)
    expected = torch.empty(2, 3, len(TAGS))
    for s in range(len(TAGS)):
        weight, bias = head.own.weight[s].clone(), head.own.bias[s].clone()
        for name in factors:
            value = parts[name][1][s]
            weight = weight + head.parts[name].weight[value]
            bias = bias + head.parts[name].bias[value]
        expected[..., s] = hidden @ weight + bias
    assert torch.allclose(head(hidden), expected, atol=1e-6)
    assert isinstance(build_supertag_head(6, TAGS, []), nn.Linear)
    with pytest.raises(ValueError, match="at least one factor"):
        FactoredSupertagHead(6, TAGS, [])


def test_training_one_supertag_moves_the_tags_that_share_its_parts() -> None:
    """A gradient step on tag 3 (label NP) also changes the score of tag 1 (label NP) and no
    other; with a plain head it changes only tag 3."""
    torch.manual_seed(1)
    hidden = torch.randn(4, 6)
    for factors, moved in ((["label"], {1, 3}), ([], {3})):
        head = build_supertag_head(6, TAGS, factors)
        before = head(hidden).detach()
        optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
        head(hidden)[:, 3].sum().backward()
        optimizer.step()
        changed = {s for s in range(len(TAGS)) if not torch.allclose(head(hidden)[:, s], before[:, s])}
        assert changed == moved, factors


def test_supertagger_with_a_factored_head_trains_and_reloads(tmp_path: Path) -> None:
    path = write_sample_treebank(tmp_path / "tiny.discbracket", sentences=30, seed=5)
    dm = SupertagDataModule({"path": str(path), "format": "discbracket"}, batch_size=8)
    dm.setup()
    encoder = {"name": "bilstm", "word_dim": 16, "char": None, "hidden_size": 32, "dropout": 0.0}
    vocabularies = build_vocabularies(encoder, [s.words for s in dm.corpora["train"]])
    pl.seed_everything(0)
    model = Supertagger(encoder, vocabularies, dm.supertags, dm.preterminals, dm.roots,
                        optimizer={"name": "adam", "lr": 0.01},
                        heads={"dropout": 0.0, "factors": ["lhs", "label", "composition", "first", "second"]})
    assert isinstance(model.supertag_head, FactoredSupertagHead)
    dm.set_input_builder(model.encoder.preparer)
    trainer = pl.Trainer(max_epochs=30, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    trainer.fit(model, datamodule=dm)
    words = [s.words for s in dm.corpora["train"]]
    gold = [t for s in dm.corpora["train"] for t in s.supertags]
    kbest = model.predict_kbest(words, k=3)
    assert sum(p == g for p, g in zip((t for s in kbest for t in s.best), gold)) / len(gold) > 0.95
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    loaded = Supertagger.load(tmp_path / "model.ckpt")
    assert isinstance(loaded.supertag_head, FactoredSupertagHead)
    again = loaded.predict_kbest(words, k=3)
    for a, b in zip(again, kbest):
        for c1, c2 in zip(a.candidates, b.candidates):
            assert [t for t, _ in c1] == [t for t, _ in c2]
            assert [w for _, w in c1] == pytest.approx([w for _, w in c2], abs=1e-5)

"""The Supertagger and its data: supertag corpus extraction and files, batches, the two-head
loss, k-best output renormalised over the k, weights-only checkpoints, validation parsing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from neurocrf.data.conll import ConllFormatError
from neurocrf.data.datamodule import BucketBatchSampler
from neurocrf.encoders import build_vocabularies
from neurocrf.parsing import read_treebank
from neurocrf.parsing.supertags import supertags_to_tree
from neurocrf.parsing.treebank import load_treebank, write_sample_treebank
from neurocrf.supertagging.data import (
    SupertagDataModule,
    corpus_statistics,
    read_supertag_corpus,
    supertag_corpus,
    write_supertag_corpus,
)
from neurocrf.supertagging.ensemble import SupertaggerEnsemble, load_supertagger
from neurocrf.supertagging.source import KBestTags
from neurocrf.supertagging.supertagger import Supertagger
from tests.helpers.ddp_shards import distributed_shards
from tests.helpers.tiny_models import TINY_ENCODER


@pytest.fixture(scope="module")
def treebank_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_treebank(tmp_path_factory.mktemp("tb") / "tiny.discbracket", sentences=40, seed=3)


@pytest.fixture(scope="module")
def datamodule(treebank_path: Path) -> SupertagDataModule:
    dm = SupertagDataModule({"path": str(treebank_path), "format": "discbracket"}, batch_size=8)
    dm.setup()
    return dm


def make_model(dm: SupertagDataModule, **kwargs) -> Supertagger:
    vocabularies = build_vocabularies(TINY_ENCODER, [s.words for s in dm.corpora["train"]])
    model = Supertagger(TINY_ENCODER, vocabularies, dm.supertags, dm.preterminals, dm.roots,
                        optimizer={"name": "adam", "lr": 0.01}, **kwargs)
    dm.set_input_builder(model.encoder.preparer)
    return model


def test_sample_treebank_is_deterministic_and_readable(tmp_path: Path, treebank_path: Path) -> None:
    again = write_sample_treebank(tmp_path / "again.discbracket", sentences=40, seed=3)
    assert again.read_text() == treebank_path.read_text()
    sentences = read_treebank(treebank_path)
    assert len(sentences) == 40 and [s.id for s in sentences] == [str(i) for i in range(40)]
    assert all(len(s.tree.children) > 1 for s in sentences)
    # words spell their POS tag, so a tagger can learn the preterminals
    assert all(w[:-1] == p.lower() for s in sentences for w, p in zip(s.words, s.pos_tags))
    assert any(node.fanout() > 1 for s in sentences for node in s.tree.subtrees())


def test_datamodule_splits_labels_and_batches(datamodule: SupertagDataModule) -> None:
    dm = datamodule
    assert [len(dm.corpora[s]) for s in ("train", "dev", "test")] == [32, 4, 4]
    assert [s.id for s in dm.corpora["test"]] == ["36", "37", "38", "39"]
    counts = {}
    for s in dm.corpora["train"]:
        for t in s.supertags:
            counts[t] = counts.get(t, 0) + 1
    assert set(dm.supertags) == set(counts)
    assert [counts[t] for t in dm.supertags] == sorted(counts.values(), reverse=True)
    assert dm.roots == ["ROOT"]
    # every training sentence's tags rebuild its tree
    for sent, gold in zip(dm.corpora["train"], dm.gold_treebank("train")):
        assert supertags_to_tree(sent.supertags, sent.preterminals) == gold.tree
    dm.set_input_builder(lambda tokens: {"n": torch.tensor([len(t) for t in tokens])})
    batch = next(iter(dm.dataloader("dev")))
    lengths = [len(s.words) for s in dm.corpora["dev"]]
    assert batch["mask"].sum(-1).tolist() == lengths
    assert batch["index"].tolist() == [0, 1, 2, 3]
    assert batch["inputs"]["n"].tolist() == lengths
    assert (batch["supertags"][~batch["mask"]] == -1).all()
    ids = {t: i for i, t in enumerate(dm.supertags)}
    for b, sent in enumerate(dm.corpora["dev"]):
        expected = [ids.get(t, -1) for t in sent.supertags]
        assert batch["supertags"][b, : len(expected)].tolist() == expected
    shuffled = [i for b in dm.dataloader("train", shuffle=True) for i in b["index"].tolist()]
    assert sorted(shuffled) == list(range(32))


def test_training_batches_take_lightnings_distributed_sampler(datamodule: SupertagDataModule) -> None:
    loader, shards = distributed_shards(datamodule.train_dataloader)
    assert isinstance(loader.batch_sampler, BucketBatchSampler)
    assert shards[0] | shards[1] == set(range(32)) and not shards[0] & shards[1]
    plain = SupertagDataModule(datamodule.treebank_config, batch_size=8, bucket=False)
    plain.setup()
    batches = [b["index"].tolist() for b in plain.train_dataloader()]
    assert sorted(i for b in batches for i in b) == list(range(32)) and len(batches) == 4


def test_supertag_corpus_file_round_trip_and_errors(tmp_path: Path, datamodule: SupertagDataModule) -> None:
    corpus = datamodule.corpora["train"]
    path = tmp_path / "train.supertags"
    write_supertag_corpus(path, corpus)
    first_line = path.read_text().splitlines()[0].split("\t")
    assert first_line == [corpus[0].words[0], corpus[0].supertags[0], corpus[0].preterminals[0]]
    back = read_supertag_corpus(path)
    assert [(s.words, s.supertags, s.preterminals) for s in back] == \
        [(s.words, s.supertags, s.preterminals) for s in corpus]
    bad = tmp_path / "bad.supertags"
    bad.write_text("a\t@pt 1 t - -\tN\nb\tX 2 x0t @pt -\n\n")
    with pytest.raises(ConllFormatError, match=r"bad.supertags:2"):
        read_supertag_corpus(bad)


def test_statistics_count_unseen_supertags(datamodule: SupertagDataModule) -> None:
    stats = corpus_statistics(datamodule.corpora, datamodule.treebanks)
    train_tags = set(datamodule.supertags)
    dev_tokens = [t for s in datamodule.corpora["dev"] for t in s.supertags]
    assert stats["train"]["supertags"] == len(train_tags)
    assert stats["dev"]["unseen_supertag_tokens"] == sum(t not in train_tags for t in dev_tokens)
    assert stats["dev"]["unseen_supertags"] == len({t for t in dev_tokens if t not in train_tags})
    assert stats["total"]["sentences"] == 40
    assert stats["total"]["max_fanout"] >= 2
    assert 0 < stats["total"]["discontinuity_rate"] <= 1


def test_treebank_config_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.discbracket"):
        load_treebank({"path": str(tmp_path / "missing.discbracket")})
    with pytest.raises(ValueError, match="unknown treebank option"):
        load_treebank({"path": "x", "splitt": 0.1})
    broken = tmp_path / "broken.discbracket"
    broken.write_text("(ROOT (N 0=a) (V 1=b))\t0\n(ROOT (N 0=a) (V 1=b)\t1\n")
    with pytest.raises(ValueError, match=r"broken.discbracket:2"):
        load_treebank({"path": str(broken)})
    with pytest.raises(ValueError, match="sentence 7"):
        from neurocrf.parsing.tree import Tree, TreebankSentence

        supertag_corpus([TreebankSentence("7", ["a", "b"], Tree.parse("(X|Y (N 0) (V 1))"))])


def test_loss_is_the_sum_of_both_cross_entropies(datamodule: SupertagDataModule) -> None:
    model = make_model(datamodule, heads={"dropout": 0.0})
    model.eval()
    batch = next(iter(datamodule.dataloader("train")))
    st, pt, _ = model._scores(batch)
    mask = batch["mask"]
    expected = F.cross_entropy(st[mask], batch["supertags"][mask]) + \
        F.cross_entropy(pt[mask], batch["preterminals"][mask])
    assert torch.allclose(model.loss(st, pt, batch), expected, atol=1e-6)
    # gold -1 (a supertag unseen in training) is ignored by the loss
    batch["supertags"][0, 0] = -1
    keep = mask.clone()
    keep[0, 0] = False
    expected = F.cross_entropy(st[keep], batch["supertags"][keep]) + \
        F.cross_entropy(pt[mask], batch["preterminals"][mask])
    assert torch.allclose(model.loss(st, pt, batch), expected, atol=1e-6)


def test_predict_kbest_renormalises_over_k(datamodule: SupertagDataModule) -> None:
    model = make_model(datamodule)
    model.eval()
    sentences = [s.words for s in datamodule.corpora["dev"]] + [[], "n1 v2 d3"]
    k = 5
    out = model.predict_kbest(sentences, k=k, batch_size=2)
    assert len(out) == len(sentences) and isinstance(out[0], KBestTags)
    assert out[-2].candidates == [] and out[-1].tokens == ["n1", "v2", "d3"]
    for words, tags in zip(sentences[:-2], out):
        assert tags.tokens == words and len(tags.candidates) == len(words) == len(tags.preterminals)
        # the same numbers straight from the model, one sentence at a time
        inputs = model.encoder.prepare([words])
        with torch.no_grad():
            st, pt = model(inputs)
        log_probs = st[0].log_softmax(-1)
        top_lp, top_ids = log_probs.topk(k, -1)
        for i, cands in enumerate(tags.candidates):
            assert len(cands) == k
            assert [t for t, _ in cands] == [model.supertags[j] for j in top_ids[i].tolist()]
            weights = [w for _, w in cands]
            assert weights == sorted(weights) and min(weights) >= 0
            assert math.isclose(sum(math.exp(-w) for w in weights), 1.0, rel_tol=1e-5)
            renorm = top_lp[i] - top_lp[i].logsumexp(0)
            assert torch.allclose(torch.tensor(weights), -renorm, atol=1e-5)
            assert math.isclose(tags.supertag_probs[i], top_lp[i, 0].exp().item(), rel_tol=1e-5)
        assert tags.preterminals == [model.preterminals[j] for j in pt[0].argmax(-1).tolist()]
        assert tags.best == [c[0][0] for c in tags.candidates]
    # k larger than the tag set: all tags, still a distribution
    everything = model.predict_kbest([sentences[0]], k=10_000)[0].candidates[0]
    assert len(everything) == len(model.supertags)
    assert math.isclose(sum(math.exp(-w) for _, w in everything), 1.0, rel_tol=1e-4)
    with pytest.raises(ValueError, match="k must be"):
        model.predict_kbest([sentences[0]], k=0)


def test_bad_configurations_raise(datamodule: SupertagDataModule) -> None:
    vocabularies = build_vocabularies(TINY_ENCODER, [["a"]])
    with pytest.raises(ValueError, match="duplicates"):
        Supertagger(TINY_ENCODER, vocabularies, ["a", "a"], ["N"], ["ROOT"])
    with pytest.raises(ValueError, match="unknown parsing option"):
        Supertagger(TINY_ENCODER, vocabularies, ["a"], ["N"], ["ROOT"], parsing={"kk": 3})
    features = {"name": "features"}
    with pytest.raises(ValueError, match="emits tag scores"):
        Supertagger(features, build_vocabularies(features, [["a", "b"]]), ["a"], ["N"], ["ROOT"])


def test_training_memorises_logs_and_checkpoint_loads_weights_only(
        tmp_path: Path, datamodule: SupertagDataModule) -> None:
    pl.seed_everything(0)
    model = make_model(datamodule, parsing={"val_every_n_epochs": 20, "k": 4}, heads={"dropout": 0.0})
    trainer = pl.Trainer(max_epochs=40, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    trainer.fit(model, datamodule=datamodule)
    metrics = trainer.callback_metrics
    for key in ("train/loss", "val/loss", "val/supertag_acc", "val/pos_acc", "val/supertag_acc_best",
                "val/f1", "val/dis_f1", "val/coverage"):
        assert key in metrics, key
    assert model.last_parse is not None and model.last_parse["sentences"] == 4
    # the training sentences are memorised
    train_words = [s.words for s in datamodule.corpora["train"]]
    kbest = model.predict_kbest(train_words, k=4)
    gold = [t for s in datamodule.corpora["train"] for t in s.supertags]
    pred = [t for s in kbest for t in s.best]
    assert sum(p == g for p, g in zip(pred, gold)) / len(gold) > 0.95
    trainer.validate(model, dataloaders=datamodule.dataloader("train"), verbose=False)
    assert trainer.callback_metrics["val/supertag_acc"] > 0.95
    assert trainer.callback_metrics["val/pos_acc"] > 0.95

    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["supertags"] == datamodule.supertags
    loaded = Supertagger.load(path)
    assert not loaded.training and loaded.roots == ["ROOT"]
    again = loaded.predict_kbest(train_words, k=4)
    for a, b in zip(again, kbest):
        for c1, c2 in zip(a.candidates, b.candidates):
            assert [t for t, _ in c1] == [t for t, _ in c2]
            assert [w for _, w in c1] == pytest.approx([w for _, w in c2], abs=1e-5)
    assert [s.preterminals for s in again] == [s.preterminals for s in kbest]


def _copy_with_labels(model: Supertagger, supertags: list[str]) -> Supertagger:
    """``model`` with its supertag list reordered / extended to ``supertags``: the head rows follow
    their labels, a new label gets a score of 3.0 from a zero weight row."""
    hp = model.hparams
    other = Supertagger(hp["encoder"], hp["vocabularies"], supertags, model.preterminals, model.roots,
                        transform=hp["transform"])
    other.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("supertag_head")},
                          strict=False)
    with torch.no_grad():
        other.supertag_head.weight.zero_()
        other.supertag_head.bias.fill_(3.0)
        for row, tag in enumerate(supertags):
            if tag in model.supertags:
                other.supertag_head.weight[row] = model.supertag_head.weight[model.supertags.index(tag)]
                other.supertag_head.bias[row] = model.supertag_head.bias[model.supertags.index(tag)]
    return other


def test_ensemble_is_the_mean_of_its_members_distributions(datamodule: SupertagDataModule) -> None:
    torch.manual_seed(0)
    first = make_model(datamodule)
    torch.manual_seed(1)
    second = make_model(datamodule)
    sentences = [s.words for s in datamodule.corpora["dev"]] + [[]]
    k = 4
    ensemble = SupertaggerEnsemble([first, second])
    assert ensemble.supertags == first.supertags and ensemble.roots == ["ROOT"]
    out = ensemble.predict_kbest(sentences, k=k, batch_size=3)
    assert out[-1].candidates == [] and len(out) == len(sentences)
    for words, tags in zip(sentences[:-1], out):
        probs = [m.batch_log_probs([words]) for m in (first, second)]
        mean = (probs[0][0].exp() + probs[1][0].exp())[0] / 2  # [T, S]
        pt_mean = (probs[0][1].exp() + probs[1][1].exp())[0] / 2
        top_p, top_ids = mean.topk(k, -1)
        assert tags.preterminals == [first.preterminals[j] for j in pt_mean.argmax(-1).tolist()]
        for i, cands in enumerate(tags.candidates):
            assert [t for t, _ in cands] == [first.supertags[j] for j in top_ids[i].tolist()]
            expected = -(top_p[i] / top_p[i].sum()).log()
            assert torch.allclose(torch.tensor([w for _, w in cands]), expected, atol=1e-5)
            assert tags.supertag_probs[i] == pytest.approx(top_p[i, 0].item(), rel=1e-5)
    single = first.predict_kbest(sentences[:-1], k=k)  # the members disagree somewhere
    assert any(a.candidates != b.candidates for a, b in zip(single, out))
    # an ensemble of one model, or of a model and its copy, is that model
    for members in ([first], [first, first]):
        again = SupertaggerEnsemble(members).predict_kbest(sentences[:-1], k=k)
        for a, b in zip(again, single):
            assert [[t for t, _ in c] for c in a.candidates] == [[t for t, _ in c] for c in b.candidates]
            assert [w for c in a.candidates for _, w in c] == pytest.approx([w for c in b.candidates for _, w in c],
                                                                            abs=1e-5)
            assert a.preterminals == b.preterminals


def test_ensemble_matches_labels_by_name(datamodule: SupertagDataModule) -> None:
    torch.manual_seed(0)
    model = make_model(datamodule)
    words = [datamodule.corpora["dev"][0].words]
    reordered = _copy_with_labels(model, list(reversed(model.supertags)))
    assert reordered.supertags != model.supertags
    alone = model.batch_log_probs(words)[0]
    both = SupertaggerEnsemble([model, reordered]).batch_log_probs(words)[0]
    assert torch.allclose(both, alone, atol=1e-5)  # the same distribution, whatever the label order
    # a label only the second member knows: half its probability there, the rest scaled by 1/2 + p/2
    extended = _copy_with_labels(model, [*model.supertags, "NEW 1 x0t @pt -"])
    ensemble = SupertaggerEnsemble([model, extended])
    assert ensemble.supertags == [*model.supertags, "NEW 1 x0t @pt -"]
    mixed = ensemble.batch_log_probs(words)[0].exp()
    new_prob = extended.batch_log_probs(words)[0].exp()
    assert torch.allclose(mixed[..., -1], new_prob[..., -1] / 2, atol=1e-6)
    assert torch.allclose(mixed[..., :-1], (alone.exp() + new_prob[..., :-1]) / 2, atol=1e-6)
    assert torch.allclose(mixed.sum(-1), torch.ones(mixed.shape[:-1]), atol=1e-5)


def test_ensemble_errors_and_loading(tmp_path: Path, datamodule: SupertagDataModule) -> None:
    model = make_model(datamodule)
    hp = model.hparams
    with pytest.raises(ValueError, match="at least one"):
        SupertaggerEnsemble([])
    other = Supertagger(hp["encoder"], hp["vocabularies"], model.supertags, model.preterminals, model.roots,
                        transform={"h": 1, "v": 1, "move_punctuation": True})
    with pytest.raises(ValueError, match="member 2 prepared its trees"):
        SupertaggerEnsemble([model, other])
    trainer = pl.Trainer(max_epochs=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.strategy.connect(model)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    assert isinstance(load_supertagger(str(path)), Supertagger)
    assert isinstance(load_supertagger([str(path)]), Supertagger)
    pair = load_supertagger([path, path])
    assert isinstance(pair, SupertaggerEnsemble) and len(pair.members) == 2
    assert all(not m.training for m in pair.members)

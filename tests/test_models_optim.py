"""Optimizers, parameter groups, schedules and the full-batch L-BFGS objective."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.data.sample import generate_sample_corpus
from neurocrf.encoders import build_vocabularies
from neurocrf.models.optim import (
    InverseTimeDecay,
    LinearWarmupDecay,
    build_optimizer,
    build_scheduler,
    l2_penalty,
    param_groups,
)
from neurocrf.models.tagger import Tagger


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
    dm.set_input_builder(model.encoder.prepare)
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

"""Optimizers and learning-rate schedules from plain config dicts.

Optimizer config (``Tagger(optimizer=...)``)::

    name: adam | adamw | sgd | lbfgs
    lr: 1e-3
    weight_decay: 0.0        # applied to weight matrices only (parameters with >= 2 dims)
    momentum: 0.9            # sgd
    nesterov: false          # sgd
    betas: [0.9, 0.999]      # adam / adamw
    encoder_lr: null         # learning rate of pretrained transformer parameters (if any)
    l2_sigma2: null          # Gaussian prior: loss = sum NLL + ||w||^2 / (2 sigma^2) (any optimizer;
                             # lbfgs: 100 (sigma = 10, MALLET's default) when the key is absent)
    # lbfgs only: full batch, like MALLET / CRFsuite (see neurocrf.models.lbfgs.FullBatchLBFGS).
    # One Lightning epoch = one optimizer step = max_iter L-BFGS iterations over the whole
    # training set (precomputed once, in chunks of chunk_tokens padded tokens).
    max_iter: 1              # iterations per epoch (1: every iteration is timed and validated)
    max_iterations: null     # total iteration limit (reached without converging -> warning + flag)
    tolerance_change: 1e-4   # converged when (f[k-period] - f[k]) / |f[k]| <= this
    period: 1                # 1: MALLET's test; CRFsuite: period 10, tolerance_change 1e-5
    tolerance_grad: 1e-5     # converged when ||g|| / max(||w||, 1) <= this (CRFsuite's epsilon)
    history_size: 10, line_search_fn: strong_wolfe, max_line_search: 25,
    chunk_tokens: null       # 20000; for pair emissions (label-pair features) 1.5M / ((L + 1) L)

Scheduler config (``Tagger(scheduler=...)``, or None)::

    name: linear             # warmup_steps or warmup_ratio, then linear decay to 0 at the last step
    name: inverse_time       # lr / (1 + decay * epoch), Ma & Hovy style; key decay: 0.05
    name: plateau            # ReduceLROnPlateau; monitor (val/f1), mode (max), factor, patience

New optimizers register in :data:`OPTIMIZERS` (a factory ``(param_groups, config) -> Optimizer``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

OptimizerFactory = Callable[[list[dict[str, Any]], dict[str, Any]], Optimizer]


def _adam(groups: list[dict[str, Any]], config: dict[str, Any]) -> Optimizer:
    return torch.optim.Adam(groups, lr=config.get("lr", 1e-3), betas=tuple(config.get("betas", (0.9, 0.999))))


def _adamw(groups: list[dict[str, Any]], config: dict[str, Any]) -> Optimizer:
    return torch.optim.AdamW(groups, lr=config.get("lr", 1e-3), betas=tuple(config.get("betas", (0.9, 0.999))))


def _sgd(groups: list[dict[str, Any]], config: dict[str, Any]) -> Optimizer:
    return torch.optim.SGD(
        groups,
        lr=config.get("lr", 0.01),
        momentum=config.get("momentum", 0.0),
        nesterov=bool(config.get("nesterov", False)),
    )


DEFAULT_LBFGS_SIGMA2 = 100.0
"""Prior variance of L-BFGS runs without ``l2_sigma2`` in their config (sigma = 10)."""


def _lbfgs(groups: list[dict[str, Any]], config: dict[str, Any]) -> Optimizer:
    from neurocrf.models.lbfgs import FullBatchLBFGS

    params = [p for group in groups for p in group["params"]]  # L-BFGS takes one group
    if any(group.get("weight_decay", 0.0) for group in groups):
        raise ValueError("lbfgs takes its L2 prior from l2_sigma2, not weight_decay")
    max_iterations = config.get("max_iterations")
    return FullBatchLBFGS(
        params,
        lr=float(config.get("lr", 1.0)),
        history_size=int(config.get("history_size", 10)),
        line_search_fn=config.get("line_search_fn", "strong_wolfe"),
        max_line_search=int(config.get("max_line_search", 25)),
        tolerance_change=float(config.get("tolerance_change", 1e-4)),
        period=int(config.get("period", 1)),
        tolerance_grad=float(config.get("tolerance_grad", 1e-5)),
        max_iterations=None if max_iterations is None else int(max_iterations),
        iterations_per_step=int(config.get("max_iter", 1)),
    )


OPTIMIZERS: dict[str, OptimizerFactory] = {
    "adam": _adam,
    "adamw": _adamw,
    "sgd": _sgd,
    "lbfgs": _lbfgs,
}


def is_full_batch(config: dict[str, Any]) -> bool:
    """Whether the optimizer is closure-based full-batch (L-BFGS): loss is then summed."""
    return config.get("name", "adam") == "lbfgs"


def pretrained_parameters(module: nn.Module) -> set[int]:
    """Ids of the parameters inside Hugging Face pretrained models (matched by class hierarchy so
    that ``transformers`` is not imported for encoders that do not use it)."""
    ids: set[int] = set()
    for sub in module.modules():
        if any(cls.__name__ == "PreTrainedModel" for cls in type(sub).__mro__):
            ids.update(id(p) for p in sub.parameters())
    return ids


def param_groups(model: nn.Module, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Split trainable parameters by learning rate (``encoder_lr`` for pretrained transformer
    parameters) and by weight decay (matrices only; biases, norms and embeddings' 1-d params not)."""
    lr = config.get("lr")
    encoder_lr = config.get("encoder_lr")
    decay = float(config.get("weight_decay", 0.0))
    pretrained = pretrained_parameters(model) if encoder_lr is not None else set()
    buckets: dict[tuple[bool, bool], list[Tensor]] = {}
    for param in model.parameters():
        if not param.requires_grad:
            continue
        key = (id(param) in pretrained, param.ndim >= 2 and decay > 0)
        buckets.setdefault(key, []).append(param)
    groups = []
    for (is_pretrained, decayed), params in sorted(buckets.items()):
        group: dict[str, Any] = {"params": params, "weight_decay": decay if decayed else 0.0}
        if is_pretrained:
            group["lr"] = float(encoder_lr)
        elif lr is not None:
            group["lr"] = float(lr)
        groups.append(group)
    return groups


def build_optimizer(model: nn.Module, config: dict[str, Any]) -> Optimizer:
    """The optimizer named by ``config["name"]`` over ``model``'s trainable parameters."""
    name = config.get("name", "adam")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](param_groups(model, config), config)


def l2_penalty(parameters: Iterable[Tensor], sigma2: float) -> Tensor:
    """Gaussian prior term ``||w||^2 / (2 sigma^2)`` over all given parameters."""
    squares = [p.pow(2).sum() for p in parameters if p.requires_grad]
    if not squares:
        return torch.zeros(())
    return torch.stack(squares).sum() / (2.0 * float(sigma2))


class LinearWarmupDecay:
    """LR factor: linear warmup over ``warmup`` steps, then linear decay to 0 at ``total`` steps.

    A class (not a closure) so that LambdaLR's state dict holds plain ints.
    """

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = int(warmup)
        self.total = max(int(total), 1)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        remaining = self.total - step
        return max(0.0, remaining / max(1, self.total - self.warmup))


class InverseTimeDecay:
    """LR factor ``1 / (1 + decay * epoch)``."""

    def __init__(self, decay: float) -> None:
        self.decay = float(decay)

    def __call__(self, epoch: int) -> float:
        return 1.0 / (1.0 + self.decay * epoch)


def build_scheduler(
    optimizer: Optimizer, config: dict[str, Any] | None, total_steps: int
) -> dict[str, Any] | None:
    """A Lightning ``lr_scheduler`` config dict, or None when ``config`` is None / name null."""
    if not config or config.get("name") in (None, "none"):
        return None
    name = config["name"]
    if name == "linear":
        warmup = config.get("warmup_steps")
        if warmup is None:
            warmup = round(float(config.get("warmup_ratio", 0.1)) * total_steps)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, LinearWarmupDecay(warmup, total_steps))
        return {"scheduler": schedule, "interval": "step", "frequency": 1}
    if name == "inverse_time":
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, InverseTimeDecay(config.get("decay", 0.05)))
        return {"scheduler": schedule, "interval": "epoch", "frequency": 1}
    if name == "plateau":
        mode = config.get("mode", "max")
        schedule = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode=mode,
            factor=float(config.get("factor", 0.5)),
            patience=int(config.get("patience", 2)),
            min_lr=float(config.get("min_lr", 0.0)),
        )
        return {
            "scheduler": schedule,
            "interval": "epoch",
            "frequency": 1,
            "monitor": config.get("monitor", "val/f1"),
            "strict": True,
        }
    raise ValueError(f"unknown scheduler {name!r}; expected linear, inverse_time, plateau or null")


def configure_optimizers(module: Any, optimizer_config: Any, scheduler_config: Any) -> Any:
    """What a LightningModule's ``configure_optimizers`` returns for these configs: the optimizer,
    or the optimizer with its per-step scheduler (sized by the trainer's estimated steps)."""
    optimizer = build_optimizer(module, optimizer_config)
    total = 1
    if module._trainer is not None:
        estimated = module.trainer.estimated_stepping_batches
        total = int(estimated) if estimated != float("inf") else 1
    scheduler = build_scheduler(optimizer, scheduler_config, total)
    if scheduler is None:
        return optimizer
    return {"optimizer": optimizer, "lr_scheduler": scheduler}

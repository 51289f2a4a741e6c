"""Optimizers and learning-rate schedules from plain config dicts.

Optimizer config (``Tagger(optimizer=...)``)::

    name: adam | adamw | sgd | lbfgs
    lr: 1e-3                 # every trainable parameter not given another rate below
    weight_decay: 0.0        # weight matrices only (>= 2 dims, outside normalisation layers);
                             # adamw: decoupled (Loshchilov & Hutter), adam / sgd: L2 in the gradient
    momentum: 0.9            # sgd
    nesterov: false          # sgd
    betas: [0.9, 0.999]      # adam / adamw
    eps: 1e-8                # adam / adamw
    head_lr: null            # learning rate of everything outside ``model.encoder``: the projection
                             # and the CRF / softmax head (supertagger: its output heads)
    encoder_lr: null         # learning rate of pretrained Hugging Face parameters (if any)
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
    log_every: 10            # a progress line every this many iterations and at the last (0: none)

Scheduler config (``Tagger(scheduler=...)``, or None)::

    name: linear             # warmup_steps or warmup_ratio, then linear decay to 0 at the last step
    name: inverse_time       # lr / (1 + decay * epoch), Ma & Hovy style; key decay: 0.05
    name: plateau            # ReduceLROnPlateau; monitor (val/f1), mode (max), factor, patience

Fine-tuning a pretrained transformer (``configs/experiment/*_minilm_crf.yaml``)::

    optimizer: {name: adamw, lr: 5e-5, head_lr: 1e-3, weight_decay: 0.01}
    scheduler: {name: linear, warmup_ratio: 0.1}
    trainer: {gradient_clip_val: 1.0}

The encoder then learns at 5e-5 and the freshly initialised projection and CRF at 1e-3; biases,
LayerNorm weights and the CRF's start / end scores are not decayed (the CRF's transition matrix
is a matrix and is). ``encoder_lr`` is the older way to say the same split from the other side
(pretrained parameters at ``encoder_lr``, the rest at ``lr``); when both are set, ``head_lr``
wins outside the encoder, ``encoder_lr`` inside the Hugging Face model, ``lr`` elsewhere.

New optimizers register in :data:`OPTIMIZERS` (a factory ``(param_groups, config) -> Optimizer``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[list[dict[str, Any]], dict[str, Any]], Optimizer]


def _adam(groups: list[dict[str, Any]], config: dict[str, Any]) -> Optimizer:
    return torch.optim.Adam(groups, lr=config.get("lr", 1e-3), betas=tuple(config.get("betas", (0.9, 0.999))),
                            eps=float(config.get("eps", 1e-8)))


def _adamw(groups: list[dict[str, Any]], config: dict[str, Any]) -> Optimizer:
    return torch.optim.AdamW(groups, lr=config.get("lr", 1e-3), betas=tuple(config.get("betas", (0.9, 0.999))),
                             eps=float(config.get("eps", 1e-8)))


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


NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm,
    nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())  # torch >= 2.4


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer: a torch one, or one named ``*Norm`` (the
    custom layer norms of Hugging Face models, e.g. ``T5LayerNorm``, ``LlamaRMSNorm``)."""
    return isinstance(module, NORM_TYPES) or type(module).__name__.endswith("Norm")


def no_decay_parameters(module: nn.Module) -> set[int]:
    """Ids of the parameters weight decay skips: vectors and scalars (biases, CRF start / end
    scores, scalar mixes) and every parameter of a normalisation layer (:func:`is_norm`)."""
    ids = {id(p) for p in module.parameters() if p.ndim < 2}
    for sub in module.modules():
        if is_norm(sub):
            ids.update(id(p) for p in sub.parameters(recurse=False))
    return ids


def head_parameters(module: nn.Module) -> set[int]:
    """Ids of the parameters outside ``module.encoder`` (the projection and the CRF / softmax head
    of a tagger, the output heads of a supertagger)."""
    encoder = getattr(module, "encoder", None)
    if not isinstance(encoder, nn.Module):
        raise ValueError(f"optimizer.head_lr needs a model with an `encoder` module; {type(module).__name__} has none")
    inside = {id(p) for p in encoder.parameters()}
    return {id(p) for p in module.parameters() if id(p) not in inside}


# learning-rate roles, in group order (the order of the groups in saved optimizer states)
_ROLES = ("base", "pretrained", "head")


def param_groups(model: nn.Module, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Trainable parameters split by learning rate and weight decay.

    Learning rate: ``head_lr`` outside ``model.encoder`` (if set), ``encoder_lr`` inside its
    Hugging Face model (if set), ``lr`` (or the optimizer's default) elsewhere. Weight decay:
    ``weight_decay`` on matrices outside normalisation layers, 0 on the rest
    (:func:`no_decay_parameters`). Each group is named ``<role>`` or ``<role>_no_decay`` with
    role ``base``, ``pretrained`` or ``head``; frozen parameters are left out.

    >>> model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    >>> [(g["name"], len(g["params"]), g["weight_decay"]) for g in param_groups(model, {"weight_decay": 0.01})]
    [('base_no_decay', 3, 0.0), ('base', 1, 0.01)]
    """
    rates = {"base": config.get("lr"), "pretrained": config.get("encoder_lr"), "head": config.get("head_lr")}
    decay = float(config.get("weight_decay", 0.0) or 0.0)
    pretrained = pretrained_parameters(model) if rates["pretrained"] is not None else set()
    head = head_parameters(model) if rates["head"] is not None else set()
    no_decay = no_decay_parameters(model)
    buckets: dict[tuple[int, bool], list[Tensor]] = {}
    for param in model.parameters():
        if not param.requires_grad:
            continue
        role = "head" if id(param) in head else "pretrained" if id(param) in pretrained else "base"
        key = (_ROLES.index(role), decay > 0 and id(param) not in no_decay)
        buckets.setdefault(key, []).append(param)
    groups = []
    for (role_index, decayed), params in sorted(buckets.items()):
        role = _ROLES[role_index]
        group: dict[str, Any] = {"params": params, "weight_decay": decay if decayed else 0.0,
                                 "name": role if decayed or decay == 0 else f"{role}_no_decay"}
        if rates[role] is not None:
            group["lr"] = float(rates[role])
        groups.append(group)
    return groups


OPTIMIZER_KEYS = frozenset({
    "name", "lr", "weight_decay", "momentum", "nesterov", "betas", "eps", "head_lr", "encoder_lr",
    "l2_sigma2", "max_iter", "max_iterations", "tolerance_change", "period", "tolerance_grad",
    "history_size", "line_search_fn", "max_line_search", "chunk_tokens", "log_every",
})
"""Every optimizer config key (a key outside it is a typo, refused rather than ignored)."""


def build_optimizer(model: nn.Module, config: dict[str, Any]) -> Optimizer:
    """The optimizer named by ``config["name"]`` over ``model``'s trainable parameters."""
    name = config.get("name", "adam")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}")
    unknown = sorted(set(config) - OPTIMIZER_KEYS)
    if unknown:
        raise ValueError(f"unknown optimizer option(s) {unknown}; expected some of {sorted(OPTIMIZER_KEYS)}")
    for key in ("lr", "head_lr", "encoder_lr"):
        value = config.get(key)
        if value is not None and not float(value) >= 0:
            raise ValueError(f"optimizer.{key} must be >= 0 (or null), got {value}")
    return OPTIMIZERS[name](param_groups(model, config), config)


def l2_penalty(parameters: Iterable[Tensor], sigma2: float) -> Tensor:
    """Gaussian prior term ``||w||^2 / (2 sigma^2)`` over all given parameters."""
    squares = [p.pow(2).sum() for p in parameters if p.requires_grad]
    if not squares:
        return torch.zeros(())
    return torch.stack(squares).sum() / (2.0 * float(sigma2))


class LinearWarmupDecay:
    """LR factor at optimizer step ``step`` (0-based): linear warmup over the first ``warmup``
    steps (``(step + 1) / (warmup + 1)``, so the first step already learns), 1 at step
    ``warmup``, then linear decay to 0 at step ``total`` (the last step taken, ``total - 1``,
    has ``1 / (total - warmup)``).

    A class (not a closure) so that LambdaLR's state dict holds plain ints.

    >>> factor = LinearWarmupDecay(warmup=2, total=10)
    >>> [round(factor(step), 3) for step in (0, 1, 2, 6, 9, 10)]
    [0.333, 0.667, 1.0, 0.5, 0.125, 0.0]
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


SCHEDULER_KEYS: dict[str, frozenset[str]] = {
    "linear": frozenset({"warmup_steps", "warmup_ratio"}),
    "inverse_time": frozenset({"decay"}),
    "plateau": frozenset({"monitor", "mode", "factor", "patience", "min_lr"}),
}
"""Each scheduler's options besides ``name``."""


def linear_warmup_steps(config: dict[str, Any], total_steps: int) -> int:
    """Warmup steps of a linear schedule: ``warmup_steps``, else ``round(warmup_ratio * total)``
    (ratio default 0.1)."""
    steps, ratio = config.get("warmup_steps"), config.get("warmup_ratio")
    if steps is not None and ratio is not None:
        raise ValueError(f"give the linear scheduler warmup_steps or warmup_ratio, not both (got {steps} and {ratio})")
    if steps is not None:
        if int(steps) != steps or steps < 0:
            raise ValueError(f"scheduler.warmup_steps must be an integer >= 0, got {steps}")
        return int(steps)
    ratio = 0.1 if ratio is None else float(ratio)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"scheduler.warmup_ratio must be in [0, 1], got {ratio}")
    return round(ratio * total_steps)


def build_scheduler(
    optimizer: Optimizer, config: dict[str, Any] | None, total_steps: int
) -> dict[str, Any] | None:
    """A Lightning ``lr_scheduler`` config dict, or None when ``config`` is None / name null."""
    if not config or config.get("name") in (None, "none"):
        return None
    name = config["name"]
    if name in SCHEDULER_KEYS:
        unknown = sorted(set(config) - SCHEDULER_KEYS[name] - {"name"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} of the {name} scheduler; expected some of"
                             f" {sorted(SCHEDULER_KEYS[name])}")
    if name == "linear":
        warmup = linear_warmup_steps(config, total_steps)
        if warmup > total_steps:
            log.warning("linear schedule: %d warmup steps but %d steps in all; the learning rate"
                        " never reaches its peak", warmup, total_steps)
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
        if estimated == float("inf"):
            if scheduler_config and scheduler_config.get("name") == "linear":
                raise ValueError("the linear schedule decays to 0 at the last step, so it needs a known number"
                                 " of steps: set trainer.max_epochs or trainer.max_steps")
        else:
            total = int(estimated)
    scheduler = build_scheduler(optimizer, scheduler_config, total)
    if scheduler is None:
        return optimizer
    return {"optimizer": optimizer, "lr_scheduler": scheduler}

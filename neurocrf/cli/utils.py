"""Shared plumbing of the Hydra entry points: instantiation, seeding, metrics, composing a tool's
config (the config directory: :mod:`neurocrf.cli.configs`).

``PROJECT_ROOT`` (used by ``configs/paths/default.yaml`` for logs and the generated sample)
defaults to the directory above the config directory, or to the working directory when the configs
are the installed copy.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
from omegaconf import DictConfig

from neurocrf.cli.configs import CONFIG_DIR, PACKAGED_CONFIGS
from neurocrf.cli.help import register as register_help_resolver
from neurocrf.values import to_plain

log = logging.getLogger(__name__)

register_help_resolver()  # configs/hydra/default.yaml names it: any composition of a tool's config needs it
os.environ.setdefault(
    "PROJECT_ROOT", str(Path.cwd() if Path(CONFIG_DIR) == PACKAGED_CONFIGS else Path(CONFIG_DIR).parent)
)


def instantiate_list(cfg: DictConfig | None, kind: str) -> list[Any]:
    """Instantiate every entry with a ``_target_`` of a config group (callbacks, loggers)."""
    objects: list[Any] = []
    if not cfg:
        return objects
    if not isinstance(cfg, (DictConfig, Mapping)):
        raise TypeError(f"{kind} config must be a mapping of name -> config")
    for name, entry in cfg.items():
        if isinstance(entry, (DictConfig, Mapping)) and "_target_" in entry:
            log.info("instantiating %s %s <%s>", kind, name, entry["_target_"])
            objects.append(hydra.utils.instantiate(entry))
    return objects


def metric_value(metrics: Mapping[str, Any], name: str | None) -> float | None:
    """``metrics[name]`` as a float (for sweepers); None when no name is configured, or, with a
    warning, when the run never logged it (e.g. validation off: the run's outputs are complete,
    only a sweeper has nothing to optimise)."""
    if not name:
        return None
    if name not in metrics:
        log.warning(
            "optimized_metric %r was not logged (validation off, or fewer validations than epochs?):"
            " the run finished, but a sweeper gets no value from it; logged metrics: %s",
            name, sorted(metrics),
        )
        return None
    value = metrics[name]
    return float(value.item() if hasattr(value, "item") else value)


def set_threads(threads: int | None) -> None:
    """Use ``threads`` torch threads for the operators and as many between them (None: torch's
    default). The inter-op count can be set once per process, before torch's first parallel
    work: a later call keeps the count torch has."""
    import torch

    if threads is None:
        return
    if int(threads) < 1:
        raise ValueError(f"threads must be >= 1 (or null: torch's default), got {threads}")
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(int(threads))
    except RuntimeError:  # already set, or parallel work already ran in this process
        log.debug("torch's inter-op threads stay at %d", torch.get_num_interop_threads())


def training_result(cfg: DictConfig, returned: tuple[dict[str, float], Any]) -> float | None:
    """What a training entry point returns to a sweeper: ``cfg.optimized_metric`` of the metrics
    ``train(cfg)`` returned (:func:`metric_value`)."""
    return metric_value(returned[0], cfg.optimized_metric)


def best_checkpoint(trainer: pl.Trainer) -> str | None:
    """The path of the best checkpoint the trainer's checkpoint callback kept; None without one."""
    callback = trainer.checkpoint_callback
    path = getattr(callback, "best_model_path", "") if callback is not None else ""
    return path or None


def float_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Trainer callback metrics (tensors) as plain floats."""
    return {key: float(value.item() if hasattr(value, "item") else value) for key, value in metrics.items()}


def set_seed(seed: int | None) -> None:
    """Seed python, numpy and torch (all devices) when ``seed`` is not None."""
    if seed is not None:
        pl.seed_everything(int(seed), workers=True)


def log_config(loggers: list[Any], cfg: DictConfig, extra: Mapping[str, Any] | None = None) -> None:
    """Send the resolved run config (and ``extra`` values) to every logger as hyperparameters."""
    if not loggers:
        return
    params = {key: value for key, value in (to_plain(cfg) or {}).items() if key != "hydra"}
    params.update(extra or {})
    for logger in loggers:
        logger.log_hyperparams(params)


def compose_task_config(
    name: str, output_dir: str | Path, overrides: list[str] | tuple[str, ...] = (), data_dir: str | Path | None = None
) -> DictConfig:
    """``configs/<name>.yaml`` composed as its entry point sees it (for scripts and tests): every
    output path under ``output_dir``, the Hydra runtime set, the ``hydra`` node removed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    paths = [f"paths.output_dir={output_dir}", f"paths.log_dir={output_dir}"]
    if data_dir is not None:
        paths.append(f"paths.data_dir={data_dir}")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=name, return_hydra_config=True, overrides=paths + list(overrides))
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # the task function never sees it
    return cfg

"""What a training run leaves in its directory, and how a rerun picks it up: resuming from
``checkpoints/last.ckpt``, skipping a finished run (``summary.json``), and the summary itself
(test scores, per-epoch seconds and dev F1, best epoch, seed, CRF config, corpus, overrides,
device) that sweep reports read (:mod:`neurocrf.study.runs`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, open_dict

from neurocrf.conventions import SUMMARY_FILE
from neurocrf.models.checkpoints import TAGGER, CheckpointError, read_checkpoint
from neurocrf.values import to_plain

log = logging.getLogger(__name__)


def finished_summary(output_dir: Path) -> dict[str, Any] | None:
    path = output_dir / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable run summary ({error}); delete it to rerun the run") from None


def resume_from_last(cfg: DictConfig) -> None:
    """Point ``cfg.ckpt_path`` at the run directory's ``checkpoints/last.ckpt`` when there is one
    (a checkpoint that does not load, e.g. cut off while being written, is set aside)."""
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    if cfg.get("ckpt_path") or not last.is_file():
        return
    try:
        read_checkpoint(last, TAGGER)
    except CheckpointError as error:  # e.g. cut off while being written: start the run again
        broken = last.with_suffix(".ckpt.broken")
        last.rename(broken)
        log.warning("resume: %s does not load (%s); moved to %s, the run starts again", last, error, broken)
        return
    with open_dict(cfg):
        cfg.ckpt_path = str(last)
    log.info("resume: continuing from %s", last)


def write_summary(cfg: DictConfig, metrics: dict[str, float], objects: dict[str, Any]) -> dict[str, Any]:
    """``<run dir>/summary.json`` (written whole or not at all): what a sweep report needs from one run."""
    from neurocrf.data.conll import atomic_write_text

    model = objects["model"]
    summary = {
        "metrics": metrics,
        "test": model.test_scores.to_dict() if model.test_scores is not None else None,
        "checkpoint": objects.get("ckpt_path"),
        "epochs": objects.get("epochs", []),
        "best_epoch": objects.get("best_epoch"),
        "seed": cfg.get("seed"),
        "crf": to_plain(cfg.crf),
        "data": {key: value for key, value in (to_plain(cfg.data) or {}).items() if key.endswith("_path")},
        "corpus": _hydra_choice("data"),
        "overrides": _task_overrides(),
        "device": device_name(objects["trainer"]),
        "torch_threads": torch.get_num_threads(),
    }
    atomic_write_text(Path(cfg.paths.output_dir) / SUMMARY_FILE, json.dumps(summary, indent=1) + "\n")
    return summary


def epoch_records(callbacks: list[pl.Callback]) -> tuple[list[dict[str, Any]], int | None]:
    """The epoch timer's records and best epoch, taken before testing restores another state."""
    from neurocrf.models.callbacks import EpochTimer

    timer = next((c for c in callbacks if isinstance(c, EpochTimer)), None)
    if timer is None:
        return [], None
    return [dict(record) for record in timer.records], timer.best_epoch()


def _task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # no Hydra run (a config composed by a script)
        return []


def _hydra_choice(group: str) -> str | None:
    from hydra.core.hydra_config import HydraConfig

    try:
        return HydraConfig.get().runtime.choices.get(group)
    except ValueError:
        return None


def device_name(trainer: pl.Trainer) -> str:
    root = trainer.strategy.root_device
    if root.type == "cuda":
        return torch.cuda.getdevice_name(root)
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            name = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), name)
    except OSError:
        pass
    return f"cpu ({name})"


def check_no_dev_monitors(callbacks: list[pl.Callback]) -> None:
    """Without a dev split nothing logs ``val/*``: a callback monitoring it would silently never
    fire (checkpoints, early stopping), so say so before training."""
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if isinstance(monitor, str) and monitor.startswith("val/"):
            raise ValueError(
                f"{type(callback).__name__} monitors {monitor!r}, but the data has no dev split"
                " (data.dev_path and data.dev_fraction are null): give a dev split, or drop the"
                " callback (e.g. callbacks=none, or ~callbacks.model_checkpoint)"
            )

"""Training callbacks: bookkeeping that must survive interruptions, and weight averaging.

``BestCheckpoint``: Lightning's ``ModelCheckpoint`` forgets the best score when a run resumes into a
new directory, so the "best" checkpoint tested after a resume would be the best of the resumed epochs
only. This one carries the best checkpoint over (a copy in the new directory, with its score).

``EpochTimer``: the wall seconds and dev score of every epoch, kept in the checkpoint so that a
resumed run still knows its earlier epochs (``summary.json`` of ``neurocrf-train``).

``EpochSeed``: every training epoch depends only on ``(seed, epoch)`` and the weights, so that a run
resumed from an end-of-epoch checkpoint continues exactly as one that never stopped.

``EMAWeights``: an exponential moving average of the weights, which validation, checkpoints and
the final model use.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch import Tensor

log = logging.getLogger(__name__)


class BestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose best checkpoint survives a resume into another directory.

    Resuming in the same directory restores everything as Lightning does. In a new directory the
    best checkpoint of the earlier epochs is copied into it and keeps its score, so later epochs
    replace it only when they beat it; the earlier run's files are never touched.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_dir = state_dict.get("dirpath", self.dirpath)
        saved_best = state_dict.get("best_model_path") or ""
        score = state_dict.get("best_model_score")
        if saved_dir == self.dirpath or self.dirpath is None or not saved_best or score is None:
            super().load_state_dict(state_dict)
            return
        source = Path(saved_best)
        if not source.is_file():
            log.warning("resume: the best checkpoint of the earlier run (%s) is gone; the best of the"
                        " resumed epochs will be tested", source)
            super().load_state_dict(state_dict)
            return
        target = Path(self.dirpath) / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.resolve() != target.resolve():
            shutil.copy2(source, target)
        self.best_model_score = score
        self.best_model_path = str(target)
        self.best_k_models = {str(target): score}
        self.kth_best_model_path = str(target)
        self.kth_value = score
        log.info("resume: best checkpoint so far %s (%s %.4f) copied to %s", source, self.monitor,
                 float(score), target)


class EpochTimer(Callback):
    """Per epoch: wall seconds from the start of training to the end of validation, and the dev
    score ``monitor`` (None without validation). ``records`` is a list of dicts
    ``{"epoch", "seconds", monitor}``, restored from checkpoints."""

    def __init__(self, monitor: str = "val/f1") -> None:
        self.monitor = monitor
        self.records: list[dict[str, Any]] = []
        self._started: float | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # runs before the checkpoint callbacks (Lightning moves those last), so the epoch's
        # record is in the checkpoint saved at this epoch's end
        if not trainer.sanity_checking and self._started is not None:
            self._record(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._started is not None:  # no validation this epoch
            self._record(trainer)

    def _record(self, trainer: pl.Trainer) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        record = {
            "epoch": int(trainer.current_epoch),
            "seconds": round(time.perf_counter() - float(self._started), 3),
            self.monitor: None if value is None else float(value),
        }
        self.records.append(record)
        self._started = None
        score = "" if value is None else f", {self.monitor} {float(value):.4f}"
        log.info("epoch %d: %.1f s%s", record["epoch"], record["seconds"], score)

    def best_epoch(self) -> int | None:
        """The epoch (0-based) of the best ``monitor`` score, the first one on ties; None without
        scores."""
        scored = [r for r in self.records if r.get(self.monitor) is not None]
        if not scored:
            return None
        return max(scored, key=lambda r: (r[self.monitor], -r["epoch"]))["epoch"]

    def state_dict(self) -> dict[str, Any]:
        return {"records": list(self.records)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.records = list(state_dict.get("records", []))


class EpochSeed(Callback):
    """Make every training epoch depend only on ``(seed, epoch)`` and the weights, so that a run
    resumed from an end-of-epoch checkpoint continues exactly as one that never stopped.

    Lightning checkpoints hold no random states, and on resume Lightning creates the first
    training iterator earlier than in an uninterrupted run. So, at each epoch start, every
    sampler of the training loader gets ``set_epoch(epoch)`` (Lightning itself only reaches
    ``loader.sampler`` and ``loader.batch_sampler.sampler``, not a custom batch sampler) and every
    ``torch.Generator`` they hold is reseeded with ``seed + epoch``; python, numpy and torch are
    reseeded with ``seed + epoch`` right before the epoch's first training batch (dropout masks).
    """

    def __init__(self, seed: int | None) -> None:
        self.seed = seed

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.seed is None:
            return
        epoch = int(trainer.current_epoch)
        for sampler in _samplers(trainer.train_dataloader):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
            generator = getattr(sampler, "generator", None)
            if isinstance(generator, torch.Generator):
                generator.manual_seed(int(self.seed) + epoch)
        _seed_all(int(self.seed) + epoch)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.seed is not None and batch_idx == 0:
            _seed_all(int(self.seed) + int(trainer.current_epoch))


def _seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass


def _samplers(loader: Any) -> list[Any]:
    """The sampler objects reachable from a loader (``sampler``, ``batch_sampler``, nested)."""
    found: list[Any] = []
    seen: set[int] = set()
    stack = list(loader) if isinstance(loader, (list, tuple)) else [loader]
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if item is not loader:
            found.append(item)
        stack.extend(getattr(item, attr, None) for attr in ("sampler", "batch_sampler"))
    return found


class EMAWeights(Callback):
    """Exponential moving average of the trained weights.

    ``EMAWeights(decay)`` keeps ``avg <- decay * avg + (1 - decay) * w`` of every trainable parameter
    after each optimizer step (with the usual warm-up ``decay_t = min(decay, (1 + t) / (10 + t))``, so
    the first steps do not stay in the average). Validation runs on the averaged weights, the
    checkpoints' ``state_dict`` holds them (so ``load_from_checkpoint``, ``trainer.test`` and
    ``neurocrf-parse`` use them), and the model holds them when training ends. The current
    (unaveraged) weights travel in the checkpoint under ``ema_current`` so that resuming continues
    training from them.

    Lightning's own ``EMAWeightAveraging`` was not used: a ``trainer.test(ckpt_path=...)`` after
    ``fit`` loads its unaveraged weights into the model, and it averages integer buffers as floats.

    Args: ``decay`` in ``[0, 1)`` (0.999: an average over the last ~1,000 steps).
    """

    def __init__(self, decay: float = 0.999) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.steps = 0
        self.average: dict[str, Tensor] = {}
        self._swapped = False

    def _parameters(self, pl_module: pl.LightningModule) -> dict[str, Tensor]:
        return {name: p for name, p in pl_module.named_parameters() if p.requires_grad}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.average:  # a resumed run has its average from the checkpoint
            self.average = {name: p.detach().clone() for name, p in self._parameters(pl_module).items()}

    @torch.no_grad()
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        decay = min(self.decay, (1 + self.steps) / (10 + self.steps))
        for name, p in self._parameters(pl_module).items():
            self.average[name].lerp_(p.detach(), 1.0 - decay)
        self.steps += 1

    @torch.no_grad()
    def _swap(self, pl_module: pl.LightningModule) -> None:
        for name, p in self._parameters(pl_module).items():
            current = p.detach().clone()
            p.copy_(self.average[name])
            self.average[name].copy_(current)
        self._swapped = not self._swapped

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.average and trainer.state.fn == "fit" and not self._swapped:
            self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._swapped:
            self._swap(pl_module)

    @torch.no_grad()
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.average and not self._swapped:
            for name, p in self._parameters(pl_module).items():
                p.copy_(self.average[name])
            self.average = {}  # the model holds the average now

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if not self.average:
            return
        state = checkpoint["state_dict"]
        if self._swapped:  # saved during validation: the module holds the average, ``average`` the current
            checkpoint["ema_current"] = {name: value.clone() for name, value in self.average.items()}
            return
        checkpoint["ema_current"] = {name: state[name].clone() for name in self.average}
        for name, value in self.average.items():
            state[name] = value.clone()

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        current = checkpoint.get("ema_current")
        if current is None or trainer.state.fn != "fit":
            return  # testing or predicting: the model keeps the averaged weights of state_dict
        with torch.no_grad():
            params = self._parameters(pl_module)
            self.average = {name: params[name].detach().clone() for name in current}
            for name, value in current.items():
                params[name].copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict["steps"])

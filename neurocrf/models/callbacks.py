"""Training callbacks that keep a run's bookkeeping right across interruptions.

``BestCheckpoint``: Lightning's ``ModelCheckpoint`` forgets the best score when a run resumes into a
new directory, so the "best" checkpoint tested after a resume would be the best of the resumed epochs
only. This one carries the best checkpoint over (a copy in the new directory, with its score).

``EpochTimer``: the wall seconds and dev score of every epoch, kept in the checkpoint so that a
resumed run still knows its earlier epochs (``summary.json`` of ``neurocrf-train``).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

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

    def state_dict(self) -> dict[str, Any]:
        return {"records": list(self.records)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.records = list(state_dict.get("records", []))

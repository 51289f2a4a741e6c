"""Exponential moving average of the trained weights, as a Lightning callback.

``EMAWeights(decay)`` keeps ``avg <- decay * avg + (1 - decay) * w`` of every trainable parameter
after each optimizer step (with the usual warm-up ``decay_t = min(decay, (1 + t) / (10 + t))``, so
the first steps do not stay in the average). Validation runs on the averaged weights, the
checkpoints' ``state_dict`` holds them (so :meth:`load_from_checkpoint`, ``trainer.test`` and
``neurocrf-parse`` use them), and the model holds them when training ends. The current
(unaveraged) weights travel in the checkpoint under ``ema_current`` so that resuming continues
training from them.

Lightning's own ``EMAWeightAveraging`` was not used: a ``trainer.test(ckpt_path=...)`` after
``fit`` loads its unaveraged weights into the model, and it averages integer buffers as floats.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from torch import Tensor


class EMAWeights(Callback):
    """Args: ``decay`` in ``[0, 1)`` (0.999: an average over the last ~1,000 steps)."""

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

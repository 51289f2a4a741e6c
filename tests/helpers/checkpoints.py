"""Models saved as checkpoint files without a training run."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch


def save_checkpoint(model: pl.LightningModule, path: Path) -> Path:
    """``model`` in the layout Lightning writes (weights, plain hyperparameters, counters)."""
    torch.save({"epoch": 0, "global_step": 0, "pytorch-lightning_version": pl.__version__,
                "state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    return path

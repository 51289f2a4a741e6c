"""EMAWeights: the average follows its formula step by step, validation and checkpoints see the
average, the model ends with it, a resumed run continues exactly, and trainer.test uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from neurocrf.models.callbacks import EMAWeights


class Regression(pl.LightningModule):
    """A linear model fitted by plain SGD; records the weights that validation and test ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)
        self.register_buffer("steps_seen", torch.zeros((), dtype=torch.long))  # an integer buffer
        self.validated_with: list[torch.Tensor] = []
        self.tested_with: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.steps_seen += 1
        return ((self.linear(x) - y) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.validated_with.append(self.linear.weight.detach().clone())
        x, y = batch
        self.log("val/loss", ((self.linear(x) - y) ** 2).mean())

    def test_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.tested_with.append(self.linear.weight.detach().clone())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Recorder(Callback):
    """The raw weights after every optimizer step."""

    def __init__(self) -> None:
        self.weights: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.weights.append(pl_module.linear.weight.detach().clone())


class SaveDuringValidation(Callback):
    """Writes a checkpoint in the middle of the second validation (the average is swapped in)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.current_epoch == 1 and batch_idx == 0:
            trainer.save_checkpoint(self.path)


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(40, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8)


def _trainer(tmp_path: Path, epochs: int, callbacks: list) -> pl.Trainer:
    return pl.Trainer(max_epochs=epochs, logger=False, callbacks=callbacks, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path))


def _expected_average(initial: torch.Tensor, weights: list[torch.Tensor], decay: float) -> list[torch.Tensor]:
    average, out = initial.clone(), []
    for t, w in enumerate(weights):
        d = min(decay, (1 + t) / (10 + t))
        average = d * average + (1 - d) * w
        out.append(average.clone())
    return out


def test_average_validation_checkpoint_and_final_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Regression()
    initial = model.linear.weight.detach().clone()
    recorder = Recorder()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="e{epoch}", save_top_k=-1,
                                 auto_insert_metric_name=False)
    trainer = _trainer(tmp_path, 3, [recorder, EMAWeights(decay=0.9), checkpoint,
                                      SaveDuringValidation(tmp_path / "during_validation.ckpt")])
    trainer.fit(model, _data(), _data())
    assert len(recorder.weights) == 15
    expected = _expected_average(initial, recorder.weights, 0.9)
    # validation after each epoch ran on the average of the steps so far, not on the raw weights
    for epoch, seen in enumerate(model.validated_with):
        assert torch.allclose(seen, expected[5 * epoch + 4], atol=1e-6)
        assert not torch.allclose(seen, recorder.weights[5 * epoch + 4], atol=1e-4)
    # the model ends with the average; integer buffers are not averaged
    assert torch.allclose(model.linear.weight, expected[-1], atol=1e-6)
    assert int(model.steps_seen) == 15
    # a checkpoint holds the average in state_dict and the raw weights beside it
    saved = torch.load(tmp_path / "e1.ckpt", weights_only=True)
    assert torch.allclose(saved["state_dict"]["linear.weight"], expected[9], atol=1e-6)
    assert torch.allclose(saved["ema_current"]["linear.weight"], recorder.weights[9], atol=1e-6)
    # the same when the checkpoint is written while validation runs on the average
    during = torch.load(tmp_path / "during_validation.ckpt", weights_only=True)
    for key in ("state_dict", "ema_current"):
        assert torch.allclose(during[key]["linear.weight"], saved[key]["linear.weight"], atol=1e-6)
    # testing a checkpoint after fit uses its averaged weights
    trainer.test(model, _data(), ckpt_path=str(tmp_path / "e1.ckpt"), verbose=False)
    assert torch.allclose(model.tested_with[-1], expected[9], atol=1e-6)


def test_resumed_run_continues_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    straight = Regression()
    start = {k: v.clone() for k, v in straight.state_dict().items()}
    _trainer(tmp_path / "a", 4, [EMAWeights(decay=0.8)]).fit(straight, _data(), _data())

    partial = Regression()
    partial.load_state_dict(start)
    saver = ModelCheckpoint(dirpath=tmp_path / "c", filename="e{epoch}", save_top_k=-1,
                            auto_insert_metric_name=False)
    _trainer(tmp_path / "c", 2, [EMAWeights(decay=0.8), saver]).fit(partial, _data(), _data())
    resumed = Regression()
    _trainer(tmp_path / "d", 4, [EMAWeights(decay=0.8)]).fit(resumed, _data(), _data(),
                                                             ckpt_path=str(tmp_path / "c" / "e1.ckpt"))
    assert torch.allclose(resumed.linear.weight, straight.linear.weight, atol=1e-6)
    assert torch.allclose(resumed.linear.bias, straight.linear.bias, atol=1e-6)


def test_decay_must_be_below_one() -> None:
    with pytest.raises(ValueError, match="decay"):
        EMAWeights(decay=1.0)

"""A small sample-corpus data module and a one-batch trainer for the full-batch (L-BFGS) tests."""

from __future__ import annotations

import pytorch_lightning as pl

from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.data.sample import generate_sample_corpus


def small_datamodule(size: int = 40, batch_size: int = 8) -> SequenceDataModule:
    corpus = generate_sample_corpus(seed=3, sizes={"train": size, "dev": 10, "test": 10})
    return SequenceDataModule.from_sentences(
        corpus["train"], corpus["dev"], corpus["test"], file_scheme="IOB2", scheme="IOB2",
        batch_size=batch_size, eval_batch_size=32,
    )


def one_batch_trainer(epochs: int) -> pl.Trainer:
    return pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                      limit_train_batches=1)


"""The data folder the configs read (``paths.data_dir``, with the built-in sample under ``sample/``),
generated at the size a test module needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from neurocrf.data.sample import ensure_sample_corpus


def sample_data_dir(tmp_path_factory: pytest.TempPathFactory, *, seed: int, train_size: int, dev_size: int,
                    test_size: int) -> Path:
    """A fresh ``paths.data_dir`` whose ``sample/`` holds a generated corpus of the given sizes."""
    folder = tmp_path_factory.mktemp("data")
    ensure_sample_corpus(folder / "sample", seed=seed, train_size=train_size, dev_size=dev_size, test_size=test_size)
    return folder


# a BiLSTM-char tagger small enough to train in seconds: one epoch, no logger, no progress bar
TINY_TAGGER = ["encoder.word_dim=16", "encoder.char_dim=8", "encoder.char_hidden=8", "encoder.hidden_size=16",
               "data.batch_size=16", "~logger", "test=false", "trainer.max_epochs=1", "~callbacks.progress_bar",
               "+trainer.enable_progress_bar=false"]


def tiny_tagger_checkpoint(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """``last.ckpt`` of a :data:`TINY_TAGGER` trained on ``data_dir``'s sample corpus."""
    from neurocrf.cli.train import train
    from neurocrf.cli.utils import compose_task_config

    out = tmp_path_factory.mktemp("train")
    train(compose_task_config("train", out, TINY_TAGGER, data_dir))
    return out / "checkpoints" / "last.ckpt"


def sample_test_text(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, empty_after: int, empty: int) -> Path:
    """The sample test split as text, one sentence per line, with ``empty`` empty lines after its
    first ``empty_after`` sentences (a window of empty sentences only among them)."""
    from neurocrf.data.conll import read_conll

    lines = [" ".join(s.tokens) for s in read_conll(data_dir / "sample" / "test.conll", tag_column=1)]
    path = tmp_path_factory.mktemp("input") / "in.txt"
    path.write_text("\n".join([*lines[:empty_after], *[""] * empty, *lines[empty_after:]]) + "\n", encoding="utf-8")
    return path

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

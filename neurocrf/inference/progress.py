"""The progress bar of a prediction run, on stderr (tqdm): sentences, tokens, sentences/s and
elapsed time; with a known input size (bytes of a file), the share read and the time left.
Quiet when stderr is not a terminal (logs, pipes, batch jobs), or with ``enabled=False``."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from tqdm import tqdm


class Progress:
    """``with Progress(total_bytes) as bar: bar.update(sentences, tokens, bytes_read)``."""

    def __init__(
        self, total_bytes: int | None = None, enabled: bool | None = None, description: str = "predict"
    ) -> None:
        active = sys.stderr.isatty() if enabled is None else enabled
        self.sentences = self.tokens = 0
        self.start = time.perf_counter()
        self._bytes = 0
        self._total = total_bytes or None
        self.bar: Any = tqdm(
            total=self._total, disable=not active, file=sys.stderr, desc=description, dynamic_ncols=True,
            unit="B" if self._total else " sentences", unit_scale=bool(self._total), leave=True,
            bar_format=None if self._total else "{desc}: {n_fmt}{unit} [{elapsed}{postfix}]",
        )

    def update(self, sentences: int, tokens: int, bytes_read: int | None = None) -> None:
        """Count ``sentences`` and ``tokens`` more, the input read up to ``bytes_read``."""
        self.sentences += sentences
        self.tokens += tokens
        if self.bar.disable:
            return
        if self._total and bytes_read is not None:
            self.bar.update(max(0, min(bytes_read, self._total) - self._bytes))
            self._bytes = max(self._bytes, min(bytes_read, self._total))
        elif not self._total:
            self.bar.update(sentences)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(
            f"{self.sentences:,} sentences, {self.tokens:,} tokens, {self.sentences / elapsed:,.0f} sentences/s",
            refresh=False,
        )

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

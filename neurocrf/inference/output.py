"""The output file of a prediction run: whole or absent.

:class:`AtomicOutput` writes to a temporary file in the output's folder (gzip-compressed when the
output's name ends in ``.gz``, with a fixed header so that equal text gives equal bytes) and
renames it onto the output only when :meth:`~AtomicOutput.commit` is called: an exception, a
``KeyboardInterrupt`` or a stop signal (:mod:`neurocrf.interrupts`) before that removes the
temporary file and leaves the output path as it was. ``"-"`` writes to standard output as results come
(nothing can be taken back there).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TextIO

from neurocrf.data.streams import STDIN, is_gzip


def check_output_path(output: str) -> None:
    """Raise before any work when ``output`` is a folder or its folder cannot be written."""
    if output == STDIN:
        return
    target = Path(output)
    if target.is_dir():
        raise IsADirectoryError(f"output={output} is a folder; name a file")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"):
            pass
    except OSError as error:
        raise OSError(f"output={output}: cannot write there ({error.strerror or error})") from None


class AtomicOutput:
    """``with AtomicOutput(path) as out: out.handle.write(...); out.commit()`` (module docstring)."""

    def __init__(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> None:
        self.path = os.fspath(path)
        self.encoding = encoding
        self.temp: Path | None = None
        self.handle: TextIO = sys.stdout
        self._raw: io.BufferedWriter | None = None

    def __enter__(self) -> AtomicOutput:
        if self.path == STDIN:
            return self
        target = Path(self.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        self.temp = Path(name)
        self._raw = os.fdopen(fd, "wb")
        binary: io.BufferedIOBase = self._raw
        if is_gzip(self.path):
            binary = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
        self.handle = io.TextIOWrapper(binary, encoding=self.encoding, newline="\n")  # type: ignore[arg-type]
        return self

    def commit(self) -> None:
        """Finish the file and rename it onto the output path."""
        if self.temp is None:
            self.handle.flush()
            return
        self.handle.close()  # closes the gzip stream and the file
        os.chmod(self.temp, 0o666 & ~_umask())
        os.replace(self.temp, self.path)
        self.temp = None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self.temp is not None:  # not committed: an error or an interruption
            with contextlib.suppress(Exception):
                self.handle.close()
            with contextlib.suppress(OSError):
                self.temp.unlink()
            self.temp = None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

"""Input and output streams of the readers and writers: files, gzip files and the standard streams.

:class:`LineSource` reads a file lazily, one decoded line at a time, keeping the number of the
line it reached (for error messages and for a run that stops early). ``path="-"`` reads standard
input; a name ending in ``.gz`` is decompressed on the fly (``gzip_input=True`` decompresses any
stream, e.g. standard input). Problems name the file and the line: bytes not valid in the
encoding, a damaged or truncated gzip file.

>>> import gzip, os, tempfile
>>> folder = tempfile.mkdtemp()
>>> path = os.path.join(folder, "in.txt.gz")
>>> with gzip.open(path, "wt", encoding="utf-8") as handle:
...     _ = handle.write("\\ufeffPeter lives\\r\\nin Berlin")
>>> source = LineSource(path)
>>> list(source), source.line
(['Peter lives', 'in Berlin'], 2)
"""

from __future__ import annotations

import codecs
import gzip
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


class ConllFormatError(ValueError):
    """A column file (or a plain text input file) that cannot be read; the message starts with
    ``path:line:``."""


STDIN = "-"
"""The name that reads standard input (and, for outputs, writes standard output)."""


def is_gzip(path: str | os.PathLike[str]) -> bool:
    """Whether a file is read or written as gzip: its name ends in ``.gz``."""
    return os.fspath(path).lower().endswith(".gz")


def plain_name(path: str | os.PathLike[str]) -> str:
    """The name without a ``.gz`` ending (``x.conll.gz`` -> ``x.conll``): what tells the format."""
    name = os.fspath(path)
    return name[:-3] if is_gzip(name) else name


class LineSource:
    """The lines of a text file, decoded lazily, without their line ends (``\\n``, ``\\r\\n``).

    A UTF-8 byte order mark is dropped; a final line break ends the last line (it does not start
    an empty one). ``line`` is the number of the last line read (0 before the first) and
    ``bytes_read`` how many (compressed) bytes were consumed, for progress against ``size``
    (None for standard input).

    Raises:
        FileNotFoundError: no such file (raised on construction).
        ConllFormatError: while iterating, naming file and line, for bytes not valid in
            ``encoding`` or a damaged gzip stream.
    """

    def __init__(self, path: str | os.PathLike[str], encoding: str = "utf-8", gzip_input: bool | None = None) -> None:
        self.name = os.fspath(path)
        self.encoding = encoding
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise ValueError(f"unknown encoding {encoding!r} for {self.name}") from None
        self.line = 0
        self._compressed = is_gzip(self.name) if gzip_input is None else gzip_input
        if self.name == STDIN:
            self._raw: BinaryIO = sys.stdin.buffer
            self.size: int | None = None
        else:
            if not Path(self.name).is_file():
                raise FileNotFoundError(f"input file not found: {self.name}")
            self._raw = open(self.name, "rb")  # noqa: SIM115 - closed by close() / the generator's end
            self.size = os.fstat(self._raw.fileno()).st_size
        self._started = False

    @property
    def bytes_read(self) -> int:
        """Bytes of the file consumed so far (compressed bytes for a gzip file)."""
        try:
            return self._raw.tell() if self.name != STDIN else 0
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        if self.name != STDIN:
            self._raw.close()

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError(f"{self.name}: a LineSource is read once")
        self._started = True
        try:
            yield from self._lines()
        finally:
            self.close()

    def _lines(self) -> Iterator[str]:
        handle: BinaryIO = gzip.GzipFile(fileobj=self._raw, mode="rb") if self._compressed else self._raw
        decoder = codecs.getincrementaldecoder(self.encoding)()
        pending = ""  # decoded text of a line whose end has not come yet (multi-byte encodings)
        first = True
        while True:
            try:
                raw = handle.readline(1 << 20)
            except (OSError, EOFError, zlib.error) as error:
                raise ConllFormatError(
                    f"{self.name}:{self.line + 1}: damaged or truncated gzip data ({error}); the lines"
                    f" before it were read"
                ) from None
            if not raw:
                break
            try:
                text = decoder.decode(raw)
            except UnicodeDecodeError as error:
                raise ConllFormatError(
                    f"{self.name}:{self.line + 1}: bytes {error.object[error.start:error.end]!r} are not valid"
                    f" {self.encoding} ({error.reason})"
                ) from None
            if first and text:
                text, first = (text[1:] if text.startswith("\ufeff") else text), False
            pending += text
            if pending.endswith("\n"):
                self.line += 1
                yield pending[:-2] if pending.endswith("\r\n") else pending[:-1]
                pending = ""
        try:
            pending += decoder.decode(b"", final=True)
        except UnicodeDecodeError as error:
            raise ConllFormatError(
                f"{self.name}:{self.line + 1}: the file ends inside a character ({error.reason})"
            ) from None
        if pending:
            self.line += 1
            yield pending[:-1] if pending.endswith("\r") else pending


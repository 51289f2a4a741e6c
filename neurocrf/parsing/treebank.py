"""One entry point for reading and writing treebanks, and the deterministic Alpino split.

Formats: ``alpino`` (a folder of ``alpino_ds`` XML files, :mod:`.alpino`), ``export`` (NeGra
export 3/4, :mod:`.export`), ``discbracket`` and ``bracket`` (Penn; read only) (:mod:`.bracket`).
All readers return ``list[TreebankSentence]`` and raise :class:`TreebankFormatError` (a
ValueError naming file and line) on malformed input.

Split (:func:`split_treebank`): sentences are ordered by numeric id; the last 10% (rounded down)
are the test set, the 10% before them the dev set, the rest train. For the Alpino ``cdb`` folder
(7,136 files with ids 0..7153, a few numbers unused) that is train = ids 0..5724 (5,710
sentences), dev = ids 5725..6440 (713), test = ids 6441..7153 (713).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence, TextIO

from neurocrf.parsing.alpino import read_alpino
from neurocrf.parsing.bracket import read_discbracket, read_penn, write_discbracket
from neurocrf.parsing.export import read_export, write_export
from neurocrf.parsing.tree import TreebankFormatError, TreebankSentence

__all__ = ["FORMATS", "read_treebank", "write_treebank", "split_treebank", "data_root",
           "TreebankFormatError"]

FORMATS = ("alpino", "export", "discbracket", "bracket")


def data_root() -> Path:
    """Folder of the shared corpora: ``$NEUROCRF_DATA``, else ``../shared/data`` next to the
    project root."""
    env = os.environ.get("NEUROCRF_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _guess_format(path: Path) -> str:
    if path.is_dir():
        return "alpino"
    suffix = path.suffix.lower()
    if suffix == ".export":
        return "export"
    if suffix in (".discbracket", ".dbr"):
        return "discbracket"
    if suffix in (".mrg", ".bracket", ".mrg.txt", ".ptb"):
        return "bracket"
    raise ValueError(f"cannot tell the treebank format of {path}; pass fmt= one of {FORMATS}")


def read_treebank(path: str | os.PathLike, fmt: str | None = None, **options) -> list[TreebankSentence]:
    """Read a treebank. ``fmt`` is one of :data:`FORMATS` (guessed from the path if None: a folder
    is Alpino, ``.export``, ``.discbracket``/``.dbr``, ``.mrg``). ``options`` go to the reader
    (e.g. ``fmt_version=4`` -> export ``fmt``, ``root_label=...``, ``limit=`` for Alpino)."""
    path = Path(path)
    fmt = fmt or _guess_format(path)
    if fmt == "alpino":
        return read_alpino(path, **options)
    if fmt == "export":
        version = options.pop("fmt_version", None)
        return read_export(path, version, **options)
    if fmt == "discbracket":
        return read_discbracket(path, **options)
    if fmt == "bracket":
        if path.is_dir():
            out: list[TreebankSentence] = []
            for f in sorted(path.glob("*.mrg")):
                out.extend(read_penn(f, **options))
            return out
        return read_penn(path, **options)
    raise ValueError(f"unknown treebank format {fmt!r}; expected one of {FORMATS}")


def write_treebank(target: str | os.PathLike | TextIO, sentences: Iterable[TreebankSentence],
                   fmt: str = "discbracket", **options) -> None:
    """Write ``discbracket`` (options: ``write_ids``) or ``export`` (options: ``fmt_version`` 3/4,
    ``root_label``)."""
    if fmt == "discbracket":
        write_discbracket(target, sentences, **options)
    elif fmt == "export":
        version = options.pop("fmt_version", 3)
        write_export(target, sentences, version, **options)
    else:
        raise ValueError(f"cannot write treebank format {fmt!r}; expected 'discbracket' or 'export'")


def _id_key(sentence: TreebankSentence) -> tuple[int, int | str]:
    return (0, int(sentence.id)) if sentence.id.isdigit() else (1, sentence.id)


def split_treebank(sentences: Sequence[TreebankSentence], dev: float = 0.1,
                   test: float = 0.1) -> dict[str, list[TreebankSentence]]:
    """Deterministic split by numeric id: last ``test`` fraction -> test, the ``dev`` fraction
    before it -> dev, the rest -> train (fractions of the total, rounded down)."""
    if not (0 <= dev < 1 and 0 <= test < 1 and dev + test < 1):
        raise ValueError(f"bad split fractions dev={dev}, test={test}")
    ordered = sorted(sentences, key=_id_key)
    n = len(ordered)
    n_test, n_dev = int(n * test + 1e-9), int(n * dev + 1e-9)
    n_train = n - n_test - n_dev
    return {"train": ordered[:n_train], "dev": ordered[n_train:n_train + n_dev],
            "test": ordered[n_train + n_dev:]}

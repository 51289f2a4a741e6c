"""Word vectors of a spaCy pipeline folder, read without spaCy.

A spaCy (v3) pipeline keeps its static vectors in ``vocab/``:

* ``vectors``: a ``.npy`` matrix ``[rows, dim]`` (pruned pipelines map many words onto one row),
* ``key2row``: a MessagePack map from a word's 64-bit key to its row,
* ``strings.json``: the strings the keys come from; a string's key is MurmurHash64A of its UTF-8
  bytes with seed 1 (spaCy's ``StringStore`` hash).

:func:`read_spacy_vectors` pairs every string of ``strings.json`` that has a key in ``key2row``
with its row, in the order of ``strings.json``. spaCy's built-in symbols (attribute and label names
such as ``number``, ``mark``, ``DATE``) are keyed by their symbol ids, not by a hash: their vectors
(78 of en_core_web_md's 684,830 keys) are not read. A folder is recognised by its ``vocab/key2row``
(or ``key2row`` itself, for the ``vocab`` folder); :func:`spacy_vocab_folder` finds it.

>>> hex(spacy_key("Germany"))
'0xa7f24ef13534022d'
>>> murmurhash64a(b"")
0
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

MURMUR_MULTIPLIER = 0xC6A4A7935BD1E995
MURMUR_SHIFT = 47
_MASK64 = (1 << 64) - 1
SPACY_HASH_SEED = 1


def murmurhash64a(data: bytes, seed: int = 0) -> int:
    """MurmurHash64A (Austin Appleby's 64-bit MurmurHash2) of ``data``, as an unsigned 64-bit int."""
    h = (seed ^ (len(data) * MURMUR_MULTIPLIER)) & _MASK64
    blocks = len(data) // 8
    for start in range(0, blocks * 8, 8):
        k = (int.from_bytes(data[start : start + 8], "little") * MURMUR_MULTIPLIER) & _MASK64
        k ^= k >> MURMUR_SHIFT
        k = (k * MURMUR_MULTIPLIER) & _MASK64
        h = ((h ^ k) * MURMUR_MULTIPLIER) & _MASK64
    if len(data) & 7:
        h = ((h ^ int.from_bytes(data[blocks * 8 :], "little")) * MURMUR_MULTIPLIER) & _MASK64
    h ^= h >> MURMUR_SHIFT
    h = (h * MURMUR_MULTIPLIER) & _MASK64
    return h ^ (h >> MURMUR_SHIFT)


def spacy_key(text: str) -> int:
    """spaCy's key of a string (``StringStore`` hash)."""
    return murmurhash64a(text.encode("utf-8"), SPACY_HASH_SEED)


def read_key2row(path: Path) -> dict[int, int]:
    """The MessagePack map of unsigned integers in ``path`` (spaCy's ``key2row``)."""
    raw = path.read_bytes()

    def unsigned(position: int) -> tuple[int, int]:
        marker = raw[position]
        if marker < 0x80:  # positive fixint
            return marker, position + 1
        width = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}.get(marker)
        if width is None:
            raise ValueError(f"{path}: byte {position}: expected an unsigned integer, found marker {marker:#04x}")
        return int.from_bytes(raw[position + 1 : position + 1 + width], "big"), position + 1 + width

    if not raw:
        raise ValueError(f"{path}: empty file, expected a MessagePack map")
    marker = raw[0]
    if 0x80 <= marker <= 0x8F:
        count, position = marker & 0x0F, 1
    elif marker == 0xDE:
        count, position = struct.unpack_from(">H", raw, 1)[0], 3
    elif marker == 0xDF:
        count, position = struct.unpack_from(">I", raw, 1)[0], 5
    else:
        raise ValueError(f"{path}: expected a MessagePack map, found marker {marker:#04x}")
    mapping: dict[int, int] = {}
    try:
        for _ in range(count):
            key, position = unsigned(position)
            mapping[key], position = unsigned(position)
    except IndexError:
        raise ValueError(f"{path}: the file ends inside its map of {count} entries") from None
    if position != len(raw):
        raise ValueError(f"{path}: {len(raw) - position} bytes after the map of {count} entries")
    return mapping


def spacy_vocab_folder(folder: Path) -> Path | None:
    """The folder holding ``key2row``, ``vectors`` and ``strings.json`` (``folder`` or
    ``folder/vocab``), or None when ``folder`` is no spaCy pipeline or vocab folder."""
    for candidate in (folder / "vocab", folder):
        if (candidate / "key2row").is_file():
            return candidate
    return None


def read_spacy_vectors(
    folder: Path, keep: Callable[[str], bool] | None = None, limit: int | None = None
) -> tuple[list[str], np.ndarray]:
    """The words of a spaCy vocab folder and their vectors ``[num_words, dim]`` float32.

    Args:
        folder: the vocab folder (:func:`spacy_vocab_folder`).
        keep: keep only the words for which ``keep(word)`` is true (a pruned pipeline maps several
            hundred thousand words onto its rows: without ``keep`` their matrix is large).
        limit: consider only the first ``limit`` words with a vector, in ``strings.json`` order.
    """
    for name in ("vectors", "strings.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"spaCy vocab folder {folder}: no {name}")
    table = np.load(folder / "vectors", mmap_mode="r", allow_pickle=False)
    if table.ndim != 2:
        raise ValueError(f"{folder / 'vectors'}: expected a 2-d matrix [rows, dim], got shape {table.shape}")
    key2row = read_key2row(folder / "key2row")
    strings = json.loads((folder / "strings.json").read_text(encoding="utf-8"))
    if not isinstance(strings, list):
        raise ValueError(f"{folder / 'strings.json'}: expected a JSON list of strings")
    words: list[str] = []
    rows: list[int] = []
    considered = 0
    for text in strings:
        if limit is None and keep is not None and not keep(text):
            continue  # cheaper than hashing every string
        row = key2row.get(spacy_key(text))
        if row is None:
            continue
        if limit is not None:
            if considered >= limit:
                break
            considered += 1
            if keep is not None and not keep(text):
                continue
        if not 0 <= row < table.shape[0]:
            raise ValueError(f"{folder / 'key2row'}: {text!r} maps to row {row}, the matrix has {table.shape[0]}")
        words.append(text)
        rows.append(row)
    matrix = np.asarray(table[np.asarray(rows, dtype=np.int64)], dtype=np.float32).reshape(len(rows), table.shape[1])
    return words, matrix

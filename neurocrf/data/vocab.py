"""A string <-> id vocabulary with optional padding and unknown entries.

>>> vocab = Vocabulary.from_counts({"the": 5, "cat": 2, "sat": 1}, min_count=2)
>>> vocab.items
['<pad>', '<unk>', 'the', 'cat']
>>> vocab.encode(["the", "dog"])
[2, 1]
>>> Vocabulary.from_dict(vocab.to_dict()) == vocab
True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PAD = "<pad>"
UNK = "<unk>"


class Vocabulary:
    """Ordered items with ids ``0..len-1``: the specials (pad, then unk) first, then the rest.

    Lookups of an unknown item return the unk id, or raise KeyError when there is no unk entry.
    """

    def __init__(
        self, items: Iterable[str] = (), *, pad: str | None = PAD, unk: str | None = UNK
    ) -> None:
        self.pad = pad
        self.unk = unk
        self._items: list[str] = []
        self._index: dict[str, int] = {}
        for special in (pad, unk):
            if special is not None:
                self.add(special)
        for item in items:
            self.add(item)

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, int],
        *,
        min_count: int = 1,
        max_size: int | None = None,
        pad: str | None = PAD,
        unk: str | None = UNK,
    ) -> Vocabulary:
        """Items counted at least ``min_count`` times, most frequent first (ties: alphabetical).

        ``max_size`` caps the number of non-special items.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        specials = {pad, unk}
        kept = [item for item, n in counts.items() if n >= min_count and item not in specials]
        kept.sort(key=lambda item: (-counts[item], item))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(kept, pad=pad, unk=unk)

    @classmethod
    def from_sequences(cls, sequences: Iterable[Iterable[str]], **options: Any) -> Vocabulary:
        """Count the items of ``sequences`` and call :meth:`from_counts` with ``options``."""
        counts: Counter[str] = Counter()
        for sequence in sequences:
            counts.update(sequence)
        return cls.from_counts(counts, **options)

    def add(self, item: str) -> int:
        """Add ``item`` if new; return its id."""
        if not isinstance(item, str):
            raise TypeError(f"vocabulary items must be str, got {type(item).__name__}: {item!r}")
        index = self._index.get(item)
        if index is None:
            index = self._index[item] = len(self._items)
            self._items.append(item)
        return index

    @property
    def items(self) -> list[str]:
        """All items in id order (a copy)."""
        return list(self._items)

    @property
    def pad_index(self) -> int | None:
        return None if self.pad is None else self._index[self.pad]

    @property
    def unk_index(self) -> int | None:
        return None if self.unk is None else self._index[self.unk]

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        return item in self._index

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._items)

    def __getitem__(self, item: str) -> int:
        index = self._index.get(item)
        if index is not None:
            return index
        if self.unk is None:
            raise KeyError(f"{item!r} is not in the vocabulary (and it has no unknown entry)")
        return self._index[self.unk]

    def lookup(self, index: int) -> str:
        """The item with id ``index``."""
        return self._items[index]

    def encode(self, items: Sequence[str]) -> list[int]:
        """Ids of ``items`` (unknown ones -> the unk id)."""
        return [self[item] for item in items]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self._items[i] for i in ids]

    def to_dict(self) -> dict[str, Any]:
        """Plain python values only (safe for ``torch.load(weights_only=True)`` and JSON)."""
        return {"items": list(self._items), "pad": self.pad, "unk": self.unk}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Vocabulary:
        """Inverse of :meth:`to_dict`."""
        vocab = cls(pad=None, unk=None)
        for item in data["items"]:
            vocab.add(item)
        if len(vocab) != len(data["items"]):
            raise ValueError("vocabulary items contain duplicates")
        vocab.pad, vocab.unk = data.get("pad"), data.get("unk")
        for special in (vocab.pad, vocab.unk):
            if special is not None and special not in vocab:
                raise ValueError(f"special item {special!r} is missing from the items")
        return vocab

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return (self._items, self.pad, self.unk) == (other._items, other.pad, other.unk)

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} items, pad={self.pad!r}, unk={self.unk!r})"

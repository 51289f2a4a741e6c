"""The encoder interface and the small helpers the encoders share.

An encoder turns a batch of tokenised sentences into one vector per word::

    inputs = encoder.prepare([["EU", "rejects", "German", "call"], ["Peter"]])   # CPU tensors
    out = encoder(inputs)                                                        # [2, 4, output_dim]

`prepare` runs in the DataLoader's collate function (so it must be cheap and must not touch the
GPU); `forward` runs on the model's device. Encoders whose output already is a score per tag (the
sparse feature encoder) set ``emits_scores = True`` and ``output_dim = num_tags``; the model then
uses the output as emissions without a projection layer. An encoder that also scores tag pairs
(observation-dependent transitions) sets ``emits_pairs = True`` and returns pair emissions
``[batch, seq_len, num_tags + 1, num_tags]`` (see :func:`neurocrf.structs.pair_emissions`).

Each encoder keeps its tokens -> tensors step in ``encoder.preparer``, a small picklable callable
holding no weights (``encoder.prepare`` calls it): hand that to DataLoader workers rather than the
bound method, which would drag the whole module along.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

PAD = "<pad>"
"""The padding entry of the vocabularies."""
UNK = "<unk>"
"""The entry for words (and characters) outside the vocabulary."""


class Encoder(nn.Module):
    """Base class of every encoder: tokens in, ``[batch, seq_len, output_dim]`` out."""

    output_dim: int
    emits_scores: bool = False
    emits_pairs: bool = False
    preparer: Callable[[list[list[str]]], dict[str, Tensor]]  # set by every encoder (see the module docstring)

    def prepare(self, tokens: list[list[str]]) -> dict[str, Tensor]:
        """Turn a batch of sentences into CPU tensors for :meth:`forward` (``self.preparer``)."""
        return self.preparer(tokens)

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:  # pragma: no cover - interface
        """Return ``[batch, seq_len, output_dim]``; ``seq_len`` = longest sentence of the batch."""
        raise NotImplementedError

    def encode(self, tokens: list[list[str]], precision: str = "32") -> Tensor:
        """Prediction: ``[batch, seq_len, output_dim]`` for a batch of non-empty sentences, in the
        weights' dtype (:meth:`prepare` then :meth:`forward`; ``precision="bf16"``: under bfloat16
        autocast, the result widened to float32). Encoders with a faster prediction path override it."""
        device = self._device()
        inputs = {key: value.to(device) for key, value in self.prepare(tokens).items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = self(inputs)
        return out.float() if out.dtype == torch.bfloat16 else out

    def _to_device(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        # A no-op when Lightning already moved the batch; convenient for direct use (predict, tests).
        device = self._device()
        return {key: value.to(device, non_blocking=True) for key, value in inputs.items()}

    def _device(self) -> torch.device:
        for tensor in self.parameters():
            return tensor.device
        for tensor in self.buffers():
            return tensor.device
        return torch.device("cpu")


class Lookup:
    """A frozen string -> id map built from a plain list (index 0 = padding, 1 = unknown)."""

    def __init__(self, items: list[str], unk: str | None = UNK) -> None:
        self.items = list(items)
        self.index = {item: i for i, item in enumerate(self.items)}
        if len(self.index) != len(self.items):
            raise ValueError("vocabulary list holds duplicate entries")
        self.unk_id = self.index[unk] if unk is not None else None

    def __len__(self) -> int:
        return len(self.items)

    def get(self, item: str) -> int | None:
        return self.index.get(item)


def find_word(mapping: Mapping[str, Any], word: str) -> Any:
    """``mapping[word]``, else ``mapping[word.lower()]``, else None (pretrained vectors and word
    clusters are often lowercased)."""
    found = mapping.get(word)
    return mapping.get(word.lower()) if found is None else found


def counted_vocabulary(counts: Counter[str], min_count: int, specials: Iterable[str] = (PAD, UNK)) -> list[str]:
    """Specials first, then items seen at least ``min_count`` times, most frequent first.

    Ties are broken alphabetically, so the result does not depend on the order of the corpus.
    """
    specials = list(specials)
    kept = [item for item, count in counts.items() if count >= min_count and item not in specials]
    kept.sort(key=lambda item: (-counts[item], item))
    return specials + kept


def with_defaults(config: Mapping[str, Any], defaults: Mapping[str, Any], encoder: str) -> dict[str, Any]:
    """Merge ``config`` over ``defaults``; an unknown key (a typo, usually) raises ValueError."""
    unknown = sorted(set(config) - set(defaults) - {"name"})
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for the {encoder!r} encoder; known options: {sorted(defaults)}"
        )
    merged = dict(defaults)
    merged.update({key: value for key, value in config.items() if key != "name"})
    return merged


def sentence_mask(tokens: list[list[str]]) -> Tensor:
    """``[batch, seq_len]`` bool, True at real words."""
    lengths = torch.tensor([len(sentence) for sentence in tokens], dtype=torch.long)
    width = int(lengths.max()) if len(tokens) else 0
    return torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)

"""Real-valued word-vector features for the sparse feature encoder (Turian et al. 2010).

Each token adds ``W [len(offsets) * D, num_tags]`` times the concatenated pretrained vectors of
the words at the given relative offsets (zeros outside the sentence and for words without a
vector): a log-linear CRF with dense features beside the indicator ones. The vectors are scaled
so that their entries have standard deviation ``scale`` (Turian et al.'s sigma; they found 0.1
best for a chunking CRF), which sets how strongly the Gaussian prior holds these weights.

The vectors of the first ``words`` entries of the source are a fixed buffer of the module, so a
checkpoint carries them; ``vocabularies["vector_words"]`` lists their words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from neurocrf.encoders.vectors import load_vectors


def vector_vocabulary(source: str, words: int) -> dict[str, Any]:
    """``{"vector_words": [...], "vector_dim": D}``: the first ``words`` entries of ``source``."""
    vectors = load_vectors(source, limit=words)
    return {"vector_words": vectors.words, "vector_dim": vectors.dim}


class WordVectorFeatures(nn.Module):
    """Word ids ``[B, T]`` (0 = no vector) -> scores ``[B, T, num_tags]``.

    Args:
        words: row ``i + 1`` of the table holds the vector of ``words[i]``.
        source: the vectors (any source of :func:`load_vectors`); None leaves the table at zero for
            a state dict to fill (checkpoint restore).
        dim: the vectors' dimension (needed when ``source`` is None).
        limit: read at most this many entries of ``source`` (``words`` came from its first ones).
    """

    def __init__(self, words: list[str], num_tags: int, offsets: Sequence[int], scale: float,
                 source: str | None = None, dim: int | None = None, limit: int | None = None) -> None:
        super().__init__()
        if not offsets:
            raise ValueError("encoder.vector_offsets must name at least one relative position")
        if scale <= 0:
            raise ValueError(f"encoder.vector_scale must be positive, got {scale}")
        self.index = {word: i + 1 for i, word in enumerate(words)}  # word -> table row
        self.offsets = [int(o) for o in offsets]
        if source is not None:
            table = self._read(words, source, scale, limit)
        elif dim is not None:
            table = torch.zeros(len(words) + 1, dim)
        else:
            raise ValueError("WordVectorFeatures needs the vectors' source or their dimension")
        self.register_buffer("table", table)  # [len(words) + 1, D], row 0 = no vector
        self.weights = nn.Linear(len(self.offsets) * table.shape[1], num_tags, bias=False)
        nn.init.zeros_(self.weights.weight)

    @staticmethod
    def _read(words: list[str], source: str, scale: float, limit: int | None) -> Tensor:
        vectors = load_vectors(source, keep=set(words).__contains__, limit=limit)
        found = vectors.index()
        missing = [word for word in words if word not in found]
        if missing:
            raise ValueError(f"{source}: no vector for {len(missing)} of the model's words, e.g. {missing[0]!r}")
        matrix = torch.from_numpy(vectors.matrix[[found[word] for word in words]])
        std = float(matrix.std()) if matrix.numel() > 1 else 1.0
        return torch.cat([matrix.new_zeros(1, matrix.shape[1]), matrix * (scale / max(std, 1e-12))])

    def forward(self, ids: Tensor) -> Tensor:
        """``ids [B, T]`` -> ``[B, T, num_tags]``; positions past the sentence read row 0 (zeros)."""
        width = ids.shape[1]
        low, high = min(0, *self.offsets), max(0, *self.offsets)
        # the vectors of positions -low before and high after the row are zeros (row 0)
        vectors = self.table[nn.functional.pad(ids, (-low, high))]  # [B, T - low + high, D]
        weight = self.weights.weight.view(-1, len(self.offsets), vectors.shape[-1])  # [L, O, D]
        # W [v(t + o1); v(t + o2); ...] as one product per offset with a shifted view of the
        # vectors: they need no gradient, so no [B, T, O * D] copy is built in either direction
        scores = vectors.new_zeros(ids.shape[0], width, weight.shape[0])
        for o, offset in enumerate(self.offsets):
            scores = scores + vectors[:, offset - low : offset - low + width] @ weight[:, o].T
        return scores

    def extra_repr(self) -> str:
        return f"words={len(self.index)}, dim={self.table.shape[1]}, offsets={self.offsets}"


"""A word embedding whose last rows are fixed: the BiLSTM's ``freeze_unseen_words``.

Pretrained words added to the vocabulary (``add_pretrained_words``) that never occur in the
training data never get a gradient, yet a plain ``nn.Embedding`` makes every optimizer step update
its whole weight (gradient, momentum and clipping included): with 100,000 added words of 300
dimensions that is most of the work of a step. :class:`FrozenTailEmbedding` keeps the rows of
the training words as a parameter and the rows after them as a buffer; with no weight decay,
training computes what it computes with the whole table trainable.

>>> embedding = FrozenTailEmbedding(trained=3, frozen=2, dim=4)
>>> embedding(torch.tensor([[0, 2, 4]])).shape
torch.Size([1, 3, 4])
>>> embedding.weight.shape, embedding.trained.weight.requires_grad, embedding.frozen.requires_grad
(torch.Size([5, 4]), True, False)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FrozenTailEmbedding(nn.Module):
    """``[...]`` ids -> ``[..., dim]``: ids below ``trained`` read the trainable rows (row 0 is
    padding), the others the fixed ``frozen`` rows."""

    def __init__(self, trained: int, frozen: int, dim: int) -> None:
        super().__init__()
        if trained < 2:
            raise ValueError(f"the trainable rows must include <pad> and <unk>, got {trained} rows")
        # drawn as nn.Embedding(trained + frozen, dim) draws its weight, so the modules built after
        # this one start from the same random numbers as with a plain embedding
        full = torch.empty(trained + frozen, dim).normal_()
        self.trained = nn.Embedding(trained, dim, padding_idx=0, _weight=full[:trained].clone())
        self.register_buffer("frozen", full[trained:].clone())
        self.num_embeddings = trained + frozen
        self.embedding_dim = dim

    @property
    def weight(self) -> Tensor:
        """Every row ``[trained + frozen, dim]``, a copy (for reading)."""
        return torch.cat([self.trained.weight.detach(), self.frozen])

    def set_rows(self, weight: Tensor) -> None:
        """Overwrite every row from ``weight`` ``[trained + frozen, dim]``."""
        with torch.no_grad():
            count = self.trained.num_embeddings
            self.trained.weight.copy_(weight[:count])
            self.frozen.copy_(weight[count:])

    def forward(self, ids: Tensor) -> Tensor:
        count = self.trained.num_embeddings
        trained = self.trained(ids.clamp(max=count - 1))
        if not self.frozen.shape[0]:
            return trained
        frozen = nn.functional.embedding((ids - count).clamp(min=0), self.frozen)
        return torch.where((ids < count).unsqueeze(-1), trained, frozen)

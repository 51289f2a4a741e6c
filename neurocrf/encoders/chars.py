"""Character-level word features: a CNN with max pooling (Ma & Hovy 2016) or a char BiLSTM
(Lample et al. 2016). Characters keep their case, so "Paris" and "paris" get different features."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from neurocrf.encoders.base import Lookup

CHAR_KINDS = ("cnn", "lstm")


def char_ids(tokens: list[list[str]], chars: Lookup, max_word_length: int) -> Tensor:
    """``[batch, seq_len, max_chars]`` long character ids, 0 = padding.

    Words longer than ``max_word_length`` keep their first ``max_word_length`` characters; an
    empty word is one unknown character, so every real word has at least one.
    """
    width = max((len(s) for s in tokens), default=0)
    longest = max((min(len(w), max_word_length) for s in tokens for w in s), default=1)
    out = torch.zeros(len(tokens), width, max(longest, 1), dtype=torch.long)
    unk = chars.unk_id
    for b, sentence in enumerate(tokens):
        for t, word in enumerate(sentence):
            ids = [chars.index.get(c, unk) for c in word[:max_word_length]] or [unk]
            out[b, t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


class CharCNN(nn.Module):
    """Embed characters, convolve, max-pool over the word: ``[N, C]`` ids -> ``[N, filters]``."""

    def __init__(self, num_chars: int, char_dim: int, filters: int, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"char_kernel must be odd, got {kernel_size}")
        self.embedding = nn.Embedding(num_chars, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, filters, kernel_size, padding=kernel_size // 2)
        self.output_dim = filters

    def forward(self, ids: Tensor) -> Tensor:
        """``ids`` ``[N, C]`` (each row has at least one non-zero id) -> ``[N, filters]``."""
        mask = ids.ne(0)
        hidden = self.conv(self.embedding(ids).transpose(1, 2))  # [N, filters, C]
        hidden = hidden.masked_fill(~mask.unsqueeze(1), float("-inf"))
        return hidden.max(dim=2).values


class CharLSTM(nn.Module):
    """A char BiLSTM; the word vector is the last forward and first backward state: ``[N, 2 * hidden]``."""

    def __init__(self, num_chars: int, char_dim: int, hidden: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_chars, char_dim, padding_idx=0)
        self.lstm = nn.LSTM(char_dim, hidden, batch_first=True, bidirectional=True)
        self.output_dim = 2 * hidden

    def forward(self, ids: Tensor) -> Tensor:
        """``ids`` ``[N, C]`` (each row has at least one non-zero id) -> ``[N, 2 * hidden]``."""
        lengths = ids.ne(0).sum(dim=1).cpu()
        packed = pack_padded_sequence(self.embedding(ids), lengths, batch_first=True, enforce_sorted=False)
        _, (last, _) = self.lstm(packed)  # last: [2, N, hidden], already in the input order
        return torch.cat([last[0], last[1]], dim=-1)


def build_char_encoder(kind: str, num_chars: int, char_dim: int, hidden: int, kernel_size: int) -> nn.Module:
    if kind == "cnn":
        return CharCNN(num_chars, char_dim, hidden, kernel_size)
    if kind == "lstm":
        return CharLSTM(num_chars, char_dim, hidden)
    raise ValueError(f"unknown char encoder {kind!r}; expected one of {CHAR_KINDS} or null")

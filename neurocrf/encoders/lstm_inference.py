"""Prediction-time (Bi)LSTM on CPU: the first layer's input projection kept per word, the
recurrence of every direction as one batched matrix product per position.

At inference a word's first-layer gate pre-activations ``W_ih [embedding; char features] + b``
depend on the word only, and they are 3/7 of the BiLSTM's multiply-adds (4H x input_dim of
4H x (input_dim + H) per direction). :class:`GateCache` keeps them for the words seen recently
(least recently used batches evicted first, memory bounded by :data:`GATE_CACHE_BYTES`), so a
batch computes the embedding, the character encoder and the input projection for its new words
only; :func:`run_recurrence` then runs the recurrence of all directions together.

Arithmetic: float32 throughout (``precision="32"``), the same operations as ``torch.lstm`` in
another order (the input projection per word rather than per position, the ``tanh`` of the cell
as ``2 sigmoid(2x) - 1`` with the ``g`` gate's weights doubled, which is exact): hidden states
agree with ``nn.LSTM`` to float32 rounding (within 2e-6 in the tests). ``precision="bf16"`` runs the recurrent
matrix product in bfloat16 (AVX512-BF16 / AMX: twice as fast; states, gates and the cached
input projection stay float32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import torch
from torch import Tensor, nn

from neurocrf.encoders.chars import reverse_positions

GATE_CACHE_BYTES = 64 * 2**20
"""Memory for cached gate pre-activations (64 MiB: 10,485 words for a 2 x 200 BiLSTM)."""

RECURRENT_PRECISIONS = ("32", "bf16")

CHUNK = 64
"""New words go through the embedding, the character encoder and the projection this many at a time."""


@dataclass
class StackedLSTM:
    """An ``nn.LSTM``'s weights laid out for :func:`run_recurrence` (:meth:`of`).

    Per layer: ``input_weight`` ``[D * 4H, in]`` and ``bias`` ``[D * 4H]`` (both biases summed),
    ``recurrent`` ``[D, H, 4H]`` (transposed for ``baddbmm``), all float32, gate order ``i, f, g,
    o`` with the ``g`` rows doubled (``tanh(x) = 2 sigmoid(2x) - 1``); ``recurrent_bf16``: the
    same in bfloat16. ``D``: 2 if bidirectional, else 1.
    """

    directions: int
    hidden: int
    layers: list[tuple[Tensor, Tensor, Tensor]]
    recurrent_bf16: list[Tensor]

    @classmethod
    @torch.no_grad()
    def of(cls, lstm: nn.LSTM) -> StackedLSTM:
        if lstm.proj_size or not lstm.batch_first:
            raise ValueError("StackedLSTM takes batch-first LSTMs without projections")
        directions, hidden = (2 if lstm.bidirectional else 1), lstm.hidden_size
        scale = torch.ones(4 * hidden)
        scale[2 * hidden:3 * hidden] = 2.0
        layers = []
        for layer in range(lstm.num_layers):
            weights = [_direction_weights(lstm, layer, suffix) for suffix in ["", "_reverse"][:directions]]
            input_weight = torch.cat([w_ih.float() * scale[:, None] for w_ih, _, _ in weights])
            bias = torch.cat([b.float() * scale for _, _, b in weights])
            recurrent = torch.stack([(w_hh.float() * scale[:, None]).t() for _, w_hh, _ in weights])
            layers.append((input_weight.contiguous(), bias.contiguous(), recurrent.contiguous()))
        return cls(directions, hidden, layers, [recurrent.bfloat16() for _, _, recurrent in layers])

    def project(self, layer: int, inputs: Tensor) -> Tensor:
        """Gate pre-activations ``[N, D * 4H]`` of ``inputs`` ``[N, in]`` for ``layer``."""
        input_weight, bias, _ = self.layers[layer]
        return torch.addmm(bias, inputs.float(), input_weight.t())

    def recurrent(self, layer: int, precision: str) -> Tensor:
        return self.recurrent_bf16[layer] if precision == "bf16" else self.layers[layer][2]


def _direction_weights(lstm: nn.LSTM, layer: int, suffix: str) -> tuple[Tensor, Tensor, Tensor]:
    """``W_ih [4H, in]``, ``W_hh [4H, H]`` and the summed bias ``[4H]`` of one direction of one layer."""
    w_ih = getattr(lstm, f"weight_ih_l{layer}{suffix}")
    w_hh = getattr(lstm, f"weight_hh_l{layer}{suffix}")
    if not lstm.bias:
        return w_ih, w_hh, w_ih.new_zeros(w_ih.shape[0])
    return w_ih, w_hh, getattr(lstm, f"bias_ih_l{layer}{suffix}") + getattr(lstm, f"bias_hh_l{layer}{suffix}")


def time_major_rows(rows: Tensor, reverse: Tensor, directions: int) -> Tensor:
    """Row numbers ``[T, D, N]`` into a ``[R * D, ...]`` table for :func:`run_recurrence`:
    direction 0 reads ``rows[n, t]``, direction 1 reads ``rows[n, reverse[n, t]]``; ``rows``
    ``[N, T]`` numbers blocks of ``D`` rows (one per direction)."""
    per_direction = [rows, rows.gather(1, reverse)][:directions]
    blocks = torch.stack(per_direction, dim=0) * directions  # [D, N, T]
    blocks = blocks + torch.arange(directions, device=rows.device).view(-1, 1, 1)
    return blocks.permute(2, 0, 1).contiguous()  # [T, D, N]


def run_recurrence(table: Tensor, index: Tensor, recurrent: Tensor) -> Tensor:
    """The LSTM recurrence of ``D`` directions at once, from zero states.

    Args:
        table: ``[R, 4H]`` float32 input pre-activations (bias included, ``g`` rows doubled).
        index: ``[T, D, N]`` the row of ``table`` for each step, direction and sequence.
        recurrent: ``[D, H, 4H]`` float32, or bfloat16 (then the product is rounded to bfloat16
            and summed in float32).

    Returns:
        ``[T * D * N + 1, H]`` float32: the hidden states (``[T, D, N, H]`` flattened), then a
        row of zeros.
    """
    steps, directions, batch = index.shape
    width = table.shape[-1]
    # one more row, of zeros, after the states: where padding positions read their output
    flat = table.new_empty(steps * directions * batch + 1, width // 4)
    flat[-1] = 0.0
    out = flat[:-1].view(steps, directions, batch, width // 4)
    gates = table.new_empty(directions, batch, width)
    cell = table.new_zeros(directions, batch, width // 4)  # twice the cell state: tanh(c) = 2 sigmoid(2c) - 1
    squashed = torch.empty_like(cell)
    low = recurrent.dtype != table.dtype
    for t in range(steps):
        # gathered step by step: the rows are used while they are in the cache
        torch.index_select(table, 0, index[t].view(-1), out=gates.view(-1, width))
        if t > 0 and low:
            gates.add_(torch.bmm(out[t - 1].to(recurrent.dtype), recurrent))
        elif t > 0:
            gates.baddbmm_(out[t - 1], recurrent)
        gates.sigmoid_()
        i, f, g, o = gates.chunk(4, dim=-1)  # g holds sigmoid(2 z_g): tanh(z_g) = 2 g - 1
        cell.mul_(f).addcmul_(i, g, value=4.0).sub_(i, alpha=2.0)  # 2c' = f 2c + 2 i (2g - 1)
        torch.sigmoid(cell, out=squashed)
        torch.mul(o, squashed, out=out[t]).mul_(2.0).sub_(o)  # o * tanh(c')
    return flat


def run_stacked(
    lstm: StackedLSTM, first_gates: Tensor, rows: Tensor, lengths: Tensor, precision: str = "32"
) -> Tensor:
    """Every layer and direction of ``lstm`` over a batch whose first-layer gate pre-activations
    are rows of ``first_gates`` ``[R, D * 4H]`` (``rows`` ``[N, T]`` picks a word's row; padding
    positions may pick any row). Returns ``[N, T, D * H]``, zeros past each row's length."""
    if precision not in RECURRENT_PRECISIONS:
        raise ValueError(f"precision must be one of {RECURRENT_PRECISIONS}, got {precision!r}")
    directions, hidden = lstm.directions, lstm.hidden
    batch, width = rows.shape
    reverse = reverse_positions(lengths, width)
    # where each (n, t, d) output lives in the time-major [T, D, N, H] output (padding: the zero row)
    positions = torch.arange(width).expand(batch, width)
    back = [positions, reverse][:directions]
    out_rows = torch.stack([(p * directions + d) * batch for d, p in enumerate(back)], dim=-1)
    out_rows = out_rows + torch.arange(batch).view(-1, 1, 1)  # [N, T, D]
    out_rows = out_rows.masked_fill_((positions >= lengths.unsqueeze(1)).unsqueeze(-1), width * directions * batch)
    table, index = first_gates.view(-1, 4 * hidden), time_major_rows(rows, reverse, directions)
    layer_out = first_gates.new_empty(batch, width, directions * hidden)
    for layer in range(len(lstm.layers)):
        states = run_recurrence(table, index, lstm.recurrent(layer, precision))
        layer_out = states.index_select(0, out_rows.view(-1)).view(batch, width, directions * hidden)
        if layer + 1 < len(lstm.layers):
            table = lstm.project(layer + 1, layer_out.view(batch * width, -1)).view(-1, 4 * hidden)
            index = time_major_rows(torch.arange(batch * width).view(batch, width), reverse, directions)
    return layer_out


class GateCache:
    """Words -> rows of first-layer gate pre-activations in a ``[capacity, width]`` table, each
    computed on first sight and kept until the table is full (then the least recently used
    quarter goes, never a word of the batch at hand) or :meth:`clear` (the weights changed).

    >>> cache = GateCache(width=1, capacity=2)
    >>> lengths = lambda words: torch.tensor([[float(len(w))] for w in words])   # [n, width]
    >>> table, rows = cache.rows([["a", "bb"], ["a"]], lengths)
    >>> table[rows].squeeze(-1).tolist()      # padding reads row 0
    [[1.0, 2.0], [1.0, 1.0]]
    >>> table, rows = cache.rows([["ccc"]], lengths)   # full: the least recently used word goes
    >>> table[rows].squeeze(-1).tolist(), len(cache)
    ([[3.0]], 2)
    """

    def __init__(self, width: int, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.width = width
        self.capacity = capacity
        self.table = torch.empty(0, width)  # allocated at first use (pages touched as rows fill)
        self.clock = 0
        self.slots: dict[str, int] = {}
        self.clear()

    def __len__(self) -> int:
        return len(self.slots)

    def clear(self) -> None:
        """Forget every word."""
        self.slots.clear()
        self.words: list[str | None] = [None] * self.capacity
        self.free = list(range(self.capacity - 1, -1, -1))
        self.last_used = torch.zeros(self.capacity, dtype=torch.long)

    def rows(self, tokens: Sequence[Sequence[str]], compute: Callable[[list[str]], Tensor]) -> tuple[Tensor, Tensor]:
        """``(table, rows)``: ``rows`` ``[N, T]`` long, each word's row in ``table``, 0 at padding;
        ``compute``: words -> their ``[n, width]`` rows. A batch of more distinct words than the
        capacity gets a table of its own."""
        slots = self.slots
        distinct = list(dict.fromkeys(chain.from_iterable(tokens)))
        if len(distinct) > self.capacity:
            return in_chunks(compute, distinct), _pad_rows(tokens, {w: i for i, w in enumerate(distinct)})
        self.clock += 1
        used = [slots[w] for w in distinct if w in slots]
        if used:
            self.last_used[torch.tensor(used)] = self.clock
        missing = [w for w in distinct if w not in slots]
        if missing:
            if not len(self.table):
                self.table = torch.empty(self.capacity, self.width)
            if len(missing) > len(self.free):
                self._evict(len(missing))
            new = [self.free.pop() for _ in missing]
            index = torch.tensor(new)
            self.table[index] = in_chunks(compute, missing).to(self.table.dtype)
            self.last_used[index] = self.clock
            for word, slot in zip(missing, new):
                slots[word] = slot
                self.words[slot] = word
        return self.table, _pad_rows(tokens, slots)

    def _evict(self, needed: int) -> None:
        """Free at least ``needed`` slots, least recently used first, never one of this batch."""
        old = torch.argsort(self.last_used, stable=True)
        old = old[self.last_used[old] < self.clock]
        count = max(needed - len(self.free), self.capacity // 4)
        for slot in old[:count].tolist():
            word = self.words[slot]
            if word is not None:
                del self.slots[word]
                self.words[slot] = None
                self.free.append(slot)


def in_chunks(compute: Callable[[list[str]], Tensor], words: list[str], size: int = CHUNK) -> Tensor:
    """``compute(words)`` ``[n, width]`` in calls of exactly ``size`` words (the last call filled
    up with repeats of its first word), so that a word's row has the same bits whatever other
    words were new with it: BLAS and oneDNN choose other kernels (other summation orders) for
    other shapes, and predictions must not depend on what the cache saw before.

    >>> in_chunks(lambda words: torch.tensor([[len(words)]] * len(words)), ["a", "b", "c"], size=2).tolist()
    [[2], [2], [2]]
    """
    parts = []
    for start in range(0, len(words), size):
        chunk = words[start:start + size]
        parts.append(compute(chunk + [chunk[0]] * (size - len(chunk)))[: len(chunk)])
    return torch.cat(parts)


def _pad_rows(tokens: Sequence[Sequence[str]], slots: dict[str, int]) -> Tensor:
    """``[N, T]`` long: ``slots[word]`` at real positions, 0 at padding."""
    lengths = torch.tensor([len(sentence) for sentence in tokens], dtype=torch.long)
    width = int(lengths.max()) if len(tokens) else 0
    rows = torch.zeros(len(tokens), width, dtype=torch.long)
    rows[torch.arange(width) < lengths.unsqueeze(1)] = torch.tensor(
        list(map(slots.__getitem__, chain.from_iterable(tokens))), dtype=torch.long)
    return rows

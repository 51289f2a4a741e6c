"""Evaluated sentences as records, and their padding for gathering across DDP ranks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

Record = tuple[int, list[int], list[int]]
"""``(dataset index, gold tag ids, predicted tag ids)`` of one evaluated sentence."""


def pad_records(
    records: Sequence[Record], rows: int, width: int, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Records as tensors of a fixed shape: index ``[rows]`` (-1: padding row), lengths
    ``[rows]``, gold and predicted ids ``[rows, width]`` (-1 padded)."""
    if len(records) > rows:
        raise ValueError(f"{len(records)} records do not fit {rows} rows")
    width = max(width, 1)
    index = torch.full((rows,), -1, dtype=torch.long)
    lengths = torch.zeros(rows, dtype=torch.long)
    gold = torch.full((rows, width), -1, dtype=torch.long)
    pred = torch.full((rows, width), -1, dtype=torch.long)
    for i, (idx, row_gold, row_pred) in enumerate(records):
        index[i], lengths[i] = idx, len(row_gold)
        gold[i, : len(row_gold)] = torch.tensor(row_gold, dtype=torch.long)
        pred[i, : len(row_pred)] = torch.tensor(row_pred, dtype=torch.long)
    return index.to(device), lengths.to(device), gold.to(device), pred.to(device)


def unpad_records(index: Tensor, lengths: Tensor, gold: Tensor, pred: Tensor) -> list[Record]:
    """Inverse of :func:`pad_records`, also over gathered ``[world, rows, ...]`` tensors."""
    width = gold.shape[-1]
    index, lengths = index.reshape(-1).tolist(), lengths.reshape(-1).tolist()
    gold_rows, pred_rows = gold.reshape(-1, width).tolist(), pred.reshape(-1, width).tolist()
    return [
        (idx, gold_rows[i][:n], pred_rows[i][:n])
        for i, (idx, n) in enumerate(zip(index, lengths))
        if idx >= 0
    ]


def dedupe_records(records: Sequence[Record]) -> list[Record]:
    """One record per dataset index (the first), sorted by index."""
    unique: dict[int, Record] = {}
    for record in records:
        unique.setdefault(record[0], record)
    return [unique[i] for i in sorted(unique)]

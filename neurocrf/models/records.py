"""Evaluated sentences as records, gathered across DDP ranks, and scored.

During validation and test every rank keeps a record per sentence it saw (:class:`EvaluationRecords`);
at the end of the epoch the records of all ranks are gathered (:func:`gather_records`: padded into
tensors of one shape, ``all_gather``, unpadded), deduplicated (the distributed sampler repeats a few
sentences to even out the ranks) and scored (:func:`record_scores`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from neurocrf.models.metrics import SpanScores, span_scores

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


def gather_records(records: Sequence[Record], all_gather: Callable[[Tensor], Tensor] | None = None,
                   device: torch.device | str = "cpu") -> list[Record]:
    """All ranks' records, deduplicated by dataset index and sorted by it.

    ``all_gather`` (a LightningModule's, under DDP; None on one device) stacks a tensor of every
    rank into ``[world, ...]``; it needs equal shapes on every rank, so the records are padded to
    the largest count and length of any rank first.
    """
    if all_gather is not None:
        size = torch.tensor([len(records), max((len(r[1]) for r in records), default=0)], device=device)
        sizes = all_gather(size).reshape(-1, 2)  # [world, 2]
        padded = pad_records(records, int(sizes[:, 0].max()), int(sizes[:, 1].max()), device)
        records = unpad_records(*(all_gather(tensor) for tensor in padded))  # each [world, rows, ...]
    return dedupe_records(records)


def tag_rows(records: Sequence[Record], tags: Sequence[str]) -> list[tuple[int, list[str], list[str]]]:
    """``(dataset index, gold tags, predicted tags)`` per record, ids mapped to tag strings."""
    return [(index, [tags[t] for t in gold], [tags[t] for t in pred]) for index, gold, pred in records]


def record_scores(records: Sequence[Record], tags: Sequence[str], scheme: str) -> SpanScores:
    """Strict span scores of the records (:func:`~neurocrf.models.metrics.span_scores`)."""
    rows = tag_rows(records, tags)
    return span_scores([gold for _, gold, _ in rows], [pred for _, _, pred in rows], scheme)


class EvaluationRecords:
    """The records of each evaluation stage (``val``, ``test``) a rank has seen this epoch."""

    def __init__(self) -> None:
        self._stages: dict[str, list[Record]] = {}

    def reset(self, stage: str) -> None:
        self._stages[stage] = []

    def add(self, stage: str, index: Tensor, gold: Tensor, predicted: Tensor, mask: Tensor) -> None:
        """One record per row: dataset ``index`` ``[B]``, gold and predicted ids ``[B, T]``, cut to
        the row's ``mask`` ``[B, T]`` length."""
        rows = self._stages.setdefault(stage, [])
        lengths = mask.sum(-1).tolist()
        gold_rows, predicted_rows = gold.tolist(), predicted.tolist()
        for i, (idx, n) in enumerate(zip(index.tolist(), lengths)):
            rows.append((idx, gold_rows[i][:n], predicted_rows[i][:n]))

    def collect(self, stage: str, module: Any) -> list[Record]:
        """The stage's records of every rank (gathered through ``module.all_gather`` when its
        trainer runs several), deduplicated and in dataset order; the stage starts empty again."""
        records = self._stages.get(stage, [])
        self._stages[stage] = []
        trainer = getattr(module, "_trainer", None)
        several = trainer is not None and trainer.world_size > 1
        return gather_records(records, module.all_gather if several else None, module.device)

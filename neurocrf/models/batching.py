"""Batches for prediction: sentences in windows of bounded size, sorted by length inside a window
(little padding), cut by sentence count and by token budget; results back in input order.

>>> plan_batches([5, 1, 3, 0, 2], batch_size=2)
[[1, 4], [2, 0]]
>>> plan_batches([5, 1, 3, 2], batch_size=8, max_tokens=6)
[[1, 3], [2], [0]]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TypeVar

T = TypeVar("T")

DEFAULT_WINDOW = 4096
"""Sentences read ahead and sorted together (memory is bounded by this many sentences)."""


def windows(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last one shorter)."""
    if size < 1:
        raise ValueError(f"window size must be at least 1, got {size}")
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def plan_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """The positions of the non-empty sentences of a window, sorted by length (shortest first;
    equal lengths in input order) and cut into batches of at most ``batch_size`` sentences whose
    padded size ``sentences x longest`` stays within ``max_tokens`` (a sentence longer than the
    budget is a batch of its own). Empty sentences (length 0) need no model and are left out."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1 (or None), got {max_tokens}")
    order = sorted((i for i, n in enumerate(lengths) if n), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted: the newest sentence is the longest of the batch
        if current and (len(current) >= batch_size or (max_tokens and (len(current) + 1) * lengths[i] > max_tokens)):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches

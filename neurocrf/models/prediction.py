"""Turning emission scores into :class:`Prediction` objects: tags, spans and their confidences.

Definitions (all from the model's own distribution over whole tag sequences, never a softmax
over Viterbi scores):

- token confidence: the marginal probability ``p(y_t = tag_t | x)`` of the predicted tag;
- span confidence: the probability that the output contains exactly this span with this type,
  i.e. the total probability of the tag sequences whose spans (read by
  :func:`~neurocrf.data.schemes.get_spans`) include it, whatever tags encode it. A span of type
  ``X`` at ``[s, e)`` is in the output when a span of type ``X`` starts at ``s``, every position up
  to ``e - 1`` continues it and position ``e`` does not. Each way to write that is one product of
  allowed tag sets over positions ``s - 1 .. e`` (an *encoding*): the first tag (``B-X``, or
  ``I-X`` / BIOES ``E-X`` with no open ``X`` span at ``s - 1``), the inside tags, and the last one
  (an open tag then forbids ``I-X`` / ``E-X`` at ``e``). In IOB1 and IOB2 a span has two
  encodings (opened by ``B-X``, or by ``I-X`` after no open ``X`` span), in BIOES four. The
  encodings are disjoint, so the confidence is the sum of ``exp(log Z_encoding - log Z)``, each
  ``Z_encoding`` the partition function with the tags of its positions restricted, from the head's
  ``window_log_partition`` (forward and backward scores once per batch, then a few steps per
  encoding): all span confidences cost time linear in the sentence length. Encodings that the
  model's constraints forbid add 0. The confidence is never below the probability of the
  Viterbi path, and never above the probability of a tag of the span's type at any of its
  positions;
- n-best: the ``n`` most probable tag sequences with their probabilities ``p(y | x)``, the
  predicted tags first.

Everything is computed in float64 (:func:`build_predictions` widens the emissions): the log
partition of a 10,000-token sentence is of the order of 1e4, where float32 numbers are 1e-3 apart,
which would put errors of 0.1% into every confidence and tie the n best paths.

The head only needs ``log_partition``, ``window_log_partition``, ``marginals``, ``decode`` and
``nbest`` (the CRF contract).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from neurocrf.data.schemes import convert_tags, get_spans
from neurocrf.models.heads import TaggingHead


class PredictedSpan(NamedTuple):
    """A predicted span ``[start, end)`` of type ``type`` with its probability ``confidence``."""

    type: str
    start: int
    end: int
    confidence: float


class NBestPath(NamedTuple):
    """One of the n best tag sequences, its probability under the model and the float64 log of
    it (a long sentence's probabilities underflow to 0; their logs keep the order)."""

    tags: list[str]
    probability: float
    log_probability: float


@dataclass
class Prediction:
    """A tagged sentence: exactly one tag and one confidence per input token (no confidences
    and no spans when predicted with ``confidences=False``)."""

    tokens: list[str]
    tags: list[str]
    scheme: str
    spans: list[PredictedSpan] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    nbest: list[NBestPath] = field(default_factory=list)

    def tags_in(self, scheme: str) -> list[str]:
        """The predicted tags converted to another scheme (``IOB1``, ``IOB2``, ``BIOES``)."""
        return convert_tags(self.tags, self.scheme, scheme) if scheme != self.scheme else self.tags

    def to_dict(self, scheme: str | None = None) -> dict[str, Any]:
        """Plain values for JSON; tags (also in the n-best list) in ``scheme`` if given."""
        scheme = scheme or self.scheme

        def convert(tags: list[str]) -> list[str]:
            return convert_tags(tags, self.scheme, scheme) if scheme != self.scheme else tags

        return {
            "tokens": self.tokens,
            "tags": convert(self.tags),
            "scheme": scheme,
            "confidences": [round(c, 6) for c in self.confidences],
            "spans": [
                {"type": s.type, "start": s.start, "end": s.end, "confidence": round(s.confidence, 6)}
                for s in self.spans
            ],
            **(
                {
                    "nbest": [
                        {"tags": convert(p.tags), "probability": round(p.probability, 6),
                         "log_probability": p.log_probability}
                        for p in self.nbest
                    ]
                }
                if self.nbest
                else {}
            ),
        }


@torch.no_grad()
def build_predictions(
    head: TaggingHead,
    emissions: Tensor,
    mask: Tensor,
    tokens: Sequence[Sequence[str]],
    tags: Sequence[str],
    scheme: str,
    nbest: int = 0,
    confidences: bool = True,
) -> list[Prediction]:
    """Decode a batch and attach confidences: one batched call of the head per quantity
    (Viterbi, marginals, span windows, n-best), each result turned into Python values once.

    Args:
        head: a CRF layer or the softmax head (:class:`~neurocrf.models.heads.TaggingHead`).
        emissions: ``[B, T, L]`` scores; mask: ``[B, T]`` bool, a prefix of ``len(tokens[i])``
            True positions per row.
        tokens: the ``B`` token lists; tags: the ``L`` tag strings; scheme: their scheme.
        nbest: also return this many best sequences per sentence (0: none).
        confidences: token and span confidences (False: tags only, no marginals).
    """
    emissions = emissions.double()  # exact confidences on long sentences (module docstring)
    paths = head.decode(emissions, mask)  # [B, T]
    lengths = mask.sum(-1).tolist()
    for i, words in enumerate(tokens):
        if lengths[i] != len(words):
            raise ValueError(f"sentence {i}: {len(words)} tokens but {lengths[i]} mask positions")
    path_rows = paths.tolist()
    if confidences:
        marginals = head.marginals(emissions, mask)  # [B, T, L]
        token_conf = marginals.gather(-1, paths.clamp(min=0).unsqueeze(-1)).squeeze(-1).tolist()  # [B, T]
    predictions = [
        Prediction(
            tokens=list(words),
            tags=[tags[t] for t in path_rows[i][: lengths[i]]],
            scheme=scheme,
            confidences=token_conf[i][: lengths[i]] if confidences else [],
        )
        for i, words in enumerate(tokens)
    ]
    if confidences:
        _attach_spans(head, emissions, mask, predictions, tags, scheme)
    if nbest > 0:
        _attach_nbest(head, emissions, mask, predictions, tags, nbest)
    return predictions


def _attach_spans(
    head: TaggingHead,
    emissions: Tensor,
    mask: Tensor,
    predictions: list[Prediction],
    tags: Sequence[str],
    scheme: str,
) -> None:
    tag_index = {tag: i for i, tag in enumerate(tags)}
    spans: list[tuple[int, Any]] = []  # (sentence, span)
    jobs: list[tuple[int, int, list[tuple[int, ...]]]] = []  # per encoding: span number, window start, allowed ids
    for i, prediction in enumerate(predictions):
        for span in get_spans(prediction.tags, scheme):
            encodings = _span_encodings(span, len(prediction.tags), tag_index, scheme)
            jobs.extend((len(spans), first, allowed) for first, allowed in encodings)
            spans.append((i, span))
    if not spans:
        return
    # each distinct allowed set once: the windows [J, W, L] are rows of a small table (row 0: every tag)
    sets: dict[tuple[int, ...], int] = {tuple(range(len(tags))): 0}
    width = max(len(job[2]) for job in jobs)
    codes = [[sets.setdefault(ids, len(sets)) for ids in job[2]] + [0] * (width - len(job[2])) for job in jobs]
    table = torch.zeros(len(sets), len(tags), dtype=torch.bool)
    for ids, code in sets.items():
        table[code, list(ids)] = True
    allowed = table.to(emissions.device)[torch.tensor(codes, device=emissions.device)]  # [J, W, L]
    owner = torch.tensor([job[0] for job in jobs], device=emissions.device)
    rows = torch.tensor([spans[job[0]][0] for job in jobs], device=emissions.device)
    starts = torch.tensor([job[1] for job in jobs], device=emissions.device)
    log_z = head.log_partition(emissions, mask).double()  # [B]
    log_z_encoding = head.window_log_partition(emissions, mask, rows, starts, allowed)
    # a sentence without any valid path (log Z = -inf) holds no span
    share = torch.where(torch.isneginf(log_z_encoding), 0.0, (log_z_encoding - log_z[rows]).exp())
    confidences = share.new_zeros(len(spans)).index_add_(0, owner, share).clamp(max=1.0).tolist()
    for (i, span), confidence in zip(spans, confidences):
        predictions[i].spans.append(PredictedSpan(span.type, span.start, span.end, float(confidence)))


# Span prefixes that leave a span open (the next tag may continue it) and those that continue one.
_OPEN = ("B", "I")
_CONTINUE = {"IOB1": ("I",), "IOB2": ("I",), "BIOES": ("I", "E")}


def _span_encodings(
    span: Any, length: int, tag_index: dict[str, int], scheme: str
) -> list[tuple[int, list[tuple[int, ...]]]]:
    """The disjoint encodings of ``span`` in a sentence of ``length`` tokens (see the module
    docstring): for each, the first position of its window and the allowed tag ids at each
    position of the window.

    >>> from neurocrf.data.schemes import Span
    >>> _span_encodings(Span("X", 1, 2), 3, {"O": 0, "B-X": 1, "I-X": 2}, "IOB1")
    [(1, [(1,), (0, 1)]), (0, [(0,), (2,), (0, 1)])]
    """
    continuing = _CONTINUE[scheme]
    prefixes = ("B", "I") if scheme != "BIOES" else ("B", "I", "E", "S")
    own = {p: tag_index[f"{p}-{span.type}"] for p in prefixes if f"{p}-{span.type}" in tag_index}

    def all_but(excluded: Sequence[str]) -> tuple[int, ...]:
        banned = {own[p] for p in excluded if p in own}
        return tuple(i for i in range(len(tag_index)) if i not in banned)

    n = span.end - span.start
    firsts = prefixes if n == 1 else _OPEN
    lasts = [None] if n == 1 else continuing  # None: the last tag is the first one
    encodings = []
    for first in firsts:
        for last in lasts:
            closing = first if last is None else last
            if first not in own or closing not in own or (n > 2 and "I" not in own):
                continue
            before = span.start > 0 and first in continuing  # no open span of the type may precede
            after = span.end < length and closing in _OPEN  # the next tag may not continue it
            window = [(own[first],)] + [(own["I"],)] * (n - 2) + ([(own[last],)] if last is not None else [])
            if before:
                window.insert(0, all_but(_OPEN))
            if after:
                window.append(all_but(continuing))
            encodings.append((span.start - int(before), window))
    return encodings


def _attach_nbest(
    head: TaggingHead,
    emissions: Tensor,
    mask: Tensor,
    predictions: list[Prediction],
    tags: Sequence[str],
    k: int,
) -> None:
    paths, scores = head.nbest(emissions, mask, k)  # [B, k, T], [B, k]
    path_rows, score_rows = paths.tolist(), scores.double().tolist()
    for i, prediction in enumerate(predictions):
        n = len(prediction.tokens)
        for ids, score in zip(path_rows[i], score_rows[i]):
            if not math.isfinite(score):  # fewer than k paths exist
                continue
            ids = ids[:n]
            if any(t < 0 for t in ids):
                continue
            prediction.nbest.append(NBestPath([tags[t] for t in ids], math.exp(score), score))

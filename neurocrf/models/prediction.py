"""Turning emission scores into :class:`Prediction` objects: tags, spans and their confidences.

Definitions (all from the model's own distribution over whole tag sequences, never a softmax
over Viterbi scores):

- token confidence: the marginal probability ``p(y_t = tag_t | x)`` of the predicted tag;
- span confidence: the probability that the output contains exactly this span with this type,
  ``p(y_s .. y_{e-1} = the span's tags, and the span is not continued | x)``. It is computed
  exactly as ``exp(log Z_clamped - log Z)``, where ``Z_clamped`` is the partition function with
  the tags at positions ``s .. e-1`` restricted to the predicted tags (and, for IOB1 / IOB2,
  the continuation tag ``I-X`` forbidden at position ``e``; for an IOB1 span opened by ``I-X``,
  ``B-X`` and ``I-X`` forbidden at ``s-1``). BIOES spans delimit themselves. ``Z_clamped`` comes
  from the head's ``window_log_partition`` (forward and backward scores once per batch, then a
  few steps per span), so all span confidences cost time linear in the sentence length. For an
  unconstrained model this is the probability of the span's tag pattern; it is never below the
  joint probability of the whole Viterbi path and never above the smallest token marginal;
- n-best: the ``n`` most probable tag sequences with their probabilities ``p(y | x)``.

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


class PredictedSpan(NamedTuple):
    """A predicted span ``[start, end)`` of type ``type`` with its probability ``confidence``."""

    type: str
    start: int
    end: int
    confidence: float


class NBestPath(NamedTuple):
    """One of the n best tag sequences and its probability under the model."""

    tags: list[str]
    probability: float


@dataclass
class Prediction:
    """A tagged sentence: exactly one tag and one confidence per input token."""

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
                        {"tags": convert(p.tags), "probability": round(p.probability, 6)}
                        for p in self.nbest
                    ]
                }
                if self.nbest
                else {}
            ),
        }


def build_predictions(
    head: torch.nn.Module,
    emissions: Tensor,
    mask: Tensor,
    tokens: Sequence[Sequence[str]],
    tags: Sequence[str],
    scheme: str,
    nbest: int = 0,
) -> list[Prediction]:
    """Decode a batch and attach confidences.

    Args:
        head: a CRF layer or the softmax head (``decode``, ``marginals``, ``log_partition``,
            ``window_log_partition``, ``nbest``).
        emissions: ``[B, T, L]`` scores; mask: ``[B, T]`` bool, a prefix of ``len(tokens[i])``
            True positions per row.
        tokens: the ``B`` token lists; tags: the ``L`` tag strings; scheme: their scheme.
        nbest: also return this many best sequences per sentence (0: none).
    """
    emissions = emissions.float()
    paths = head.decode(emissions, mask)  # [B, T]
    marginals = head.marginals(emissions, mask)  # [B, T, L]
    lengths = mask.sum(-1).tolist()
    tag_ids = [paths[i, : lengths[i]].tolist() for i in range(len(tokens))]
    token_conf = marginals.gather(-1, paths.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [B, T]

    predictions = []
    for i, words in enumerate(tokens):
        if lengths[i] != len(words):
            raise ValueError(f"sentence {i}: {len(words)} tokens but {lengths[i]} mask positions")
        predictions.append(
            Prediction(
                tokens=list(words),
                tags=[tags[t] for t in tag_ids[i]],
                scheme=scheme,
                confidences=token_conf[i, : lengths[i]].tolist(),
            )
        )
    _attach_spans(head, emissions, mask, predictions, tags, scheme)
    if nbest > 0:
        _attach_nbest(head, emissions, mask, predictions, tags, nbest)
    return predictions


def _attach_spans(
    head: torch.nn.Module,
    emissions: Tensor,
    mask: Tensor,
    predictions: list[Prediction],
    tags: Sequence[str],
    scheme: str,
) -> None:
    tag_index = {tag: i for i, tag in enumerate(tags)}
    jobs: list[tuple[int, Any, int, Tensor]] = []  # (sentence, span, window start, allowed [W, L])
    for i, prediction in enumerate(predictions):
        for span in get_spans(prediction.tags, scheme):
            jobs.append((i, span, *_span_window(prediction.tags, span, tag_index, scheme)))
    if not jobs:
        return
    width = max(job[3].shape[0] for job in jobs)
    allowed = torch.ones(len(jobs), width, len(tags), dtype=torch.bool)
    for j, job in enumerate(jobs):
        allowed[j, : job[3].shape[0]] = job[3]
    rows = torch.tensor([job[0] for job in jobs], device=emissions.device)
    starts = torch.tensor([job[2] for job in jobs], device=emissions.device)
    log_z = head.log_partition(emissions, mask).double()  # [B]
    log_z_span = head.window_log_partition(emissions, mask, rows, starts, allowed.to(emissions.device))
    confidences = (log_z_span - log_z[rows]).exp().clamp(max=1.0).tolist()
    for (i, span, _, _), confidence in zip(jobs, confidences):
        predictions[i].spans.append(PredictedSpan(span.type, span.start, span.end, float(confidence)))


def _span_window(path: Sequence[str], span: Any, tag_index: dict[str, int], scheme: str) -> tuple[int, Tensor]:
    """The positions whose tags decide that ``span`` is in the output: the first one and the
    allowed tags ``[W, L]`` there (the span's own tags; no continuation ``I-X`` after an IOB span;
    for an IOB1 span opened by ``I-X``, neither ``B-X`` nor ``I-X`` before it)."""
    first, last = span.start, span.end - 1
    inside = tag_index.get(f"I-{span.type}")
    continues = scheme in ("IOB1", "IOB2") and span.end < len(path) and inside is not None
    opens_with_inside = scheme == "IOB1" and span.start > 0 and path[span.start].startswith("I-")
    first -= int(opens_with_inside)
    last += int(continues)
    allowed = torch.zeros(last - first + 1, len(tag_index), dtype=torch.bool)
    for t in range(span.start, span.end):
        allowed[t - first, tag_index[path[t]]] = True
    if continues:
        allowed[-1] = True
        allowed[-1, inside] = False
    if opens_with_inside:
        allowed[0] = True
        for prefix in ("B", "I"):
            other = tag_index.get(f"{prefix}-{span.type}")
            if other is not None:
                allowed[0, other] = False
    return first, allowed


def _attach_nbest(
    head: torch.nn.Module,
    emissions: Tensor,
    mask: Tensor,
    predictions: list[Prediction],
    tags: Sequence[str],
    k: int,
) -> None:
    paths, scores = head.nbest(emissions, mask, k)  # [B, k, T], [B, k]
    for i, prediction in enumerate(predictions):
        n = len(prediction.tokens)
        for j in range(paths.shape[1]):
            score = float(scores[i, j])
            if not math.isfinite(score):  # fewer than k paths exist
                continue
            ids = paths[i, j, :n].tolist()
            if any(t < 0 for t in ids):
                continue
            prediction.nbest.append(NBestPath([tags[t] for t in ids], float(torch.tensor(score).exp())))

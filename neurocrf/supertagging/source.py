"""What the parse code takes from a supertagger: k-best supertags per token, and the two protocols
of the things that give them.

- :class:`SupertagSource`: anything that answers :meth:`~SupertagSource.predict_kbest` with
  :class:`KBestTags`, and says which labels it knows and how its trees were prepared: a
  :class:`~neurocrf.supertagging.supertagger.Supertagger`, a
  :class:`~neurocrf.supertagging.ensemble.SupertaggerEnsemble` or
  :class:`~neurocrf.supertagging.saved_tags.SavedSupertags`.
- :class:`SupertagScorer`: a source that also computes whole distributions for a batch
  (:meth:`~SupertagScorer.batch_log_probs`): the model and the ensemble, whose
  ``predict_kbest`` is :func:`predict_kbest` over their own distributions.

>>> import torch
>>> class Uniform:
...     supertags, preterminals = ["A 2 t - -", "B 2 t - -"], ["N"]
...     def batch_log_probs(self, tokens):
...         width = max(len(t) for t in tokens)
...         return (torch.full((len(tokens), width, 2), 0.5).log(), torch.zeros(len(tokens), width, 1))
>>> tags = predict_kbest(Uniform(), [["a", "b"]], k=1, batch_size=8)[0]
>>> tags.best, tags.preterminals
(['A 2 t - -', 'A 2 t - -'], ['N', 'N'])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from neurocrf.parsing.parser import candidates_from_topk


@dataclass
class KBestTags:
    """Supertagger output for one sentence.

    ``candidates[i]``: the ``k`` best ``(supertag, weight)`` of token ``i``, best first, weights
    ``-log p`` with the ``k`` probabilities renormalised; ``preterminals[i]``: the predicted
    preterminal (collapsed POS chain); ``supertag_probs[i]``: the unrenormalised probability of
    the best supertag (a confidence)."""

    tokens: list[str]
    candidates: list[list[tuple[str, float]]]
    preterminals: list[str]
    supertag_probs: list[float] = field(default_factory=list)

    @property
    def best(self) -> list[str]:
        """The 1-best supertag per token."""
        return [c[0][0] for c in self.candidates]


@runtime_checkable
class SupertagSource(Protocol):
    """Something that gives supertag distributions, as the parse code reads them."""

    @property
    def supertags(self) -> Sequence[str]:
        """Every supertag it can predict."""

    @property
    def preterminals(self) -> Sequence[str]:
        """Every preterminal it can predict."""

    @property
    def roots(self) -> Sequence[str]:
        """Root labels of the prepared training trees (the parser's goal labels)."""

    @property
    def transform(self) -> dict[str, Any]:
        """How the training trees were prepared (``move_punctuation``, ``h``, ``v``)."""

    def predict_kbest(self, sentences: Sequence[Sequence[str] | str], k: int = 10,
                      batch_size: int = 64) -> list[KBestTags]:
        """The ``k`` best supertags and the best preterminal per token, one entry per sentence."""


@runtime_checkable
class SupertagScorer(SupertagSource, Protocol):
    """A source that computes whole supertag and preterminal distributions for a batch of
    sentences (last score dimension in the order of ``supertags`` / ``preterminals``)."""

    def batch_log_probs(self, tokens: Sequence[Sequence[str]]) -> tuple[Tensor, Tensor]:
        """Supertag ``[B, T, S]`` and preterminal ``[B, T, P]`` log-probabilities of non-empty
        token lists (positions past a sentence's end are padding)."""


@torch.no_grad()
def predict_kbest(scorer: SupertagScorer, sentences: Sequence[Sequence[str] | str], k: int,
                  batch_size: int) -> list[KBestTags]:
    """The ``k`` best supertags per token (weights ``-log`` of the probabilities renormalised over
    the ``k``) and the best preterminal, from ``scorer``'s distributions. Sentences are token
    lists or strings (split on whitespace), batched by length; one :class:`KBestTags` per
    sentence, in input order (an empty sentence gets empty lists)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, len(scorer.supertags))
    tokenised = [s.split() if isinstance(s, str) else list(s) for s in sentences]
    results: list[KBestTags] = [KBestTags([], [], [], []) for _ in tokenised]
    order = sorted((i for i, w in enumerate(tokenised) if w), key=lambda i: len(tokenised[i]))
    for begin in range(0, len(order), batch_size):
        chunk = order[begin:begin + batch_size]
        tokens = [tokenised[i] for i in chunk]
        log_probs, pt_log_probs = scorer.batch_log_probs(tokens)
        top_lp, top_ids = log_probs.topk(k, dim=-1)  # [B, T, k]
        pt_ids = pt_log_probs.argmax(-1)  # [B, T]
        top_lp, top_ids, pt_ids = top_lp.cpu(), top_ids.cpu(), pt_ids.cpu()
        for b, i in enumerate(chunk):
            n = len(tokens[b])
            results[i] = KBestTags(
                tokens=tokens[b],
                candidates=candidates_from_topk(top_ids[b, :n], top_lp[b, :n], scorer.supertags),
                preterminals=[scorer.preterminals[p] for p in pt_ids[b, :n].tolist()],
                supertag_probs=[math.exp(lp) for lp in top_lp[b, :n, 0].tolist()],
            )
    return results

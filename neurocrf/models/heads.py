"""Output layers of the tagger: a CRF layer (any of the three) or the softmax head, built from a
plain config dict (:func:`build_head`), and the contract they share (:class:`TaggingHead`).

>>> head = build_head({"kind": "softmax"}, ["O", "B-X", "I-X"], "IOB2")
>>> isinstance(head, TaggingHead), isinstance(build_head({"kind": "precursor"}, ["O", "B-X"], "IOB2"), TaggingHead)
(True, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from neurocrf.structs import CRF_KINDS, ChainCRF, build_crf
from neurocrf.structs.engine import SEARCH_DTYPE
from neurocrf.structs.engine.semiring import NEG_INF, top_first

HEAD_KINDS = ("softmax", *CRF_KINDS)
_HEAD_KEYS = ("kind", "constrained", "dropout", "reduction")


@runtime_checkable
class TaggingHead(Protocol):
    """What the :class:`~neurocrf.models.tagger.Tagger` and :mod:`~neurocrf.models.prediction`
    call on their output layer (a ``torch.nn.Module``): the CRF layers of :mod:`neurocrf.structs`
    and :class:`SoftmaxHead` satisfy it.

    Shapes: ``emissions`` ``[B, T, L]`` (pair emissions ``[B, T, L + 1, L]`` for a head with
    ``accepts_pair_emissions``), ``mask`` ``[B, T]`` bool (the True positions of each row, in order,
    are the sentence), ``tags`` ``[B, T]`` ids (any value at padding).
    """

    accepts_pair_emissions: bool
    """Whether the head takes pair emissions (scores of tag pairs: observation-dependent transitions)."""

    def __call__(self, emissions: Tensor, tags: Tensor, mask: Tensor, reduction: str = "mean") -> Tensor:
        """Negative log-likelihood of ``tags``; ``reduction``: ``mean`` (over sentences), ``sum``,
        ``none`` (``[B]``) or ``token_mean``."""
        ...

    def log_partition(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """``[B]`` log partition function."""
        ...

    def window_log_partition(self, emissions: Tensor, mask: Tensor, rows: Tensor, starts: Tensor,
                             allowed: Tensor) -> Tensor:
        """``[J]`` log partition of row ``rows[j]`` with the tags at positions ``starts[j] ..``
        restricted to ``allowed[j]`` (bool ``[J, W, L]``): the span confidences."""
        ...

    def marginals(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """``[B, T, L]`` token posteriors, 0 at padding."""
        ...

    def decode(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """``[B, T]`` most probable tags, -1 at padding."""
        ...

    def nbest(self, emissions: Tensor, mask: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The ``k`` most probable tag sequences ``[B, k, T]`` (-1 padding; the first is
        :meth:`decode`'s) and their float64 log-probabilities ``[B, k]``, non-increasing (``-inf``
        where fewer than ``k`` exist)."""
        ...


class SoftmaxHead(nn.Module):
    """Independent per-token classification with the CRF layers' interface.

    The model ``p(y | x) = prod_t softmax(e_t)[y_t]`` is a chain without transitions, so the same
    quantities exist: ``log_partition`` is ``sum_t logsumexp(e_t)``, the marginals are the token
    softmax, decoding is the per-token argmax and the n best paths come from an exact beam (exact
    because the factors are independent). Complexity O(T L) (n-best: O(T k L log(k L))).
    """

    accepts_pair_emissions = False

    def forward(self, emissions: Tensor, tags: Tensor, mask: Tensor, reduction: str = "mean") -> Tensor:
        """Negative log-likelihood of ``tags`` ``[B, T]`` (padding any value) under ``emissions``
        ``[B, T, L]``; reduction ``mean`` (over sentences), ``sum``, ``none`` (``[B]``) or
        ``token_mean``."""
        log_probs = emissions.float().log_softmax(-1)
        picked = log_probs.gather(-1, tags.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [B, T]
        nll = -(picked * mask).sum(-1)  # [B]
        return _reduce(nll, mask, reduction)

    def log_partition(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """``[B]``: sum over real positions of ``logsumexp`` over tags (float64 for float64
        emissions, else float32)."""
        return (emissions.to(ChainCRF._compute_dtype(emissions)).logsumexp(-1) * mask).sum(-1)

    def window_log_partition(self, emissions: Tensor, mask: Tensor, rows: Tensor, starts: Tensor,
                             allowed: Tensor) -> Tensor:
        """``[J]`` :meth:`log_partition` of row ``rows[j]`` with the tags at positions
        ``starts[j] ..`` restricted to ``allowed[j]`` (bool ``[J, W, L]``), positions counted over
        the row's True mask positions (see ``ChainCRF.window_log_partition``)."""
        order, lengths, width = ChainCRF._compaction(mask)
        compact = ChainCRF._gather_positions(emissions.double(), order, width)  # [B, width, L]
        span = allowed.shape[1]
        positions = starts.unsqueeze(1) + torch.arange(span, device=emissions.device)  # [J, W]
        inside = positions < lengths[rows].unsqueeze(1)
        picked = compact[rows.unsqueeze(1), positions.clamp(max=max(width - 1, 0))]  # [J, W, L]
        lost = picked.logsumexp(-1) - picked.masked_fill(~allowed, NEG_INF).logsumexp(-1)
        full = (compact.logsumexp(-1) * ChainCRF._gather_positions(mask, order, width)).sum(-1)
        return full[rows] - (lost * inside).sum(-1)

    def marginals(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """``[B, T, L]`` token softmax, 0 at padding."""
        return emissions.to(ChainCRF._compute_dtype(emissions)).softmax(-1) * mask.unsqueeze(-1)

    def decode(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """``[B, T]`` argmax tags, -1 at padding."""
        return emissions.argmax(-1).masked_fill(~mask, -1)

    def nbest(self, emissions: Tensor, mask: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """``k`` best paths ``[B, k, T]`` (-1 padding) and their float64 log-probabilities
        ``[B, k]``, non-increasing (``-inf`` where fewer than ``k`` paths exist). The first path is
        :meth:`decode`'s; the beam runs in float64, in which long sentences keep their order
        (see :data:`~neurocrf.structs.engine.SEARCH_DTYPE`)."""
        log_probs = emissions.to(SEARCH_DTYPE).log_softmax(-1)  # [B, T, L]
        batch, length, num_tags = log_probs.shape
        # A padded position keeps every beam unchanged: label 0 with log-probability 0.
        keep = torch.full((num_tags,), NEG_INF, device=log_probs.device)
        keep[0] = 0.0
        log_probs = torch.where(mask.unsqueeze(-1), log_probs, keep)
        scores = log_probs.new_zeros(batch, 1)
        back_beams, back_labels = [], []
        for t in range(length):
            candidates = (scores.unsqueeze(-1) + log_probs[:, t].unsqueeze(1)).reshape(batch, -1)
            scores, flat = top_first(candidates, min(k, candidates.shape[1]))
            back_beams.append(flat // num_tags)
            back_labels.append(flat % num_tags)
        beams = scores.shape[1]
        paths = torch.full((batch, beams, length), -1, dtype=torch.long, device=log_probs.device)
        beam = torch.arange(beams, device=log_probs.device).expand(batch, beams)
        for t in range(length - 1, -1, -1):
            paths[:, :, t] = back_labels[t].gather(1, beam)
            beam = back_beams[t].gather(1, beam)
        paths = paths.masked_fill(~mask.unsqueeze(1), -1)
        if beams < k:
            paths = torch.cat([paths, paths.new_full((batch, k - beams, length), -1)], 1)
            scores = torch.cat([scores, scores.new_full((batch, k - beams), NEG_INF)], 1)
        return paths, scores


def _reduce(nll: Tensor, mask: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return nll.mean()
    if reduction == "sum":
        return nll.sum()
    if reduction == "none":
        return nll
    if reduction == "token_mean":
        return nll.sum() / mask.sum().clamp(min=1)
    raise ValueError(f"unknown reduction {reduction!r}; expected mean, sum, none or token_mean")


def build_head(config: Mapping[str, Any], tags: Sequence[str], scheme: str) -> TaggingHead:
    """The output layer named by ``config["kind"]``: a CRF layer (options other than ``kind``,
    ``constrained``, ``dropout``, ``reduction`` go to :func:`neurocrf.structs.build_crf`) or the
    softmax head."""
    kind = config.get("kind", "first_order")
    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; expected one of {', '.join(HEAD_KINDS)}")
    options = {key: value for key, value in config.items() if key not in _HEAD_KEYS}
    if kind == "softmax":
        if options:
            raise ValueError(f"softmax head takes no options, got {sorted(options)}")
        return SoftmaxHead()
    return build_crf(kind, list(tags), scheme, constrained=bool(config.get("constrained", True)), **options)

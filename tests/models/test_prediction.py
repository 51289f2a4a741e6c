"""Predictions against brute force: Viterbi path, token marginals, span confidences, n-best.

Every tag sequence of a short sentence is enumerated and scored with the head's own ``score`` /
``log_partition`` (for the softmax head: the product of token softmaxes), for all four heads.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from neurocrf.data.schemes import all_tags, get_spans
from neurocrf.models.heads import SoftmaxHead, build_head
from neurocrf.models.prediction import PredictedSpan, Prediction, build_predictions

HEADS = ["softmax", "first_order", "second_order", "precursor"]


@torch.no_grad()
def _path_log_probs(head, emissions: torch.Tensor, length: int,
                    num_tags: int) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """All tag sequences of ``length`` and their log-probabilities for one sentence ``[1, T, L]``."""
    paths = list(itertools.product(range(num_tags), repeat=length))
    tags = torch.tensor(paths, dtype=torch.long)
    em = emissions[:, :length].expand(len(paths), -1, -1)
    mask = torch.ones(len(paths), length, dtype=torch.bool)
    if isinstance(head, SoftmaxHead):
        log_probs = em.log_softmax(-1).gather(-1, tags.unsqueeze(-1)).squeeze(-1).sum(-1)
    else:
        log_probs = head.score(em, tags, mask) - head.log_partition(em, mask)
    return paths, log_probs


def _case(kind: str, scheme: str, seed: int):
    torch.manual_seed(seed)
    tags = all_tags(["X", "Y"], scheme)
    head = build_head({"kind": kind}, tags, scheme)
    with torch.no_grad():
        for param in head.parameters():  # random transitions, not the initial zeros
            param.normal_(0.0, 1.0)
    length = 5 if scheme == "IOB2" else 4
    emissions = 2.0 * torch.randn(2, length, len(tags))
    mask = torch.tensor([[True] * length, [True] * (length - 1) + [False]])
    return head, tags, emissions, mask


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "BIOES"])
@pytest.mark.parametrize("kind", HEADS)
def test_predictions_match_brute_force(kind: str, scheme: str) -> None:
    head, tags, emissions, mask = _case(kind, scheme, seed=HEADS.index(kind) + 7 * len(scheme))
    tokens = [[f"w{i}" for i in range(int(n))] for n in mask.sum(-1)]
    with torch.no_grad():
        predictions = build_predictions(head, emissions, mask, tokens, tags, scheme, nbest=4)
    for row, prediction in enumerate(predictions):
        n = len(tokens[row])
        paths, log_probs = _path_log_probs(head, emissions[row : row + 1], n, len(tags))
        probs = log_probs.exp()
        assert float(probs.sum()) == pytest.approx(1.0, abs=1e-4)
        assert len(prediction.tags) == len(prediction.confidences) == n

        best = paths[int(log_probs.argmax())]
        assert prediction.tags == [tags[t] for t in best]

        for t, tag in enumerate(prediction.tags):  # token confidence = marginal of the tag
            marginal = sum(float(p) for path, p in zip(paths, probs) if tags[path[t]] == tag)
            assert prediction.confidences[t] == pytest.approx(marginal, abs=1e-4)

        expected_spans = get_spans(prediction.tags, scheme)
        found = [(s.type, s.start, s.end) for s in prediction.spans]
        assert found == [(s.type, s.start, s.end) for s in expected_spans]
        for span in prediction.spans:
            # the probability that the output holds this span, summed over every encoding of it
            present = sum(
                float(p)
                for path, p in zip(paths, probs)
                if (span.type, span.start, span.end) in
                {(s.type, s.start, s.end) for s in get_spans([tags[t] for t in path], scheme)}
            )
            assert span.confidence == pytest.approx(present, abs=1e-4)
            viterbi = float(probs.max())
            assert span.confidence >= viterbi - 1e-6
            for t in range(span.start, span.end):  # at most the probability of the type at each position
                typed = sum(float(p) for path, p in zip(paths, probs) if tags[path[t]].endswith(f"-{span.type}"))
                assert span.confidence <= typed + 1e-6

        top = torch.topk(probs, 4)
        assert [p.probability for p in prediction.nbest] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert prediction.nbest[0].tags == prediction.tags
        for path in prediction.nbest:  # each listed path has the probability stated
            ids = tuple(tags.index(t) for t in path.tags)
            assert float(probs[paths.index(ids)]) == pytest.approx(path.probability, abs=1e-4)


def test_softmax_nbest_with_fewer_paths_than_k() -> None:
    head = SoftmaxHead()
    emissions = torch.randn(1, 2, 2)
    mask = torch.tensor([[True, False]])  # one token, two tags: 2 paths exist
    paths, scores = head.nbest(emissions, mask, 5)
    assert paths.shape == (1, 5, 2) and scores.shape == (1, 5)
    assert torch.isfinite(scores[0, :2]).all() and torch.isinf(scores[0, 2:]).all()
    assert (paths[0, :, 1] == -1).all()
    assert float(scores[0, :2].exp().sum()) == pytest.approx(1.0, abs=1e-5)


def test_softmax_loss_is_token_cross_entropy() -> None:
    head = SoftmaxHead()
    emissions = torch.randn(2, 3, 4)
    tags = torch.tensor([[1, 2, 3], [0, 1, -1]])
    mask = tags >= 0
    expected = torch.nn.functional.cross_entropy(emissions[mask], tags[mask], reduction="sum")
    assert float(head(emissions, tags, mask, reduction="sum")) == pytest.approx(float(expected), rel=1e-5)
    assert float(head(emissions, tags, mask, reduction="mean")) == pytest.approx(float(expected) / 2, rel=1e-5)
    assert float(head(emissions, tags, mask, reduction="token_mean")) == pytest.approx(float(expected) / 5, rel=1e-5)
    assert head(emissions, tags, mask, reduction="none").shape == (2,)
    assert (head.decode(emissions, mask)[1, 2] == -1).item()


def test_iob1_span_confidence_sums_its_encodings() -> None:
    """An IOB1 span at [1, 2) is B-X (after any tag) or I-X after no open X span; never continued."""
    head, scheme = SoftmaxHead(), "IOB1"
    tags = all_tags(["X"], scheme)  # O, B-X, I-X
    emissions = torch.tensor([[[3.0, 0.0, 0.5], [0.0, 1.0, 3.0], [3.0, 0.0, 0.0]]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    prediction = build_predictions(head, emissions, mask, [["a", "b", "c"]], tags, scheme)[0]
    assert prediction.tags == ["O", "I-X", "O"]
    probs = emissions[0].softmax(-1)
    opened_by_inside = probs[0, 0] * probs[1, 2]  # p(y0 not in {B-X, I-X}) * p(y1 = I-X)
    expected = float((probs[1, 1] + opened_by_inside) * (1 - probs[2, 2]))  # ... * p(y2 != I-X)
    assert prediction.spans[0].confidence == pytest.approx(expected, abs=1e-5)


def test_iob1_span_confidence_counts_the_b_encoding_of_a_crf() -> None:
    """Constrained IOB1 CRF, Viterbi path I-X B-X O: the second span is also O I-X O. Counting one
    encoding gave 0.665 where the probability of the span is 0.964 (enumerated here)."""
    tags = all_tags(["X"], "IOB1")
    head = build_head({"kind": "first_order"}, tags, "IOB1")
    with torch.no_grad():
        for param in head.parameters():
            param.zero_()
        head.transitions[2, 2] = -6.0  # I-X -> I-X rare: adjacent X tokens are separate spans
    emissions = torch.tensor([[[0.0, 0.0, 0.8], [-2.0, 4.0, 4.0], [3.0, 0.0, 0.0]]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    prediction = build_predictions(head, emissions, mask, [["a", "b", "c"]], tags, "IOB1")[0]
    assert prediction.tags == ["I-X", "B-X", "O"]
    paths, log_probs = _path_log_probs(head, emissions, 3, len(tags))
    probs = log_probs.exp()
    present = sum(float(p) for path, p in zip(paths, probs)
                  if ("X", 1, 2) in {(s.type, s.start, s.end) for s in get_spans([tags[t] for t in path], "IOB1")})
    one_encoding = sum(float(p) for path, p in zip(paths, probs) if path[1] == 1 and path[2] != 2)
    assert present == pytest.approx(0.964, abs=1e-3) and one_encoding == pytest.approx(0.665, abs=1e-3)
    assert prediction.spans[1].confidence == pytest.approx(present, abs=1e-5)


def test_prediction_conversion_and_dict() -> None:
    prediction = Prediction(
        tokens=["Ann", "Lee", "ran"],
        tags=["B-PER", "E-PER", "O"],
        scheme="BIOES",
        spans=[PredictedSpan("PER", 0, 2, 0.9)],
        confidences=[0.95, 0.9, 0.99],
    )
    assert prediction.tags_in("IOB2") == ["B-PER", "I-PER", "O"]
    record = prediction.to_dict("IOB1")
    assert record["tags"] == ["I-PER", "I-PER", "O"] and record["scheme"] == "IOB1"
    assert record["spans"] == [{"type": "PER", "start": 0, "end": 2, "confidence": 0.9}]
    assert "nbest" not in record

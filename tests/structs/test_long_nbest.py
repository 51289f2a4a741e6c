"""n-best lists and confidences on a 10,000-token sentence with float32 emissions.

Path scores of such a sentence reach magnitudes of 1e4, where float32 numbers are 1e-3 apart:
the k best paths (which differ from the Viterbi path in a position or two) then tie or swap. The
lists must equal the float64 ones: the Viterbi path first, exact log-probabilities, non-increasing.
Oracles that do not use the k-best scan: the float64 score of every listed path from the layer's
``score``, and the paths that differ from the Viterbi path at one position, a subset of all
paths, so the j-th listed log-probability is at least the j-th best among them.
"""

from __future__ import annotations

import copy

import pytest
import torch

from neurocrf.models.heads import SoftmaxHead, build_head
from neurocrf.models.prediction import build_predictions

TAGS = ["O", "B-X", "I-X"]
LONG = 10_000
K = 5
KINDS = ["first_order", "second_order", "precursor", "softmax"]


def _head(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    head = build_head({"kind": kind}, TAGS, "IOB2")
    with torch.no_grad():
        for param in head.parameters():  # random transitions, not the initial zeros
            param.normal_(0.0, 1.0)
    return head


def _emissions() -> torch.Tensor:
    """float32 ``[1, LONG, 3]``."""
    return 3.0 * torch.randn(1, LONG, len(TAGS), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _exact_log_probs(head: torch.nn.Module, emissions: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
    """float64 ``log p(path)`` ``[k]`` of paths ``[k, T]`` of the one row of ``emissions``."""
    em = emissions.double().expand(paths.shape[0], -1, -1)
    if isinstance(head, SoftmaxHead):
        return em.log_softmax(-1).gather(-1, paths.unsqueeze(-1)).squeeze(-1).sum(-1)
    exact = copy.deepcopy(head).double()
    return exact.score(em, paths) - exact.log_partition(em)


@torch.no_grad()
def _one_change_log_probs(head: torch.nn.Module, emissions: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """float64 log-probabilities, best first, of the Viterbi path ``best`` ``[T]`` and of every
    path that differs from it at one position (first-order and softmax heads)."""
    em = emissions[0].double()
    positions = torch.arange(LONG)
    if isinstance(head, SoftmaxHead):
        terms = em.log_softmax(-1)  # [T, L]
    else:  # the scores of position t that depend on its tag: emission, move in, move out
        start, moves, end = head._potentials(torch.float64)
        into = torch.cat([start.unsqueeze(0), moves[best[:-1]]])  # [T, L]
        out = torch.cat([moves[:, best[1:]].t(), end.unsqueeze(0)])  # [T, L]
        terms = em + into + out
    change = terms - terms[positions, best].unsqueeze(1)
    change[positions, best] = float("-inf")  # the path itself, counted once below
    base = _exact_log_probs(head, emissions, best.unsqueeze(0))
    return torch.cat([base, base + change.flatten()]).sort(descending=True).values


@pytest.mark.parametrize("kind", KINDS)
def test_nbest_on_10000_tokens_is_exact(kind: str) -> None:
    head = _head(kind)
    emissions = _emissions()
    mask = torch.ones(1, LONG, dtype=torch.bool)
    with torch.no_grad():
        paths, log_probs = head.nbest(emissions, mask, K)
        viterbi = head.decode(emissions, mask)
    assert log_probs.dtype == torch.float64
    assert torch.equal(paths[0, 0], viterbi[0])  # the Viterbi path first
    assert len({tuple(p.tolist()) for p in paths[0]}) == K  # k distinct paths
    values = log_probs[0]
    assert bool((values[1:] <= values[:-1]).all()), values  # non-increasing
    torch.testing.assert_close(values, _exact_log_probs(head, emissions, paths[0]), rtol=0, atol=1e-8)
    # float64 emissions give the same list
    with torch.no_grad():
        paths64, log_probs64 = head.nbest(emissions.double(), mask, K)
    assert torch.equal(paths64, paths)
    torch.testing.assert_close(log_probs64, log_probs, rtol=0, atol=1e-8)
    if kind in ("first_order", "softmax"):
        variants = _one_change_log_probs(head, emissions, viterbi[0])
        assert float(values[0]) == pytest.approx(float(variants[0]), abs=1e-8)  # no change beats the Viterbi path
        assert bool((values >= variants[:K] - 1e-8).all()), (values, variants[:K])


@pytest.mark.parametrize("kind", ["first_order", "softmax"])
def test_predictions_on_10000_tokens_are_exact(kind: str) -> None:
    """Through the prediction layer (``Tagger.predict``, ``neurocrf-predict nbest=``): the
    predicted tags head the n-best list, whose probabilities are the float64 ones, and each
    single-token span's confidence is its float64 probability (CRF: P(B-X at t, no I-X at t + 1);
    its constraints forbid opening a span by I-X)."""
    head = _head(kind)
    emissions = _emissions()
    mask = torch.ones(1, LONG, dtype=torch.bool)
    tokens = [[f"w{i}" for i in range(LONG)]]
    (prediction,) = build_predictions(head, emissions, mask, tokens, TAGS, "IOB2", nbest=K)
    assert prediction.nbest[0].tags == prediction.tags
    log_probs = [p.log_probability for p in prediction.nbest]
    assert log_probs == sorted(log_probs, reverse=True)
    ids = torch.tensor([[TAGS.index(t) for t in p.tags] for p in prediction.nbest])
    assert log_probs == pytest.approx(_exact_log_probs(head, emissions, ids).tolist(), rel=0, abs=1e-8)
    assert [p.probability for p in prediction.nbest] == [0.0] * K  # exp(-1e3) underflows
    single = [s for s in prediction.spans if s.end - s.start == 1 and s.end < LONG]
    assert len(single) > 100
    with torch.no_grad():
        if isinstance(head, SoftmaxHead):
            marg = emissions[0].double().softmax(-1)
            # opened by B-X, or by I-X first or after O (no constraints here)
            opened = marg[:, 1] + torch.cat([marg.new_ones(1), marg[:-1, 0]]) * marg[:, 2]
            expected = [float(opened[s.start] * (1 - marg[s.end, 2])) for s in single]
        else:
            dist = copy.deepcopy(head).double().distribution(emissions.double(), mask)
            nodes, edges = dist.marginals[0], dist.edge_marginals[0]
            expected = [float(nodes[s.start, 1] - edges[s.end, 1, 2]) for s in single]
    assert [s.confidence for s in single] == pytest.approx(expected, rel=1e-7, abs=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_tied_paths_put_the_decoded_path_first(kind: str) -> None:
    """Zero scores tie every allowed path: ties resolve as in Viterbi (lower index first), so the
    decoded path heads the n-best list, the distribution's top-k and the exported decoder agree."""
    head = build_head({"kind": kind}, TAGS, "IOB2")
    with torch.no_grad():
        for param in head.parameters():
            param.zero_()
    emissions = torch.zeros(2, 7, len(TAGS))
    mask = torch.tensor([[True] * 7, [True, False, True, True, False, True, False]])
    with torch.no_grad():
        decoded = head.decode(emissions, mask)
        for k in (1, 4, 40):
            paths, log_probs = head.nbest(emissions, mask, k)
            assert torch.equal(paths[:, 0], decoded)
            for row in log_probs:
                assert torch.allclose(row[torch.isfinite(row)], row[0])  # all tied
    if kind != "softmax":
        assert torch.equal(head.decoder()(emissions, mask), decoded)
        assert torch.equal(head.distribution(emissions, mask).topk(3)[0][:, 0], decoded)

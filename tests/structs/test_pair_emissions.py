"""Observation-dependent transitions: the first-order CRF on pair emissions ``[B, T, L + 1, L]``,
every quantity against brute-force enumeration written from the model's definition.

``score(y) = start[y_1] + P[1, L, y_1] + sum_{t>1} (P[t, y_{t-1}, y_t] + trans[y_{t-1}, y_t]) + end[y_T]``
over each row's True mask positions (holes, a masked first position, rows of length 0 and 1).
"""

from __future__ import annotations

import pytest
import torch

from neurocrf.structs import LinearChainCRF, SecondOrderCRF, build_crf, pair_emissions
from neurocrf.structs.engine.pytorch import exp_scan
from tests.helpers.enumeration import (  # noqa: F401  (kernel: every test on both scan kernels)
    BIOES_TAGS,
    IOB2_TAGS,
    all_sequences,
    kernel,
    make_layer,
    pair_reference_scores,
    random_mask,
)
from tests.helpers.scans import assert_exp_scan_equals_log_scan

NEG_INF = float("-inf")
CASES = [(IOB2_TAGS, "IOB2", False), (IOB2_TAGS, "IOB2", True), (BIOES_TAGS, "BIOES", True)]


@pytest.fixture(params=CASES, ids=lambda c: f"{c[1]}-{'c' if c[2] else 'u'}")
def setup(request):
    tags, scheme, constrained = request.param
    crf, constraints = make_layer("first_order", tags, scheme, constrained)
    generator = torch.Generator().manual_seed(len(tags) + constrained)
    batch, seq_len, n = 5, 6, len(tags)
    pairs = torch.randn(batch, seq_len, n + 1, n, generator=generator, dtype=torch.float64) * 2
    mask = random_mask(batch, seq_len, generator)
    return crf, constraints, pairs, mask, generator


def enumerate_row(crf, constraints, pairs, mask, row):
    p = pairs[row][mask[row]]
    ys = all_sequences(crf.num_tags, p.shape[0])
    return ys, pair_reference_scores(crf, p, ys, constraints)


def test_log_partition_and_nll(setup):
    crf, constraints, pairs, mask, generator = setup
    log_z = crf.log_partition(pairs, mask)
    assert log_z[0] == 0
    for row in range(pairs.shape[0]):
        ys, scores = enumerate_row(crf, constraints, pairs, mask, row)
        torch.testing.assert_close(log_z[row], torch.logsumexp(scores, 0))
        valid = torch.isfinite(scores).nonzero().flatten()
        pick = ys[valid[torch.randint(len(valid), (1,), generator=generator)]][0]
        tags = torch.zeros(1, pairs.shape[1], dtype=torch.long)
        tags[0, mask[row]] = pick
        expected = pair_reference_scores(crf, pairs[row][mask[row]], pick[None], constraints)[0]
        torch.testing.assert_close(crf.score(pairs[row:row + 1], tags, mask[row:row + 1])[0], expected)
        nll = crf(pairs[row:row + 1], tags, mask[row:row + 1], reduction="none")[0]
        torch.testing.assert_close(nll, torch.logsumexp(scores, 0) - expected)


def test_decode_and_nbest(setup):
    crf, constraints, pairs, mask, _ = setup
    best = crf.decode(pairs, mask)
    paths, log_probs = crf.nbest(pairs, mask, k=4)
    for row in range(pairs.shape[0]):
        ys, scores = enumerate_row(crf, constraints, pairs, mask, row)
        log_z = torch.logsumexp(scores, 0)
        ref = pair_reference_scores(crf, pairs[row][mask[row]], best[row][mask[row]][None], constraints)[0]
        torch.testing.assert_close(ref, scores.max())
        expected = scores[torch.isfinite(scores)].sort(descending=True).values[:4] - log_z
        torch.testing.assert_close(log_probs[row, : len(expected)], expected)
        for rank in range(len(expected)):
            path = paths[row, rank][mask[row]]
            ref = pair_reference_scores(crf, pairs[row][mask[row]], path[None], constraints)[0]
            torch.testing.assert_close(ref - log_z, log_probs[row, rank])
    assert bool((best[~mask] == -1).all())


def test_marginals_and_partial_labels(setup):
    crf, constraints, pairs, mask, generator = setup
    marg = crf.marginals(pairs, mask)
    assert marg.shape == pairs.shape[:2] + (crf.num_tags,)
    allowed = torch.rand(*marg.shape, generator=generator) < 0.6
    allowed[..., 0] = True
    nll = crf(pairs, allowed, mask, reduction="none")
    for row in range(pairs.shape[0]):
        ys, scores = enumerate_row(crf, constraints, pairs, mask, row)
        probs = torch.softmax(scores, 0)
        expected = torch.zeros(ys.shape[1], crf.num_tags, dtype=torch.float64)
        admitted = torch.ones(ys.shape[0], dtype=torch.bool)
        for t in range(ys.shape[1]):
            expected[t].index_add_(0, ys[:, t], probs)
            admitted &= allowed[row][mask[row]][t, ys[:, t]]
        torch.testing.assert_close(marg[row][mask[row]], expected)
        partial = torch.logsumexp(scores, 0) - torch.logsumexp(scores.masked_fill(~admitted, NEG_INF), 0)
        torch.testing.assert_close(nll[row], partial)


def test_window_log_partition(setup):
    crf, constraints, pairs, mask, generator = setup
    rows, starts, windows, expected = [], [], [], []
    for row in range(pairs.shape[0]):
        n = int(mask[row].sum())
        ys, scores = enumerate_row(crf, constraints, pairs, mask, row)
        for start in range(n):
            allowed = torch.rand(2, crf.num_tags, generator=generator) < 0.5
            allowed[:, 0] = True
            allowed[max(0, n - start):] = True
            admitted = torch.ones(ys.shape[0], dtype=torch.bool)
            for i in range(min(2, n - start)):
                admitted &= allowed[i, ys[:, start + i]]
            rows.append(row), starts.append(start), windows.append(allowed)
            expected.append(torch.logsumexp(scores.masked_fill(~admitted, NEG_INF), 0))
    got = crf.window_log_partition(pairs, mask, torch.tensor(rows), torch.tensor(starts), torch.stack(windows))
    torch.testing.assert_close(got, torch.stack(expected))


def test_gradients_match_autograd_through_enumeration(setup):
    """d log Z / d pair emissions = the edge marginals (and P[first, L, .] the first tag's):
    the hand-written backward pass against autograd through the enumeration, per row."""
    crf, constraints, pairs, mask, _ = setup
    for row in range(1, pairs.shape[0]):
        fast_leaf = pairs[row:row + 1].clone().requires_grad_(True)
        crf.zero_grad()
        crf.log_partition(fast_leaf, mask[row:row + 1]).sum().backward()
        fast_params = {name: p.grad.clone() for name, p in crf.named_parameters()}
        slow_leaf = pairs[row:row + 1].clone().requires_grad_(True)
        crf.zero_grad()
        p = slow_leaf[0][mask[row]]
        ys = all_sequences(crf.num_tags, p.shape[0])
        torch.logsumexp(pair_reference_scores(crf, p, ys, constraints), 0).backward()
        torch.testing.assert_close(fast_leaf.grad, slow_leaf.grad)
        for name, param in crf.named_parameters():
            expected = torch.zeros_like(param) if param.grad is None else param.grad  # unused when length < 2
            torch.testing.assert_close(fast_params[name], expected, msg=f"gradient of {name}")


def test_pair_emissions_helper_reduces_to_plain_emissions():
    """Zero transition scores give the plain first-order CRF; row L is the tag emission itself."""
    crf, _ = make_layer("first_order", BIOES_TAGS, "BIOES", True)
    emissions = torch.randn(3, 5, len(BIOES_TAGS), dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)
    pairs = pair_emissions(emissions, torch.zeros(3, 5, len(BIOES_TAGS), len(BIOES_TAGS), dtype=torch.float64))
    torch.testing.assert_close(crf.log_partition(pairs, mask), crf.log_partition(emissions, mask))
    assert torch.equal(crf.decode(pairs, mask), crf.decode(emissions, mask))
    torch.testing.assert_close(pairs[:, :, -1], emissions)
    with pytest.raises(ValueError, match="transition scores"):
        pair_emissions(emissions, torch.zeros(3, 5, 2, 2))


def test_parallel_scan_takes_pair_emissions():
    crf, _ = make_layer("first_order", IOB2_TAGS, "IOB2", True)
    pairs = torch.randn(2, 7, len(IOB2_TAGS) + 1, len(IOB2_TAGS), dtype=torch.float64)
    mask = torch.tensor([[1] * 7, [1, 1, 1, 0, 1, 0, 0]], dtype=torch.bool)
    sequential = crf.log_partition(pairs, mask)
    crf.scan = "parallel"
    torch.testing.assert_close(crf.log_partition(pairs, mask), sequential)


def test_other_layers_refuse_pair_emissions():
    pairs = torch.randn(2, 3, 4, 3)
    for crf in (SecondOrderCRF(3), build_crf("precursor", ["O", "B-A", "I-A"], "IOB2")):
        with pytest.raises(ValueError, match="pair emissions"):
            crf.log_partition(pairs)
    with pytest.raises(ValueError, match=r"num_tags \+ 1"):
        LinearChainCRF(3).log_partition(torch.randn(2, 3, 3, 3))


@pytest.mark.parametrize("budget", [30.0, 300.0])
def test_blocked_exp_scan_takes_pair_emissions(monkeypatch, budget):
    """The GPU kernel (blocks of positions, forced onto the CPU here) against the log-space one."""
    monkeypatch.setattr(exp_scan, "_BLOCKED_DEVICES", {"cpu", "cuda"})
    crf, _ = make_layer("first_order", BIOES_TAGS, "BIOES", True)
    generator = torch.Generator().manual_seed(5)
    pairs = torch.randn(4, 41, len(BIOES_TAGS) + 1, len(BIOES_TAGS), generator=generator, dtype=torch.float64)
    mask = torch.rand(4, 41, generator=generator) < 0.9
    assert_exp_scan_equals_log_scan(monkeypatch, crf, pairs, mask, budget)


def test_torch_struct_on_the_same_edge_potentials_agrees():
    """An independent oracle, and the fairness of scripts/bench_pair_emissions.py: torch-struct's
    LinearChainCRF on the edge potentials the benchmark builds gives the same log Z and NLL."""
    torch_struct = pytest.importorskip("torch_struct")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_pair_emissions.py"
    spec = importlib.util.spec_from_file_location("bench_pair_emissions", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    crf, _ = make_layer("first_order", IOB2_TAGS, "IOB2", False)
    generator = torch.Generator().manual_seed(9)
    batch, seq_len, n = 3, 6, len(IOB2_TAGS)
    pairs = torch.randn(batch, seq_len, n + 1, n, generator=generator, dtype=torch.float64)
    tags = torch.randint(n, (batch, seq_len), generator=generator)
    lengths = torch.full((batch,), seq_len)
    dist = torch_struct.LinearChainCRF(bench.edge_potentials(crf, pairs), lengths=lengths)
    torch.testing.assert_close(dist.partition, crf.log_partition(pairs))
    nll = -dist.log_prob(dist.to_event(tags, n, lengths=lengths))
    torch.testing.assert_close(nll, crf(pairs, tags, reduction="none"))

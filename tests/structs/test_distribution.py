"""``crf.distribution``: every quantity of every layer against brute-force enumeration of all tag
sequences (float64, masks with holes, constraints, both scans), torch-struct as a second oracle,
sampling by a chi-square test, and exact first and second derivatives."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from neurocrf.structs import ChainDistribution, LinearChainCRF, SecondOrderCRF, pair_emissions
from neurocrf.structs.engine.chain import path_score
from tests.helpers.enumeration import (
    BIOES_TAGS,
    IOB2_TAGS,
    enumerate_row,
    make_layer,
    pair_reference_scores,
    random_mask,
)

NEG_INF = float("-inf")
CASES = [
    ("first_order", IOB2_TAGS[:3], "IOB2", False, {}),
    ("first_order", IOB2_TAGS, "IOB2", True, {}),
    ("second_order", IOB2_TAGS, "IOB2", True, {}),
    ("precursor", IOB2_TAGS, "IOB2", True, {"memory": "tag"}),
    ("precursor", BIOES_TAGS, "BIOES", True, {"memory": "type", "state_bias": True}),
]
CASE_IDS = [f"{c[0]}-{c[2]}-{'c' if c[3] else 'u'}" + "".join(f"-{v}" for v in c[4].values()) for c in CASES]


def build(case, scan: str, seed: int):
    kind, tags, scheme, constrained, options = case
    torch.manual_seed(seed)
    return make_layer(kind, tags, scheme, constrained, scan=scan, **options)


def reference(crf, constraints, emissions, mask, row):
    """Enumerated sequences, their scores and log-probabilities, node and edge marginals, entropy."""
    ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
    log_z = torch.logsumexp(scores, 0)
    log_p = scores - log_z if torch.isfinite(log_z) else torch.full_like(scores, NEG_INF)
    probs = log_p.exp()
    n, num_tags = ys.shape[1], crf.num_tags
    nodes = torch.zeros(n, num_tags, dtype=torch.float64)
    edges = torch.zeros(n, num_tags, num_tags, dtype=torch.float64)
    for t in range(n):
        nodes[t].index_add_(0, ys[:, t], probs)
        if t:
            edges[t].index_put_((ys[:, t - 1], ys[:, t]), probs, accumulate=True)
    entropy = -(probs * log_p.masked_fill(probs == 0, 0.0)).sum()
    return ys, scores, log_z, log_p, nodes, edges, entropy


def sample_inputs(crf, seed: int, batch: int = 5, seq_len: int = 6):
    generator = torch.Generator().manual_seed(seed)
    emissions = torch.randn(batch, seq_len, crf.num_tags, generator=generator, dtype=torch.float64) * 2
    mask = random_mask(batch, seq_len, generator)
    mask[3] = True  # full length
    mask[-1] = True
    mask[-1, 2] = False  # a hole
    return emissions, mask


def full_tags(ys: torch.Tensor, mask_row: torch.Tensor) -> torch.Tensor:
    """Sequences ``[N, n]`` over a row's True positions -> ``[N, seq_len]`` with -1 elsewhere."""
    out = torch.full((ys.shape[0], mask_row.shape[0]), -1, dtype=torch.long)
    out[:, mask_row] = ys
    return out


@pytest.mark.parametrize("scan", ["sequential", "parallel"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_every_quantity_matches_enumeration(case, scan):
    crf, constraints = build(case, scan, seed=1)
    emissions, mask = sample_inputs(crf, seed=len(case[1]))
    q_crf, _ = build(case, scan, seed=2)
    q_emissions = emissions + torch.randn_like(emissions)
    dist, other = crf.distribution(emissions, mask), q_crf.distribution(q_emissions, mask)
    batch, seq_len = mask.shape
    assert isinstance(dist, ChainDistribution)
    assert dist.marginals.shape == (batch, seq_len, crf.num_tags)
    assert dist.edge_marginals.shape == (batch, seq_len, crf.num_tags, crf.num_tags)
    tags_k, log_probs_k = dist.topk(4)
    samples = dist.sample(50, generator=torch.Generator().manual_seed(0))
    cross, kl, entropy = dist.cross_entropy(other), dist.kl(other), dist.entropy()
    for row in range(batch):
        ys, scores, log_z, log_p, nodes, edges, ent = reference(crf, constraints, emissions, mask, row)
        _, q_scores, q_log_z, q_log_p, *_ = reference(q_crf, constraints, q_emissions, mask, row)
        torch.testing.assert_close(dist.log_partition[row], log_z)
        torch.testing.assert_close(dist.marginals[row][mask[row]], nodes)
        torch.testing.assert_close(dist.edge_marginals[row][mask[row]], edges)
        assert not dist.marginals[row][~mask[row]].any() and not dist.edge_marginals[row][~mask[row]].any()
        torch.testing.assert_close(entropy[row], ent)
        probs = log_p.exp()
        expected_cross = -(probs * q_log_p.masked_fill(probs == 0, 0.0)).sum()
        torch.testing.assert_close(cross[row], expected_cross)
        torch.testing.assert_close(kl[row], expected_cross - ent)
        # log_prob of every sequence of the row at once ([N, B, T], the other rows' tags arbitrary)
        every = torch.zeros(ys.shape[0], batch, seq_len, dtype=torch.long)
        every[:, row] = full_tags(ys, mask[row])
        torch.testing.assert_close(dist.log_prob(every)[:, row], log_p)
        # argmax and top-k: the best sequences and their log-probabilities
        best = log_p.sort(descending=True).values
        torch.testing.assert_close(log_p[(full_tags(ys, mask[row]) == dist.argmax[row]).all(1)][0], best[0])
        finite = int(torch.isfinite(best[:4]).sum())
        torch.testing.assert_close(log_probs_k[row, :finite], best[:finite])
        assert torch.isneginf(log_probs_k[row, finite:]).all() and (tags_k[row, finite:] == -1).all()
        for rank in range(finite):
            match = (full_tags(ys, mask[row]) == tags_k[row, rank]).all(1)
            torch.testing.assert_close(log_p[match][0], log_probs_k[row, rank])
        # samples: -1 at masked positions, only sequences of positive probability
        assert (samples[:, row, ~mask[row]] == -1).all()
        drawn = (samples[:, row, mask[row]].unsqueeze(1) == ys.unsqueeze(0)).all(-1)  # [50, N]
        assert (drawn.sum(1) == 1).all() and torch.isfinite(log_p[drawn.nonzero()[:, 1]]).all()
    # the layer methods agree with the distribution
    torch.testing.assert_close(-dist.log_prob(samples[0].clamp(min=0)),
                               crf(emissions, samples[0], mask, reduction="none"))
    torch.testing.assert_close(dist.marginals, crf.marginals(emissions, mask))
    torch.testing.assert_close(dist.log_partition, crf.log_partition(emissions, mask))


@pytest.mark.parametrize("case", CASES[1:], ids=CASE_IDS[1:])
def test_state_paths_and_tag_paths_are_in_bijection(case):
    """Every state path of positive weight maps to a distinct tag path with the same score: the
    sums over state paths behind entropy and KL are sums over tag sequences."""
    crf, constraints = build(case, "sequential", seed=3)
    length = 4 if crf.num_states() <= 9 else 3
    emissions = torch.randn(1, length, crf.num_tags, dtype=torch.float64)
    state_emissions = crf._state_emissions(emissions)
    states = torch.tensor(list(itertools.product(range(crf.num_states()), repeat=length)))
    # the engine reads one new component per move: (a, b) -> (b, c) for pair states
    size, order = crf._potentials(torch.float64)[1].shape[-1], len(crf._state_shape())
    states = states[(states[:, 1:] // size == states[:, :-1] % size ** (order - 1)).all(1)]
    with torch.no_grad():
        batch_emissions = state_emissions.expand(len(states), *state_emissions.shape[1:])
        lengths = torch.full((len(states),), length)
        scores = path_score(*crf._potentials(torch.float64), batch_emissions, states, lengths)
    kept = torch.isfinite(scores)
    tags = crf.state_labels[states[kept]]
    assert len(set(map(tuple, tags.tolist()))) == int(kept.sum())  # injective
    mask = torch.ones(1, length, dtype=torch.bool)
    ys, tag_scores = enumerate_row(crf, constraints, emissions, mask, 0)
    assert int(torch.isfinite(tag_scores).sum()) == int(kept.sum())  # onto the valid tag paths
    lookup = {tuple(y): s for y, s in zip(ys.tolist(), tag_scores.tolist())}
    expected = torch.tensor([lookup[tuple(t)] for t in tags.tolist()], dtype=torch.float64)
    torch.testing.assert_close(scores[kept], expected)


def test_pair_emissions_match_enumeration():
    crf, constraints = make_layer("first_order", IOB2_TAGS, "IOB2", True)
    generator = torch.Generator().manual_seed(4)
    emissions = torch.randn(4, 5, 5, generator=generator, dtype=torch.float64)
    pairs = pair_emissions(emissions, torch.randn(4, 5, 5, 5, generator=generator, dtype=torch.float64))
    mask = random_mask(4, 5, generator)
    dist = crf.distribution(pairs, mask)
    other = crf.distribution(emissions, mask)
    for row in range(4):
        ys = enumerate_row(crf, constraints, emissions, mask, row)[0]
        scores = pair_reference_scores(crf, pairs[row][mask[row]], ys, constraints)
        log_p = scores - torch.logsumexp(scores, 0)
        probs = log_p.exp()
        edges = torch.zeros(ys.shape[1], 5, 5, dtype=torch.float64)
        for t in range(1, ys.shape[1]):
            edges[t].index_put_((ys[:, t - 1], ys[:, t]), probs, accumulate=True)
        torch.testing.assert_close(dist.edge_marginals[row][mask[row]], edges)
        torch.testing.assert_close(dist.entropy()[row], -(probs * log_p.masked_fill(probs == 0, 0)).sum())
        q_log_p = enumerate_row(crf, constraints, emissions, mask, row)[1]
        q_log_p = q_log_p - torch.logsumexp(q_log_p, 0)
        torch.testing.assert_close(dist.kl(other)[row], (probs * (log_p - q_log_p)).nan_to_num(0.0).sum())


@pytest.mark.filterwarnings("ignore:.*arg_constraints")
def test_matches_torch_struct():
    torch_struct = pytest.importorskip("torch_struct")
    num_tags, batch, seq_len = 4, 3, 5
    lengths = torch.tensor([5, 2, 4])
    mask = torch.arange(seq_len) < lengths[:, None]
    layers = [LinearChainCRF(num_tags).double() for _ in range(2)]
    dists, peers = [], []
    for crf in layers:
        with torch.no_grad():
            for param in crf.parameters():
                param.normal_()
        emissions = torch.randn(batch, seq_len, num_tags, dtype=torch.float64) * 2
        # torch-struct edge potentials [B, N - 1, C_next, C_prev] with start, emissions and end folded in
        edges = crf.transitions.detach().t().expand(batch, seq_len - 1, num_tags, num_tags).clone()
        edges += emissions[:, 1:, :, None]
        edges[:, 0] += (crf.start_transitions.detach() + emissions[:, 0])[:, None, :]
        for row, length in enumerate(lengths.tolist()):
            edges[row, length - 2] += crf.end_transitions.detach()[:, None]
        dists.append(crf.distribution(emissions, mask))
        peers.append(torch_struct.LinearChainCRF(edges, lengths=lengths))
    p, q = dists
    torch.testing.assert_close(p.entropy(), peers[0].entropy)
    torch.testing.assert_close(p.kl(q), peers[0].kl(peers[1]))
    torch.testing.assert_close(p.cross_entropy(q), peers[0].cross_entropy(peers[1]))
    peer_edges = peers[0].marginals  # [B, N - 1, C_next, C_prev]
    torch.testing.assert_close(p.edge_marginals[:, 1:], peer_edges.transpose(-1, -2))
    node = torch.cat([peer_edges[:, :1].sum(-2), peer_edges.sum(-1)], dim=1) * mask[..., None]
    torch.testing.assert_close(p.marginals, node)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs`` (cells with an expected
    count below 5 pooled into one)."""
    expected = probs * counts.sum()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum(0, keepdim=True)])
    expected = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    keep = expected > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic / 2))


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4]], ids=[CASE_IDS[1], CASE_IDS[2], CASE_IDS[4]])
def test_samples_follow_the_exact_distribution(case):
    crf, constraints = build(case, "sequential", seed=5)
    emissions = torch.randn(2, 4, crf.num_tags, dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True], [True, True, True, True]])
    draws = 20000
    samples = crf.distribution(emissions, mask).sample(draws, generator=torch.Generator().manual_seed(7))
    for row in range(2):
        ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
        probs = torch.softmax(scores.detach(), 0)
        match = (samples[:, row, mask[row]].unsqueeze(1) == ys.unsqueeze(0)).all(-1)  # [draws, N]
        assert (match.sum(1) == 1).all()
        counts = match.sum(0).double()
        assert not counts[probs == 0].any()  # never a forbidden sequence
        assert chi_square_p_value(counts, probs) > 1e-3
        # the test has power: the distribution of scores scaled by 0.9 is rejected
        biased = probs ** 0.9
        assert chi_square_p_value(counts, biased / biased.sum()) < 1e-10


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3]], ids=[CASE_IDS[1], CASE_IDS[2], CASE_IDS[3]])
def test_first_and_second_derivatives(case):
    """Exact whatever the layer's scan: the sequential kernel's hand-written backward is not used."""
    crf, _ = build(case, "sequential", seed=6)
    q_crf, _ = build(case, "sequential", seed=7)
    emissions = torch.randn(2, 3, crf.num_tags, dtype=torch.float64, requires_grad=True)
    q_emissions = torch.randn(2, 3, crf.num_tags, dtype=torch.float64)
    mask = torch.tensor([[True, False, True], [True, True, True]])

    def quantities(e):
        dist = crf.distribution(e, mask)
        return (dist.entropy(), dist.kl(q_crf.distribution(q_emissions, mask)), dist.log_partition,
                dist.log_prob(torch.ones(2, 3, dtype=torch.long)), dist.marginals, dist.edge_marginals)

    assert torch.autograd.gradcheck(quantities, (emissions,), fast_mode=True)
    assert torch.autograd.gradgradcheck(lambda e: quantities(e)[:4], (emissions,), fast_mode=True)
    # the layer's parameters get gradients too
    crf.distribution(emissions, mask).entropy().sum().backward()
    assert all(p.grad is not None for p in crf.parameters())


def test_values_read_without_gradients_are_not_reused_with_them():
    crf = LinearChainCRF(3).double()
    emissions = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    dist = crf.distribution(emissions)
    with torch.no_grad():
        dist.entropy(), dist.marginals
    (grad,) = torch.autograd.grad(dist.entropy().sum() + dist.marginals[:, 1, 0].sum(), emissions)
    fresh = crf.distribution(emissions)
    (expected,) = torch.autograd.grad(fresh.entropy().sum() + fresh.marginals[:, 1, 0].sum(), emissions)
    torch.testing.assert_close(grad, expected)


def test_edges_and_errors():
    crf, _ = make_layer("first_order", IOB2_TAGS, "IOB2", True)
    for shape in [(0, 4), (3, 0), (0, 0)]:
        dist = crf.distribution(torch.randn(*shape, 5, dtype=torch.float64))
        assert dist.log_partition.shape == dist.entropy().shape == (shape[0],)
        assert dist.sample(2).shape == (2, *shape) and dist.argmax.shape == shape
        assert dist.topk(3)[0].shape == (shape[0], 3, shape[1])
        assert dist.edge_marginals.shape == (*shape, 5, 5) and dist.marginals.shape == (*shape, 5)
        assert (dist.log_partition == 0).all() and (dist.kl(dist) == 0).all()
    # a row without a valid path (I-PER cannot start a sentence) and an all-False row
    emissions = torch.randn(3, 3, 5, dtype=torch.float64)
    emissions[0, 0] = NEG_INF
    emissions[0, 0, 2] = 0.0
    mask = torch.tensor([[True, True, True], [False, False, False], [True, True, False]])
    dist = crf.distribution(emissions, mask)
    assert torch.isneginf(dist.log_partition[0]) and dist.log_partition[1] == 0
    assert not dist.marginals[0].any() and not dist.edge_marginals[0].any()
    assert (dist.argmax[:2] == -1).all() and (dist.sample(3)[:, :2] == -1).all()
    assert torch.isneginf(dist.topk(2)[1][0]).all() and torch.isneginf(dist.log_prob(dist.argmax)[0])
    values = torch.stack([dist.entropy(), dist.kl(crf.distribution(emissions.clamp(min=-5), mask))])
    assert torch.isfinite(values).all() and (values[:, :2] == 0).all()
    # q forbids a sequence that p can draw: infinite cross-entropy and KL
    q_emissions = emissions.clamp(min=-5).clone()
    q_emissions[2, :, 0] = NEG_INF
    p = crf.distribution(emissions.clamp(min=-5), mask)
    assert torch.isposinf(p.kl(crf.distribution(q_emissions, mask))[2])
    leaf = emissions.clamp(min=-5).requires_grad_(True)
    crf.distribution(leaf, mask).entropy().sum().backward()
    assert torch.isfinite(leaf.grad).all()
    # float32 in, float32 out
    assert crf.float().distribution(emissions.float().clamp(min=-5), mask).entropy().dtype == torch.float32
    crf.double()
    with pytest.raises(ValueError, match="same layer kind"):
        dist.kl(SecondOrderCRF(5).double().distribution(emissions, mask))
    with pytest.raises(ValueError, match="same mask"):
        dist.kl(crf.distribution(emissions, torch.ones(3, 3, dtype=torch.bool)))
    with pytest.raises(ValueError, match=r"\[\.\.\., batch, seq_len\]"):
        dist.log_prob(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        dist.log_prob(torch.full((3, 3), 7))
    with pytest.raises(ValueError, match="outside"):
        dist.log_prob(torch.full((3, 3), -2))


def test_doctests() -> None:
    import doctest

    from neurocrf.structs import distribution

    assert doctest.testmod(distribution).failed == 0


@pytest.mark.gpu
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3]], ids=[CASE_IDS[1], CASE_IDS[2], CASE_IDS[3]])
def test_cuda_matches_cpu(case):
    crf, _ = build(case, "auto", seed=8)
    emissions, mask = sample_inputs(crf, seed=8, batch=6, seq_len=9)
    dist = crf.distribution(emissions, mask)
    gpu = copy.deepcopy(crf).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):  # ignored inside: float64 in, float64 out
        on_gpu = gpu.distribution(emissions.cuda(), mask.cuda())
        values = [on_gpu.entropy(), on_gpu.kl(on_gpu), on_gpu.marginals, on_gpu.edge_marginals, on_gpu.argmax]
    for got, expected in zip(values, [dist.entropy(), dist.kl(dist), dist.marginals, dist.edge_marginals, dist.argmax]):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected)
    samples = on_gpu.sample(100, generator=torch.Generator("cuda").manual_seed(0))
    assert torch.isfinite(dist.log_prob(samples.cpu())[:, mask.any(1)]).all()

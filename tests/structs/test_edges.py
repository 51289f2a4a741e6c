"""Edges of the CRF layers: second derivatives, empty batches and sequences, rows without a valid path.

Every quantity is checked against brute-force enumeration with the reference scores written from
each model's definition (``tests.test_structs_bruteforce``), in float64 at tiny sizes, for all three
layers and every kernel: the certified exp-space scan, the log-space scan and the parallel scan.
"""

from __future__ import annotations

import pytest
import torch

from neurocrf.structs import LinearChainCRF
from neurocrf.structs.engine.chain import Chain
from neurocrf.structs.engine.pytorch import exp_scan
from tests.helpers.enumeration import REFERENCES, all_sequences, make_layer

NEG_INF = float("-inf")
TAGS = ["O", "B-A", "I-A"]
LAYERS = [("first_order", {}), ("second_order", {}), ("precursor", {"memory": "tag"})]
KERNELS = ["exp", "log", "parallel"]
LAYER_IDS = [kind for kind, _ in LAYERS]


def build(kind: str, options: dict, kernel: str, monkeypatch, scheme: str = "IOB2", constrained: bool = True):
    if kernel == "parallel" and kind == "second_order":
        pytest.skip("the parallel scan covers first-order state spaces only")
    if kernel == "log":
        monkeypatch.setattr(exp_scan, "_BLOCK_BUDGET", -1.0)
    scan = {"scan": "parallel"} if kernel == "parallel" else {}
    return make_layer(kind, TAGS, scheme, constrained, **options, **scan)


def enumerated_marginals(crf, constraints, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T, L]`` token posteriors by enumeration, differentiable with respect to ``emissions``."""
    rows = []
    for row in range(emissions.shape[0]):
        e = emissions[row][mask[row]]
        ys = all_sequences(crf.num_tags, e.shape[0])
        scores = REFERENCES[type(crf)](crf, e, ys, constraints)
        probs = torch.softmax(scores, 0) if bool(torch.isfinite(scores).any()) else torch.zeros_like(scores)
        marg = emissions.new_zeros(emissions.shape[1:])
        positions = mask[row].nonzero().flatten()
        for i, t in enumerate(positions.tolist()):
            marg = marg.index_put((torch.tensor([t]).expand(len(ys)), ys[:, i]), probs, accumulate=True)
        rows.append(marg)
    return torch.stack(rows)


# --- second derivatives ---------------------------------------------------------------------------
def test_issue_reproduction_gradgradcheck_default_kernel():
    e = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    crf = LinearChainCRF(4).double()
    assert torch.autograd.gradgradcheck(lambda x: crf.log_partition(x), (e,))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind,options", LAYERS, ids=LAYER_IDS)
def test_double_backward_and_differentiable_marginals(kind, options, kernel, monkeypatch):
    """IOB1 constraints (B-A only after A), a mask with holes and a masked first position."""
    crf, _ = build(kind, options, kernel, monkeypatch, scheme="IOB1")
    mask = torch.tensor([[True, False, True, True], [False, True, True, False]])
    e = torch.randn(2, 4, len(TAGS), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: crf.log_partition(x, mask), (e,))
    assert torch.autograd.gradgradcheck(lambda x: crf.log_partition(x, mask), (e,))
    assert torch.autograd.gradcheck(lambda x: crf.marginals(x, mask), (e,))


@pytest.mark.parametrize("kind,options", LAYERS, ids=LAYER_IDS)
def test_jacobian_of_marginals_matches_enumeration(kind, options, monkeypatch):
    """d P(y_t = i) / d emission[s, j] (token covariances) and parameter gradients of the marginals
    (differentiating the backward pass runs the same autograd scan on every kernel)."""
    crf, constraints = build(kind, options, "exp", monkeypatch)
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])
    e = torch.randn(2, 4, len(TAGS), dtype=torch.float64) * 2
    got = torch.autograd.functional.jacobian(lambda x: crf.marginals(x, mask), e)
    expected = torch.autograd.functional.jacobian(lambda x: enumerated_marginals(crf, constraints, x, mask), e)
    torch.testing.assert_close(got, expected)
    weights = torch.randn(2, 4, len(TAGS), dtype=torch.float64)
    fast = torch.autograd.grad((crf.marginals(e, mask) * weights).sum(), list(crf.parameters()))
    slow = torch.autograd.grad((enumerated_marginals(crf, constraints, e, mask) * weights).sum(),
                               list(crf.parameters()), allow_unused=True)
    for name, a, b in zip([n for n, _ in crf.named_parameters()], fast, slow):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, msg=f"d marginals / d {name}")


@pytest.mark.parametrize("order,per_position", [(1, False), (1, True), (2, False)])
def test_chain_double_backward_for_every_potential(order, per_position):
    size, batch, seq_len = 2, 3, 3
    shape = (size,) * order
    lead = (batch, seq_len) if per_position else ()
    potentials = [torch.randn(s, dtype=torch.float64, requires_grad=True)
                  for s in (shape, lead + shape + (size,), shape, (batch, seq_len) + shape)]
    lengths = torch.tensor([3, 0, 2])

    def log_z(*xs):
        return Chain(*xs, lengths).log_partition()

    assert torch.autograd.gradgradcheck(log_z, potentials)


# --- empty batches and empty sequences --------------------------------------------------------------
@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 0)], ids=["batch0", "len0", "both0"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind,options", LAYERS, ids=LAYER_IDS)
def test_empty_batch_and_empty_sequence(kind, options, kernel, shape, monkeypatch):
    crf, _ = build(kind, options, kernel, monkeypatch)
    batch, seq_len = shape
    num_tags, k = len(TAGS), 3
    e = torch.randn(batch, seq_len, num_tags, dtype=torch.float64, requires_grad=True)
    tags = torch.zeros(batch, seq_len, dtype=torch.long)
    mask = torch.ones(batch, seq_len, dtype=torch.bool)
    zeros = torch.zeros(batch, dtype=torch.float64)  # one empty path per row: log Z = score = NLL = 0
    torch.testing.assert_close(crf.log_partition(e, mask), zeros)
    torch.testing.assert_close(crf.score(e, tags, mask), zeros)
    torch.testing.assert_close(crf(e, tags, mask, reduction="none"), zeros)
    allowed = torch.ones(batch, seq_len, num_tags, dtype=torch.bool)
    torch.testing.assert_close(crf(e, allowed, mask, reduction="none"), zeros)
    for reduction in ("sum", "mean", "token_mean"):
        loss = crf(e, tags, mask, reduction=reduction)
        assert loss.shape == () and float(loss.detach()) == 0.0
    crf(e, tags, mask).backward()
    assert e.grad.shape == e.shape and not bool(e.grad.any())
    assert all(p.grad is None or not bool(p.grad.any()) for p in crf.parameters())
    assert crf.decode(e, mask).shape == (batch, seq_len)
    paths, log_probs = crf.nbest(e, mask, k)
    assert paths.shape == (batch, k, seq_len) and log_probs.shape == (batch, k)
    if batch:
        torch.testing.assert_close(log_probs, torch.tensor([[0.0] + [NEG_INF] * (k - 1)] * batch, dtype=torch.float64))
    marg = crf.marginals(e, mask)
    assert marg.shape == e.shape and marg.dtype == e.dtype
    with torch.no_grad():
        assert crf.marginals(e, mask).shape == e.shape
    windows = crf.window_log_partition(e, mask, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                                       torch.ones(0, 2, num_tags, dtype=torch.bool))
    assert windows.shape == (0,)


# --- rows without a valid path -----------------------------------------------------------------------
def no_path_case(generator: torch.Generator):
    """Row 0: every tag -inf at one position; row 1 allows only O -> I-A (forbidden in IOB2);
    row 2 is ordinary. Masks with holes; tags valid for row 2."""
    e = torch.randn(3, 5, len(TAGS), generator=generator, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True, True], [False, True, True, True, False],
                         [True, False, True, True, True]])
    e[0, 3] = NEG_INF
    e[1, 1, 1:] = NEG_INF  # only O
    e[1, 2, :2] = NEG_INF  # only I-A
    tags = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 2, 0, 0], [1, 0, 2, 0, 1]])
    return e, mask, tags


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind,options", LAYERS, ids=LAYER_IDS)
def test_rows_without_a_valid_path(kind, options, kernel, monkeypatch):
    crf, constraints = build(kind, options, kernel, monkeypatch)
    generator = torch.Generator().manual_seed(5)
    e, mask, tags = no_path_case(generator)
    bad, good = [0, 1], 2
    reference = []
    for row in range(3):
        ys = all_sequences(crf.num_tags, int(mask[row].sum()))
        reference.append((ys, REFERENCES[type(crf)](crf, e[row][mask[row]], ys, constraints)))
    for row in bad:
        assert not bool(torch.isfinite(reference[row][1]).any())  # the case really has no path

    log_z = crf.log_partition(e, mask)
    torch.testing.assert_close(log_z, torch.stack([torch.logsumexp(s, 0) for _, s in reference]))
    assert bool(torch.isneginf(log_z[bad]).all())

    leaf = e.clone().requires_grad_(True)
    nll = crf(leaf, tags, mask, reduction="none")
    assert bool(torch.isposinf(nll[bad]).all()) and bool(torch.isfinite(nll[good]))
    assert bool(torch.isposinf(crf(leaf, tags, mask, reduction="mean")))
    nll.sum().backward()
    assert bool(torch.isfinite(leaf.grad).all()) and not bool(leaf.grad[bad].any())
    grads = [p.grad.clone() for p in crf.parameters()]
    crf.zero_grad()
    good_leaf = e[good:good + 1].clone().requires_grad_(True)
    crf(good_leaf, tags[good:good + 1], mask[good:good + 1], reduction="sum").backward()
    torch.testing.assert_close(leaf.grad[good], good_leaf.grad[0])
    for got, expected in zip(grads, (p.grad for p in crf.parameters())):
        torch.testing.assert_close(got, expected)  # the rows without a path add nothing
    allowed = torch.ones(*e.shape, dtype=torch.bool)
    assert bool(torch.isposinf(crf(e, allowed, mask, reduction="none")[bad]).all())

    best = crf.decode(e, mask)
    assert bool((best[bad] == -1).all())
    ys, scores = reference[good]
    path = best[good][mask[good]]
    path_score = REFERENCES[type(crf)](crf, e[good][mask[good]], path[None], constraints)[0]
    torch.testing.assert_close(path_score, scores.max())

    paths, log_probs = crf.nbest(e, mask, 4)
    assert bool(torch.isneginf(log_probs[bad]).all()) and bool((paths[bad] == -1).all())
    torch.testing.assert_close(log_probs[good], (scores.sort(descending=True).values[:4] - torch.logsumexp(scores, 0)))

    marg = crf.marginals(leaf, mask)  # differentiable: the graph through -inf stays NaN-free
    torch.testing.assert_close(marg, enumerated_marginals(crf, constraints, e, mask))
    assert not bool(marg[bad].any())
    (grad,) = torch.autograd.grad((marg * torch.randn(marg.shape, generator=generator, dtype=marg.dtype)).sum(), leaf)
    assert bool(torch.isfinite(grad).all()) and not bool(grad[bad].any())

    windows = crf.window_log_partition(e, mask, torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1]),
                                       torch.ones(3, 2, len(TAGS), dtype=torch.bool))
    assert bool(torch.isneginf(windows[:2]).all())
    torch.testing.assert_close(windows[2], torch.logsumexp(scores, 0))



@pytest.mark.parametrize("scan", ["sequential", "parallel"])
def test_pair_emissions_double_backward(scan):
    """Observation-dependent transitions [B, T, L + 1, L]: per-position potentials, same guarantees."""
    crf, _ = make_layer("first_order", TAGS, "IOB2", True, scan=scan)
    mask = torch.tensor([[True, False, True, True], [False, True, True, False]])
    pairs = torch.randn(2, 4, len(TAGS) + 1, len(TAGS), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: crf.log_partition(x, mask), (pairs,))
    assert torch.autograd.gradcheck(lambda x: crf.marginals(x, mask), (pairs,))

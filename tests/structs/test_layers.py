"""CRF layers against peer libraries, gradients, numerics, input errors, constraints and scans."""

from __future__ import annotations

import pytest
import torch

from neurocrf.structs import (
    LinearChainCRF,
    PrecursorInducedCRF,
    SecondOrderCRF,
    allowed_transitions,
    build_crf,
    engine,
)
from neurocrf.structs.engine import pytorch as torch_backend
from neurocrf.structs.engine.augmented import augment
from neurocrf.structs.engine.chain import Chain
from neurocrf.structs.engine.pytorch import exp_scan
from neurocrf.structs.engine.pytorch import first_order as fast_first_order
from tests.helpers.scans import assert_exp_scan_equals_log_scan

IOB2_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def layers(tags=IOB2_TAGS):
    return [build_crf(kind, tags, "IOB2") for kind in ("first_order", "second_order", "precursor")]


@pytest.fixture(params=["compiled", "exp", "log"])
def kernel(request, monkeypatch):
    """The compiled backend (the CPU default), the torch backend's certified exp-space scans, and
    its log-space scan."""
    if request.param != "compiled":
        monkeypatch.setenv(engine.ENV, "torch")
    if request.param == "log":
        monkeypatch.setattr(exp_scan, "_BLOCK_BUDGET", -1.0)
        monkeypatch.setattr(fast_first_order, "applies", lambda *args: False)
    return request.param


# --- peers ---------------------------------------------------------------------------------------
def test_matches_pytorch_crf(kernel):
    torchcrf = pytest.importorskip("torchcrf")
    torch.manual_seed(1)
    num_tags, batch, seq_len = 7, 6, 11
    ours = LinearChainCRF(num_tags)
    peer = torchcrf.CRF(num_tags, batch_first=True)
    with torch.no_grad():
        peer.start_transitions.copy_(ours.start_transitions)
        peer.end_transitions.copy_(ours.end_transitions)
        peer.transitions.copy_(ours.transitions)
    emissions = torch.randn(batch, seq_len, num_tags) * 3
    tags = torch.randint(num_tags, (batch, seq_len))
    lengths = torch.tensor([11, 1, 5, 8, 11, 2])
    mask = torch.arange(seq_len) < lengths[:, None]  # pytorch-crf needs prefix masks
    expected = -peer(emissions, tags, mask, reduction="none")
    torch.testing.assert_close(ours(emissions, tags, mask, reduction="none"), expected, rtol=1e-5, atol=1e-4)
    decoded = ours.decode(emissions, mask)
    for row, path in enumerate(peer.decode(emissions, mask)):
        assert decoded[row, : len(path)].tolist() == path
        assert bool((decoded[row, len(path):] == -1).all())


def test_matches_torch_struct(kernel):
    torch_struct = pytest.importorskip("torch_struct")
    torch.manual_seed(2)
    num_tags, batch, seq_len = 5, 4, 9
    crf = LinearChainCRF(num_tags).double()
    emissions = torch.randn(batch, seq_len, num_tags, dtype=torch.float64)
    lengths = torch.tensor([9, 2, 6, 9])
    mask = torch.arange(seq_len) < lengths[:, None]
    # torch-struct edge potentials [B, N-1, C_next, C_prev], folding start, emissions and end in.
    trans = crf.transitions.detach().t()
    edges = trans.expand(batch, seq_len - 1, num_tags, num_tags).clone()
    edges += emissions[:, 1:, :, None]
    edges[:, 0] += (crf.start_transitions.detach() + emissions[:, 0])[:, None, :]
    for row, length in enumerate(lengths.tolist()):
        edges[row, length - 2] += crf.end_transitions.detach()[:, None]
    dist = torch_struct.LinearChainCRF(edges, lengths=lengths)
    torch.testing.assert_close(crf.log_partition(emissions, mask), dist.partition)
    # node marginals from the edge marginals: P(y_{n+1}) = sum over prev of edge[n]
    edge_marg = dist.marginals
    node = torch.zeros(batch, seq_len, num_tags, dtype=torch.float64)
    node[:, 1:] = edge_marg.sum(-1)
    node[:, 0] = edge_marg[:, 0].sum(-2)
    node = node * mask[..., None]
    torch.testing.assert_close(crf.marginals(emissions, mask), node)


# --- gradients -----------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [1, 2])
def test_gradcheck_hand_written_backward(kernel, order):
    torch.manual_seed(3)
    size, batch, seq_len = 3, 2, 4
    shape = (size,) * order
    start = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    moves = torch.randn(shape + (size,), dtype=torch.float64, requires_grad=True)
    end = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    emissions = torch.randn((batch, seq_len) + shape, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 2])

    def log_z(s, w, e, x):
        return Chain(s, w, e, x, lengths).log_partition()

    assert torch.autograd.gradcheck(log_z, (start, moves, end, emissions), eps=1e-6, atol=1e-6)


def test_training_step_reduces_loss():
    torch.manual_seed(4)
    for crf in layers():
        emissions = torch.randn(8, 6, len(IOB2_TAGS), requires_grad=True)
        tags = torch.zeros(8, 6, dtype=torch.long)
        tags[:, 1], tags[:, 2] = 1, 2
        optimizer = torch.optim.SGD([emissions, *crf.parameters()], lr=0.5)
        first = None
        for _ in range(20):
            optimizer.zero_grad()
            loss = crf(emissions, tags)
            loss.backward()
            optimizer.step()
            first = loss.item() if first is None else first
        assert loss.item() < first * 0.5
        assert crf.decode(emissions).tolist() == tags.tolist()


# --- numerics ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1.0, 1e2, 1e4])
def test_large_emissions_and_masked_rows_stay_finite(scale):
    torch.manual_seed(5)
    for crf in layers():
        emissions = (torch.randn(4, 7, len(IOB2_TAGS)) * scale).requires_grad_(True)
        mask = torch.ones(4, 7, dtype=torch.bool)
        mask[0] = False
        mask[1, 1:] = False
        tags = crf.decode(emissions.detach(), mask).clamp(min=0)
        loss = crf(emissions, tags, mask, reduction="sum")
        loss.backward()
        assert torch.isfinite(loss)
        assert bool(torch.isfinite(emissions.grad).all())
        assert all(bool(torch.isfinite(p.grad).all()) for p in crf.parameters())
        assert float(crf.log_partition(emissions, mask)[0]) == 0.0
        marg = crf.marginals(emissions, mask)
        assert bool(torch.isfinite(marg).all())
        torch.testing.assert_close(marg.sum(-1), mask.float(), atol=1e-4, rtol=0)


def test_large_emissions_match_float64_reference():
    torch.manual_seed(6)
    crf = LinearChainCRF(5, allowed_transitions(IOB2_TAGS, "IOB2")).double()
    emissions = torch.randn(3, 12, 5, dtype=torch.float64) * 1e4
    exact = crf.log_partition(emissions)
    # the log partition is within log(#paths) of the best path score
    _, best = crf.nbest(emissions, k=1)
    assert bool((exact >= exact + best[:, 0] - 1e-6).all())  # best log-prob <= 0
    assert bool((best[:, 0] > -12 * torch.log(torch.tensor(5.0))).all())


def test_float32_matches_float64():
    torch.manual_seed(7)
    for crf in layers():
        emissions = torch.randn(5, 9, len(IOB2_TAGS)) * 4
        mask = torch.rand(5, 9) < 0.8
        single = crf.log_partition(emissions, mask)
        assert single.dtype == torch.float32
        double = crf.double().log_partition(emissions.double(), mask)
        assert double.dtype == torch.float64
        torch.testing.assert_close(single.double(), double, rtol=1e-5, atol=1e-4)
        crf.float()


def test_bf16_autocast_is_disabled_inside():
    torch.manual_seed(8)
    crf = LinearChainCRF(5)
    emissions = torch.randn(2, 6, 5)
    tags = torch.randint(5, (2, 6))
    reference = crf(emissions, tags)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = crf(emissions.bfloat16(), tags)
        marg = crf.marginals(emissions.bfloat16())
    assert inside.dtype == torch.float32
    assert torch.isfinite(inside) and bool(torch.isfinite(marg).all())
    torch.testing.assert_close(inside, reference, atol=0.1, rtol=0.02)


# --- errors --------------------------------------------------------------------------------------
def test_bad_inputs_raise_value_errors():
    crf = LinearChainCRF(4)
    good = torch.randn(2, 3, 4)
    cases = [
        (lambda: crf.log_partition(torch.randn(2, 3)), "emissions must be"),
        (lambda: crf.log_partition(torch.randn(2, 3, 5)), "5 tags"),
        (lambda: crf.log_partition(torch.zeros(2, 3, 4, dtype=torch.long)), "floating point"),
        (lambda: crf.log_partition(good, torch.ones(2, 4, dtype=torch.bool)), "mask has shape"),
        (lambda: crf.log_partition(good, torch.ones(2, 3)), "bool"),
        (lambda: crf(good, torch.zeros(2, 4, dtype=torch.long)), "tags have shape"),
        (lambda: crf(good, torch.full((2, 3), 4)), "outside"),
        (lambda: crf(good, torch.zeros(2, 3), reduction="mean"), "integer"),
        (lambda: crf(good, torch.zeros(2, 3, dtype=torch.long), reduction="avg"), "reduction"),
        (lambda: crf(good, torch.ones(2, 3, 5, dtype=torch.bool)), "allowed tags"),
        (lambda: LinearChainCRF(0), "positive"),
        (lambda: LinearChainCRF(3, allowed_transitions(IOB2_TAGS, "IOB2")), "constraints have shapes"),
        (lambda: allowed_transitions(["O", "X-PER"], "IOB2"), "PREFIX-TYPE"),
        (lambda: allowed_transitions(["O", "E-PER"], "IOB2"), "not valid in scheme"),
        (lambda: allowed_transitions(["O"], "BILOU"), "unknown tag scheme"),
        (lambda: PrecursorInducedCRF(["B-PER", "I-PER"], "IOB2"), "outside label"),
        (lambda: build_crf("third_order", IOB2_TAGS, "IOB2"), "unknown CRF kind"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_padding_tags_are_ignored():
    crf = LinearChainCRF(4)
    emissions = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    tags = torch.randint(4, (2, 5))
    padded = tags.clone()
    padded[0, 3:] = -1
    torch.testing.assert_close(crf(emissions, tags, mask, reduction="none"),
                               crf(emissions, padded, mask, reduction="none"))


def test_reductions():
    crf = LinearChainCRF(4)
    emissions = torch.randn(3, 5, 4)
    tags = torch.randint(4, (3, 5))
    mask = torch.arange(5) < torch.tensor([5, 3, 0])[:, None]
    nll = crf(emissions, tags, mask, reduction="none")
    torch.testing.assert_close(crf(emissions, tags, mask, reduction="sum"), nll.sum())
    torch.testing.assert_close(crf(emissions, tags, mask, reduction="mean"), nll.mean())
    torch.testing.assert_close(crf(emissions, tags, mask, reduction="token_mean"), nll.sum() / 8)
    assert float(nll[2]) == 0.0


# --- constraints ---------------------------------------------------------------------------------
def test_allowed_transitions_known_cases():
    c = allowed_transitions(["O", "B-A", "I-A", "B-B", "I-B"], "IOB2")
    assert c.start.tolist() == [True, True, False, True, False]
    assert c.transitions[0].tolist() == [True, True, False, True, False]  # O -> I-X forbidden
    assert c.transitions[1].tolist() == [True, True, True, True, False]  # B-A -> I-B forbidden
    c = allowed_transitions(["O", "I-A", "B-A"], "IOB1")
    assert c.start.tolist() == [True, True, False]
    assert c.transitions[:, 2].tolist() == [False, True, True]  # B-A only after an A entity
    c = allowed_transitions(["O", "B-A", "I-A", "E-A", "S-A"], "BIOES")
    assert c.end.tolist() == [True, False, False, True, True]
    assert c.transitions[1].tolist() == [False, False, True, True, False]
    assert c.transitions[3].tolist() == [True, True, False, False, True]


@pytest.mark.parametrize("scheme,tags", [
    ("IOB2", IOB2_TAGS),
    ("BIOES", ["O", "B-A", "I-A", "E-A", "S-A", "B-B", "I-B", "E-B", "S-B"]),
])
def test_every_output_respects_constraints(scheme, tags):
    torch.manual_seed(9)
    c = allowed_transitions(tags, scheme)

    def valid(path: list[int]) -> bool:
        if not path:
            return True
        ok = bool(c.start[path[0]]) and bool(c.end[path[-1]])
        return ok and all(bool(c.transitions[a, b]) for a, b in zip(path, path[1:]))

    for kind in ("first_order", "second_order", "precursor"):
        crf = build_crf(kind, tags, scheme)
        emissions = torch.randn(6, 7, len(tags)) * 5
        mask = torch.rand(6, 7) < 0.8
        for row in crf.decode(emissions, mask):
            assert valid([t for t in row.tolist() if t >= 0])
        paths, scores = crf.nbest(emissions, mask, k=6)
        for row in range(6):
            for rank in range(6):
                if torch.isfinite(scores[row, rank]):
                    assert valid([t for t in paths[row, rank].tolist() if t >= 0])


# --- scans ---------------------------------------------------------------------------------------
def test_parallel_scan_equals_sequential():
    torch.manual_seed(10)
    for crf in (LinearChainCRF(5, allowed_transitions(IOB2_TAGS, "IOB2")),
                PrecursorInducedCRF(IOB2_TAGS, "IOB2")):
        emissions = torch.randn(4, 37, 5, dtype=torch.float64)
        mask = torch.rand(4, 37) < 0.9
        mask[1] = False
        tags = crf.decode(emissions, mask).clamp(min=0)
        crf = crf.double()
        results = {}
        for scan in ("sequential", "parallel"):
            crf.scan = scan
            leaf = emissions.clone().requires_grad_(True)
            loss = crf(leaf, tags, mask, reduction="sum")
            loss.backward()
            results[scan] = (loss.detach(), leaf.grad, crf.marginals(emissions, mask))
        for a, b in zip(results["sequential"], results["parallel"]):
            torch.testing.assert_close(a, b)


def test_the_chain_engine_chooses_the_scan(monkeypatch):
    """The engine decides: forced parallel on first-order state spaces only, auto only on CUDA from
    the threshold, and log partition and marginals of the parallel choice equal the sequential."""
    torch.manual_seed(3)
    potentials = (torch.randn(4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64),
                  torch.randn(4, dtype=torch.float64))
    emissions, lengths = torch.randn(3, 9, 4, dtype=torch.float64), torch.tensor([9, 4, 0])
    chains = {scan: Chain(*potentials, emissions, lengths, scan=scan) for scan in ("sequential", "parallel", "auto")}
    assert [torch_backend.uses_parallel_scan(potentials[0], emissions, s, 512)
            for s in ("sequential", "parallel", "auto")] == [False, True, False]
    assert not torch_backend.uses_parallel_scan(torch.zeros(3, 3), torch.randn(2, 5, 3, 3), "parallel", 512)
    assert [chains[s].backend_for("log_partition")[0] for s in ("sequential", "parallel")] == ["torch", "torch"]
    calls = []
    real = torch_backend.parallel_log_partition
    monkeypatch.setattr(torch_backend, "parallel_log_partition", lambda *args: calls.append(1) or real(*args))
    torch.testing.assert_close(chains["parallel"].log_partition(), chains["sequential"].log_partition())
    torch.testing.assert_close(chains["parallel"].marginals(), chains["sequential"].marginals())
    torch.testing.assert_close(chains["auto"].log_partition(), chains["sequential"].log_partition())
    assert len(calls) == 2
    with pytest.raises(ValueError, match="scan must be"):
        Chain(*potentials, emissions, lengths, scan="tree")
    with pytest.raises(ValueError, match="scan must be"):
        LinearChainCRF(4, scan="tree")


def test_second_order_rejects_forced_parallel_gracefully():
    crf = SecondOrderCRF(3, scan="parallel")
    emissions = torch.randn(2, 5, 3)
    # the pair state space always runs sequentially
    torch.testing.assert_close(crf.log_partition(emissions), SecondOrderCRF(3).load_state_dict(
        crf.state_dict()) and crf.log_partition(emissions))


# --- torch.compile -------------------------------------------------------------------------------
@pytest.mark.slow
def test_compiled_loss_and_decode_do_not_recompile_per_length():
    torch._dynamo.reset()
    frames: list[int] = []

    def counting_backend(graph_module, example_inputs):
        frames.append(1)
        return graph_module.forward

    crf = LinearChainCRF(5)
    projection = torch.nn.Linear(8, 5)

    def loss_fn(features, tags, mask):
        return crf(projection(features), tags, mask)

    def decode_fn(features, mask):
        return crf.decode(projection(features), mask)

    compiled_loss = torch.compile(loss_fn, backend=counting_backend, dynamic=True)
    compiled_decode = torch.compile(decode_fn, backend=counting_backend, dynamic=True)
    for seq_len in (7, 13):
        features = torch.randn(3, seq_len, 8)
        mask = torch.ones(3, seq_len, dtype=torch.bool)
        tags = torch.randint(5, (3, seq_len))
        torch.testing.assert_close(compiled_loss(features, tags, mask), loss_fn(features, tags, mask))
        assert compiled_decode(features, mask).tolist() == decode_fn(features, mask).tolist()
        if seq_len == 7:
            after_first = len(frames)
    assert len(frames) == after_first, "a new sequence length triggered a recompilation"


@pytest.mark.parametrize("budget", [30.0, 80.0, 300.0, 1e9])
def test_blocked_exp_scan_equals_log_scan_on_long_rows(monkeypatch, budget):
    """Block sizes from 1 to 16 (set through the budget) against the log-space kernel."""
    monkeypatch.setattr(exp_scan, "_BLOCKED_DEVICES", {"cpu", "cuda"})
    torch.manual_seed(11)
    tags = IOB2_TAGS
    for crf in layers(tags):
        crf = crf.double()
        emissions = torch.randn(5, 53, len(tags), dtype=torch.float64) * 2
        mask = torch.rand(5, 53) < 0.9
        mask[3, 20:] = False
        assert_exp_scan_equals_log_scan(monkeypatch, crf, emissions, mask, budget)


def test_exp_scan_block_size_follows_spread(monkeypatch):
    monkeypatch.setattr(exp_scan, "_BLOCKED_DEVICES", {"cpu", "cuda"})
    augmented = augment(torch.zeros(4), torch.zeros(4, 4), torch.zeros(4), torch.randn(2, 40, 4), torch.tensor([40, 3]))
    scan = exp_scan.ExpScan(*augmented, 20.0)
    assert scan.block == 15
    assert exp_scan.ExpScan(*augmented, 250.0).block == 1
    assert exp_scan.ExpScan.attempt(*augmented, 301.0) is None


@pytest.mark.parametrize("state_bias", [False, True])
def test_precursor_state_emissions_match_an_index_select_with_first_and_second_derivatives(state_bias):
    """The state emissions repeat the O column for the memory O states; their gradient (and its
    own gradient, as in differentiable marginals) is that of indexing the tags by state label."""
    crf = PrecursorInducedCRF(["B-A", "I-A", "O", "B-B", "I-B"], "IOB2", state_bias=state_bias).double()
    emissions = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    expanded = crf._state_emissions(emissions)
    reference = emissions.index_select(-1, crf.state_labels)
    if state_bias:
        reference = reference + torch.zeros(crf.num_states(), dtype=torch.float64).index_add(
            0, crf.o_states, crf.state_bias)
    assert torch.equal(expanded, reference)
    weights = torch.randn_like(expanded)
    (grad,) = torch.autograd.grad((expanded * weights).sum(), emissions, create_graph=True)
    (expected,) = torch.autograd.grad((reference * weights).sum(), emissions, create_graph=True)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    assert torch.autograd.gradgradcheck(lambda e: crf._state_emissions(e), (emissions,))
    assert torch.equal(crf._state_emissions(emissions.detach()), expanded.detach())

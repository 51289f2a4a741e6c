"""The fast first-order scans (the torch backend's and the compiled backend's) against enumeration
and against the general chain engine, their certificates, their fallbacks and double backward."""

from __future__ import annotations

import math

import pytest
import torch

from neurocrf.structs import LinearChainCRF, allowed_transitions, engine
from neurocrf.structs.engine import compiled as compiled_backend
from neurocrf.structs.engine import pytorch as torch_backend
from neurocrf.structs.engine.augmented import augment
from neurocrf.structs.engine.compiled import kernel as fast_kernel
from neurocrf.structs.engine.pytorch import exp_scan
from neurocrf.structs.engine.pytorch import first_order as fast_first_order
from neurocrf.structs.engine.pytorch import search as fast_search
from tests.helpers import enumeration as bf

FIRST_ORDER_CASES = [case for case in bf.CASES if case[0] == "first_order"]
ENUMERATION_CHECKS = [bf.check_log_partition, bf.check_score_and_nll, bf.check_decode, bf.check_marginals,
                      bf.check_partial_labels, bf.check_marginals_are_gradient_of_log_partition,
                      bf.check_parameter_gradients_match_autograd_through_enumeration]


@pytest.fixture
def compiled(monkeypatch):
    """Every layer on the compiled backend for one test (skipped where it cannot be built)."""
    reason = fast_kernel.unavailable()
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setenv(engine.ENV, "compiled")


@pytest.fixture
def torch_path(monkeypatch):
    """Every layer on the torch backend for one test."""
    monkeypatch.setenv(engine.ENV, "torch")


@pytest.fixture
def path(request):
    """``"torch"`` or ``"compiled"``: the backend of the test (through the fixtures above)."""
    request.getfixturevalue("compiled" if request.param == "compiled" else "torch_path")
    return request.param


@pytest.fixture
def taken(monkeypatch):
    """Counts the certified fast scans (log partition, gradients, marginals) and Viterbi calls of
    both backends."""
    counts = {"scan": 0, "viterbi": 0}
    scan, viterbi = fast_first_order.forward_backward, fast_search.viterbi
    kernel_scan, kernel_viterbi = fast_kernel.fb_forward, fast_kernel.viterbi

    def counted_scan(*args, **kwargs):
        result = scan(*args, **kwargs)
        counts["scan"] += result is not None
        return result

    def counted_kernel_scan(*args, **kwargs):
        result = kernel_scan(*args, **kwargs)
        counts["scan"] += result[2] > 0
        return result

    def counted(function):
        def run(*args, **kwargs):
            counts["viterbi"] += 1
            return function(*args, **kwargs)
        return run

    monkeypatch.setattr(fast_first_order, "forward_backward", counted_scan)
    monkeypatch.setattr(fast_search, "viterbi", counted(viterbi))
    monkeypatch.setattr(fast_kernel, "fb_forward", counted_kernel_scan)
    monkeypatch.setattr(fast_kernel, "viterbi", counted(kernel_viterbi))
    return counts


def general_engine(monkeypatch) -> None:
    """The torch backend's general scans from here on."""
    monkeypatch.setenv(engine.ENV, "torch")
    monkeypatch.setattr(fast_first_order, "applies", lambda *args: False)


def case_setup(case):
    kind, tags, scheme, constrained, options = case
    crf, constraints = bf.make_layer(kind, tags, scheme, constrained, **options)
    generator = torch.Generator().manual_seed(len(tags) * 7 + len(kind))
    emissions = torch.randn(5, 6, len(tags), generator=generator, dtype=torch.float64) * 2
    return crf, constraints, emissions, bf.random_mask(5, 6, generator), generator


@pytest.mark.parametrize("path", ["torch", "compiled"], indirect=True)
@pytest.mark.parametrize("case", FIRST_ORDER_CASES, ids=lambda c: f"{c[2]}-{'c' if c[3] else 'u'}")
def test_fast_paths_against_enumeration(path, case, taken):
    setup = case_setup(case)
    for check in ENUMERATION_CHECKS:
        check(setup)
    assert taken["scan"] > 0 and taken["viterbi"] > 0


def layer_outputs(crf, emissions, mask, tags):
    """Log Z, NLL and every gradient, marginals, Viterbi tags and n-best scores."""
    crf.zero_grad()
    leaf = emissions.clone().requires_grad_(True)
    nll = crf(leaf, tags, mask, reduction="sum")
    nll.backward()
    with torch.no_grad():
        return [crf.log_partition(emissions, mask), nll.detach(), leaf.grad,
                *[p.grad.clone() for p in crf.parameters()],
                crf.marginals(emissions, mask), crf.decode(emissions, mask), crf.nbest(emissions, mask, k=3)[1]]


def random_inputs(num_tags: int, batch: int, seq_len: int, scale: float, dtype=torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    emissions = (torch.randn(batch, seq_len, num_tags, generator=generator) * scale).to(dtype)
    mask = torch.rand(batch, seq_len, generator=generator) < 0.8
    mask[0] = True
    mask[1] = False  # an empty row
    mask[2, 1:] = False  # a row of length 1
    tags = torch.randint(num_tags, (batch, seq_len), generator=generator)
    return emissions, mask, tags


def iob2_layer(dtype=torch.float64) -> LinearChainCRF:
    tags = ["O", "B-A", "I-A", "B-B", "I-B"]
    crf = LinearChainCRF(len(tags), allowed_transitions(tags, "IOB2")).to(dtype)
    with torch.no_grad():
        for param in crf.parameters():
            param.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3))
    return crf


@pytest.mark.parametrize("path", ["torch", "compiled"], indirect=True)
def test_fast_paths_equal_general_engine_on_long_constrained_rows(path, monkeypatch, taken):
    crf = iob2_layer()
    emissions, mask, _ = random_inputs(5, 6, 70, scale=3.0)
    gold = crf.decode(emissions, mask).clamp(min=0)
    fast = layer_outputs(crf, emissions, mask, gold)
    assert taken["scan"] > 0
    general_engine(monkeypatch)
    for got, expected in zip(fast, layer_outputs(crf, emissions, mask, gold)):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_compiled_kernel_equals_torch_path_in_float32(compiled, monkeypatch):
    crf = iob2_layer(torch.float32)
    emissions, mask, _ = random_inputs(5, 7, 33, scale=2.0, dtype=torch.float32, seed=5)
    tags = crf.decode(emissions, mask).clamp(min=0)
    with_kernel = layer_outputs(crf, emissions, mask, tags)
    monkeypatch.setenv(engine.ENV, "torch")
    for got, expected in zip(with_kernel, layer_outputs(crf, emissions, mask, tags)):
        if got.dtype == torch.long:
            assert torch.equal(got, expected)  # same sums, same ties: the same Viterbi paths
        else:
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("budget, interval", [(1e-9, 1), (300.0, 3), (1e9, 13101539)])
def test_rescaling_interval_is_exact_or_falls_back(budget, interval, monkeypatch, torch_path):
    """Rescaling every position, every few positions, or never: certified results equal the
    log-space scan; without rescaling these rows sink about 350 nats, fail the certificate and fall
    back."""
    monkeypatch.setattr(fast_first_order, "_SCALE_BUDGET", budget)
    crf = iob2_layer()
    emissions, mask, _ = random_inputs(5, 4, 500, scale=6.0, seed=1)
    tags = crf.decode(emissions, mask).clamp(min=0)
    potentials = (*crf._potentials(torch.float64), emissions)
    spread = torch_backend._spread(*potentials)()
    scan = fast_first_order.ForwardBackward(*potentials, mask.sum(1), spread)
    assert scan.interval == interval
    assert scan.ok == (budget < 1e9)
    fast = layer_outputs(crf, emissions, mask, tags)
    general_engine(monkeypatch)
    monkeypatch.setattr(exp_scan, "_BLOCK_BUDGET", -1.0)  # log space
    for got, expected in zip(fast, layer_outputs(crf, emissions, mask, tags)):
        torch.testing.assert_close(got, expected)  # float64: rtol 1e-7, atol 1e-7


def test_certificate_rejects_values_below_float64_range():
    values = torch.tensor([[[1.0, 0.5, 0.0]], [[1.0, 1e-200, 0.0]]], dtype=torch.float64)
    assert fast_first_order._certified(values[:1], 10.0)
    assert not fast_first_order._certified(values, 10.0)  # 1e-200 < exp(-(400 - 10)) relative
    assert not fast_first_order._certified(torch.full((1, 1, 2), math.nan, dtype=torch.float64), 10.0)
    assert not fast_first_order._certified(torch.full((1, 1, 2), 1e200, dtype=torch.float64), 10.0)


@pytest.mark.parametrize("path", ["torch", "compiled"], indirect=True)
def test_sinking_path_is_refused_and_recomputed_exactly(path):
    """Two separated chains (A->A, B->B): B sinks 800 nats below A, then catches up; the fast scans
    and the engine's rescaled exp-space scan must refuse (float64 would lose B), and the log-space
    scan they hand over to must give the exact answer: log(2) + 800."""
    from neurocrf.structs.constraints import Constraints

    allowed = torch.tensor([[True, False], [False, True]])
    crf = LinearChainCRF(2, Constraints(torch.ones(2, dtype=torch.bool), allowed, torch.ones(2, dtype=torch.bool)))
    crf = crf.double()
    with torch.no_grad():
        for param in crf.parameters():
            param.zero_()
    emissions = torch.zeros(1, 80, 2, dtype=torch.float64)
    emissions[0, :40, 0] = 20.0
    emissions[0, 40:, 1] = 20.0
    potentials, lengths = (*crf._potentials(torch.float64), emissions), torch.tensor([80])
    spread = torch_backend._spread(*potentials)
    assert fast_first_order.forward_backward(*potentials, lengths, spread) is None
    assert not compiled_backend.KernelForwardBackward(*potentials, lengths).ok
    assert exp_scan.ExpScan.attempt(*augment(*potentials, lengths), spread()) is None
    torch.testing.assert_close(crf.log_partition(emissions), torch.tensor([800.0 + math.log(2.0)], dtype=torch.float64))
    torch.testing.assert_close(crf.marginals(emissions)[0, :, 1], torch.full((80,), 0.5, dtype=torch.float64))


@pytest.mark.parametrize("path", ["torch", "compiled"], indirect=True)
def test_double_backward_goes_through_the_general_engine(path, monkeypatch):
    """create_graph=True: second derivatives are those of the general engine's log partition."""
    crf = iob2_layer()
    emissions, mask, _ = random_inputs(5, 3, 7, scale=1.0, seed=2)
    direction = torch.randn_like(emissions)

    def second_derivative():
        leaf = emissions.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(crf.log_partition(leaf, mask).sum(), leaf, create_graph=True)
        (again,) = torch.autograd.grad((grad * direction).sum(), leaf)
        return grad.detach(), again

    fast = second_derivative()
    general_engine(monkeypatch)
    for got, expected in zip(fast, second_derivative()):
        torch.testing.assert_close(got, expected)


def test_without_a_compiler_auto_runs_torch_and_compiled_says_why(monkeypatch, tmp_path):
    """No compiler and no library built at install: "auto" computes on the torch backend without a
    word, backend="compiled" raises and names the missing compiler."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(fast_kernel, "_library", None)
    monkeypatch.setattr(fast_kernel, "_failed", None)
    monkeypatch.setattr(fast_kernel, "__file__", str(tmp_path / "kernel.py"))  # no library built at install
    monkeypatch.delenv(engine.ENV, raising=False)
    assert "no-such-compiler" in fast_kernel.unavailable()
    crf = iob2_layer()
    emissions, mask, _ = random_inputs(5, 3, 9, scale=1.0)
    tags = crf.decode(emissions, mask).clamp(min=0)
    assert torch.isfinite(crf(emissions, tags, mask)).all()
    crf.backend = "compiled"
    with pytest.raises(engine.BackendError, match="compiled.*no-such-compiler"):
        crf(emissions, tags, mask)


def test_step_spread_matches_its_definition():
    start = torch.tensor([0.5, -math.inf, -2.0])
    moves = torch.tensor([[1.0, -math.inf, 0.0], [3.0, -1.0, 2.0], [0.0, 0.0, -math.inf]])
    end = torch.tensor([-0.5, 0.0, 4.0])
    emissions = torch.tensor([[[1.0, -math.inf, 3.0], [-math.inf] * 3], [[0.0, 0.5, -1.0], [2.0, 2.0, 2.0]]])
    # emission spread 2 (rows 0 and 1 of the first sequence: 3 - 1 and all -inf -> 0; 0.5 - (-1) = 1.5)
    expected = 2 * 2.0 + 4.0 - (-2.0) + math.log(3 + 1)
    assert fast_first_order.step_spread(start, moves, end, emissions, 3) == pytest.approx(expected)
    assert math.isnan(fast_first_order.step_spread(start, moves * math.nan, end, emissions, 3))


def test_compiled_gold_score_rejects_out_of_range_states(compiled):
    start, moves, end = torch.zeros(3), torch.zeros(3, 3), torch.zeros(3)
    emissions = torch.randn(2, 4, 3)
    lengths = torch.tensor([4, 2])
    states = torch.tensor([[0, 1, 2, 1], [2, 0, 7, 7]])  # past row 1's length: ignored
    expected = torch_backend.path_score(start, moves, end, emissions, states.clamp(max=2), lengths)
    torch.testing.assert_close(compiled_backend.path_score(start, moves, end, emissions, states, lengths), expected)
    states[1, 1] = 3
    with pytest.raises(IndexError, match="outside"):
        compiled_backend.path_score(start, moves, end, emissions, states, lengths)


@pytest.mark.parametrize("path", ["torch", "compiled"], indirect=True)
def test_row_without_a_path_decodes_to_minus_one(path):
    """IOB2 forbids I-A after O: a row whose emissions allow only O then I-A has no path."""
    crf = iob2_layer()
    emissions = torch.randn(2, 4, 5, dtype=torch.float64)
    emissions[1] = -math.inf
    emissions[1, :2, 0] = 0.0  # O, O
    emissions[1, 2:, 2] = 0.0  # I-A, I-A
    tags = crf.decode(emissions)
    assert bool((tags[1] == -1).all())
    assert bool((tags[0] >= 0).all())


@pytest.mark.parametrize("budget, max_log, certified", [(1e-9, 300.0, True), (300.0, 300.0, True), (1e9, 5.0, False)])
def test_pair_scan_is_exact_or_falls_back(budget, max_log, certified, monkeypatch):
    """Second order (fast_pairs): log Z, every gradient and the marginals equal the log-space scan
    whether the pair scan rescales every position or every few; a scan whose values leave the
    certified range (narrowed here to exp(+-5), never rescaled) hands over to the general engine."""
    from neurocrf.structs import SecondOrderCRF
    from neurocrf.structs.engine.pytorch import pairs as fast_pairs

    monkeypatch.setattr(fast_first_order, "_SCALE_BUDGET", budget)
    monkeypatch.setattr(fast_pairs, "_MAX_LOG", max_log)
    built, scan_class = [], fast_pairs.PairForwardBackward
    monkeypatch.setattr(fast_pairs, "PairForwardBackward", lambda *args: built.append(scan_class(*args)) or built[-1])
    tags = ["O", "B-A", "I-A", "B-B", "I-B"]
    crf = SecondOrderCRF(len(tags), allowed_transitions(tags, "IOB2")).double()
    with torch.no_grad():
        for param in crf.parameters():
            param.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(4))
    emissions, mask, _ = random_inputs(5, 4, 120, scale=3.0, seed=6)
    gold = crf.decode(emissions, mask).clamp(min=0)
    fast = layer_outputs(crf, emissions, mask, gold)
    assert built and all(scan.ok == certified for scan in built)
    general_engine(monkeypatch)
    monkeypatch.setattr(exp_scan, "_BLOCK_BUDGET", -1.0)  # log space
    for got, expected in zip(fast, layer_outputs(crf, emissions, mask, gold)):
        torch.testing.assert_close(got, expected)


def test_pair_viterbi_equals_the_reference(monkeypatch):
    """The torch backend's Viterbi on pair states (back-pointers recomputed along the path) = the
    reference's max scan."""
    from neurocrf.structs import SecondOrderCRF
    from neurocrf.structs.engine import reference

    tags = ["O", "B-A", "I-A", "B-B", "I-B"]
    crf = SecondOrderCRF(len(tags), allowed_transitions(tags, "IOB2"))
    with torch.no_grad():
        for param in crf.parameters():
            param.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(5))
    emissions, mask, _ = random_inputs(5, 300, 30, scale=2.0, dtype=torch.float32, seed=7)
    mask[4] = True
    emissions[4] = -math.inf
    emissions[4, :, 0] = 0.0
    emissions[4, 3, 2] = 0.0  # a row whose only admissible tags form no path: O then I-A only
    emissions[4, 3, 0] = -math.inf
    crf.backend = "torch"
    calls = []
    scan = fast_search._by_scores
    monkeypatch.setattr(fast_search, "_by_scores", lambda *args: calls.append(1) or scan(*args))
    fast = crf.decode(emissions, mask)
    assert calls
    monkeypatch.setattr(fast_search, "viterbi", reference.max_scan)
    expected = crf.decode(emissions, mask)
    expected[4] = -1
    assert torch.equal(fast, expected)
    assert bool((fast[4] == -1).all())

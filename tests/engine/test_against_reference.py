"""The engine's reference against brute-force enumeration, and every backend against the reference.

:mod:`neurocrf.structs.engine.reference` is the plain log-space implementation of every engine
quantity; here it is held to enumeration over every tag sequence, and the backends (the torch
backend's fast scans, the compiled C kernel, the Triton kernels on Triton's interpreter) are held
to it, quantity by quantity: log Z and its gradients, marginals, Viterbi, k best, path scores.
Inputs come through the layers (first order, second order, precursor, pair emissions: per-position
transitions) with masks that have a masked first position, holes, empty rows and rows of one
position, and as random chains with forbidden moves and rows without any path. The large cases
are marked slow.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from neurocrf.structs import LinearChainCRF, pair_emissions
from neurocrf.structs.engine import reference
from neurocrf.structs.engine.pytorch import first_order, search
from tests.helpers.chains import check_against_enumeration, layer_inputs, random_chain
from tests.helpers.enumeration import CASES, make_layer, pair_reference_scores, random_mask

NEG_INF = float("-inf")
BACKENDS = ["torch", "compiled", "triton"]
# numpy's log(0) = -inf inside Triton's interpreter is the intended value
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


def case_id(case) -> str:
    kind, tags, scheme, constrained, options = case
    return "-".join([kind, scheme, "constrained" if constrained else "free", *map(str, options.values())])


def pair_layer(seed: int):
    """A first-order layer with pair emissions (per-position transitions in the engine)."""
    torch.manual_seed(seed)
    crf = LinearChainCRF(3).double()
    with torch.no_grad():
        for param in crf.parameters():
            param.normal_(0.0, 1.0)
    return crf


@pytest.fixture
def backend(request, monkeypatch):
    """The backend module of the test; Triton on its interpreter (skipped without triton), the
    compiled kernel skipped where it cannot be built."""
    name = request.param
    if name == "triton":
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    from neurocrf.structs import engine

    module = engine.load(name)
    reason = module.available()
    if reason is not None:
        pytest.skip(reason)
    return module


def assert_same_as_reference(backend, start, transitions, end, emissions, lengths, k: int = 3) -> None:
    """Every quantity of ``backend`` = the reference's on these chain inputs (skipped for inputs the
    backend does not take): log Z and its four gradients, marginals, Viterbi (paths identical),
    the k best (paths and scores), path scores and their gradients."""
    potentials = (start, transitions, end, emissions)
    reason = backend.unsupported(*potentials, lengths, k=k)
    if reason is not None:
        pytest.skip(reason)
    results = []
    for module in (backend, reference):
        leaves = [x.detach().clone().requires_grad_(True) for x in potentials]
        log_z = module.log_partition(*leaves, lengths)
        log_z.sum().backward()
        results.append((log_z.detach(), [x.grad for x in leaves]))
    (log_z, grads), (expected_log_z, expected_grads) = results
    torch.testing.assert_close(log_z, expected_log_z)
    for name, got, expected in zip(("start", "transitions", "end", "emissions"), grads, expected_grads):
        torch.testing.assert_close(got, expected, msg=f"gradient of {name}")

    detached = tuple(x.detach() for x in potentials)
    torch.testing.assert_close(backend.node_marginals(*detached, lengths), reference.node_marginals(*detached, lengths))
    states, best = backend.viterbi(*detached, lengths)
    expected_states, expected_best = reference.viterbi(*detached, lengths)
    assert torch.equal(states, expected_states)
    torch.testing.assert_close(best, expected_best, rtol=0, atol=1e-9)
    paths, scores = backend.kbest(*detached, lengths, k)
    expected_paths, expected_scores = reference.kbest(*detached, lengths, k)
    torch.testing.assert_close(scores, expected_scores, rtol=0, atol=1e-9)
    assert torch.equal(paths, expected_paths)

    random_states = torch.randint(0, start.numel(), states.shape, generator=torch.Generator().manual_seed(0))
    walked = torch.where(states >= 0, states, random_states)  # best paths, and any states where there is none
    scored = []
    for module in (backend, reference):
        leaves = [x.detach().clone().requires_grad_(True) for x in potentials]
        score = module.path_score(*leaves, walked, lengths)
        score.sum().backward()
        scored.append((score.detach(), [x.grad for x in leaves]))
    (score, grads), (expected_score, expected_grads) = scored
    torch.testing.assert_close(score.to(expected_score.dtype), expected_score)
    for name, got, expected in zip(("start", "transitions", "end", "emissions"), grads, expected_grads):
        torch.testing.assert_close(got, expected, msg=f"path score gradient of {name}")


# --- the reference against enumeration ---------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[case_id(case) for case in CASES])
def test_reference_matches_enumeration(case):
    kind, tags, scheme, constrained, options = case
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    crf, constraints = make_layer(kind, tags, scheme, constrained, **options)
    emissions = torch.randn(5, 6, len(tags), generator=generator, dtype=torch.float64)
    check_against_enumeration(reference, crf, constraints, emissions, random_mask(5, 6, generator))


def test_reference_matches_enumeration_with_per_position_transitions():
    generator = torch.Generator().manual_seed(2)
    crf = pair_layer(2)
    pairs = pair_emissions(torch.randn(4, 5, 3, generator=generator, dtype=torch.float64),
                           torch.randn(4, 5, 3, 3, generator=generator, dtype=torch.float64))
    check_against_enumeration(reference, crf, None, pairs, random_mask(4, 5, generator),
                              reference=pair_reference_scores)


def test_reference_viterbi_ties_go_to_the_lower_state():
    """All paths score 0: the best path is all state 0; among equal scores the k best take the
    lower state at the later position first (the order of ``max`` over the flattened sources)."""
    start, transitions, end = torch.zeros(3), torch.zeros(3, 3), torch.zeros(3)
    emissions, lengths = torch.zeros(1, 2, 3), torch.tensor([2])
    states, _ = reference.viterbi(start, transitions, end, emissions, lengths)
    paths, _ = reference.kbest(start, transitions, end, emissions, lengths, 4)
    assert states.tolist() == [[0, 0]]
    assert paths.tolist() == [[[0, 0], [1, 0], [2, 0], [0, 1]]]


# --- every backend against the reference ---------------------------------------------------------------

def per_backend(cases: list, default: set[int], triton_default: set[int]) -> list:
    """``(backend, case)`` parameters: case ``i`` runs by default on torch and compiled when ``i`` is
    in ``default``, on Triton's interpreter (10-20 s a case) when it is in ``triton_default``;
    every combination with ``-m slow``."""
    params = []
    for name in BACKENDS:
        for i, case in enumerate(cases):
            fast = i in (triton_default if name == "triton" else default)
            param = case.values[0] if hasattr(case, "values") else case
            label = case.id if hasattr(case, "id") else case_id(case)
            params.append(pytest.param(name, param, id=f"{label}-{name}", marks=() if fast else pytest.mark.slow))
    return params


@pytest.mark.parametrize(("backend", "case"), per_backend(CASES, {1, 6, 10}, {1}), indirect=["backend"])
def test_backend_matches_reference_on_layer_inputs(backend, case):
    """Each layer kind, masks with a masked first position, holes, an empty row and a row of one."""
    kind, tags, scheme, constrained, options = case
    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    crf, _ = make_layer(kind, tags, scheme, constrained, **options)
    emissions = torch.randn(5, 7, len(tags), generator=generator, dtype=torch.float64)
    assert_same_as_reference(backend, *(x.detach() for x in layer_inputs(crf, emissions, random_mask(5, 7, generator))))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)], indirect=True)
def test_backend_matches_reference_on_pair_emissions(backend):
    """Per-position transitions (a first-order layer with pair emissions; the compiled kernel does
    not take them)."""
    generator = torch.Generator().manual_seed(4)
    crf = pair_layer(4)
    pairs = pair_emissions(torch.randn(4, 6, 3, generator=generator, dtype=torch.float64),
                           torch.randn(4, 6, 3, 3, generator=generator, dtype=torch.float64))
    assert_same_as_reference(backend, *(x.detach() for x in layer_inputs(crf, pairs, random_mask(4, 6, generator))))


CHAINS = [  # batch, seq_len, size, order, per_position, dtype
    pytest.param((6, 9, 4, 1, False, torch.float64), id="first-order"),
    pytest.param((6, 9, 4, 1, False, torch.float32), id="first-order-float32"),
    pytest.param((5, 7, 3, 2, False, torch.float64), id="pairs"),
    pytest.param((5, 7, 3, 1, True, torch.float64), id="first-order-per-position"),
    pytest.param((4, 6, 3, 2, True, torch.float64), id="pairs-per-position"),
    pytest.param((24, 60, 9, 1, False, torch.float64), id="first-order-large"),
    pytest.param((24, 60, 5, 2, False, torch.float64), id="pairs-large"),
]


@pytest.mark.parametrize(("backend", "shape"), per_backend(CHAINS, {0, 1, 2, 3, 4}, {2}), indirect=["backend"])
def test_backend_matches_reference_on_random_chains(backend, shape):
    """Forbidden moves, lengths from 0 to T, and a row whose every position forbids all states
    but one, with no move between them (no path at all)."""
    batch, seq_len, size, order, per_position, dtype = shape
    if backend.__name__.endswith("triton") and (seq_len > 9 or size > 4):
        pytest.skip("large cases take minutes on Triton's interpreter")
    start, transitions, end, emissions, lengths = random_chain(batch, seq_len, size, order, dtype,
                                                               torch.Generator().manual_seed(5),
                                                               per_position=per_position)
    emissions[-1] = NEG_INF
    emissions[-1, ..., 0] = 0.0
    lengths[-1] = seq_len
    if per_position:
        transitions[-1, ..., 0] = NEG_INF
    else:
        transitions[..., 0, 0] = NEG_INF
    assert_same_as_reference(backend, start, transitions, end, emissions, lengths)


@pytest.mark.parametrize("per_position", [False, True])
@pytest.mark.parametrize("order", [1, 2])
def test_both_torch_viterbi_scans_equal_the_reference_with_ties(monkeypatch, order, per_position):
    """The torch backend's one max scan, by back-pointers and by recomputed pointers, = the
    reference's paths on integer scores (ties everywhere) and rows without a path."""
    generator = torch.Generator().manual_seed(6)
    start, transitions, end, emissions, lengths = random_chain(7, 12, 3, order, torch.float64, generator,
                                                               per_position=per_position)
    start, transitions, end, emissions = (x.round() for x in (start, transitions, end, emissions))
    augmented = reference.augmented(start, transitions, end, emissions, lengths)
    expected = reference.max_scan(*augmented)
    for scan in (search._by_pointers, search._by_scores):
        states, best = scan(*augmented)
        found = torch.isfinite(expected[1])
        assert torch.equal(states[found], expected[0][found]), scan.__name__
        assert torch.equal(best, expected[1])


def test_torch_backend_uses_its_fast_scans_here(monkeypatch):
    """The first-order layer inputs above take the torch backend's certified fast scan (not only
    its general one), so the comparison covers it."""
    from neurocrf.structs.engine import pytorch as torch_backend

    calls = []
    scan = first_order.forward_backward
    monkeypatch.setattr(first_order, "forward_backward", lambda *args: calls.append(1) or scan(*args))
    generator = torch.Generator().manual_seed(3)
    crf, _ = make_layer(*CASES[1][:4])
    emissions = torch.randn(5, 7, len(CASES[1][1]), generator=generator, dtype=torch.float64)
    inputs = [x.detach() for x in layer_inputs(crf, emissions, random_mask(5, 7, generator))]
    torch_backend.log_partition(*inputs)
    assert calls

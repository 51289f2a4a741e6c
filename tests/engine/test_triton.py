"""The Triton backend of the chain engine against brute-force enumeration and the torch engine.

CPU tests run the kernels on Triton's interpreter: the ``interpreted`` fixture sets
``TRITON_INTERPRET=1`` for each test (the backend reads it at call time and keeps interpreted and
compiled kernels apart, so the order of imports does not matter). Tests marked ``gpu`` compile the
same kernels for CUDA and compare them with the torch engine at benchmark sizes.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from neurocrf.structs import LinearChainCRF  # noqa: E402
from neurocrf.structs.engine import triton as backend  # noqa: E402
from neurocrf.structs.engine.chain import Chain  # noqa: E402
from neurocrf.structs.engine.chain import path_score as torch_path_score  # noqa: E402
from neurocrf.structs.engine.triton import runtime  # noqa: E402
from tests.helpers.chains import random_chain  # noqa: E402
from tests.helpers.enumeration import CASES, make_layer, pair_reference_scores, random_mask  # noqa: E402
from tests.helpers.triton import (  # noqa: E402
    assert_same_as_torch,
    check_against_enumeration,
    torch_gradients,
    triton_gradients,
)

NEG_INF = float("-inf")
# numpy's log(0) = -inf inside the interpreter is the intended value
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


@pytest.fixture(autouse=True)
def interpreted(request, monkeypatch):
    """CPU tests: Triton's interpreter; ``gpu`` tests: compiled kernels."""
    if "gpu" in request.keywords:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


# one case per layer in the default run (constraints, BIOES, state bias), every case with -m slow
DEFAULT_CASES = (1, 6, 10)
LAYER_CASES = [pytest.param(case, marks=() if i in DEFAULT_CASES else pytest.mark.slow) for i, case in enumerate(CASES)]


@pytest.mark.parametrize("case", LAYER_CASES, ids=lambda c: f"{c[0]}-{c[2]}-{'c' if c[3] else 'u'}-{len(c[4])}")
def test_layers_match_enumeration(case):
    """First-order, second-order (pair states) and precursor (expanded states) layers, with and
    without constraints, masks with holes, rows of length 0 and 1."""
    kind, tags, scheme, constrained, options = case
    crf, constraints = make_layer(kind, tags, scheme, constrained, **options)
    generator = torch.Generator().manual_seed(len(tags) * 7 + len(kind))
    emissions = torch.randn(5, 6, len(tags), generator=generator, dtype=torch.float64) * 2
    check_against_enumeration(crf, constraints, emissions, random_mask(5, 6, generator))


def test_pair_emissions_match_enumeration():
    """Per-position transitions (the first-order layer's pair emissions)."""
    crf, constraints = make_layer("first_order", ["O", "B-A", "I-A", "B-B", "I-B"], "IOB2", True)
    generator = torch.Generator().manual_seed(3)
    pairs = torch.randn(4, 5, 6, 5, generator=generator, dtype=torch.float64) * 2
    check_against_enumeration(crf, constraints, pairs, random_mask(4, 5, generator), reference=pair_reference_scores)


@pytest.mark.parametrize("num_tags", [1, 5, 17, 33])
def test_state_counts_match_enumeration(num_tags):
    """Any number of states (padding lanes of non-power-of-two blocks), with -inf constraints."""
    crf = LinearChainCRF(num_tags).double()
    generator = torch.Generator().manual_seed(num_tags)
    with torch.no_grad():
        for param in crf.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64))
        crf.transitions[torch.rand(num_tags, num_tags, generator=generator) < 0.2] = NEG_INF
    seq_len = 3 if num_tags <= 17 else 2
    emissions = torch.randn(4, seq_len, num_tags, generator=generator, dtype=torch.float64)
    mask = torch.tensor([[True] * seq_len, [False] * seq_len, [True] + [False] * (seq_len - 1),
                         [False] + [True] * (seq_len - 1)])
    check_against_enumeration(crf, None, emissions, mask, k=3)


CHAINS = [(5, 1, False, torch.float32), (4, 2, False, torch.float64), (5, 1, True, torch.float64),
          (3, 2, True, torch.float32)]
SLOW_CHAINS = [(5, 1, False, torch.float64), (17, 1, False, torch.float32), (17, 1, False, torch.float64),
               (4, 2, False, torch.float32), (6, 2, False, torch.float32), (5, 1, True, torch.float32),
               (3, 2, True, torch.float64)]


@pytest.mark.parametrize("size,order,per_position,dtype",
                         CHAINS + [pytest.param(*case, marks=pytest.mark.slow) for case in SLOW_CHAINS],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_matches_torch_engine(size, order, per_position, dtype):
    """Every quantity and every gradient equal to the torch engine's; search results identical."""
    generator = torch.Generator().manual_seed(size * 10 + order)
    *potentials, lengths = random_chain(4, 9, size, order, dtype, generator, per_position)
    assert assert_same_as_torch(potentials, lengths, 6).dtype == dtype
    gold = Chain(*potentials, lengths).kbest(1)[0][:, 0].clamp(min=0)
    path_grads = []
    for score_fn in (backend.path_score, torch_path_score):
        leaves = [x.detach().clone().requires_grad_(True) for x in potentials]
        score = score_fn(*leaves, gold, lengths)
        score.masked_fill(~torch.isfinite(score), 0).sum().backward()
        path_grads.append((score.detach(), [x.grad for x in leaves]))
    torch.testing.assert_close(path_grads[0][0], path_grads[1][0])
    assert path_grads[0][0].dtype == dtype
    for got, expected in zip(path_grads[0][1], path_grads[1][1]):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("order", [1, 2])
def test_ties_broken_as_the_torch_engine(order):
    """Integer scores make many paths tie: Viterbi and k best pick the same ones as the torch engine."""
    generator = torch.Generator().manual_seed(order)
    size = 4 if order == 1 else 3
    shape = (size,) * order
    start, end = torch.zeros(shape), torch.randint(0, 2, shape, generator=generator).float()
    moves = torch.randint(0, 2, shape + (size,), generator=generator).float()
    emissions = torch.randint(0, 2, (3, 7) + shape, generator=generator).float()
    lengths = torch.tensor([7, 4, 1])
    chain = Chain(start, moves, end, emissions, lengths)
    assert torch.equal(backend.viterbi(start, moves, end, emissions, lengths)[0], chain.viterbi()[0])
    for k in (1, 5, 16):
        paths, scores = backend.kbest(start, moves, end, emissions, lengths, k)
        ref_paths, ref_scores = chain.kbest(k)
        assert torch.equal(paths, ref_paths) and torch.equal(scores, ref_scores)


def test_rows_without_a_path_and_empty_inputs():
    """No finite path: log Z -inf, zero (not NaN) gradients and marginals, states -1; empty
    batches and empty sequences: zeros and no launch."""
    generator = torch.Generator().manual_seed(0)
    *potentials, lengths = random_chain(3, 5, 4, 1, torch.float32, generator, holes=0.0)
    potentials[3][1, 2] = NEG_INF  # row 1: every state forbidden at position 2
    lengths = torch.tensor([5, 5, 0])
    log_z, grads = triton_gradients(potentials, lengths)
    assert torch.isneginf(log_z[1]) and torch.isfinite(log_z[0]) and log_z[2] == 0
    for grad in grads:
        assert bool(torch.isfinite(grad).all())
    assert bool((grads[3][1] == 0).all()) and bool((grads[3][2] == 0).all())
    assert bool((backend.node_marginals(*potentials, lengths)[1] == 0).all())
    leaves = [x.clone().requires_grad_(True) for x in potentials]  # an infinite weight on the dead row
    backend.log_partition(*leaves, lengths).backward(torch.tensor([1.0, float("inf"), 1.0]))
    assert all(bool(torch.isfinite(x.grad).all()) for x in leaves) and bool((leaves[3].grad[1] == 0).all())
    states, best = backend.viterbi(*potentials, lengths)
    assert bool((states[1] == -1).all()) and torch.isneginf(best[1]) and best[2] == 0
    paths, scores = backend.kbest(*potentials, lengths, 3)
    assert bool((paths[1] == -1).all()) and bool(torch.isneginf(scores[1]).all())
    assert scores[2, 0] == 0 and bool(torch.isneginf(scores[2, 1:]).all())

    before = sum(runtime.LAUNCHES.values())
    start, moves, end = potentials[:3]
    for batch, seq_len in ((0, 5), (2, 0)):
        emissions = torch.zeros(batch, seq_len, 4, requires_grad=True)
        lengths = torch.zeros(batch, dtype=torch.long)
        log_z = backend.log_partition(start, moves, end, emissions, lengths)
        log_z.sum().backward()
        assert log_z.shape == (batch,) and bool((log_z == 0).all()) and emissions.grad.shape == emissions.shape
        assert backend.node_marginals(start, moves, end, emissions, lengths).shape == (batch, seq_len, 4)
        assert backend.kbest(start, moves, end, emissions, lengths, 2)[0].shape == (batch, 2, seq_len)
    assert sum(runtime.LAUNCHES.values()) == before


@pytest.mark.parametrize("seq_len", [300, pytest.param(3000, marks=pytest.mark.slow)])
def test_long_sequence_float32_precision(seq_len):
    """One long row in float32: log Z and gradients against the float64 torch engine."""
    generator = torch.Generator().manual_seed(5)
    *potentials, _ = random_chain(1, seq_len, 5, 1, torch.float32, generator, holes=0.1, scale=3.0)
    lengths = torch.tensor([seq_len])
    log_z, grads = triton_gradients(potentials, lengths)
    ref_log_z, ref_grads = torch_gradients([x.double() for x in potentials], lengths)
    assert abs(float(log_z[0]) / float(ref_log_z[0]) - 1) < 1e-6
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_long_sequences_run_the_recurrences_in_float64(monkeypatch):
    """From ``LONG_SEQUENCE`` positions float32 inputs run float64 kernels (results stay float32)."""
    from neurocrf.structs.engine.triton import inputs

    launched = []
    original = runtime.launch

    def record(name, rows, *args, **constants):
        launched.append((name, args[0].dtype))
        original(name, rows, *args, **constants)

    monkeypatch.setattr(runtime, "launch", record)
    *potentials, lengths = random_chain(2, 10, 3, 1, torch.float32, torch.Generator().manual_seed(2))
    for threshold, dtype in ((11, torch.float32), (10, torch.float64)):
        monkeypatch.setattr(inputs, "LONG_SEQUENCE", threshold)
        launched.clear()
        log_z, grads = triton_gradients(potentials, lengths)
        assert [kernel_dtype for _, kernel_dtype in launched] == [dtype, dtype]
        assert log_z.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
        ref_log_z, ref_grads = torch_gradients([x.double() for x in potentials], lengths)
        torch.testing.assert_close(log_z, ref_log_z.float())
        for got, expected in zip(grads, ref_grads):
            torch.testing.assert_close(got, expected.float())


def test_half_precision_emissions_and_large_scores():
    """bf16 and fp16 emissions are upcast inside (float32 results); emissions of 1e4 give no NaN."""
    generator = torch.Generator().manual_seed(6)
    *potentials, lengths = random_chain(3, 6, 5, 1, torch.float32, generator)
    start, moves, end, emissions = potentials
    for half in (torch.bfloat16, torch.float16):
        low = emissions.to(half).requires_grad_(True)
        log_z = backend.log_partition(start, moves, end, low, lengths)
        assert log_z.dtype == torch.float32
        torch.testing.assert_close(log_z, backend.log_partition(start, moves, end, low.float(), lengths))
        log_z.sum().backward()
        assert low.grad.dtype == half
    big = (emissions * 1e4).requires_grad_(True)
    log_z = backend.log_partition(start, moves, end, big, lengths)
    log_z.sum().backward()
    assert bool(torch.isfinite(log_z).all()) and bool(torch.isfinite(big.grad).all())
    ref_log_z, ref_grads = torch_gradients([start, moves, end, big.detach()], lengths)
    torch.testing.assert_close(log_z.double(), ref_log_z.double(), rtol=1e-6, atol=0)
    torch.testing.assert_close(big.grad, ref_grads[3], rtol=1e-4, atol=1e-4)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _launches(fn) -> tuple[int, int]:
    """(Triton kernel launches, torch operators) run by ``fn``."""
    before = sum(runtime.LAUNCHES.values())
    with _CountOps() as ops:
        fn()
    return sum(runtime.LAUNCHES.values()) - before, ops.count


@pytest.mark.parametrize("order,per_position", [(1, False), pytest.param(2, False, marks=pytest.mark.slow),
                                                pytest.param(1, True, marks=pytest.mark.slow)])
def test_launches_do_not_grow_with_length_or_batch(order, per_position):
    counts = []
    for batch, seq_len in ((2, 3), (2, 12), (4, 12)):
        *potentials, lengths = random_chain(batch, seq_len, 3, order, torch.float32, torch.Generator().manual_seed(1),
                                            per_position)
        leaves = [x.requires_grad_(True) for x in potentials]

        def calls():
            backend.log_partition(*leaves, lengths).sum().backward()
            backend.node_marginals(*potentials, lengths)
            backend.viterbi(*potentials, lengths)
            backend.kbest(*potentials, lengths, 4)

        counts.append(_launches(calls))
    assert counts[0][0] == 6  # forward, backward; forward + backward for the marginals; search twice
    assert counts[0] == counts[1] == counts[2]


def test_unsupported_inputs_say_why(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    *potentials, lengths = random_chain(2, 3, 3, 1, torch.float32, generator)
    assert backend.unsupported(*potentials, lengths) is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA tensors" in backend.unsupported(*potentials, lengths)
    with pytest.raises(ValueError, match="CUDA tensors"):
        backend.log_partition(*potentials, lengths)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    *big, lengths = random_chain(1, 2, 40, 2, torch.float32, generator)
    assert backend.unsupported(*big, lengths) is None  # 1600 pair states: the blocked kernels
    assert backend.unsupported(*big, lengths, k=16) is None

    def first_order(size):  # expanded views: no memory
        return [torch.zeros(1).expand(*shape) for shape in ((size,), (size, size), (size,), (1, 2, size))]

    assert "int32 offsets" in backend.unsupported(*first_order(50000), lengths)
    wide = first_order(40000)
    assert backend.unsupported(*wide, lengths, k=8) is None
    assert "key limit" in backend.unsupported(*wide, lengths, k=30000)
    assert "do not fit one block" in backend.unsupported(*big, lengths, k=5000)
    order3 = [torch.zeros(2, 2, 2), torch.zeros(2, 2, 2, 2), torch.zeros(2, 2, 2), torch.zeros(1, 1, 2, 2, 2)]
    assert "order 3" in backend.unsupported(*order3, torch.ones(1, dtype=torch.long))
    assert "dtype" in backend.unsupported(*potentials[:3], potentials[3].long(), lengths)
    with pytest.raises(ValueError, match="state shape"):
        backend.log_partition(potentials[0][:2], *potentials[1:], lengths)


# --- GPU: the compiled kernels at benchmark sizes --------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("batch,seq_len,size,order", [(32, 40, 9, 1), (256, 128, 17, 1), (64, 1024, 9, 1),
                                                      (32, 40, 10, 2), (64, 1024, 10, 2),
                                                      (32, 40, 200, 1), (16, 40, 34, 2)])  # blocked kernels
def test_gpu_matches_torch_engine(batch, seq_len, size, order):
    generator = torch.Generator().manual_seed(batch + seq_len)
    *potentials, lengths = random_chain(batch, seq_len, size, order, torch.float32, generator, holes=0.1)
    potentials, lengths = [x.cuda() for x in potentials], lengths.cuda()
    log_z, grads = triton_gradients(potentials, lengths)
    ref_log_z, ref_grads = torch_gradients([x.double() for x in potentials], lengths)
    torch.testing.assert_close(log_z.double(), ref_log_z, rtol=1e-6, atol=1e-5)
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    chain = Chain(*potentials, lengths)
    states, best = backend.viterbi(*potentials, lengths)
    ref_states, ref_best = chain.viterbi()
    assert torch.equal(states, ref_states)
    torch.testing.assert_close(best, ref_best, rtol=0, atol=1e-9)
    k = 5 if order == 1 else 4  # 10 x 10 pair states hold up to 4 ranks on chip
    paths, scores = backend.kbest(*potentials, lengths, k)
    ref_paths, ref_scores = chain.kbest(k)
    assert torch.equal(paths, ref_paths) and torch.equal(scores, ref_scores)


@pytest.mark.gpu
def test_gpu_long_sequence_precision():
    """T = 20,000 in float32: NLL relative error <= 1e-6, gradients <= 1e-5 against float64."""
    generator = torch.Generator().manual_seed(9)
    *potentials, _ = random_chain(2, 20000, 9, 1, torch.float32, generator, holes=0.1, scale=3.0)
    potentials, lengths = [x.cuda() for x in potentials], torch.tensor([20000, 13001], device="cuda")
    gold = Chain(*[x.double() for x in potentials], lengths).viterbi()[0].clamp(min=0)
    nll = backend.log_partition(*potentials, lengths).double() - backend.path_score(*potentials, gold, lengths).double()
    ref = Chain(*[x.double() for x in potentials], lengths).log_partition() - torch_path_score(
        *[x.double() for x in potentials], gold, lengths)
    assert float(((nll - ref) / ref).abs().max()) <= 1e-6
    _, grads = triton_gradients(potentials, lengths)
    _, ref_grads = torch_gradients([x.double() for x in potentials], lengths)
    for got, expected in zip(grads, ref_grads):
        assert float((got.double() - expected).abs().max()) <= 1e-5 * max(1.0, float(expected.abs().max()))

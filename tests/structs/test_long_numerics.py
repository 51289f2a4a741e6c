"""Numerics of long sequences on CPU: float32 NLL and gradients against float64 references (compiled
gold-path sums, the parallel scan), the precursor layer's shrinking O state on the compiled scan,
and the memory of the torch backend's first-order Viterbi."""

from __future__ import annotations

import copy

import pytest
import torch

from neurocrf.structs import LinearChainCRF, PrecursorInducedCRF, allowed_transitions
from neurocrf.structs.engine import pytorch as torch_backend
from neurocrf.structs.engine import reference
from neurocrf.structs.engine.augmented import augment
from neurocrf.structs.engine.compiled import kernel
from neurocrf.structs.engine.pytorch import first_order, search

TAGS = ["O", "B-A", "I-A", "B-B", "I-B", "B-C", "I-C", "B-D", "I-D"]


@pytest.fixture
def compiled():
    reason = kernel.unavailable()
    if reason is not None:
        pytest.skip(reason)


def seeded_layer(layer):
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    return layer


def float64_nll(crf, emissions, tags) -> torch.Tensor:
    wide = copy.deepcopy(crf).double()
    wide.backend = "torch"
    return wide(emissions.double(), tags, reduction="none")


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_compiled_nll_of_20000_positions_in_float32_is_accurate(compiled, scale):
    """Gold-path scores summed in float64: the float32 NLL stays within 1e-6 of float64's (summed in
    float32 they were 5e-4 off, 2e-3 with large emissions)."""
    crf = seeded_layer(LinearChainCRF(len(TAGS), backend="compiled"))
    generator = torch.Generator().manual_seed(1)
    emissions = torch.randn(2, 20_000, len(TAGS), generator=generator) * scale
    tags = torch.randint(len(TAGS), (2, 20_000), generator=generator)
    nll = crf(emissions, tags, reduction="none")
    expected = float64_nll(crf, emissions, tags)
    assert nll.dtype == torch.float32
    assert float(((nll.double() - expected).abs() / expected.abs()).max()) <= 1e-6


def test_parallel_scan_gradients_of_20000_positions_in_float32(monkeypatch):
    """The parallel scan (the torch backend's long-sequence path on GPUs, forced here on CPU) sums in
    float64: float32 gradients within 1e-5 of float64's (8e-4 off when it summed in float32)."""
    crf = seeded_layer(LinearChainCRF(5, scan="parallel"))
    emissions = torch.randn(1, 20_000, 5, generator=torch.Generator().manual_seed(2)) * 3

    def gradient(dtype):
        leaf = emissions.to(dtype).requires_grad_(True)
        layer = crf.to(dtype)
        (grad,) = torch.autograd.grad(layer.log_partition(leaf).sum(), leaf)
        return grad.double()

    got, expected = gradient(torch.float32), gradient(torch.float64)
    assert float((got - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("seq_len", [256, 1000])
@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_precursor_stays_on_the_fast_scans_and_is_exact(request, monkeypatch, backend, seq_len):
    """The "no entity yet" O state shrinks below float64's range on long sentences: the fast scans
    (compiled and torch) drop it with a bound on what it could carry instead of handing the batch to
    the slow log-space scan, and log Z, the gradients and the marginals equal the log-space scan's."""
    if backend == "compiled":
        request.getfixturevalue("compiled")
    crf = seeded_layer(PrecursorInducedCRF(TAGS, "IOB2", backend=backend)).double()
    generator = torch.Generator().manual_seed(3)
    emissions = torch.randn(3, seq_len, len(TAGS), generator=generator, dtype=torch.float64) * 2
    mask = torch.ones(3, seq_len, dtype=torch.bool)
    mask[1, seq_len // 2:] = False
    tags = crf.decode(emissions, mask).clamp(min=0)

    def outputs():
        crf.zero_grad()
        leaf = emissions.clone().requires_grad_(True)
        nll = crf(leaf, tags, mask, reduction="sum")
        nll.backward()
        with torch.no_grad():
            marginals = crf.marginals(emissions, mask)
        return [nll.detach(), leaf.grad, *[p.grad.clone() for p in crf.parameters()], marginals]

    def refuse(*args, **kwargs):
        raise AssertionError("the fast scan handed the batch to the general scan")

    with monkeypatch.context() as patch:
        patch.setattr(torch_backend, "general_log_partition", refuse)
        patch.setattr(torch_backend.LogPartition, "apply", refuse)
        fast = outputs()
    crf.backend = "torch"
    monkeypatch.setattr(first_order, "applies", lambda *args: False)
    monkeypatch.setattr(torch_backend.ExpScan, "attempt", classmethod(lambda cls, *args: None))  # log space
    for got, expected in zip(fast, outputs()):
        torch.testing.assert_close(got, expected)  # float64: rtol 1e-7, atol 1e-7


def test_torch_viterbi_memory_does_not_grow_with_the_batch_times_length():
    """64 x 128 x 45 decodes with step buffers of a few MiB (the full [T, B, L+1, L+1] float64 step
    tensor took 139 MB) and the paths of the reference's max scan."""
    crf = seeded_layer(LinearChainCRF(45, allowed_transitions(["O"] + [f"{p}-T{i}" for i in range(22) for p in "BI"],
                                                                "IOB2"), backend="torch"))
    emissions = torch.randn(64, 128, 45, generator=torch.Generator().manual_seed(4))
    mask = torch.rand(64, 128, generator=torch.Generator().manual_seed(5)) < 0.9
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        tags = crf.decode(emissions, mask)
    largest = max(event.cpu_memory_usage for event in profile.events())
    assert 0 < largest <= 16 << 20  # bytes one operation allocates
    start, transitions, end = (x.double() for x in crf._potentials(torch.float64))
    lengths = mask.sum(1)
    compact = torch.stack([torch.cat([e[m], e[~m]]) for e, m in zip(emissions.double(), mask)])
    states, _ = reference.max_scan(*augment(start, transitions, end, compact, lengths))
    expected = torch.full_like(tags, -1)
    for row in range(64):
        expected[row, mask[row]] = states[row, : int(lengths[row])]
    assert torch.equal(tags, expected)


def test_viterbi_by_scores_equals_viterbi_by_pointers(monkeypatch):
    """Large steps recompute the back-pointers along the path: same paths, ties included (integer
    scores tie everywhere), rows without a path all -1."""
    crf = LinearChainCRF(5, allowed_transitions(["O", "B-A", "I-A", "B-B", "I-B"], "IOB2"), backend="torch").double()
    with torch.no_grad():
        for param in crf.parameters():
            param.copy_(torch.randint(-2, 3, param.shape, generator=torch.Generator().manual_seed(7)))
    emissions = torch.randint(-2, 3, (6, 30, 5), generator=torch.Generator().manual_seed(8)).double()
    emissions[5] = -float("inf")
    emissions[5, :, 2] = 0.0  # only I-A: no path under IOB2
    mask = torch.rand(6, 30, generator=torch.Generator().manual_seed(9)) < 0.9
    by_pointers = crf.decode(emissions, mask)
    monkeypatch.setattr(search, "SCORES_ONLY_ELEMENTS", 0)
    assert torch.equal(crf.decode(emissions, mask), by_pointers)
    assert bool((by_pointers[5] == -1).all())


"""Emission columns shared by several states (``Chain(..., columns=)``): every quantity, on the
torch backend and on the compiled kernel (which reads the columns in place), equals the torch
backend's over the expanded state emissions, with masks, empty rows, -inf moves (the kernel's list of moves
outside its dense destinations), long rows whose "no entity yet" state is dropped, float32 and
float64, and second derivatives; the precursor layer takes the in-place path on the compiled
kernel."""

from __future__ import annotations

import pytest
import torch

from neurocrf.structs import PrecursorInducedCRF
from neurocrf.structs.engine import columns as shared
from neurocrf.structs.engine.chain import Chain
from neurocrf.structs.engine.compiled import kernel

TAGS = ["O", "B-A", "I-A", "B-B", "I-B", "B-C", "I-C"]


@pytest.fixture(params=["torch", "compiled"])
def backend(request):
    if request.param == "compiled" and kernel.unavailable() is not None:
        pytest.skip(kernel.unavailable())
    return request.param


def chain_inputs(seed: int, dtype: torch.dtype, batch: int = 4, seq_len: int = 6, num_columns: int = 4,
                 columns: tuple[int, ...] = (0, 1, 2, 3, 0, 0, 2), forbidden: str = "block"):
    """Potentials of a chain whose states ``>= num_columns`` repeat columns, with lengths 0 .. T.

    ``forbidden``: ``"block"`` (states ``>= num_columns`` entered only from a few sources, like the
    precursor's O states, the rest dense), ``"scattered"`` (random -inf moves) or ``"none"``."""
    generator = torch.Generator().manual_seed(seed)
    size = len(columns)
    start, end = torch.randn(size, generator=generator), torch.randn(size, generator=generator)
    transitions = torch.randn(size, size, generator=generator)
    if forbidden == "block":
        allowed = torch.ones(size, size, dtype=torch.bool)
        allowed[:, num_columns:] = False
        for k in range(num_columns, size):
            allowed[[k, k % num_columns, (k * 3) % size], k] = True
        transitions = transitions.masked_fill(~allowed, float("-inf"))
    elif forbidden == "scattered":
        transitions = transitions.masked_fill(torch.rand(size, size, generator=generator) < 0.3, float("-inf"))
    emissions = torch.randn(batch, seq_len, num_columns, generator=generator) * 2
    lengths = torch.arange(batch) * seq_len // max(batch - 1, 1)
    potentials = [x.to(dtype) for x in (start, transitions, end, emissions)]
    return potentials, lengths, torch.tensor(columns)


def quantities(potentials, lengths, columns, states, backend, expanded: bool):
    """log Z, gold-path scores, their gradients, the marginals and the Viterbi path and score of the
    chain (over the expanded state emissions when ``expanded``)."""
    leaves = [x.clone().requires_grad_(True) for x in potentials]
    emissions = shared.expand(leaves[3], columns) if expanded else leaves[3]
    chain = Chain(*leaves[:3], emissions, lengths, backend=backend, columns=None if expanded else columns)
    log_z, score = chain.log_partition(), chain.path_score(states)
    weights = torch.linspace(0.5, 1.5, log_z.shape[0], dtype=log_z.dtype)
    grads = torch.autograd.grad((weights * (log_z - score)).sum(), leaves)
    return [log_z, score, *grads, chain.marginals(), *chain.viterbi()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("forbidden", ["block", "scattered", "none"])
def test_shared_columns_equal_the_expanded_chain(backend, dtype, forbidden):
    potentials, lengths, columns = chain_inputs(0, dtype, forbidden=forbidden)
    allowed = potentials[1] > float("-inf")
    states = torch.zeros(lengths.shape[0], potentials[3].shape[1], dtype=torch.long)
    for t in range(1, states.shape[1]):  # an allowed path, whatever the forbidden moves
        states[:, t] = allowed[states[:, t - 1]].to(torch.int8).argmax(-1)
    got = quantities(potentials, lengths, columns, states, backend, expanded=False)
    expected = quantities(potentials, lengths, columns, states, "torch", expanded=True)
    assert got[5].shape == potentials[3].shape  # the emission gradient has the columns' shape
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def test_compiled_kernel_reads_shared_columns_in_place(monkeypatch):
    if kernel.unavailable() is not None:
        pytest.skip(kernel.unavailable())
    potentials, lengths, columns = chain_inputs(1, torch.float32)
    expected = quantities(potentials, lengths, columns, torch.zeros(4, 6, dtype=torch.long), "torch", True)

    def refuse(*args):
        raise AssertionError("the state emissions were expanded")

    monkeypatch.setattr(shared, "expand", refuse)
    leaves = [x.clone().requires_grad_(True) for x in potentials]
    chain = Chain(*leaves[:3], leaves[3], lengths, backend="compiled", columns=columns)
    log_z, score = chain.log_partition(), chain.path_score(torch.zeros(4, 6, dtype=torch.long))
    weights = torch.linspace(0.5, 1.5, 4)
    grads = torch.autograd.grad((weights * (log_z - score)).sum(), leaves)
    for a, b in zip([log_z, score, *grads, *chain.viterbi()], expected[:6] + expected[7:]):
        torch.testing.assert_close(a, b)


def test_second_derivatives_through_shared_columns(backend):
    potentials, lengths, columns = chain_inputs(2, torch.float64, batch=3, seq_len=4)
    states = torch.zeros(3, 4, dtype=torch.long)

    def hessian_vector(expanded: bool):
        leaves = [x.clone().requires_grad_(True) for x in potentials]
        emissions = shared.expand(leaves[3], columns) if expanded else leaves[3]
        chain = Chain(*leaves[:3], emissions, lengths, backend="torch" if expanded else backend,
                      columns=None if expanded else columns)
        nll = (chain.log_partition() - chain.path_score(states)).sum()
        (grad,) = torch.autograd.grad(nll, leaves[3], create_graph=True)
        return torch.autograd.grad((grad ** 2).sum(), leaves)

    for a, b in zip(hessian_vector(False), hessian_vector(True)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_long_unconstrained_precursor_nll_equals_the_torch_backend(dtype):
    """The unconstrained precursor layer on the compiled kernel (O column shared in place, the O
    states' moves listed, the shrinking "no entity yet" state dropped and certified) against the
    torch backend's log-space scan in float64."""
    if kernel.unavailable() is not None:
        pytest.skip(kernel.unavailable())
    crf = PrecursorInducedCRF(TAGS, "IOB2", constrained=False, backend="compiled")
    with torch.no_grad():
        for param in crf.parameters():
            param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(4))
    generator = torch.Generator().manual_seed(5)
    emissions = torch.randn(3, 600, len(TAGS), generator=generator) * 2
    tags = torch.randint(len(TAGS), (3, 600), generator=generator)
    mask = torch.ones(3, 600, dtype=torch.bool)
    mask[1, 300:] = False
    mask[2, ::7] = False  # holes

    def nll_and_grads(layer, x):
        layer.zero_grad()
        leaf = x.clone().requires_grad_(True)
        nll = layer(leaf, tags, mask, reduction="none")
        (nll * torch.tensor([1.0, 0.5, 2.0], dtype=x.dtype)).sum().backward()
        return [nll.detach().double(), leaf.grad.double(), *[p.grad.double() for p in layer.parameters()]]

    got = nll_and_grads(crf.to(dtype), emissions.to(dtype))
    reference = PrecursorInducedCRF(TAGS, "IOB2", constrained=False, backend="torch", scan="sequential").double()
    reference.load_state_dict(crf.state_dict())
    expected = nll_and_grads(reference, emissions.double())
    tolerance = {torch.float32: 2e-5, torch.float64: 1e-9}[dtype]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * float(b.abs().max().clamp(min=1)))


def test_bad_columns_are_refused():
    with pytest.raises(ValueError, match="start with 0 .. 2"):
        shared.check(torch.tensor([0, 2, 1, 0]), 3)
    with pytest.raises(ValueError, match="repeat columns"):
        shared.check(torch.tensor([0, 1, 2, 3]), 3)
    with pytest.raises(ValueError, match="int64"):
        shared.check(torch.tensor([0.0, 1.0]), 2)
    potentials, lengths, columns = chain_inputs(3, torch.float32)
    with pytest.raises(ValueError, match="one column per state"):
        Chain(*potentials, lengths, columns=columns[:-1])
    with pytest.raises(ValueError, match="repeat columns"):  # the kernel would read past the emissions
        Chain(*potentials, lengths, columns=torch.tensor([0, 1, 2, 3, 0, 0, 4]))
    pairs = (torch.zeros(3, 3), torch.zeros(3, 3, 3), torch.zeros(3, 3), torch.zeros(2, 4, 3))
    with pytest.raises(ValueError, match="first-order chain"):
        Chain(*pairs, torch.tensor([4, 2]), columns=torch.tensor([0, 1, 2]))

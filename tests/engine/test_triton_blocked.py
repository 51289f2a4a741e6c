"""The blocked Triton kernels (state spaces past one on-chip tile) against brute-force enumeration
and the torch engine, on Triton's interpreter.

Large state spaces run the blocked kernels by themselves (first order with 150-200 states, pair
states of the second-order layer with 17 and 33 tags, the precursor's expanded states with many
entity types, k = 16 at 33 states). Tests that shrink ``MAX_TILE`` and ``BLOCK_TILE`` run the same
kernels on tiny state spaces split into many blocks in every direction, so that block edges,
padding lanes and merges of tied candidates across blocks are all exercised cheaply.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from neurocrf.structs import LinearChainCRF, PrecursorInducedCRF  # noqa: E402
from neurocrf.structs.engine import triton as backend  # noqa: E402
from neurocrf.structs.engine.chain import Chain  # noqa: E402
from neurocrf.structs.engine.triton import runtime  # noqa: E402
from tests.helpers.chains import layer_inputs, random_chain  # noqa: E402
from tests.helpers.enumeration import make_layer, random_mask  # noqa: E402
from tests.helpers.triton import (  # noqa: E402
    assert_same_as_torch,
    check_against_enumeration,
    torch_gradients,
    triton_gradients,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Every state space runs the blocked kernels, with blocks of at most 4 elements (times the
    rank block); returns a function that sets another block budget."""
    monkeypatch.setattr(runtime, "MAX_TILE", 1)
    monkeypatch.setattr(runtime, "BLOCK_TILE", 4)
    return lambda elements: monkeypatch.setattr(runtime, "BLOCK_TILE", elements)


def tags_of(num_tags: int) -> list[str]:
    """``O`` and IOB2 tags of ``(num_tags - 1) // 2`` entity types."""
    types = (num_tags - 1) // 2
    return ["O"] + [f"{prefix}-T{i}" for i in range(types) for prefix in "BI"]


# --- sizes past one tile: the blocked kernels run by themselves ----------------------------------

def test_many_states_match_enumeration():
    """First order with 150 states (a 256-wide destination tile, source blocks of 16), with -inf
    transitions, masks with holes and rows of length 0 and 1."""
    crf = LinearChainCRF(150).double()
    generator = torch.Generator().manual_seed(150)
    with torch.no_grad():
        for param in crf.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64))
        crf.transitions[torch.rand(150, 150, generator=generator) < 0.2] = float("-inf")
    assert runtime.plan("forward_kernel", 150, 1)[0] == "forward_blocked_kernel"
    emissions = torch.randn(3, 3, 150, generator=generator, dtype=torch.float64) * 2
    mask = torch.tensor([[True, True, False], [False, False, False], [False, True, True]])
    check_against_enumeration(crf, None, emissions, mask, k=2)


@pytest.mark.parametrize("kind,num_tags", [("second_order", 1), ("second_order", 5), ("second_order", 17),
                                           ("second_order", 33), ("precursor", 1), ("precursor", 17),
                                           ("precursor", 33)])
def test_layer_tag_counts_match_enumeration(kind, num_tags):
    """Second-order (pair states: 18 and 34 components run blocked) and precursor layers at the
    tag counts 1, 5, 17 and 33, IOB2-constrained, against enumeration."""
    tags = tags_of(num_tags)
    crf, constraints = make_layer(kind, tags, "IOB2", num_tags > 1)
    generator = torch.Generator().manual_seed(num_tags)
    emissions = torch.randn(3, 4, num_tags, generator=generator, dtype=torch.float64) * 2
    mask = random_mask(3, 4, generator)  # lengths 0, 1 and 3 (every transition of the layer is used)
    check_against_enumeration(crf, constraints, emissions, mask, k=2)


def test_precursor_with_many_entity_types_matches_enumeration():
    """45 entity types: 91 tags, 136 expanded states (blocked), against enumeration."""
    crf, constraints = make_layer("precursor", tags_of(91), "IOB2", True)
    assert isinstance(crf, PrecursorInducedCRF) and crf.num_states() == 136
    generator = torch.Generator().manual_seed(91)
    emissions = torch.randn(3, 3, 91, generator=generator, dtype=torch.float64) * 2
    mask = torch.tensor([[True, False, True], [False, False, False], [False, True, False]])
    moves = layer_inputs(crf, emissions, mask)[1]
    assert runtime.plan("backward_kernel", moves.shape[-1], 1)[0] == "backward_blocked_kernel"
    check_against_enumeration(crf, constraints, emissions, mask, k=3)


@pytest.mark.parametrize("size,order,per_position,dtype,k", [
    (200, 1, False, torch.float32, 2), (150, 1, True, torch.float64, 2), (18, 2, True, torch.float64, 2),
    (33, 1, False, torch.float64, 16),
    pytest.param(34, 2, False, torch.float32, 2, marks=pytest.mark.slow),
    pytest.param(34, 2, False, torch.float64, 16, marks=pytest.mark.slow),
    pytest.param(200, 1, False, torch.float64, 16, marks=pytest.mark.slow)],
    ids=lambda v: str(v).replace("torch.", ""))
def test_large_state_spaces_match_torch_engine(size, order, per_position, dtype, k):
    generator = torch.Generator().manual_seed(size + order)
    *potentials, lengths = random_chain(3, 3, size, order, dtype, generator, per_position)
    single_tile = runtime.tile_elements(size, order) <= runtime.MAX_TILE  # 33 states: only k = 16 is blocked
    assert_same_as_torch(potentials, lengths, k, ("search_kernel",) if single_tile else tuple(runtime.BLOCKED))


# --- tiny blocks: every state space split in many blocks -----------------------------------------

@pytest.mark.parametrize("size,order,per_position,dtype", [
    (3, 2, False, torch.float64), pytest.param(5, 1, True, torch.float32, marks=pytest.mark.slow),
    pytest.param(7, 1, False, torch.float64, marks=pytest.mark.slow),
    pytest.param(4, 2, True, torch.float32, marks=pytest.mark.slow)], ids=lambda v: str(v).replace("torch.", ""))
def test_tiny_blocks_match_torch_engine(tiny_blocks, size, order, per_position, dtype):
    generator = torch.Generator().manual_seed(size * 3 + order)
    *potentials, lengths = random_chain(3, 3, size, order, dtype, generator, per_position)
    assert_same_as_torch(potentials, lengths, 2, tuple(runtime.BLOCKED))


@pytest.mark.parametrize("order,k,elements", [(1, 1, 4), pytest.param(1, 16, 64, marks=pytest.mark.slow),
                                              pytest.param(2, 1, 4, marks=pytest.mark.slow), (2, 16, 64)])
def test_tiny_blocks_break_ties_as_the_torch_engine(tiny_blocks, order, k, elements):
    """Integer scores: many tied candidates fall in different source blocks and are merged into
    the running top k; the picks equal the torch engine's (smallest source tag and rank first)."""
    tiny_blocks(elements)
    size = 5 if order == 1 else 3
    constants = runtime.plan("search_kernel", size, order, k)[1]
    assert constants["BA"] < size and (order == 1 or constants["BB"] < size)  # sources split in blocks
    generator = torch.Generator().manual_seed(order + 10)
    shape = (size,) * order
    start, end = torch.zeros(shape), torch.randint(0, 2, shape, generator=generator).float()
    moves = torch.randint(0, 2, shape + (size,), generator=generator).float()
    emissions = torch.randint(0, 2, (2, 3) + shape, generator=generator).float()
    lengths = torch.tensor([3, 2])
    paths, scores = backend.kbest(start, moves, end, emissions, lengths, k)
    ref_paths, ref_scores = Chain(start, moves, end, emissions, lengths).kbest(k)
    assert torch.equal(paths, ref_paths) and torch.equal(scores, ref_scores)
    assert "search_blocked_kernel" in runtime.LAUNCHES


def test_tiny_blocks_rows_without_a_path_and_large_emissions(tiny_blocks):
    """Blocked kernels: a row without any path gives -inf, zero gradients and states -1; a row of
    length 0 gives 0 and one empty path; emissions of 1e4 give no NaN and the torch engine's
    values (the unshifted stored scores are rescaled when read); bfloat16 emissions run."""
    tiny_blocks(16)
    generator = torch.Generator().manual_seed(4)
    *potentials, _ = random_chain(3, 3, 5, 1, torch.float32, generator, holes=0.0)
    potentials[3][1, 2] = float("-inf")
    lengths = torch.tensor([3, 3, 0])
    log_z, grads = triton_gradients(potentials, lengths)
    assert torch.isneginf(log_z[1]) and torch.isfinite(log_z[0]) and log_z[2] == 0
    assert all(bool(torch.isfinite(g).all()) for g in grads) and bool((grads[3][1:] == 0).all())
    states, best = backend.viterbi(*potentials, lengths)
    assert bool((states[1:] == -1).all()) and torch.isneginf(best[1]) and best[2] == 0
    big = [*potentials[:3], potentials[3] * 1e4]
    log_z, grads = triton_gradients(big, torch.tensor([3, 2, 1]))
    ref_log_z, ref_grads = torch_gradients([x.double() for x in big], torch.tensor([3, 2, 1]))
    torch.testing.assert_close(log_z.double(), ref_log_z, rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[3].double(), ref_grads[3], rtol=1e-4, atol=1e-4)
    low = potentials[3].to(torch.bfloat16)  # upcast inside: the same as float32 emissions of these values
    torch.testing.assert_close(backend.log_partition(*potentials[:3], low, lengths),
                               backend.log_partition(*potentials[:3], low.float(), lengths))


def test_blocked_launches_do_not_grow_with_length_or_batch(tiny_blocks):
    tiny_blocks(16)
    counts = []
    for batch, seq_len in ((2, 2), (2, 3), (3, 3)):
        *potentials, lengths = random_chain(batch, seq_len, 3, 1, torch.float32, torch.Generator().manual_seed(1))
        leaves = [x.requires_grad_(True) for x in potentials]
        before = dict(runtime.LAUNCHES)
        backend.log_partition(*leaves, lengths).sum().backward()
        backend.viterbi(*potentials, lengths)
        backend.kbest(*potentials, lengths, 2)
        counts.append({name: runtime.LAUNCHES[name] - before.get(name, 0) for name in runtime.LAUNCHES})
    assert counts[0] == {"forward_blocked_kernel": 1, "backward_blocked_kernel": 1, "search_blocked_kernel": 2}
    assert counts[0] == counts[1] == counts[2]


def test_plan_picks_blocks_within_the_budget():
    """Single tile up to ``MAX_TILE``; past it, blocks of at most ``BLOCK_TILE`` elements that
    cover any size (the rank block is never split)."""
    assert runtime.plan("forward_kernel", 128, 1)[0] == "forward_kernel"
    assert runtime.plan("search_kernel", 17, 1, 16)[0] == "search_kernel"
    for kernel, size, order, k in (("forward_kernel", 129, 1, 1), ("backward_kernel", 5000, 1, 1),
                                   ("search_kernel", 33, 1, 16), ("search_kernel", 34, 2, 16),
                                   ("backward_kernel", 18, 2, 1), ("search_kernel", 300, 2, 64)):
        name, constants = runtime.plan(kernel, size, order, k)
        assert name == runtime.BLOCKED[kernel]
        ranks = constants.get("BK", 1)
        assert constants["BA"] * constants["BB"] * constants["BC"] * ranks <= runtime.BLOCK_TILE
        assert constants["BB"] == 1 or order == 2
    wide = runtime.plan("backward_kernel", 200, 1, wide=True)[1]  # float64: half the block
    assert wide["BA"] * wide["BC"] <= runtime.BLOCK_TILE // 2

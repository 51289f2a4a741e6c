"""Brute-force enumeration of every tag sequence, written from each model's definition (no chain
engine), and the checks of every CRF quantity against it.

The enumeration runs over the True positions of each row, so masks with holes, a masked first
position, and rows of length 0 or 1 are all covered. ``check_*`` take the ``setup`` tuple
``(crf, constraints, emissions, mask, generator)`` of a test.
"""

from __future__ import annotations

import itertools

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
from neurocrf.structs.constraints import split_tag
from neurocrf.structs.engine.pytorch import exp_scan
from neurocrf.structs.engine.pytorch import first_order as fast_first_order

NEG_INF = float("-inf")


IOB2_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


BIOES_TAGS = ["O", "B-X", "I-X", "E-X", "S-X"]


def all_sequences(num_tags: int, length: int) -> torch.Tensor:
    if length == 0:
        return torch.zeros(1, 0, dtype=torch.long)
    return torch.tensor(list(itertools.product(range(num_tags), repeat=length)), dtype=torch.long)


def _allowed_mask(crf, ys: torch.Tensor, constraints) -> torch.Tensor:
    if constraints is None or ys.shape[1] == 0:
        return torch.ones(ys.shape[0], dtype=torch.bool)
    ok = constraints.start[ys[:, 0]] & constraints.end[ys[:, -1]]
    if ys.shape[1] > 1:
        ok &= constraints.transitions[ys[:, :-1], ys[:, 1:]].all(1)
    return ok


def first_order_scores(crf: LinearChainCRF, e: torch.Tensor, ys: torch.Tensor, constraints) -> torch.Tensor:
    n = ys.shape[1]
    if n == 0:
        return torch.zeros(ys.shape[0], dtype=e.dtype)
    s = crf.start_transitions.double()[ys[:, 0]] + crf.end_transitions.double()[ys[:, -1]]
    s = s + e[torch.arange(n), ys].sum(1)
    if n > 1:
        s = s + crf.transitions.double()[ys[:, :-1], ys[:, 1:]].sum(1)
    return s.masked_fill(~_allowed_mask(crf, ys, constraints), NEG_INF)


def second_order_scores(crf: SecondOrderCRF, e: torch.Tensor, ys: torch.Tensor, constraints) -> torch.Tensor:
    n = ys.shape[1]
    if n == 0:
        return torch.zeros(ys.shape[0], dtype=e.dtype)
    s = crf.start_transitions.double()[ys[:, 0]] + crf.end_transitions.double()[ys[:, -1]]
    s = s + e[torch.arange(n), ys].sum(1)
    if n > 1:
        s = s + crf.transitions.double()[ys[:, :-1], ys[:, 1:]].sum(1)
        s = s + crf.start_pair_transitions.double()[ys[:, 0], ys[:, 1]]
        s = s + crf.end_pair_transitions.double()[ys[:, -2], ys[:, -1]]
    if n > 2:
        s = s + crf.triple_transitions.double()[ys[:, :-2], ys[:, 1:-1], ys[:, 2:]].sum(1)
    return s.masked_fill(~_allowed_mask(crf, ys, constraints), NEG_INF)


def precursor_states(crf: PrecursorInducedCRF, y: list[int]) -> list[int]:
    """Expand one tag sequence by the paper's rule: O remembers the last entity (plain O before any)."""
    states, current_o = [], crf.o_index
    for tag in y:
        if tag == crf.o_index:
            states.append(current_o)
            continue
        states.append(tag)
        prefix, entity_type = split_tag(crf.tags[tag])
        key = entity_type if crf.memory == "type" else crf.tags[tag]
        current_o = crf.num_tags + crf.memory_keys.index(key) if key in crf.memory_keys else crf.o_index
    return states


def precursor_scores(crf: PrecursorInducedCRF, e: torch.Tensor, ys: torch.Tensor, constraints) -> torch.Tensor:
    n = ys.shape[1]
    if n == 0:
        return torch.zeros(ys.shape[0], dtype=e.dtype)
    states = torch.tensor([precursor_states(crf, y) for y in ys.tolist()], dtype=torch.long)
    bias = torch.zeros(crf.state_labels.shape[0], dtype=e.dtype)
    if crf.state_bias is not None:
        bias[crf.o_states] = crf.state_bias.double()
    s = crf.start_transitions.double()[states[:, 0]] + crf.end_transitions.double()[states[:, -1]]
    s = s + e[torch.arange(n), ys].sum(1) + bias[states].sum(1)
    if n > 1:
        s = s + crf.transitions.double()[states[:, :-1], states[:, 1:]].sum(1)
    return s.masked_fill(~_allowed_mask(crf, ys, constraints), NEG_INF)


REFERENCES = {
    LinearChainCRF: first_order_scores,
    SecondOrderCRF: second_order_scores,
    PrecursorInducedCRF: precursor_scores,
}


def make_layer(kind: str, tags: list[str], scheme: str, constrained: bool, **options):
    crf = build_crf(kind, tags, scheme, constrained=constrained, **options).double()
    with torch.no_grad():
        for param in crf.parameters():
            param.normal_(0.0, 1.0)
    constraints = allowed_transitions(tags, scheme) if constrained else None
    return crf, constraints


def random_mask(batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    mask = torch.rand(batch, seq_len, generator=generator) < 0.7
    mask[0] = False  # a fully masked row
    mask[1] = False
    mask[1, seq_len // 2] = True  # a single True position in the middle
    if batch > 2:
        mask[2] = True
        mask[2, 0] = False  # masked first position, like [CLS]
    return mask


CASES = [
    ("first_order", IOB2_TAGS, "IOB2", False, {}),
    ("first_order", IOB2_TAGS, "IOB2", True, {}),
    ("first_order", BIOES_TAGS, "BIOES", True, {}),
    ("first_order", ["O", "I-A", "B-A", "I-B"], "IOB1", True, {}),
    ("second_order", IOB2_TAGS[:3], "IOB2", False, {}),
    ("second_order", IOB2_TAGS, "IOB2", True, {}),
    ("second_order", BIOES_TAGS, "BIOES", True, {}),
    ("precursor", IOB2_TAGS, "IOB2", True, {"memory": "type"}),
    ("precursor", IOB2_TAGS, "IOB2", True, {"memory": "tag"}),
    ("precursor", IOB2_TAGS, "IOB2", False, {"memory": "tag", "state_bias": True}),
    ("precursor", BIOES_TAGS, "BIOES", True, {"memory": "tag", "state_bias": True}),
    ("precursor", ["O", "I-A", "B-A", "I-B"], "IOB1", True, {"memory": "type"}),
]


@pytest.fixture(autouse=True, params=["compiled", "exp", "log"])
def kernel(request, monkeypatch):
    """Run every check on the compiled backend (the CPU default: first-order layers; others run on
    torch) and on both scans of the torch backend: the certified exp-space one (for first-order
    layers the fast path of first_order) and the log-space one."""
    if request.param != "compiled":
        monkeypatch.setenv(engine.ENV, "torch")
    if request.param == "log":
        monkeypatch.setattr(exp_scan, "_BLOCK_BUDGET", -1.0)
        monkeypatch.setattr(fast_first_order, "applies", lambda *args: False)
    return request.param


def enumerate_row(crf, constraints, emissions, mask, row):
    e = emissions[row][mask[row]]
    ys = all_sequences(crf.num_tags, e.shape[0])
    scores = REFERENCES[type(crf)](crf, e, ys, constraints)
    return ys, scores


def check_log_partition(setup):
    crf, constraints, emissions, mask, _ = setup
    log_z = crf.log_partition(emissions, mask)
    for row in range(emissions.shape[0]):
        _, scores = enumerate_row(crf, constraints, emissions, mask, row)
        torch.testing.assert_close(log_z[row], torch.logsumexp(scores, 0))
    assert log_z[0] == 0  # fully masked row: one empty path


def check_score_and_nll(setup):
    crf, constraints, emissions, mask, generator = setup
    for row in range(emissions.shape[0]):
        ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
        valid = torch.isfinite(scores).nonzero().flatten()
        pick = ys[valid[torch.randint(len(valid), (1,), generator=generator)]][0]
        tags = torch.full((1, emissions.shape[1]), -1, dtype=torch.long)
        tags[0, mask[row]] = pick
        expected = REFERENCES[type(crf)](crf, emissions[row][mask[row]], pick[None], constraints)[0]
        got = crf.score(emissions[row:row + 1], tags, mask[row:row + 1])
        torch.testing.assert_close(got[0], expected)
        nll = crf(emissions[row:row + 1], tags, mask[row:row + 1], reduction="none")
        torch.testing.assert_close(nll[0], torch.logsumexp(scores, 0) - expected)


def check_decode(setup):
    crf, constraints, emissions, mask, _ = setup
    best = crf.decode(emissions, mask)
    assert best.shape == mask.shape
    assert bool((best[~mask] == -1).all())
    for row in range(emissions.shape[0]):
        ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
        path = best[row][mask[row]]
        assert bool((path >= 0).all())
        path_score = REFERENCES[type(crf)](crf, emissions[row][mask[row]], path[None], constraints)[0]
        torch.testing.assert_close(path_score, scores.max())


def check_nbest(setup, k):
    crf, constraints, emissions, mask, _ = setup
    paths, log_probs = crf.nbest(emissions, mask, k=k)
    assert paths.shape == (emissions.shape[0], k, emissions.shape[1])
    for row in range(emissions.shape[0]):
        ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
        log_z = torch.logsumexp(scores, 0)
        finite = scores[torch.isfinite(scores)]
        expected = finite.sort(descending=True).values[:k] - log_z
        got = log_probs[row]
        torch.testing.assert_close(got[: len(expected)], expected)
        assert bool(torch.isneginf(got[len(expected):]).all())
        for rank in range(len(expected)):
            path = paths[row, rank][mask[row]]
            ref = REFERENCES[type(crf)](crf, emissions[row][mask[row]], path[None], constraints)[0]
            torch.testing.assert_close(ref - log_z, got[rank])
        assert bool((paths[row, :, ~mask[row]] == -1).all())
        assert bool((paths[row, len(expected):] == -1).all())


def check_marginals(setup):
    crf, constraints, emissions, mask, _ = setup
    marg = crf.marginals(emissions, mask)
    assert marg.shape == emissions.shape
    for row in range(emissions.shape[0]):
        ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
        probs = torch.softmax(scores, 0)
        n = ys.shape[1]
        expected = torch.zeros(n, crf.num_tags, dtype=torch.float64)
        for t in range(n):
            expected[t].index_add_(0, ys[:, t], probs)
        torch.testing.assert_close(marg[row][mask[row]], expected)
        assert bool((marg[row][~mask[row]] == 0).all())


def check_partial_labels(setup):
    crf, constraints, emissions, mask, generator = setup
    allowed = torch.rand(*emissions.shape, generator=generator) < 0.6
    allowed[..., 0] = True  # keep at least one admissible sequence in unconstrained cases
    nll = crf(emissions, allowed, mask, reduction="none")
    for row in range(emissions.shape[0]):
        ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
        sets = allowed[row][mask[row]]
        admitted = torch.ones(ys.shape[0], dtype=torch.bool)
        for t in range(ys.shape[1]):
            admitted &= sets[t, ys[:, t]]
        expected = torch.logsumexp(scores, 0) - torch.logsumexp(scores.masked_fill(~admitted, NEG_INF), 0)
        torch.testing.assert_close(nll[row], expected)


def check_window_log_partition(setup):
    """Restricting the tags of a window of positions = enumerating the sequences it admits."""
    crf, constraints, emissions, mask, generator = setup
    lengths = mask.sum(1)
    rows, starts, windows, expected = [], [], [], []
    for row in range(emissions.shape[0]):
        n = int(lengths[row])
        if n == 0:
            continue
        ys, scores = enumerate_row(crf, constraints, emissions, mask, row)
        for start in range(n):
            width = 3  # padded past the row's end with "every tag allowed"
            allowed = torch.rand(width, crf.num_tags, generator=generator) < 0.5
            allowed[:, int(torch.randint(crf.num_tags, (1,), generator=generator))] = True
            allowed[max(0, n - start):] = True
            admitted = torch.ones(ys.shape[0], dtype=torch.bool)
            for i in range(min(width, n - start)):
                admitted &= allowed[i, ys[:, start + i]]
            rows.append(row)
            starts.append(start)
            windows.append(allowed)
            expected.append(torch.logsumexp(scores.masked_fill(~admitted, NEG_INF), 0))
    got = crf.window_log_partition(emissions, mask, torch.tensor(rows), torch.tensor(starts), torch.stack(windows))
    torch.testing.assert_close(got, torch.stack(expected).to(got.dtype))


def check_marginals_are_gradient_of_log_partition(setup):
    crf, _, emissions, mask, _ = setup
    leaf = emissions.clone().requires_grad_(True)
    crf.log_partition(leaf, mask).sum().backward()
    torch.testing.assert_close(leaf.grad, crf.marginals(emissions, mask))


def check_parameter_gradients_match_autograd_through_enumeration(setup):
    crf, constraints, emissions, mask, _ = setup
    row = 2
    crf.zero_grad()
    crf.log_partition(emissions[row:row + 1], mask[row:row + 1]).sum().backward()
    fast = {name: p.grad.clone() for name, p in crf.named_parameters()}
    crf.zero_grad()
    _, scores = enumerate_row(crf, constraints, emissions, mask, row)
    torch.logsumexp(scores, 0).backward()
    for name, param in crf.named_parameters():
        torch.testing.assert_close(fast[name], param.grad, msg=f"gradient of {name}")



def pair_reference_scores(crf: LinearChainCRF, pairs: torch.Tensor, ys: torch.Tensor, constraints) -> torch.Tensor:
    """Scores of the sequences ``ys`` ``[N, n]`` given one row's compacted pair emissions ``[n, L + 1, L]``."""
    n, num_tags = ys.shape[1], crf.num_tags
    if n == 0:
        return torch.zeros(ys.shape[0], dtype=pairs.dtype)
    s = crf.start_transitions.double()[ys[:, 0]] + crf.end_transitions.double()[ys[:, -1]]
    s = s + pairs[0, num_tags][ys[:, 0]]
    for t in range(1, n):
        s = s + pairs[t][ys[:, t - 1], ys[:, t]] + crf.transitions.double()[ys[:, t - 1], ys[:, t]]
    if constraints is not None:
        ok = constraints.start[ys[:, 0]] & constraints.end[ys[:, -1]]
        if n > 1:
            ok &= constraints.transitions[ys[:, :-1], ys[:, 1:]].all(1)
        s = s.masked_fill(~ok, NEG_INF)
    return s


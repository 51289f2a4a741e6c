"""Every CRF quantity of every layer against brute-force enumeration of all tag sequences
(the enumeration and its checks: :mod:`tests.helpers.enumeration`), on the compiled backend and on
both scans of the torch backend."""

from __future__ import annotations

import pytest
import torch

from neurocrf.structs import PrecursorInducedCRF
from tests.helpers import enumeration
from tests.helpers.enumeration import CASES, kernel, make_layer, random_mask  # noqa: F401  (kernel: autouse)

CHECKS = [enumeration.check_log_partition, enumeration.check_score_and_nll, enumeration.check_decode,
          enumeration.check_marginals, enumeration.check_partial_labels, enumeration.check_window_log_partition,
          enumeration.check_marginals_are_gradient_of_log_partition,
          enumeration.check_parameter_gradients_match_autograd_through_enumeration]


@pytest.fixture(params=CASES, ids=lambda c: f"{c[0]}-{c[2]}-{'c' if c[3] else 'u'}-{'-'.join(map(str, c[4].values()))}")
def setup(request):
    kind, tags, scheme, constrained, options = request.param
    crf, constraints = make_layer(kind, tags, scheme, constrained, **options)
    generator = torch.Generator().manual_seed(len(tags) * 7 + len(kind))
    batch, seq_len = 5, 6
    emissions = torch.randn(batch, seq_len, len(tags), generator=generator, dtype=torch.float64) * 2
    mask = random_mask(batch, seq_len, generator)
    return crf, constraints, emissions, mask, generator


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_against_enumeration(setup, check):
    check(setup)


@pytest.mark.parametrize("k", [1, 4, 40])
def test_nbest(setup, k):
    enumeration.check_nbest(setup, k)


def test_precursor_state_counts():
    e = 3
    iob2 = ["O"] + [f"{p}-{t}" for t in "ABC" for p in "BI"]
    bioes = ["O"] + [f"{p}-{t}" for t in "ABC" for p in "BIES"]
    assert PrecursorInducedCRF(iob2, "IOB2", memory="type").num_states() == 3 * e + 1
    assert PrecursorInducedCRF(iob2, "IOB2", memory="tag").num_states() == 4 * e + 1  # N + N - 1
    assert PrecursorInducedCRF(bioes, "BIOES", memory="type").num_states() == 5 * e + 1
    assert PrecursorInducedCRF(bioes, "BIOES", memory="tag").num_states() == 6 * e + 1
    assert PrecursorInducedCRF(bioes, "BIOES", memory="tag", constrained=False).num_states() == 8 * e + 1

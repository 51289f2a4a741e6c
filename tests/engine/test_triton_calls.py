"""What runs around the Triton kernels per CRF call, counted under Triton's interpreter: non-view
aten ops (each one a kernel launch of a few microseconds of CPU time on a GPU), host syncs (none:
they stop the host from running ahead of the device and break CUDA-graph capture) and kernel
launches (constant), for the three layers' NLL forward + backward, Viterbi and k best, at both
size classes of the backend (single-tile kernels and blocked kernels)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from neurocrf.structs import LinearChainCRF, PrecursorInducedCRF, SecondOrderCRF  # noqa: E402
from tools.gpu_calls import TAGS_IOB2, calls, counting, inputs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")

# per layer: (NLL forward + backward, decode) op limits; no host sync anywhere
LIMITS = {"first order": (12, 6), "precursor": (16, 8), "second order": (16, 8)}
MANY_TYPES = ["O"] + [f"{prefix}-T{i}" for i in range(45) for prefix in "BI"]  # 136 precursor states
LAYERS = {
    ("first order", "tile"): lambda: LinearChainCRF(9, backend="triton"),
    ("precursor", "tile"): lambda: PrecursorInducedCRF(TAGS_IOB2, "IOB2", backend="triton"),
    ("second order", "tile"): lambda: SecondOrderCRF(5, backend="triton"),
    ("first order", "blocked"): lambda: LinearChainCRF(200, backend="triton"),
    ("precursor", "blocked"): lambda: PrecursorInducedCRF(MANY_TYPES, "IOB2", backend="triton"),
    ("second order", "blocked"): lambda: SecondOrderCRF(17, backend="triton"),
}


@pytest.mark.parametrize("kind,size,build", [pytest.param(kind, size, build, id=f"{kind.replace(' ', '_')}-{size}")
                                             for (kind, size), build in LAYERS.items()])
def test_a_triton_call_dispatches_a_handful_of_ops_and_never_syncs(kind, size, build, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    layer = build()
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0, 0.5)
    emissions, mask, tags = inputs(layer, 3, 5, "cpu")
    mask[1, 2] = False  # a hole: the kernels compact the row themselves
    nll_limit, decode_limit = LIMITS[kind]
    for name, run in calls(layer, emissions, mask, tags, k=3).items():
        run()  # first use
        with counting() as counts:
            run()
        assert counts.syncs == 0, f"{name}: host syncs {dict(counts.sync_names)}"
        limit = nll_limit if name == "nll" else decode_limit
        assert counts.ops <= limit, f"{name}: {counts.ops} ops > {limit}: {dict(counts.names)}"
        assert counts.launches == (2 if name in ("nll", "kbest") else 1)


def test_the_counter_sees_the_syncs_of_the_torch_path(monkeypatch):
    """The same call on the torch backend compacts the mask on the host: the counter must see it
    (a counter that cannot fail would prove nothing)."""
    layer = LinearChainCRF(4, backend="torch")
    emissions, mask, tags = inputs(layer, 2, 4, "cpu")
    with counting() as counts:
        layer(emissions, tags, mask).backward()
    assert counts.syncs > 0 and counts.ops > 12 and counts.launches == 0

"""The CPU-able parts of the GPU check's CRF step (``python -m tools.gpu_capture``): every layer
and call runs, the profiler counts its ops, the timings come out, and the table has one row per
(layer, call); CUDA-graph capture is GPU-only and is reported as such."""

from __future__ import annotations

import pytest

from tools import gpu_capture


def test_the_cpu_dry_run_prints_one_row_per_layer_and_call(capsys):
    assert gpu_capture.main(["--device", "cpu", "--batch", "2", "--seq-len", "3", "--no-compile"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "n/a (CPU)" in line]
    assert len(rows) == 9
    for row in rows:
        launches = int(row.split("|")[3])
        assert launches > 0


@pytest.mark.slow
def test_a_compiled_call_gives_what_eager_gives():
    layer = gpu_capture.layers("cpu", backend="auto")["first order"]
    emissions, mask, tags = gpu_capture.inputs(layer, 2, 3, "cpu")
    assert gpu_capture.compiled(layer, "nll", emissions, mask, tags, "cpu") == "same as eager"

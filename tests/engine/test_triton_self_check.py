"""Before ``backend="auto"`` trusts the Triton kernels for a kind of chain, dtype and device, it
checks them against the torch engine once; a kernel that is wrong or fails makes "auto" warn once
and use torch, while a backend named explicitly raises. Driven on CPU tensors under Triton's
interpreter, with the chooser told to treat CPU tensors as Triton-eligible."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("triton")

from neurocrf.structs import LinearChainCRF, engine  # noqa: E402
from neurocrf.structs.engine import triton as triton_backend  # noqa: E402
from neurocrf.structs.engine.triton import runtime, selfcheck  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """"auto" takes Triton for CPU tensors (interpreted), with no self-check run yet."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(engine.ENV, raising=False)
    monkeypatch.delenv(engine.SELF_CHECK_ENV, raising=False)
    monkeypatch.setitem(engine._AUTO_ORDER, "cpu", ("triton",))
    monkeypatch.setattr(engine, "_CHECKS", {})


def wrong_log_partition(*args):
    return triton_backend.partition.LogPartition.apply(*args) + 0.5


def failing_launch(*args, **kwargs):
    raise RuntimeError("PTX assembly aborted")


def problem():
    crf = LinearChainCRF(4)
    emissions = torch.randn(2, 5, 4)
    return crf, emissions, emissions.argmax(-1)


def test_auto_runs_the_triton_kernels_once_they_pass(triton_on_cpu):
    crf, emissions, _ = problem()
    runtime.LAUNCHES.clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*self-check")
        crf.log_partition(emissions)
    assert runtime.LAUNCHES["forward_kernel"] > 1  # the check's launches and the call's
    assert engine.self_checks() == {
        "triton: first-order states, shared transitions, torch.float32, device cpu": "passed"}


@pytest.mark.parametrize("fault", ["wrong", "raises"])
def test_a_failing_kernel_makes_auto_warn_once_and_use_torch(fault, triton_on_cpu, monkeypatch):
    if fault == "wrong":
        monkeypatch.setattr(triton_backend, "log_partition", wrong_log_partition)
        expected = "log Z differs from the torch engine by 0.5"
    else:
        monkeypatch.setattr(runtime, "launch", failing_launch)
        expected = "RuntimeError: PTX assembly aborted"
    crf, emissions, tags = problem()
    reference = LinearChainCRF(4, backend="torch")
    reference.load_state_dict(crf.state_dict())
    with pytest.warns(RuntimeWarning, match="failed its self-check") as caught:
        log_z = crf.log_partition(emissions)
    message = str(caught[0].message)
    assert expected in message and "device cpu" in message and "triton 3." in message
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*self-check")  # once per kind, dtype and device
        loss, again = crf(emissions, tags), crf.log_partition(emissions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the search runs in float64: a kind of its own
        path = crf.decode(emissions)
    torch.testing.assert_close(again, log_z)
    torch.testing.assert_close(log_z, reference.log_partition(emissions))
    torch.testing.assert_close(loss, reference(emissions, tags))
    assert torch.equal(path, reference.decode(emissions))
    assert engine.auto_choice("cpu")[0] == "torch"
    with pytest.raises(engine.BackendError, match="failed its self-check"):
        LinearChainCRF(4, backend="triton").log_partition(emissions)


def test_the_setting_skips_the_check(triton_on_cpu, monkeypatch):
    monkeypatch.setenv(engine.SELF_CHECK_ENV, "0")
    monkeypatch.setattr(runtime, "launch", failing_launch)
    crf, emissions, _ = problem()
    with pytest.raises(RuntimeError, match="PTX assembly aborted"):
        crf.log_partition(emissions)
    assert engine.self_checks() == {}


def test_auto_takes_triton_only_in_the_tested_versions(triton_on_cpu, monkeypatch):
    assert selfcheck.version_reason("3.2.0") is None and selfcheck.version_reason("3.9.1") is None
    assert "outside the versions" in selfcheck.version_reason("2.2.0")
    assert "outside the versions" in selfcheck.version_reason("3.99.0")
    monkeypatch.setattr(triton_backend, "auto_reason", lambda: selfcheck.version_reason("2.2.0"))
    name, why = engine.auto_choice("cpu")
    assert name == "torch" and "triton 2.2.0 is outside" in why[0]
    runtime.LAUNCHES.clear()
    LinearChainCRF(3).decode(torch.randn(1, 2, 3))
    assert not runtime.LAUNCHES  # a named backend still runs: the gate is auto's
    LinearChainCRF(3, backend="triton").decode(torch.randn(1, 2, 3))
    assert runtime.LAUNCHES["search_kernel"] >= 1

"""The backend choice: resolution of a layer's ``backend`` and NEUROCRF_CRF_BACKEND, the choice per
quantity and device, the errors of a backend asked for by name, dispatch to a backend module (a fake
triton module stands in for the real one), the layers' attribute, and the Hydra option."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from neurocrf.cli.utils import compose_task_config
from neurocrf.models.heads import build_head
from neurocrf.structs import LinearChainCRF, PrecursorInducedCRF, SecondOrderCRF, build_crf, engine
from neurocrf.structs.engine import BackendError, resolve, select
from neurocrf.structs.engine.compiled import kernel

TAGS = ["O", "B-A", "I-A", "B-B", "I-B"]


def first_order(batch: int = 2, seq_len: int = 4, size: int = 3, device: str = "cpu"):
    return (torch.zeros(size, device=device), torch.zeros(size, size, device=device), torch.zeros(size, device=device),
            torch.randn(batch, seq_len, size, device=device), torch.full((batch,), seq_len, device=device))


def pair_states(size: int = 3):
    return (torch.zeros(size, size), torch.zeros(size, size, size), torch.zeros(size, size),
            torch.randn(2, 4, size, size), torch.tensor([4, 2]))


@pytest.fixture
def compiled():
    reason = kernel.unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(engine.ENV, raising=False)


@pytest.fixture
def fake_triton(monkeypatch):
    """A stand-in for neurocrf.structs.engine.triton that records its calls and computes with the
    torch backend; ``state`` sets what available() and unsupported() answer."""
    torch_backend = engine.load("torch")
    module = types.ModuleType("neurocrf.structs.engine.triton")
    module.calls, module.state = [], {"available": None, "unsupported": None}
    module.available = lambda: module.state["available"]
    module.asked_k = []
    module.unsupported = lambda *potentials, k=1: module.asked_k.append(k) or module.state["unsupported"]
    for quantity in engine.QUANTITIES:
        def run(*args, _quantity=quantity, **kwargs):
            module.calls.append(_quantity)
            return getattr(torch_backend, _quantity)(*args)
        setattr(module, quantity, run)
    monkeypatch.setitem(sys.modules, "neurocrf.structs.engine.triton", module)
    return module


@pytest.mark.parametrize("requested, env, expected", [
    ("auto", None, "auto"),
    ("auto", "", "auto"),
    ("auto", "torch", "torch"),
    ("auto", "triton", "triton"),
    ("auto", " compiled ", "compiled"),
    ("torch", "triton", "torch"),
    ("compiled", "torch", "compiled"),
    ("triton", None, "triton"),
])
def test_resolution_table(requested, env, expected):
    """A name other than "auto" wins; the environment variable replaces "auto"."""
    environ = {} if env is None else {engine.ENV: env}
    assert resolve(requested, environ) == expected


def test_bad_names_are_refused_with_the_source_named(monkeypatch):
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve("cuda")
    with pytest.raises(ValueError, match=f"{engine.ENV}='gpu'"):
        resolve("auto", {engine.ENV: "gpu"})
    with pytest.raises(ValueError, match="backend must be one of"):
        LinearChainCRF(3, backend="fast")
    monkeypatch.setenv(engine.ENV, "gpu")
    with pytest.raises(ValueError, match=engine.ENV):
        LinearChainCRF(3).log_partition(torch.randn(1, 2, 3))


def test_backends_satisfy_the_contract(compiled, fake_triton):
    for name in ("torch", "compiled", "triton"):
        assert isinstance(engine.load(name), engine.Backend)
    assert not isinstance(types.ModuleType("empty"), engine.Backend)
    assert engine.describe()["torch"] == "available"


def test_auto_on_cpu_picks_the_compiled_kernel_where_it_applies(compiled, no_env):
    assert select("auto", "log_partition", *first_order())[0] == "compiled"
    assert select("auto", "viterbi", *first_order())[0] == "compiled"
    assert select("auto", "log_partition", *pair_states())[0] == "torch"  # pair states: torch
    per_position = first_order()
    per_position = (per_position[0], torch.zeros(2, 4, 3, 3), *per_position[2:])
    assert select("auto", "log_partition", *per_position)[0] == "torch"
    assert select("auto", "log_partition", *first_order(), scan="parallel")[0] == "torch"
    assert select("auto", "log_partition", *first_order(device="meta"))[0] == "torch"  # no backend listed


def test_auto_takes_triton_only_where_the_device_order_lists_it(fake_triton, compiled, no_env, monkeypatch):
    assert select("auto", "log_partition", *first_order())[0] == "compiled"  # CPU tensors: not triton
    monkeypatch.setitem(engine._AUTO_ORDER, "cpu", ("triton", "compiled"))  # as for CUDA tensors
    assert select("auto", "log_partition", *first_order())[0] == "triton"
    fake_triton.state["unsupported"] = "no kernel for this"
    assert select("auto", "log_partition", *first_order())[0] == "compiled"
    fake_triton.state["available"] = "triton is not installed"
    assert select("auto", "kbest", *first_order())[0] == "compiled"


def test_the_chooser_tells_a_backend_how_many_paths_kbest_wants(fake_triton, no_env, monkeypatch):
    """A backend whose tiles hold only so many paths refuses a large k, and "auto" then takes torch."""
    monkeypatch.setitem(engine._AUTO_ORDER, "cpu", ("triton",))
    crf = LinearChainCRF(3)
    fake_triton.unsupported = lambda *potentials, k=1: fake_triton.asked_k.append(k) or (
        f"k = {k} paths do not fit on chip" if k > 4 else None)
    crf.nbest(torch.randn(2, 4, 3), k=3)
    assert fake_triton.asked_k[-2:] == [3, 1] and "kbest" in fake_triton.calls  # k best, then log Z
    fake_triton.calls.clear()
    crf.nbest(torch.randn(2, 4, 3), k=16)
    assert 16 in fake_triton.asked_k and "kbest" not in fake_triton.calls  # torch found the 16 paths
    crf.backend = "triton"
    with pytest.raises(BackendError, match="k = 16 paths do not fit on chip"):
        crf.nbest(torch.randn(2, 4, 3), k=16)


def test_a_backend_named_runs_or_says_why(fake_triton, compiled, no_env, monkeypatch):
    with pytest.raises(BackendError, match="'compiled' cannot compute log_partition: .*pair states"):
        select("compiled", "log_partition", *pair_states())
    with pytest.raises(BackendError, match="scan='parallel'.*torch backend"):
        select("compiled", "log_partition", *first_order(), scan="parallel")
    fake_triton.state["available"] = "no CUDA device"
    with pytest.raises(BackendError, match="'triton' cannot compute viterbi: no CUDA device"):
        select("triton", "viterbi", *first_order())
    fake_triton.state["available"] = None
    fake_triton.state["unsupported"] = "tensors must be on a CUDA device, got cpu"
    with pytest.raises(BackendError, match="must be on a CUDA device"):
        LinearChainCRF(3, backend="triton").decode(torch.randn(2, 4, 3))
    monkeypatch.delitem(sys.modules, "neurocrf.structs.engine.triton")
    monkeypatch.setattr(engine, "_MODULES", {**engine._MODULES, "triton": "neurocrf.structs.engine.no_such_module"})
    with pytest.raises(BackendError, match="'triton' CRF backend cannot be imported"):
        select("triton", "log_partition", *first_order())


def test_every_quantity_of_every_layer_is_dispatched_to_the_backend(fake_triton, no_env):
    """A layer set to a backend computes every quantity there, with the values of the torch backend."""
    emissions, mask = torch.randn(3, 5, len(TAGS)), torch.rand(3, 5) < 0.8
    tags = torch.randint(len(TAGS), (3, 5))
    for kind in ("first_order", "second_order", "precursor"):
        crf = build_crf(kind, TAGS, "IOB2", backend="torch")
        expected = [crf(emissions, tags, mask), crf.decode(emissions, mask), crf.nbest(emissions, mask, 2)[1]]
        with torch.no_grad():
            expected.append(crf.marginals(emissions, mask))
        crf.backend = "triton"
        fake_triton.calls.clear()
        got = [crf(emissions, tags, mask), crf.decode(emissions, mask), crf.nbest(emissions, mask, 2)[1]]
        with torch.no_grad():
            got.append(crf.marginals(emissions, mask))
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
        assert set(fake_triton.calls) == set(engine.QUANTITIES)


def test_environment_variable_sets_the_backend_for_a_run(fake_triton, monkeypatch):
    monkeypatch.setenv(engine.ENV, "triton")
    crf = LinearChainCRF(3)
    crf.decode(torch.randn(2, 4, 3))
    assert fake_triton.calls == ["viterbi"]
    crf.backend = "torch"  # a name wins over the variable
    crf.decode(torch.randn(2, 4, 3))
    assert fake_triton.calls == ["viterbi"]


def test_each_layer_takes_backend_as_argument_and_attribute():
    layers = [LinearChainCRF(3, backend="torch"), SecondOrderCRF(3, backend="torch"),
              PrecursorInducedCRF(TAGS, "IOB2", backend="torch")]
    for layer in layers:
        assert layer.backend == "torch"
        layer.backend = "auto"
        assert layer.backend == "auto"
        with pytest.raises(ValueError, match="backend must be one of"):
            layer.backend = "gpu"
        assert "backend" not in layer.state_dict()
    assert build_crf("precursor", TAGS, "IOB2", backend="compiled").backend == "compiled"
    assert LinearChainCRF(3).backend == "auto"


@pytest.mark.parametrize("kind", ["first_order", "second_order", "precursor"])
def test_hydra_option_reaches_the_layer(tmp_path, kind):
    cfg = compose_task_config("train", tmp_path, [f"crf={kind}", "crf.backend=torch"])
    assert cfg.crf.backend == "torch"
    assert build_head(dict(cfg.crf), TAGS, "IOB2").backend == "torch"
    default = compose_task_config("train", tmp_path, [f"crf={kind}"])
    assert default.crf.backend == "auto"
    old_checkpoint_head = {key: value for key, value in dict(default.crf).items() if key != "backend"}
    assert build_head(old_checkpoint_head, TAGS, "IOB2").backend == "auto"

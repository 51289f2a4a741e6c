"""Every CRF layer built with ``backend="triton"`` computes what the same layer computes with
``backend="torch"``: the engine's chooser really hands the Triton backend each quantity (loss and
its gradients, Viterbi, n-best, marginals), on Triton's CPU interpreter. The kernels themselves are
checked against enumeration in tests/engine/test_triton.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from neurocrf.structs import LinearChainCRF, PrecursorInducedCRF, SecondOrderCRF  # noqa: E402
from neurocrf.structs.engine import BackendError  # noqa: E402
from neurocrf.structs.engine.triton import runtime  # noqa: E402

TAGS = ["O", "B-A", "I-A", "B-B", "I-B"]
LAYERS = {
    "first_order": lambda backend: LinearChainCRF(5, backend=backend),
    "second_order": lambda backend: SecondOrderCRF(4, backend=backend),
    "precursor": lambda backend: PrecursorInducedCRF(TAGS, "IOB2", backend=backend),
}
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


def assert_triton_layer_equals_torch_layer(build, emissions: torch.Tensor, mask: torch.Tensor, k: int,
                                           kernels: set[str]) -> None:
    """``build("triton")`` with the parameters of ``build("torch")`` (drawn at random): the NLL of
    the torch layer's best paths and its gradients, Viterbi, the k best and the marginals are
    the same, and the Triton ``kernels`` ran."""
    reference, layer = build("torch"), build("triton")
    with torch.no_grad():
        for param in reference.parameters():
            param.normal_()
    layer.load_state_dict(reference.state_dict())
    gold = reference.decode(emissions, mask).clamp(min=0)  # an admissible path for every layer
    runtime.LAUNCHES.clear()
    results = []
    for crf in (reference, layer):
        leaf = emissions.clone().requires_grad_()
        nll = crf(leaf, gold, mask, reduction="sum")
        grads = torch.autograd.grad(nll, [leaf, *crf.parameters()])
        with torch.no_grad():
            results.append((nll, grads, crf.decode(emissions, mask), *crf.nbest(emissions, mask, k=k),
                            crf.marginals(emissions, mask)))
    assert kernels <= set(runtime.LAUNCHES)
    (nll, grads, tags, nbest, nbest_scores, marginals), theirs = results
    torch.testing.assert_close(theirs[0], nll)
    for mine, other in zip(theirs[1], grads):
        torch.testing.assert_close(mine, other)
    assert torch.equal(theirs[2], tags) and torch.equal(theirs[3], nbest)
    torch.testing.assert_close(theirs[4], nbest_scores)
    torch.testing.assert_close(theirs[5], marginals)


@pytest.mark.parametrize("kind", LAYERS)
def test_a_triton_layer_computes_what_the_torch_layer_computes(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    num_tags = 4 if kind == "second_order" else 5
    emissions = torch.randn(4, 7, num_tags, dtype=torch.float64)
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[0] = False  # an empty row
    mask[1, 1:] = False  # one position
    mask[2, [1, 4]] = False  # holes
    assert_triton_layer_equals_torch_layer(LAYERS[kind], emissions, mask, 3,
                                           {"forward_kernel", "backward_kernel", "search_kernel"})


@pytest.mark.parametrize("kind", ["second_order", "precursor"])
def test_a_large_triton_layer_runs_the_blocked_kernels(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past one on-chip tile (the second-order layer with 17 tags: 18 x 18 pair states; the
    precursor layer with 45 entity types: 136 states) the layer still runs on the Triton backend
    and computes what the torch layer computes."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(1)
    tags = ["O"] + [f"{prefix}-T{i}" for i in range(8 if kind == "second_order" else 45) for prefix in "BI"]
    build = {"second_order": lambda backend: SecondOrderCRF(len(tags), backend=backend),
             "precursor": lambda backend: PrecursorInducedCRF(tags, "IOB2", backend=backend)}[kind]
    emissions = torch.randn(2, 4, len(tags), dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    assert_triton_layer_equals_torch_layer(build, emissions, mask, 2, set(runtime.BLOCKED.values()))


def test_a_triton_layer_on_cpu_tensors_without_the_interpreter_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(BackendError, match="needs CUDA tensors"):
        LinearChainCRF(3, backend="triton").decode(torch.randn(1, 2, 3))

"""Checks of the Triton backend: against brute-force enumeration (through a layer's chain inputs)
and against the torch engine (log Z, gradients, marginals, Viterbi, k best). Import after
``pytest.importorskip("triton")``."""

from __future__ import annotations

import torch

from neurocrf.structs.engine import triton as backend
from neurocrf.structs.engine.chain import Chain
from neurocrf.structs.engine.triton import runtime
from tests.helpers import chains

NEG_INF = float("-inf")


def check_against_enumeration(crf, constraints, emissions, mask, reference=None, k=4):
    """:func:`tests.helpers.chains.check_against_enumeration` of the triton backend."""
    chains.check_against_enumeration(backend, crf, constraints, emissions, mask, reference, k)


def torch_gradients(potentials, lengths):
    leaves = [x.detach().clone().requires_grad_(True) for x in potentials]
    log_z = Chain(*leaves, lengths, scan="sequential").log_partition()
    log_z.sum().backward()
    return log_z.detach(), [x.grad for x in leaves]


def triton_gradients(potentials, lengths):
    leaves = [x.detach().clone().requires_grad_(True) for x in potentials]
    log_z = backend.log_partition(*leaves, lengths)
    log_z.sum().backward()
    return log_z.detach(), [x.grad for x in leaves]


def assert_same_as_torch(potentials, lengths, k: int, blocked: tuple[str, ...] = ()) -> torch.Tensor:
    """log Z and its four gradients, marginals, Viterbi and the k best of the triton backend =
    the torch engine's (paths, scores and ties identical), the ``blocked`` kernels (names of
    :data:`~neurocrf.structs.engine.triton.runtime.BLOCKED`) among those run; returns the triton log Z."""
    runtime.LAUNCHES.clear()
    log_z, grads = triton_gradients(potentials, lengths)
    ref_log_z, ref_grads = torch_gradients(potentials, lengths)
    torch.testing.assert_close(log_z, ref_log_z)
    for name, got, expected in zip(("start", "transitions", "end", "emissions"), grads, ref_grads):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, msg=f"gradient of {name}")
    chain = Chain(*potentials, lengths)
    torch.testing.assert_close(backend.node_marginals(*potentials, lengths), chain.marginals())
    states, best = backend.viterbi(*potentials, lengths)
    ref_states, ref_best = chain.viterbi()
    assert torch.equal(states, ref_states)
    torch.testing.assert_close(best, ref_best, rtol=0, atol=1e-12)
    paths, scores = backend.kbest(*potentials, lengths, k)
    ref_paths, ref_scores = chain.kbest(k)
    assert torch.equal(paths, ref_paths) and torch.equal(scores, ref_scores)
    assert {runtime.BLOCKED[kernel] for kernel in blocked} <= set(runtime.LAUNCHES)
    return log_z


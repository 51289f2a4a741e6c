"""Checks of the Triton backend: against brute-force enumeration (through a layer's chain inputs)
and against the torch engine (log Z, gradients, marginals, Viterbi, k best). Import after
``pytest.importorskip("triton")``."""

from __future__ import annotations

import torch

from neurocrf.structs.engine import triton as backend
from neurocrf.structs.engine.chain import Chain
from neurocrf.structs.engine.triton import runtime
from tests.helpers.enumeration import REFERENCES, all_sequences

NEG_INF = float("-inf")


def layer_inputs(crf, emissions, mask):
    """The compacted chain inputs a layer hands to the engine: start, transitions, end, state
    emissions, lengths (differentiable w.r.t. the layer's parameters and ``emissions``)."""
    _, _, lengths, _, compact, (start, moves, end) = crf._prepare(emissions, mask)
    return start, moves, end, crf._state_emissions(compact), lengths


def enumerate_rows(crf, constraints, emissions, mask, reference=None):
    """Per row: all tag sequences over the row's True positions and their reference scores."""
    rows = []
    for row in range(emissions.shape[0]):
        e = emissions[row][mask[row]]
        ys = all_sequences(crf.num_tags, e.shape[0])
        score = (reference or REFERENCES[type(crf)])(crf, e, ys, constraints)
        rows.append((ys, score))
    return rows


def tag_marginals(crf, state_marginals, width):
    batch = state_marginals.shape[0]
    flat = state_marginals.reshape(batch, width, -1)
    out = flat.new_zeros(batch, width, crf.num_tags + 1)
    out.index_add_(2, crf.state_labels.clamp(max=crf.num_tags), flat)
    return out[..., : crf.num_tags]


def check_against_enumeration(crf, constraints, emissions, mask, reference=None, k=4):
    """log Z, its gradients (parameters and emissions), marginals, Viterbi and k best of the
    triton backend = brute-force enumeration, row by row."""
    leaf = emissions.clone().requires_grad_(True)
    inputs = layer_inputs(crf, leaf, mask)
    lengths = inputs[-1]
    crf.zero_grad()
    log_z = backend.log_partition(*inputs)
    log_z.sum().backward()
    got_grads = {name: p.grad.clone() for name, p in crf.named_parameters()}
    got_emission_grad = leaf.grad.clone()

    rows = enumerate_rows(crf, constraints, leaf, mask, reference)
    crf.zero_grad()
    leaf.grad = None
    expected_log_z = torch.stack([torch.logsumexp(score, 0) for _, score in rows])
    expected_log_z.sum().backward()
    torch.testing.assert_close(log_z, expected_log_z.detach())
    for name, param in crf.named_parameters():
        torch.testing.assert_close(got_grads[name], param.grad, msg=f"gradient of {name}")
    torch.testing.assert_close(got_emission_grad, leaf.grad)

    detached = tuple(x.detach() for x in inputs)
    width = detached[3].shape[1]
    marginals = tag_marginals(crf, backend.node_marginals(*detached), width)
    states, best = backend.viterbi(*detached)
    paths, scores = backend.kbest(*detached, k)
    for row, (ys, score) in enumerate(rows):
        score = score.detach()
        n = int(lengths[row])
        probs = torch.softmax(score, 0)
        expected = torch.zeros(n, crf.num_tags, dtype=torch.float64)
        for t in range(n):
            expected[t].index_add_(0, ys[:, t], probs)
        torch.testing.assert_close(marginals[row, :n], expected)
        assert bool((marginals[row, n:] == 0).all())
        torch.testing.assert_close(best[row], score.max())
        tags = crf._state_to_tag(states[row, :n])
        assert bool((states[row, n:] == -1).all())
        if n:
            assert torch.equal(ys[(ys == tags).all(1)].squeeze(0), tags)  # the path scoring best
            torch.testing.assert_close(score[(ys == tags).all(1)][0], score.max())
        ranked = score[torch.isfinite(score)].sort(descending=True).values[:k]
        torch.testing.assert_close(scores[row, : len(ranked)], ranked)
        assert bool(torch.isneginf(scores[row, len(ranked):]).all())
        for rank in range(len(ranked)):
            tags = crf._state_to_tag(paths[row, rank, :n])
            torch.testing.assert_close(score[(ys == tags).all(1)][0], ranked[rank])
        assert bool((paths[row, len(ranked):] == -1).all()) and bool((paths[row, :, n:] == -1).all())


def random_chain(batch, seq_len, size, order, dtype, generator, per_position=False, scale=1.0, holes=0.2):
    """Random potentials with -inf constraints, lengths from 0 to ``seq_len``."""
    shape = (size,) * order
    start = torch.randn(shape, generator=generator, dtype=torch.float64)
    end = torch.randn(shape, generator=generator, dtype=torch.float64)
    lead = (batch, seq_len) if per_position else ()
    moves = torch.randn(lead + shape + (size,), generator=generator, dtype=torch.float64)
    moves = moves.masked_fill(torch.rand(moves.shape, generator=generator) < holes, NEG_INF)
    emissions = torch.randn((batch, seq_len) + shape, generator=generator, dtype=torch.float64) * scale
    lengths = torch.randint(0, seq_len + 1, (batch,), generator=generator)
    if batch > 1:
        lengths[0], lengths[1] = seq_len, min(1, seq_len)
    return tuple(x.to(dtype) for x in (start, moves, end, emissions)) + (lengths,)


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


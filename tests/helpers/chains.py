"""Chain inputs for the engine's backends and the reference, and checks of any of them against
brute-force enumeration (through a layer's chain inputs). Backends are modules with the functions
of :class:`~neurocrf.structs.engine.Backend` (the reference among them)."""

from __future__ import annotations

import torch

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


def check_against_enumeration(backend, crf, constraints, emissions, mask, reference=None, k=4):
    """log Z, its gradients (parameters and emissions), marginals, Viterbi and k best of
    ``backend`` (a module with the functions of :class:`~neurocrf.structs.engine.Backend`) =
    brute-force enumeration, row by row."""
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

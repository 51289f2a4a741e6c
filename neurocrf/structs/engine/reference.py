"""The reference every backend is tested against: the plain log-space chain engine.

Every engine quantity, written once for clarity rather than speed, over the engine's state-space
interface (first order, pair states, per-position transitions; shared emission columns are
expanded by :class:`~neurocrf.structs.engine.chain.Chain` before they get here): a log-space
forward-backward for the log partition and the marginals, a max scan for Viterbi, a k-max scan
for the k best paths, and a sum along the path for path scores. The backends
(:mod:`~neurocrf.structs.engine.pytorch`, :mod:`~neurocrf.structs.engine.compiled`,
:mod:`~neurocrf.structs.engine.triton`) compute the same quantities faster and are held to this
module (and it to brute-force enumeration) by ``tests/engine/test_against_reference.py``.

Two kinds of function:

- the :class:`~neurocrf.structs.engine.Backend` contract (:func:`log_partition`,
  :func:`node_marginals`, :func:`viterbi`, :func:`kbest`, :func:`path_score`) on the original,
  compacted potentials: ``start [*S]``, ``transitions [*S, C]`` or per position ``[B, T, *S, C]``,
  ``end [*S]``, ``emissions [B, T, *S]``, ``lengths [B]``;
- their building blocks on the augmented, time-major potentials of :func:`augmented` (an absorbing
  END value on every component, see :mod:`~neurocrf.structs.engine.augmented`): ``start [*S']``,
  ``moves [*S', C']`` (or per position ``[T + 1, B, *S', C']``), ``emissions [T + 1, B, *S']``.
  Every row then takes the same number of steps and needs no masking.

Torch only, any device, derivatives of every order: the forward and backward scores are built
from :meth:`~neurocrf.structs.engine.semiring.LogSemiring.plus` (``differentiable=True``), so
autograd differentiates log Z, the marginals, entropies and divergences built on them exactly to
any order. That is why the layers' higher derivatives (``create_graph=True``) and
:class:`~neurocrf.structs.distribution.ChainDistribution` run on this module whatever the backend;
``differentiable=False`` runs ``torch.logsumexp`` into one buffer, without a graph, for the
backends' exact fallbacks. Log partition and marginals are computed in float64, searches in
:data:`~neurocrf.structs.engine.SEARCH_DTYPE`. Time O(T |S'| C') per row (k best: times
``k log(C' k)``).

>>> import torch
>>> start, transitions, end = torch.zeros(2), torch.zeros(2, 2), torch.zeros(2)
>>> emissions, lengths = torch.zeros(1, 3, 2), torch.tensor([3])
>>> log_partition(start, transitions, end, emissions, lengths)  # 2 ** 3 paths of score 0
tensor([2.0794])
>>> kbest(start, transitions, end, torch.tensor([[[1.0, 0.0]]]), torch.tensor([1]), 3)
(tensor([[[ 0],
         [ 1],
         [-1]]]), tensor([[1., 0., -inf]], dtype=torch.float64))
"""

from __future__ import annotations

import torch
from torch import Tensor

from neurocrf.structs.engine import SEARCH_DTYPE
from neurocrf.structs.engine.augmented import active_positions, augment, is_per_position, moves_into, state_map
from neurocrf.structs.engine.semiring import NEG_INF, KMaxSemiring, LogSemiring, top_first


def available() -> str | None:
    """Always available (plain torch)."""
    return None


def unsupported(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
                k: int = 1) -> str | None:
    """Takes every input."""
    return None


# --- the contract, on the original potentials -------------------------------------------------------

def augmented(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
              dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """The augmented, time-major ``start``, ``moves`` and ``emissions`` in ``dtype`` (differentiable)."""
    return tuple(x.to(dtype) for x in augment(start, transitions, end, emissions, lengths))  # type: ignore[return-value]


def original_states(states: Tensor, size: int, order: int) -> Tensor:
    """Flat augmented states -> flat original states (-1 for states with an END component)."""
    return state_map(size, order, states.device)[states]


def _inner(x: Tensor, size: int, order: int) -> Tensor:
    """Augmented ``[T + 1, B, *S']`` -> the original states of the ``T`` positions, ``[B, T, |S|]``."""
    x = x[(slice(0, x.shape[0] - 1), slice(None)) + (slice(0, size),) * order]
    return x.reshape(x.shape[0], x.shape[1], size ** order).transpose(0, 1)


def log_partition(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[B]`` log partition in the emissions' dtype (0 for empty rows, ``-inf`` without a path),
    differentiable to any order (a graph of ``[B, T, |S|, C]`` intermediates)."""
    alphas = forward_scores(*augmented(start, transitions, end, emissions, lengths))
    log_z = log_z_from(alphas)
    return torch.where(lengths > 0, log_z, torch.zeros_like(log_z)).to(emissions.dtype)


def node_marginals(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor) -> Tensor:
    """``[B, T, |S|]`` state posteriors in the emissions' dtype (0 past each length and in rows
    without a path); no gradient."""
    with torch.no_grad():
        aug_start, moves, aug_emissions = augmented(start, transitions, end, emissions, lengths)
        alphas = forward_scores(aug_start, moves, aug_emissions, differentiable=False)
        betas = backward_scores(moves, aug_emissions, differentiable=False)
        posteriors = state_posteriors(alphas, betas, log_z_from(alphas))
    return _inner(posteriors, transitions.shape[-1], start.dim()).to(emissions.dtype)


def viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
            ) -> tuple[Tensor, Tensor]:
    """Best path: flat states ``[B, T]`` (-1 past each length and in rows without a path) and float64
    scores ``[B]`` (``-inf`` without a path); ties go to the lower state index."""
    if emissions.shape[0] == 0:
        return lengths.new_zeros(0, emissions.shape[1]), emissions.new_zeros(0, dtype=SEARCH_DTYPE)
    with torch.no_grad():
        states, best = max_scan(*augmented(start, transitions, end, emissions, lengths, SEARCH_DTYPE))
    states = original_states(states, transitions.shape[-1], start.dim())
    return states.masked_fill(torch.isneginf(best).unsqueeze(1), -1), best


def kbest(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor, k: int
          ) -> tuple[Tensor, Tensor]:
    """The k best paths, best first (the first is :func:`viterbi`'s): flat states ``[B, k, T]`` and
    float64 scores ``[B, k]``; missing paths have score ``-inf`` and states -1."""
    if emissions.shape[0] == 0:
        return lengths.new_zeros(0, k, emissions.shape[1]), emissions.new_zeros(0, k, dtype=SEARCH_DTYPE)
    with torch.no_grad():
        states, scores = kmax_scan(*augmented(start, transitions, end, emissions, lengths, SEARCH_DTYPE), k)
    states = original_states(states, transitions.shape[-1], start.dim())
    return states.masked_fill(~torch.isfinite(scores).unsqueeze(-1), -1), scores


def path_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor,
               lengths: Tensor) -> Tensor:
    """``[B]`` unnormalised score of the flat state paths ``states [B, T]`` (entries past a row's
    length are ignored but must be valid indices), differentiable to any order."""
    batch, seq_len = states.shape
    if seq_len == 0:
        return emissions.new_zeros(batch)
    num_components = transitions.shape[-1]
    active = active_positions(lengths, seq_len)
    zero = emissions.new_zeros(())
    emitted = emissions.reshape(batch, seq_len, -1).gather(2, states.unsqueeze(-1)).squeeze(-1)
    total = torch.where(active, emitted, zero).sum(1)
    has_any = lengths > 0
    total = total + torch.where(has_any, start.reshape(-1)[states[:, 0]], zero)
    if seq_len > 1:
        into = states[:, 1:] % num_components  # the component a move into (*r, c) reads
        if is_per_position(transitions, emissions):
            flat = transitions.reshape(batch, seq_len, -1, num_components)
            rows = torch.arange(batch, device=states.device).unsqueeze(1)
            positions = torch.arange(1, seq_len, device=states.device).unsqueeze(0)
            moved = flat[rows, positions, states[:, :-1], into]
        else:
            moved = transitions.reshape(-1, num_components)[states[:, :-1], into]
        total = total + torch.where(active[:, 1:], moved, zero).sum(1)
    last = states.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return total + torch.where(has_any, end.reshape(-1)[last], zero)


# --- forward-backward on the augmented potentials ---------------------------------------------------

def forward_scores(start: Tensor, moves: Tensor, emissions: Tensor, differentiable: bool = True) -> Tensor:
    """Forward (alpha) log scores ``[T + 1, B, *S']``: everything up to and including each position
    (see the module docstring for ``differentiable``)."""
    if not differentiable:
        alphas = torch.empty_like(emissions)
        torch.add(start, emissions[0], out=alphas[0])
        for t in range(1, emissions.shape[0]):
            torch.logsumexp(alphas[t - 1].unsqueeze(-1) + moves_into(moves, emissions, t), dim=1, out=alphas[t])
            alphas[t] += emissions[t]
        return alphas
    alpha = start + emissions[0]
    alphas = [alpha]
    for t in range(1, emissions.shape[0]):
        alpha = LogSemiring.plus(alpha.unsqueeze(-1) + moves_into(moves, emissions, t), dim=1) + emissions[t]
        alphas.append(alpha)
    return torch.stack(alphas)


def backward_scores(moves: Tensor, emissions: Tensor, differentiable: bool = True) -> Tensor:
    """Backward (beta) log scores ``[T + 1, B, *S']``: everything after each position."""
    if not differentiable:
        betas = torch.empty_like(emissions)
        betas[-1] = 0.0
        for t in range(emissions.shape[0] - 2, -1, -1):
            following = (emissions[t + 1] + betas[t + 1]).unsqueeze(1)  # [B, 1, *R, C']
            torch.logsumexp(moves_into(moves, emissions, t + 1) + following, dim=-1, out=betas[t])
        return betas
    beta = torch.zeros_like(emissions[-1])
    betas = [beta]
    for t in range(emissions.shape[0] - 2, -1, -1):
        following = (emissions[t + 1] + beta).unsqueeze(1)  # [B, 1, *R, C']
        beta = LogSemiring.plus(moves_into(moves, emissions, t + 1) + following, dim=-1)
        betas.append(beta)
    return torch.stack(betas[::-1])


def log_z_from(alphas: Tensor) -> Tensor:
    """``[B]`` log partition from the forward scores (the last position is END in every row)."""
    return LogSemiring.plus(alphas[-1].flatten(1), dim=1)


def safe_log_z(log_z: Tensor) -> Tensor:
    """``log_z`` with ``-inf`` (no valid path) replaced by 0, so that differences stay NaN-free."""
    return torch.where(torch.isfinite(log_z), log_z, torch.zeros_like(log_z))


def state_posteriors(alphas: Tensor, betas: Tensor, log_z: Tensor) -> Tensor:
    """``[T + 1, B, *S']`` state posteriors (all 0 in rows whose log partition is not finite)."""
    finite = torch.isfinite(log_z).view(1, -1, *([1] * (alphas.dim() - 2)))
    marginals = torch.exp(alphas + betas - safe_log_z(log_z).view_as(finite))
    return torch.where(finite, marginals, torch.zeros_like(marginals))


def edge_posteriors(moves: Tensor, emissions: Tensor, alphas: Tensor, betas: Tensor, log_z: Tensor) -> Tensor:
    """``[T, B, *S', C']``: entry ``t - 1`` is the posterior of each move into position ``t``."""
    steps = emissions.shape[0]
    into = moves[1:] if moves.dim() > emissions.dim() else moves
    following = (emissions + betas)[1:].unsqueeze(2)  # [T, B, 1, *R, C']
    shift = safe_log_z(log_z).view(1, -1, *([1] * (alphas.dim() - 1)))
    return torch.exp(alphas[: steps - 1].unsqueeze(-1) + into + following - shift)


def expectation(weights: Tensor, scores: Tensor, dims: tuple[int, ...]) -> Tensor:
    """``sum(weights * scores)`` over ``dims`` with ``0 * -inf = 0``; ``-inf`` wherever a positive
    weight meets a ``-inf`` score (the expectation of a score that is ``-inf`` with positive
    probability)."""
    finite = torch.isfinite(scores)
    total = (weights * torch.where(finite, scores, torch.zeros_like(scores))).sum(dims)
    lost = ((weights > 0) & ~finite).sum(dims) > 0
    return total.masked_fill(lost, NEG_INF)


def _gumbel_argmax(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """Index of ``argmax(logits + Gumbel noise)`` over the last dim: an exact draw from
    ``softmax(logits)`` that never picks a ``-inf`` entry while a finite one exists."""
    tiny = torch.finfo(torch.float64).tiny
    uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
    noise = -torch.log(-torch.log(uniform.clamp(min=tiny)))
    return (logits + noise).argmax(-1)


def _previous(source: Tensor, state: Tensor, width: int, order: int) -> Tensor:
    """Flat source ``(a, *r)`` of a transition into flat destination ``(*r, c)``."""
    return source * width ** (order - 1) + torch.div(state, width, rounding_mode="floor")


def sample_states(moves: Tensor, emissions: Tensor, alphas: Tensor, num: int,
                  generator: torch.Generator | None = None) -> Tensor:
    """Forward filtering, backward sampling: ``[num, B, T + 1]`` flat augmented states.

    The last state is drawn from the final forward scores, then each earlier state from
    ``alpha_t(s) + W(s -> s_{t+1})``: exact draws from the chain's distribution. Rows without a
    valid path return arbitrary states (callers mask them).
    """
    steps, batch = alphas.shape[:2]
    order = alphas.dim() - 2
    width = emissions.shape[-1]
    flat = width ** order
    scores = alphas.detach().reshape(steps, 1, batch, flat)
    state = _gumbel_argmax(scores[-1].expand(num, batch, flat), generator)
    path = [state]
    for t in range(steps - 2, -1, -1):
        step_moves = moves_into(moves, emissions, t + 1).detach()
        step_moves = step_moves.reshape(*step_moves.shape[: step_moves.dim() - order - 1], flat * width)
        step_moves = step_moves.expand(num, batch, flat * width)
        sources = _previous(torch.arange(width, device=state.device), state.unsqueeze(-1), width, order)  # [num, B, C']
        component = (state % width).unsqueeze(-1)
        logits = scores[t].expand(num, batch, flat).gather(2, sources)
        logits = logits + step_moves.gather(2, sources * width + component)
        state = sources.gather(2, _gumbel_argmax(logits, generator).unsqueeze(-1)).squeeze(-1)
        path.append(state)
    return torch.stack(path[::-1], dim=-1)


# --- max and k-max scans on the augmented potentials -------------------------------------------------

def max_scan(start: Tensor, moves: Tensor, emissions: Tensor) -> tuple[Tensor, Tensor]:
    """The best path: flat augmented states ``[B, T]`` of positions ``0 .. T - 1`` and its score
    ``[B]`` (``-inf`` for rows without a path, whose states are then arbitrary)."""
    batch, order, width = emissions.shape[1], start.dim(), start.shape[0]
    score = start + emissions[0]
    pointers = []
    for t in range(1, emissions.shape[0]):
        # the emission of the destination (*r, c) does not depend on the source a: added after the max
        score, pointer = (score.unsqueeze(-1) + moves_into(moves, emissions, t)).max(dim=1)
        score = score + emissions[t]
        pointers.append(pointer.reshape(batch, -1))
    best_score, state = score.reshape(batch, -1).max(dim=1, keepdim=True)
    path = []
    for pointer in reversed(pointers):
        state = _previous(pointer.gather(1, state), state, width, order)
        path.append(state)
    return torch.cat(path[::-1], dim=1) if path else state.new_zeros(batch, 0), best_score.squeeze(1)


def kmax_scan(start: Tensor, moves: Tensor, emissions: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best paths: flat augmented states ``[B, k, T]`` and scores ``[B, k]``, best first
    (the first path is :func:`max_scan`'s); missing paths have score ``-inf`` and arbitrary states."""
    semiring = KMaxSemiring(k)
    steps, batch = emissions.shape[:2]
    order, width = start.dim(), start.shape[0]
    num_states = width ** order
    pointers = torch.empty((steps, batch, num_states, k), dtype=torch.long, device=emissions.device)
    score = emissions.new_full(emissions.shape[1:] + (k,), NEG_INF)
    score[..., 0] = start + emissions[0]
    ranked_moves = moves.unsqueeze(-1)
    for t in range(1, steps):
        best, pointer = semiring.plus_with_argmax(score.unsqueeze(-2) + moves_into(ranked_moves, emissions, t))
        score = best + emissions[t].unsqueeze(-1)
        pointers[t] = pointer.reshape(batch, num_states, k)
    best_scores, flat = top_first(score.reshape(batch, num_states * k), k)
    state, rank = torch.div(flat, k, rounding_mode="floor"), flat % k
    pointers = pointers.reshape(steps, batch, num_states * k)
    paths = torch.empty((batch, k, steps - 1), dtype=torch.long, device=state.device)
    for t in range(steps - 1, 0, -1):
        pointer = pointers[t].gather(1, state * k + rank)
        state = _previous(torch.div(pointer, k, rounding_mode="floor"), state, width, order)
        rank = pointer % k
        paths[:, :, t - 1] = state
    return paths, best_scores

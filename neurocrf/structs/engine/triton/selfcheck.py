"""The Triton kernels checked against the torch engine on a small random problem, before
``backend="auto"`` trusts them on a device (see :func:`neurocrf.structs.engine.select`).

:func:`self_check` runs every entry point the layers use (log Z and its gradients, node marginals,
Viterbi, k best, and the masked NLL and k best that read a mask and tag emissions in place) on a
few rows of a random chain of the given kind, dtype and device, and the torch engine on the same
potentials. It returns None when they agree, else one line naming what differed (or the error a
kernel raised: a compile or launch failure). A few milliseconds on a GPU once compiled.

:data:`TESTED` is the Triton version range the kernels are compile-tested with; ``"auto"`` takes the
Triton backend only inside it (:func:`version_reason`).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

TESTED = ((3, 2), (3, 9))
"""Oldest and newest ``(major, minor)`` Triton release the kernels are compiled with in the tests
(every kernel for sm_75, sm_80 and sm_90; see docs/benchmarks.md)."""


def version_reason(version: str | None = None) -> str | None:
    """None when Triton ``version`` (default: the installed one) is inside :data:`TESTED`, else why
    ``"auto"`` does not take the Triton backend (a backend named explicitly still runs)."""
    if version is None:
        import triton

        version = triton.__version__
    try:
        release = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return f"triton {version}: version not understood; the kernels are tested with {_range()}"
    if not TESTED[0] <= release <= TESTED[1]:
        return f"triton {version} is outside the versions the kernels are tested with ({_range()})"
    return None


def _range() -> str:
    return f"triton {TESTED[0][0]}.{TESTED[0][1]} to {TESTED[1][0]}.{TESTED[1][1]}"


def _problem(order: int, per_position: bool, dtype: torch.dtype, device: torch.device):
    """Random potentials of a small chain (one forbidden transition, rows of 5, 2 and 0 positions)."""
    generator = torch.Generator().manual_seed(1234)
    size = 4 if order == 1 else 3
    shape = (size,) * order
    batch, seq_len = 3, 5

    def draw(*dims: int) -> Tensor:
        return torch.randn(*dims, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)

    start, end = draw(*shape), draw(*shape)
    transitions = draw(*((batch, seq_len) if per_position else ()), *shape, size)
    transitions[..., 0, 1] = float("-inf")
    emissions = draw(batch, seq_len, *shape)
    lengths = torch.tensor([5, 2, 0], device=device)
    return start, transitions, end, emissions, lengths


def _differs(name: str, mine: Tensor, reference: Tensor, tolerance: float) -> str | None:
    mine, reference = mine.detach().double().cpu(), reference.detach().double().cpu()
    finite = torch.isfinite(reference)
    if mine.shape != reference.shape or not torch.equal(torch.isfinite(mine), finite):
        return f"{name}: shape or infinities differ from the torch engine"
    if not finite.any():
        return None
    gap = (mine[finite] - reference[finite]).abs().max().item()
    allowed = tolerance * (1.0 + reference[finite].abs().max().item())
    return None if gap <= allowed else f"{name} differs from the torch engine by {gap:.3g}"


def self_check(order: int, per_position: bool, dtype: torch.dtype, device: torch.device | str) -> str | None:
    """None when the Triton kernels compute what the torch engine computes on a small chain of
    this ``order``, kind of transitions, ``dtype`` and ``device``, else one line saying what
    differed or which error a kernel raised."""
    from neurocrf.structs import engine
    from neurocrf.structs.engine import triton as kernels

    reference = engine.load("torch")

    device = torch.device(device)
    try:
        # the interpreter's numpy warns on log(0) = -inf, the intended value; callers may be in no_grad
        # or inference mode
        with warnings.catch_warnings(), torch.inference_mode(False), torch.enable_grad():
            warnings.simplefilter("ignore", RuntimeWarning)
            checks = _checks(kernels, reference, order, per_position, dtype, device)
    except Exception as error:  # noqa: BLE001 - any failure of a kernel means: do not trust it
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".strip()
    for name, mine, theirs in checks:
        reason = _differs(name, mine, theirs, 1e-4 if dtype != torch.float64 else 1e-8)
        if reason is not None:
            return reason
    return None


def _checks(kernels, reference, order: int, per_position: bool, dtype: torch.dtype, device: torch.device
            ) -> list[tuple[str, Tensor, Tensor]]:
    """(what, Triton's result, the torch engine's) of every entry point on one small problem."""
    start, transitions, end, emissions, lengths = _problem(order, per_position, dtype, device)
    results = []
    for backend in (kernels, reference):
        inputs = [x.clone().requires_grad_() for x in (start, transitions, end, emissions)]
        log_z = backend.log_partition(*inputs, lengths)
        grads = torch.autograd.grad(log_z.sum(), inputs)
        potentials = [x.detach() for x in inputs]
        marginals = backend.node_marginals(*potentials, lengths)
        states, scores = backend.kbest(*potentials, lengths, 3)
        results.append((log_z, *grads, marginals, scores, states.double()))
    checks = list(zip(("log Z", "d start", "d transitions", "d end", "d emissions", "marginals", "k-best scores",
                       "k-best paths"), *results))
    if not per_position:
        checks += _masked_checks(kernels, reference, start, transitions, end, emissions, lengths)
    return checks


def _masked_checks(kernels, reference, start, transitions, end, emissions, lengths) -> list[tuple[str, Tensor, Tensor]]:
    """The masked k best and (first order) the masked NLL of the torch engine's best paths, on a
    mask with a hole, against the torch engine on the compacted chain."""
    batch, seq_len = emissions.shape[:2]
    mask = torch.arange(seq_len, device=lengths.device) < lengths[:, None]
    mask[0, 1] = False
    compact_lengths = mask.sum(1)
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    compact = emissions.gather(1, order.view(batch, seq_len, *[1] * (emissions.dim() - 2)).expand_as(emissions))
    states, scores = reference.kbest(start, transitions, end, compact, compact_lengths, 2)
    log_z = reference.log_partition(start, transitions, end, compact, compact_lengths)
    paths, log_probs = kernels.masked_kbest(start, transitions, end, emissions, mask, compact_lengths, 2,
                                            normalize=True)
    expected_paths = torch.full_like(paths, -1).scatter(2, order[:, None].expand(-1, 2, -1), states)
    expected_paths = torch.where(mask[:, None], expected_paths, -1)
    expected_log_probs = torch.where(torch.isneginf(scores), scores, scores - log_z.double()[:, None])
    checks = [("masked k-best log-probabilities", log_probs, expected_log_probs),
              ("masked k-best paths", paths.double(), expected_paths.double())]
    if start.dim() == 1:
        best = states[:, 0].clamp(min=0)
        gold = torch.zeros(batch, seq_len, dtype=torch.long, device=mask.device).scatter(1, order, best)
        nll = kernels.masked_nll(start, transitions, end, emissions, mask, compact_lengths, gold)
        score = reference.path_score(start, transitions, end, compact, best, compact_lengths)
        expected = torch.where(torch.isneginf(log_z), torch.full_like(log_z, float("inf")), log_z - score)
        checks.append(("masked NLL", nll, expected))
    return checks

"""The Triton backend of the chain engine: fused kernels written for this project.

One program per batch row keeps the row's state scores on chip and loops over the positions
inside the kernel, so every call launches a constant number of kernels whatever the batch size
and the sequence length (:mod:`.kernels`). Inputs follow the chain engine's conventions: ``start
[*S]``, ``transitions [*S, C]`` or per position ``[B, T, *S, C]``, ``end [*S]``, compacted
``emissions [B, T, *S]`` and ``lengths [B]``, with ``S = (C,) * order`` and order 1 (tags,
expanded precursor states) or 2 (pair states).

- :func:`log_partition`: ``[B]``, differentiable (the backward pass is the fused
  forward-backward kernel: gradients are marginals);
- :func:`node_marginals`: ``[B, T, |S|]``;
- :func:`viterbi`, :func:`kbest`: flat states and float64 scores, identical to the torch engine's
  (ties included);
- :func:`path_score`: the score of given paths, summed in float64;
- :func:`masked_nll`, :func:`masked_kbest`: the layers' loss and search on uncompacted emissions
  and a mask, compacted, scored and mapped back to tags inside the kernels (no host sync, a
  handful of allocations per call; ``ChainCRF`` takes them where the backend offers them).

State-space size. A state space whose transition tile ``[BA, BB, BC]`` (``C^order x C`` rounded
up to powers of two, times the rank block for k best) fits :data:`~.runtime.MAX_TILE` (16,384
elements: first order up to 128 states, pair states up to 16 components, k = 16 up to 32 states)
runs the single-tile kernels, everything in registers. Larger ones run the blocked kernels of
:mod:`.blocked`: each position loops over blocks of destination and source states of at most
:data:`~.runtime.BLOCK_TILE` elements (times the rank block), with the row's state vectors in a
per-row scratch buffer in global memory (ping-pong, one barrier per position): an online
log-sum-exp across source blocks (forward), across destination blocks (backward), and a merge of
each block's candidates into the running top k (search; ties broken exactly as the single tile
does). Any tag count and any k up to ``BLOCK_TILE`` run, in the same number of launches; the limits
left are int32 offsets (``|S| * C < 2^31``) and search keys (``|S| * k < 2^30``). The work per
position grows as ``|S| * C``, and blocked kernels re-read the previous scores once per
destination block, so very large state spaces are memory-bound rather than register-bound.

Numerics: float32 and float64 inputs (float16 and bfloat16 emissions upcast inside); results in
float64 for float64 inputs, else float32. Scores are rescaled log values with the log scale kept
in float64; from :data:`~.inputs.LONG_SEQUENCE` positions the recurrences run in float64. Search
runs in float64. Gradients are first derivatives (for gradients of gradients use the torch engine).

CUDA tensors run compiled kernels; CPU tensors run on Triton's interpreter when
``TRITON_INTERPRET=1`` (slow: for tests; read at every call, see :mod:`.runtime`).
:func:`unsupported` says why an input cannot run (no CUDA tensor, triton missing, an unsupported
dtype or order, offsets or search keys past int32, more ranks than one block holds).
"""

from neurocrf.structs.engine.triton.partition import log_partition, masked_nll, node_marginals
from neurocrf.structs.engine.triton.runtime import LAUNCHES, available, unsupported
from neurocrf.structs.engine.triton.score import path_score
from neurocrf.structs.engine.triton.search import kbest, masked_kbest, viterbi
from neurocrf.structs.engine.triton.selfcheck import TESTED, self_check


def auto_reason() -> str | None:
    """Why ``backend="auto"`` does not take the Triton backend here (None: it does): a Triton
    version outside :data:`~.selfcheck.TESTED`."""
    from neurocrf.structs.engine.triton.selfcheck import version_reason

    return version_reason()


def version() -> str:
    """``triton <version>``."""
    import triton

    return f"triton {triton.__version__}"

__all__ = ["LAUNCHES", "TESTED", "auto_reason", "available", "kbest", "log_partition", "masked_kbest", "masked_nll",
           "node_marginals", "path_score", "self_check", "unsupported", "version", "viterbi"]

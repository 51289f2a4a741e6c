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
- :func:`path_score`: the score of given paths, summed in float64.

Numerics: float32 and float64 inputs (float16 and bfloat16 emissions upcast inside); results in
float64 for float64 inputs, else float32. Scores are rescaled log values with the log scale kept
in float64; from :data:`~.inputs.LONG_SEQUENCE` positions the recurrences run in float64. Search
runs in float64. Gradients are first derivatives (for gradients of gradients use the torch engine).

CUDA tensors run compiled kernels; CPU tensors run on Triton's interpreter when
``TRITON_INTERPRET=1`` (slow: for tests; read at every call, see :mod:`.runtime`).
:func:`unsupported` says why an input cannot run (no CUDA tensor, triton missing, a state space
too large for one program's registers, an unsupported dtype or order).
"""

from neurocrf.structs.engine.triton.partition import log_partition, node_marginals
from neurocrf.structs.engine.triton.runtime import LAUNCHES, available, unsupported
from neurocrf.structs.engine.triton.score import path_score
from neurocrf.structs.engine.triton.search import kbest, viterbi

__all__ = ["LAUNCHES", "available", "kbest", "log_partition", "node_marginals", "path_score", "unsupported",
           "viterbi"]

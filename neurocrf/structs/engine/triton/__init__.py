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

CUDA tensors run compiled kernels; CPU tensors run on Triton's interpreter when
``TRITON_INTERPRET=1`` (slow: for tests). :func:`unsupported` says why an input cannot run.
"""

from neurocrf.structs.engine.triton.partition import log_partition, node_marginals
from neurocrf.structs.engine.triton.runtime import LAUNCHES, available, unsupported
from neurocrf.structs.engine.triton.score import path_score
from neurocrf.structs.engine.triton.search import kbest, viterbi

__all__ = ["LAUNCHES", "available", "kbest", "log_partition", "node_marginals", "path_score", "unsupported",
           "viterbi"]

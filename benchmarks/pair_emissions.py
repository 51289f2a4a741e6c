"""Observation-dependent transitions: neurocrf's first-order CRF on pair emissions against
torch-struct's LinearChainCRF on the same edge potentials, in one process.

    python -m benchmarks.pair_emissions --threads 1

Pair emissions ``[B, T, L + 1, L]`` are torch-struct's native input (edge potentials ``[B, T - 1,
L, L]``); both compute the NLL of the same tag sequences (checked equal before timing) and its
gradient, and the Viterbi path. Rows of full length (torch-struct's ``lengths`` then cost
nothing). The plain first-order CRF (tag emissions only) is the reference for the cost of the
pairs. Timing as in :mod:`benchmarks.crf`: interleaved rounds, medians.
"""

from __future__ import annotations

import argparse
import platform
import warnings

import torch

from benchmarks.common import time_interleaved
from neurocrf.structs import LinearChainCRF

SIZES = [(32, 40, 9), (32, 40, 23), (128, 40, 23), (32, 40, 45)]


def edge_potentials(crf: LinearChainCRF, pairs: torch.Tensor) -> torch.Tensor:
    """Pair emissions ``[B, T, L + 1, L]`` -> torch-struct edges ``[B, T - 1, L (current), L (previous)]``
    carrying the same total score (start and first position in the first edge, end in the last)."""
    num_tags = crf.num_tags
    edges = (crf.transitions + pairs[:, 1:, :num_tags]).transpose(-1, -2)
    first = (crf.start_transitions + pairs[:, 0, num_tags])[:, None, :]  # indexed by the previous tag
    last = crf.end_transitions[None, :, None]  # indexed by the current tag
    parts = [edges[:, :1] + first.unsqueeze(1), edges[:, 1:-1], edges[:, -1:] + last]
    if edges.shape[1] == 1:
        parts = [edges + first.unsqueeze(1) + last]
    return torch.cat(parts, dim=1)


def measure(batch: int, seq_len: int, num_tags: int, repeats: int) -> dict[str, dict[str, float]]:
    """Median ms of NLL fwd+bwd and Viterbi for the three contenders at one size."""
    import torch_struct

    torch.manual_seed(0)
    crf = LinearChainCRF(num_tags)
    pairs = torch.randn(batch, seq_len, num_tags + 1, num_tags, requires_grad=True)
    emissions = torch.randn(batch, seq_len, num_tags, requires_grad=True)
    tags = torch.randint(num_tags, (batch, seq_len))
    mask = torch.ones(batch, seq_len, dtype=torch.bool)
    lengths = torch.full((batch,), seq_len)

    def struct_distribution() -> object:
        return torch_struct.LinearChainCRF(edge_potentials(crf, pairs), lengths=lengths)

    def struct_nll() -> torch.Tensor:
        dist = struct_distribution()
        return -dist.log_prob(dist.to_event(tags, num_tags, lengths=lengths)).mean()

    def struct_viterbi() -> torch.Tensor:
        with torch.no_grad():
            return struct_distribution().argmax

    def train_step(loss_fn, leaf: torch.Tensor):
        def run() -> None:
            leaf.grad = None
            loss_fn().backward()
        return run

    torch.testing.assert_close(crf(pairs, tags, mask).detach(), struct_nll().detach(), rtol=1e-4, atol=1e-3)
    device = torch.device("cpu")
    nll = time_interleaved({
        "pairs": train_step(lambda: crf(pairs, tags, mask), pairs),
        "struct": train_step(struct_nll, pairs),
        "tags": train_step(lambda: crf(emissions, tags, mask), emissions),
    }, repeats, device)
    viterbi = time_interleaved({
        "pairs": lambda: crf.decode(pairs.detach(), mask),
        "struct": struct_viterbi,
        "tags": lambda: crf.decode(emissions.detach(), mask),
    }, repeats, device)
    return {"NLL fwd+bwd": nll, "Viterbi": viterbi}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="torch_struct")
    print(f"## Pair emissions on {platform.processor() or platform.machine()}, {args.threads} torch thread(s), "
          f"torch {torch.__version__}; {args.repeats} interleaved rounds, median ms\n")
    print("| B x T x L | op | neurocrf pairs | torch-struct | neurocrf / torch-struct | neurocrf tags only |")
    print("|---|---|---:|---:|---:|---:|")
    for batch, seq_len, num_tags in SIZES:
        for label, times in measure(batch, seq_len, num_tags, args.repeats).items():
            print(f"| {batch}x{seq_len}x{num_tags} | {label} | {times['pairs']:.2f} | {times['struct']:.2f} | "
                  f"{times['pairs'] / times['struct']:.2f} | {times['tags']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

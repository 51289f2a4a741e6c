"""Observation-dependent transitions: neurocrf's first-order CRF on pair emissions against
torch-struct's LinearChainCRF on the same edge potentials, in one process.

    python scripts/bench_pair_emissions.py --threads 1

Pair emissions ``[B, T, L + 1, L]`` are torch-struct's native input (edge potentials ``[B, T - 1,
L, L]``); both compute the NLL of the same tag sequences (checked equal before timing) and its
gradient, and the Viterbi path. Rows of full length (torch-struct's ``lengths`` then cost
nothing). The plain first-order CRF (tag emissions only) is the reference for the cost of the
pairs. Timing as in ``bench_crf.py``: interleaved rounds, medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import warnings
from pathlib import Path

import torch

from neurocrf.structs import LinearChainCRF

SIZES = [(32, 40, 9), (32, 40, 23), (128, 40, 23), (32, 40, 45)]


def _time_interleaved():
    spec = importlib.util.spec_from_file_location("bench_crf", Path(__file__).with_name("bench_crf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.time_interleaved


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import torch_struct

    warnings.filterwarnings("ignore", module="torch_struct")
    time_interleaved = _time_interleaved()
    device = torch.device("cpu")
    print(f"## Pair emissions on {platform.processor() or platform.machine()}, {args.threads} torch thread(s), "
          f"torch {torch.__version__}; {args.repeats} interleaved rounds, median ms\n")
    print("| B x T x L | op | neurocrf pairs | torch-struct | neurocrf / torch-struct | neurocrf tags only |")
    print("|---|---|---:|---:|---:|---:|")
    for batch, seq_len, num_tags in SIZES:
        torch.manual_seed(0)
        crf = LinearChainCRF(num_tags)
        pairs = torch.randn(batch, seq_len, num_tags + 1, num_tags, requires_grad=True)
        emissions = torch.randn(batch, seq_len, num_tags, requires_grad=True)
        tags = torch.randint(num_tags, (batch, seq_len))
        mask = torch.ones(batch, seq_len, dtype=torch.bool)
        lengths = torch.full((batch,), seq_len)

        def struct_nll() -> torch.Tensor:
            dist = torch_struct.LinearChainCRF(edge_potentials(crf, pairs), lengths=lengths)
            return -dist.log_prob(dist.to_event(tags, num_tags, lengths=lengths)).mean()

        ours = crf(pairs, tags, mask).detach()
        torch.testing.assert_close(ours, struct_nll().detach(), rtol=1e-4, atol=1e-3)

        def step(loss_fn, leaf):
            def run() -> None:
                leaf.grad = None
                loss_fn().backward()
            return run

        nll = time_interleaved({
            "pairs": step(lambda: crf(pairs, tags, mask), pairs),
            "struct": step(struct_nll, pairs),
            "tags": step(lambda: crf(emissions, tags, mask), emissions),
        }, args.repeats, device)

        def struct_viterbi():
            with torch.no_grad():
                return torch_struct.LinearChainCRF(edge_potentials(crf, pairs), lengths=lengths).argmax

        viterbi = time_interleaved({
            "pairs": lambda: crf.decode(pairs.detach(), mask),
            "struct": struct_viterbi,
            "tags": lambda: crf.decode(emissions.detach(), mask),
        }, args.repeats, device)
        size = f"{batch}x{seq_len}x{num_tags}"
        for label, times in (("NLL fwd+bwd", nll), ("Viterbi", viterbi)):
            print(f"| {size} | {label} | {times['pairs']:.2f} | {times['struct']:.2f} | "
                  f"{times['pairs'] / times['struct']:.2f} | {times['tags']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

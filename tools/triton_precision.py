"""Precision of the Triton backend on one long sequence against the float64 torch engine.

Random float32 potentials (some -inf transitions), one row of ``--length`` positions: the NLL of
the float64 Viterbi path (triton log Z minus its float64 path score) and the gradients of log Z
for start, transitions, end and emissions, compared with the torch engine in float64. Runs the
compiled kernels on CUDA, or Triton's interpreter on CPU (``--device cpu``; about 20 minutes for
20,000 positions).

    python -m tools.triton_precision --device cuda --length 20000
    TRITON_INTERPRET=1 python -m tools.triton_precision --device cpu --length 20000 --tags 9
"""

from __future__ import annotations

import argparse
import time

import torch

from neurocrf.structs.engine import triton as backend
from neurocrf.structs.engine.chain import Chain, path_score


def potentials(length: int, tags: int, order: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (tags,) * order
    start, end = (torch.randn(shape, generator=generator) for _ in range(2))
    moves = torch.randn(shape + (tags,), generator=generator)
    moves = moves.masked_fill(torch.rand(moves.shape, generator=generator) < 0.1, float("-inf"))
    emissions = torch.randn((1, length) + shape, generator=generator) * 3
    return [start, moves, end, emissions]


def gradients(fn, inputs: list[torch.Tensor], lengths: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    log_z = fn(*leaves, lengths)
    log_z.sum().backward()
    return log_z.detach(), [x.grad for x in leaves]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--length", type=int, default=20000)
    parser.add_argument("--tags", type=int, default=9)
    parser.add_argument("--order", type=int, default=1, choices=(1, 2))
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args()
    begin = time.perf_counter()
    inputs = [x.to(args.device) for x in potentials(args.length, args.tags, args.order, args.seed)]
    lengths = torch.tensor([args.length], device=args.device)
    wide = [x.double() for x in inputs]
    gold = Chain(*wide, lengths).viterbi()[0].clamp(min=0)
    nll = backend.log_partition(*inputs, lengths).double() - backend.path_score(*inputs, gold, lengths).double()
    reference = Chain(*wide, lengths).log_partition() - path_score(*wide, gold, lengths)
    _, grads = gradients(backend.log_partition, inputs, lengths)
    _, ref_grads = gradients(lambda *x: Chain(*x, scan="sequential").log_partition(), wide, lengths)
    errors = [float((got.double() - ref).abs().max()) / max(1.0, float(ref.abs().max()))
              for got, ref in zip(grads, ref_grads)]
    print(f"T={args.length} C={args.tags} order={args.order} float32 on {args.device}: NLL {float(reference[0]):.3f}, "
          f"relative error {float(((nll - reference) / reference).abs()[0]):.1e}; gradient error (max abs, relative "
          f"to max(1, max |gradient|)): start {errors[0]:.1e}, transitions {errors[1]:.1e}, end {errors[2]:.1e}, "
          f"emissions {errors[3]:.1e}; {time.perf_counter() - begin:.0f} s")


if __name__ == "__main__":
    main()

"""Registers and spills of the Triton kernels, compiled for real GPU targets without a GPU.

Compiles every kernel of :mod:`neurocrf.structs.engine.triton.kernels` for each target and a few
state-space sizes (with the block sizes and warps the backend would launch) and prints a markdown
table of registers per thread and spill bytes (the thread's stack frame and local arrays in local
memory: cuobjdump's STACK + LOCAL), read from the cubin with ``cuobjdump -res-usage`` from Triton's
NVIDIA backend. State spaces past the single-tile limit
(:data:`~neurocrf.structs.engine.triton.runtime.MAX_TILE`) compile the blocked kernels the backend
launches for them (the ``kernel`` column names the function).

    python -m tools.triton_resources                       # sm_80 and sm_90, the default sizes
    python -m tools.triton_resources --arch 90 --sizes 9,17 --out resources.md
"""

from __future__ import annotations

import argparse
import platform
import time

import triton

from neurocrf.structs.engine.triton import runtime
from tools.triton_compiling import KERNELS, Case, compile_kernel, resource_usage

# (C, order, k): first-order tag sets, the precursor's expanded states, pair states; k for search.
# From (18, 2, 1) on the blocked kernels: pair states of 17 and 33 tags, 200 states, k = 16 at 33
DEFAULT_CASES = [(9, 1, 1), (17, 1, 1), (33, 1, 1), (9, 1, 5), (17, 1, 16), (10, 2, 1), (6, 2, 5), (18, 2, 1),
                 (34, 2, 1), (200, 1, 1), (33, 1, 16), (34, 2, 16)]


def cases(sizes: list[tuple[int, int, int]]) -> list[Case]:
    out = []
    for size, order, k in sizes:
        for kernel in KERNELS:
            if (kernel == "search_kernel") != (k > 1) and k > 1:
                continue  # k > 1 rows only time the search kernel
            out.append(Case(kernel, size, order, k))
            if kernel != "search_kernel" and k == 1 and order == 1 and size == 9:
                out.append(Case(kernel, size, order, k, per_position=True))
            if kernel == "backward_kernel" and runtime.plan(kernel, size, order)[0] != kernel:
                out.append(Case(kernel, size, order, k, dtype="float64", emissions="float64"))  # smaller blocks
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="80,90", help="compute capabilities, comma-separated")
    parser.add_argument("--sizes", help="C:order:k triples, comma-separated (default: a fixed set)")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    sizes = DEFAULT_CASES if not args.sizes else [
        tuple(int(v) for v in (item.split(":") + ["1", "1"])[:3]) for item in args.sizes.split(",")]
    lines = [f"triton {triton.__version__}, python {platform.python_version()}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| kernel | C | order | k | transitions | dtype | warps | target | registers | spill B | shared B |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for case in cases(sizes):
        for arch in (int(a) for a in args.arch.split(",")):
            compiled = compile_kernel(case, arch)
            usage = resource_usage(compiled.asm["cubin"])
            k = case.k if case.kernel == "search_kernel" else "-"
            line = (f"| {case.plan()[0]} | {case.size} | {case.order} | {k}"
                    f" | {'per position' if case.per_position else 'shared'} | {case.dtype}"
                    f" | {case.num_warps()} | sm_{arch}"
                    f" | {usage['registers']} | {usage['spill_bytes']} | {usage['shared_bytes']} |")
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

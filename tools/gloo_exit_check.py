"""Does a gloo process group left open at exit abort its process? Bare torch, no Lightning.

Spawns 2 processes N times; each initialises a gloo group, runs an all-gather and an all-reduce and
exits, destroying the group first or not. Prints how many spawns passed and failed (a failure is a
worker that died, e.g. SIGABRT with "terminate called without an active exception").

    python -m tools.gloo_exit_check --runs 40              # the group left open, as Lightning leaves it
    python -m tools.gloo_exit_check --runs 40 --destroy    # destroyed before the interpreter exits
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def worker(rank: int, port: int, destroy: bool) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    gathered: list[object] = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})
    dist.all_reduce(torch.ones(3))
    if destroy:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--destroy", action="store_true", help="destroy the group before exiting")
    args = parser.parse_args()
    failed = 0
    for _ in range(args.runs):
        try:
            mp.spawn(worker, args=(free_port(), args.destroy), nprocs=2)
        except mp.ProcessExitedException as error:
            failed += 1
            print(f"worker died: {error}", flush=True)
    print(f"destroy={args.destroy}: {args.runs - failed} passed, {failed} failed")


if __name__ == "__main__":
    main()

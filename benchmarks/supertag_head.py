"""Cost of the factored supertag head and of the EMA weight update, against a plain head, in one run.

    python -m benchmarks.supertag_head --threads 1
    python -m benchmarks.supertag_head --threads 1 --supertags /path/train.supertags  # real inventory

Times, interleaved over rounds (medians): forward + cross-entropy + backward of the supertag head
on a batch of hidden states ``[batch, seq_len, 400]`` (the Alpino BiLSTM's output), plain
(``nn.Linear``) vs factored (all six parts), and one :class:`EMAWeights` update over parameters of
the size of the whole Alpino supertagger. Without ``--supertags`` the inventory is synthetic
(2,421 tags from 110 labels and 8 compositions, the size of Alpino's training inventory).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from neurocrf.models.callbacks import EMAWeights
from neurocrf.supertagging.heads import FACTORS, build_supertag_head


def synthetic_supertags(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    labels = [f"L{i}" for i in range(110)]
    compositions = ["t", "x0t", "ty0", "x0ty0", "tx0", "t,y0", "x0t,y0", "x0,ty0"]
    tags: set[str] = set()
    while len(tags) < count:
        comp = rng.choice(compositions)
        first = rng.choice(labels) if "x" in comp else "-"
        second = rng.choice(labels) if "y" in comp else "-"
        tags.add(f"{rng.choice(labels)}{rng.choice(['', '|<>'])} {rng.choice('12')} {comp} {first} {second}")
    return sorted(tags)


def read_supertags(path: Path) -> list[str]:
    tags = {line.split("\t")[1] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    return sorted(tags)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=25)
    ap.add_argument("--hidden", type=int, default=400)
    ap.add_argument("--supertags", type=Path, default=None, help="a supertag corpus file (train split)")
    ap.add_argument("--ema-parameters", type=int, default=4_581_090,
                    help="parameters averaged per update (the Alpino supertagger's)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    supertags = read_supertags(args.supertags) if args.supertags else synthetic_supertags(2421)
    heads = {"plain": build_supertag_head(args.hidden, supertags, []),
             "factored": build_supertag_head(args.hidden, supertags, list(FACTORS)[:6])}
    hidden = torch.randn(args.batch, args.seq_len, args.hidden, requires_grad=True)
    gold = torch.randint(len(supertags), (args.batch * args.seq_len,))

    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(torch.randn(args.ema_parameters))
    ema = EMAWeights(0.999)
    ema.average = {"weight": module.weight.detach().clone()}

    def step(head: torch.nn.Module) -> None:
        scores = head(hidden)
        F.cross_entropy(scores.reshape(-1, scores.shape[-1]), gold).backward()
        head.zero_grad(set_to_none=True)
        hidden.grad = None

    def ema_update() -> None:
        ema.on_train_batch_end(None, module, None, None, 0)  # type: ignore[arg-type]

    jobs = {"plain": lambda: step(heads["plain"]), "factored": lambda: step(heads["factored"]),
            "ema update": ema_update}
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for name, job in jobs.items():  # warm-up
        job()
    for _ in range(args.rounds):
        for name, job in jobs.items():
            start = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) * 1000 for name, values in times.items()}
    print(f"{len(supertags)} supertags, hidden [{args.batch}, {args.seq_len}, {args.hidden}], "
          f"{args.threads} thread(s), {args.rounds} interleaved rounds, medians")
    print("| what | ms | ratio to the plain head step |")
    print("|---|---:|---:|")
    for name in jobs:
        print(f"| {name} | {median[name]:.2f} | {median[name] / median['plain']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

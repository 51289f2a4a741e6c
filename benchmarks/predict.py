"""Prediction throughput and memory of ``neurocrf-predict``'s path (:mod:`neurocrf.inference`) at
corpus scale: sentences/s, tokens/s and peak RSS per input size.

Input: text files of N sentences (one per line), the generated sample corpus (its sentence
generator, 50,000 distinct sentences repeated), written once into ``--cache``. Each (size,
configuration) runs in a fresh subprocess that loads the checkpoint and runs
:meth:`neurocrf.inference.run.FilePrediction.run` from the text file to a CoNLL (or JSON lines)
file; timed: the whole run (reading, batching, model, writing, the final rename), not the model
loading. Peak RSS: the subprocess's ``ru_maxrss`` (model, interpreter and libraries included).
CPU seconds: the subprocess's CPU time over the same run (on a shared machine, wall time counts
the waits for a core; with one thread, CPU time is what the run would take on a quiet one).

    # the BiLSTM-char sample model (1 epoch of neurocrf-train), CPU, 1 thread, confidences off
    python -m benchmarks.predict --ckpt logs/.../last.ckpt --sizes 1000 10000 100000 --threads 1
    python -m benchmarks.predict --ckpt ... --sizes 10000 --threads 2 --confidence
    python -m benchmarks.predict --ckpt ... --sizes 10000 --profile      # where the time goes
    python -m benchmarks.predict --train-sample logs/bench_model         # make the sample model
    python -m benchmarks.predict --ckpt ... --text dev.txt --precision bf16  # a text file of your own

Prints one JSON line per run and a markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, module_command, module_env


def write_input(path: Path, sentences: int, seed: int = 13) -> Path:
    """``sentences`` lines of the sample corpus's generated sentences (50,000 distinct, repeated)."""
    if path.exists():
        return path
    from neurocrf.data.sample import generate_sample_corpus

    distinct = [" ".join(s.tokens) for s in generate_sample_corpus(seed, {"bench": min(sentences, 50_000)})["bench"]]
    temp = path.with_suffix(".tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        for i in range(sentences):
            handle.write(distinct[i % len(distinct)] + "\n")
    temp.replace(path)
    return path


def child(args: argparse.Namespace) -> None:
    """One run in this process; prints its JSON record."""
    import torch

    torch.set_num_threads(args.threads)
    from neurocrf.inference.run import FilePrediction
    from neurocrf.models.predict_options import PredictOptions
    from neurocrf.models.tagger import Tagger

    model = Tagger.load(args.ckpt, map_location="cpu").to(args.device)
    output = Path(args.output)
    options = PredictOptions(batch_size=args.batch_size, max_tokens=args.max_tokens, window=args.window,
                             nbest=args.nbest, precision=args.precision)
    job = FilePrediction(args.input, output, input_format="text", output_format=args.format,
                         confidence=args.confidence, options=options)
    loaded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu_start = time.process_time()
    start = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        summary = profiler.runcall(job.run, model, progress=False)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(35)
    else:
        summary = job.run(model, progress=False)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    output.unlink()
    print(json.dumps({
        "sentences": summary["sentences"], "tokens": summary["tokens"], "seconds": round(seconds, 2),
        "sentences_per_s": round(summary["sentences"] / seconds), "tokens_per_s": round(summary["tokens"] / seconds),
        "cpu_seconds": round(cpu_seconds, 2), "tokens_per_cpu_s": round(summary["tokens"] / cpu_seconds),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_after_load_mb": round(loaded_rss), "threads": args.threads, "confidence": args.confidence,
        "format": args.format, "nbest": args.nbest, "batch_size": args.batch_size, "max_tokens": args.max_tokens,
        "window": args.window, "precision": args.precision, "device": args.device,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", help="a tagger checkpoint")
    parser.add_argument("--train-sample", metavar="DIR", help="train the BiLSTM-char sample model (1 epoch) into DIR")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--text", type=Path, nargs="+", metavar="FILE",
                        help="text files (a whitespace-tokenised sentence per line) instead of --sizes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--confidence", action="store_true", help="token and span confidences (marginals) too")
    parser.add_argument("--format", default="conll", choices=["conll", "jsonl"], help="jsonl implies confidences")
    parser.add_argument("--nbest", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--precision", default="32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=ROOT / "logs" / "bench_predict")
    parser.add_argument("--profile", action="store_true", help="cProfile of the run on stderr")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.train_sample:
        subprocess.run([sys.executable, "-m", "neurocrf.cli.train", "trainer.max_epochs=1", "test=false", "~logger",
                        f"hydra.run.dir={args.train_sample}"], check=True, cwd=ROOT)
        print(f"checkpoint: {Path(args.train_sample) / 'checkpoints' / 'last.ckpt'}")
        return
    if not args.ckpt:
        parser.error("--ckpt (or --train-sample) is required")
    args.cache.mkdir(parents=True, exist_ok=True)
    env = module_env(OMP_NUM_THREADS=str(args.threads))
    forwarded = ["--ckpt", args.ckpt, "--threads", str(args.threads), "--format", args.format, "--nbest",
                 str(args.nbest), "--batch-size", str(args.batch_size), "--window", str(args.window), "--precision",
                 args.precision, "--device", args.device, *(["--confidence"] if args.confidence else []),
                 *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
                 *(["--profile"] if args.profile else [])]
    records: list[dict[str, Any]] = []
    sources = args.text or [write_input(args.cache / f"sample_{size}.txt", size) for size in args.sizes]
    for source in sources:
        output = args.cache / f"out_{source.stem}_{os.getpid()}.{args.format}"
        command = module_command("benchmarks.predict", "--child", "--input", str(source), "--output", str(output),
                                 *forwarded)
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"run on {source} failed:\n{done.stderr[-4000:]}")
        if args.profile:
            print(done.stderr, file=sys.stderr)
        record = {**json.loads(done.stdout.strip().splitlines()[-1]), "input": source.name}
        records.append(record)
        print(json.dumps(record), flush=True)
    print(f"\n{platform.processor() or platform.machine()}, torch threads {args.threads},"
          f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| sentences | tokens | seconds | sentences/s | tokens/s | CPU seconds | tokens per CPU second |"
          " peak RSS (MB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in records:
        print(f"| {r['sentences']:,} | {r['tokens']:,} | {r['seconds']} | {r['sentences_per_s']:,} |"
              f" {r['tokens_per_s']:,} | {r['cpu_seconds']} | {r['tokens_per_cpu_s']:,} | {r['peak_rss_mb']:,} |")


if __name__ == "__main__":
    main()

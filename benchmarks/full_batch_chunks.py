"""Seconds and peak memory of one whole-set objective + gradient of a feature CRF, by chunk size.

Full-batch L-BFGS (``optimizer.name=lbfgs``) evaluates the summed NLL of the whole training set
in chunks of at most ``optimizer.chunk_tokens`` padded tokens (:func:`length_sorted_chunks`).
This script times one forward + backward pass over the first ``--sentences`` training sentences
of an experiment for several chunk sizes, each in a fresh process (so that its peak resident
memory is its own), and prints a markdown table::

    python -m benchmarks.full_batch_chunks --experiment chunking_conll2000_features \\
        --overrides crf=second_order --sentences 1500 --chunk-tokens 20000 5000 1500 --threads 1

Reads the corpus from ``$NEUROCRF_DATA`` (default ``../shared/data``), like the experiment.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import tempfile
import time

from benchmarks.common import module_command, module_env


def measure(experiment: str, overrides: list[str], sentences: int, chunk_tokens: int, repeat: int) -> dict:
    """One process's measurement (run by :func:`main` in a child process)."""
    import hydra
    import torch

    from neurocrf.cli.utils import compose_task_config
    from neurocrf.models.building import build_tagger
    from neurocrf.models.full_batch import length_sorted_chunks

    with tempfile.TemporaryDirectory() as out:
        cfg = compose_task_config("train", out, [f"experiment={experiment}", *overrides])
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.setup("fit")
    model = build_tagger(cfg, datamodule)
    if str(cfg.trainer.get("precision")) == "64-true":
        model = model.double()
    datamodule.set_input_builder(model.encoder.preparer)
    loader = datamodule.train_dataloader()
    dataset, collate = loader.dataset, loader.collate_fn
    count = min(sentences, len(dataset))
    groups = length_sorted_chunks([dataset.lengths[i] for i in range(count)], chunk_tokens)
    batches = [collate([dataset[i] for i in group]) for group in groups]
    for param in model.parameters():  # dense gradients that sparse feature gradients add into
        param.grad = torch.zeros_like(param)
    if hasattr(model.encoder, "sparse_gradients"):
        model.encoder.sparse_gradients = True

    def objective_and_gradient() -> None:
        for batch in batches:
            loss = model.head(model._emissions(batch), batch["tags"], batch["mask"], reduction="sum")
            loss.backward()

    objective_and_gradient()  # warm-up
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        objective_and_gradient()
        seconds.append(time.perf_counter() - start)
    return {
        "chunk_tokens": chunk_tokens,
        "chunks": len(batches),
        "tokens": sum(int(b["mask"].sum()) for b in batches),
        "seconds": min(seconds),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "tags": len(model.tags),
        "crf": type(model.head).__name__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", default="chunking_conll2000_features")
    ap.add_argument("--overrides", nargs="*", default=[], help="Hydra overrides, e.g. crf=second_order")
    ap.add_argument("--sentences", type=int, default=1500, help="the first N training sentences")
    ap.add_argument("--chunk-tokens", type=int, nargs="+", default=[20000, 5000, 1500])
    ap.add_argument("--repeat", type=int, default=2, help="timed passes per size (the minimum is kept)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # child process: one size
    args = ap.parse_args()

    if args.one is not None:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.experiment, args.overrides, args.sentences, args.one, args.repeat)))
        return
    rows = []
    for size in args.chunk_tokens:
        command = module_command("benchmarks.full_batch_chunks", "--experiment", args.experiment, "--sentences",
                                 str(args.sentences), "--repeat", str(args.repeat), "--threads", str(args.threads),
                                 "--one", str(size), "--overrides", *args.overrides)
        done = subprocess.run(command, env=module_env(), capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first = rows[0]
    print(f"{first['crf']}, {first['tags']} tags, {first['tokens']} tokens, {args.threads} thread(s); "
          f"experiment={args.experiment} {' '.join(args.overrides)}\n")
    print("| chunk tokens | chunks | s per objective + gradient | peak RSS (GB) |")
    print("|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['chunk_tokens']} | {row['chunks']} | {row['seconds']:.2f} | {row['peak_rss_gb']:.2f} |")


if __name__ == "__main__":
    main()

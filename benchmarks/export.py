"""Time of one Viterbi decode: eager ``crf.decode``, the exportable ``crf.decoder()`` in eager
mode, its ``torch.export`` program, and its ONNX model in onnxruntime, in one process.

Every contender runs once per round, in rotating order, for ``--repeats`` rounds; the table gives
medians in milliseconds and each one's ratio to ``crf.decode`` (same rounds). Random masks with
holes; one thread for torch and for onnxruntime by default.

    python -m benchmarks.export --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from benchmarks.common import iob2_tags
from neurocrf.structs import build_crf
from neurocrf.structs.export import dynamic_shapes

SIZES = [(32, 40, 9), (32, 40, 17), (8, 256, 9)]


def contenders(kind: str, num_tags: int, threads: int, folder: Path) -> dict[str, Callable]:
    import onnxruntime

    crf = build_crf(kind, iob2_tags(num_tags), "IOB2")
    example = torch.randn(3, 6, num_tags), torch.rand(3, 6) < 0.8
    program = torch.export.export(crf.decoder(), example, dynamic_shapes=dynamic_shapes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(program, dynamo=True, output_names=["tags"], verbose=False).save(str(folder / "d.onnx"))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(folder / "d.onnx"), options, providers=["CPUExecutionProvider"])
    module = program.module()
    return {
        "crf.decode": crf.decode,
        "decoder (eager)": crf.decoder(),
        "torch.export": module,
        "onnxruntime": lambda e, m: session.run(None, {"emissions": e.numpy(), "mask": m.numpy()})[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} rounds,"
          " median ms (ratio to crf.decode)")
    print("| layer | B x T x L | " + " | ".join(["crf.decode", "decoder (eager)", "torch.export",
                                                 "onnxruntime"]) + " |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for kind in ("first_order", "second_order"):
            for batch, seq_len, num_tags in SIZES:
                runs = contenders(kind, num_tags, args.threads, Path(folder))
                emissions = torch.randn(batch, seq_len, num_tags)
                mask = torch.rand(batch, seq_len) < 0.9
                expected = runs["crf.decode"](emissions, mask)
                times: dict[str, list[float]] = {name: [] for name in runs}
                names = list(runs)
                for round_ in range(args.repeats + 2):
                    for name in names[round_ % len(names):] + names[: round_ % len(names)]:
                        start = time.perf_counter()
                        out = runs[name](emissions, mask)
                        if round_ >= 2:  # warm-up rounds not counted
                            times[name].append(time.perf_counter() - start)
                        assert torch.equal(torch.as_tensor(out), expected), name
                median = {name: statistics.median(values) * 1e3 for name, values in times.items()}
                cells = [f"{median[name]:.2f} ({median[name] / median['crf.decode']:.2f})" for name in names]
                print(f"| {kind} | {batch}x{seq_len}x{num_tags} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

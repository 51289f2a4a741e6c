"""Time exact span confidences on one very long sentence (``build_predictions``), per CRF layer.

    python -m benchmarks.span_confidences --length 5000 --threads 1

Random emissions (scale 3) over BIOES tags of four types give a few thousand predicted spans; the
time covers Viterbi, marginals and every span's confidence, as ``Tagger.predict`` computes them.
"""

from __future__ import annotations

import argparse
import time

import torch

from neurocrf.data.schemes import all_tags
from neurocrf.models.prediction import build_predictions
from neurocrf.structs import CRF_KINDS, build_crf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tags = all_tags(["PER", "LOC", "ORG", "MISC"], "BIOES")
    print(f"| CRF | tokens | spans | seconds ({args.threads} thread) |\n|---|---:|---:|---:|")
    for kind in CRF_KINDS:
        torch.manual_seed(args.seed)
        head = build_crf(kind, tags, "BIOES")
        emissions = torch.randn(1, args.length, len(tags)) * 3
        mask = torch.ones(1, args.length, dtype=torch.bool)
        began = time.perf_counter()
        (prediction,) = build_predictions(head, emissions, mask, [["w"] * args.length], tags, "BIOES")
        seconds = time.perf_counter() - began
        assert len(prediction.tags) == args.length
        print(f"| {kind} | {args.length} | {len(prediction.spans)} | {seconds:.2f} |")


if __name__ == "__main__":
    main()

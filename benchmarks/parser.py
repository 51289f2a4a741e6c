"""Speed of the LCFRS parser on gold supertags plus distractors, one table row per setting.

    python -m benchmarks.parser                                   # Alpino test split, k = 10
    python -m benchmarks.parser --treebank trees.export --split all --k 5 --noise frequency

Reads the treebank (``--treebank``, default ``$NEUROCRF_DATA/alpino/cdb``), moves punctuation into
the trees, splits it by sentence id (:func:`neurocrf.parsing.treebank.split_treebank`) and, for
each ``--noise`` and for the gold tag given the best or a random rank, parses ``--split`` from
each token's gold supertag plus ``k - 1`` distractors (:func:`benchmark_parser`). Prints a
markdown table: sentences/s (extraction not timed), fallbacks, and gold trees recovered.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neurocrf.parsing import move_punctuation_sentence, prepare_tree, restore_tree
from neurocrf.parsing.parser import Parser
from neurocrf.parsing.supertags import extract_supertags
from neurocrf.parsing.tree import TreebankSentence
from neurocrf.parsing.treebank import data_root, read_treebank, select_split, split_treebank

NOISE = ("frequency", "same_pos")


def benchmark_parser(sentences: Sequence[TreebankSentence], k: int = 10, *, seed: int = 0,
                     gold_best: bool = True, noise: str = "frequency",
                     time_limit: float | None = 5.0, h: int = 0, v: int = 1) -> dict[str, Any]:
    """Parse ``sentences`` from gold supertags plus ``k - 1`` noise tags per token; measure speed.

    Noise tags are drawn from the supertags of ``sentences`` by frequency (``noise="frequency"``)
    or, closer to a tagger's confusions, from the supertags seen with the token's gold
    preterminal (``noise="same_pos"``; by frequency, topped up from all tags). Probabilities: with
    ``gold_best`` the gold tag gets the largest share of a random distribution over the ``k``
    candidates (so the best derivation is the gold one); otherwise the gold tag sits at a random
    rank (the parse may differ from gold, and search does more work). Extraction time is not
    timed. Returns sentences, tokens, k, gold_best, noise, seconds, sentences_per_second,
    fallbacks, exact (parses equal to the restored gold tree), mean_items, max_seconds.
    """
    if noise not in NOISE:
        raise ValueError(f"noise must be one of {NOISE}, got {noise!r}")
    rng = random.Random(seed)
    gold = [extract_supertags(s, h=h, v=v) for s in sentences]
    counts = Counter(t for sent in gold for t in sent.tags)
    vocab, freq = zip(*counts.items())
    by_pos: dict[str, Counter[str]] = {}
    for sent in gold:
        for tag, pt in zip(sent.tags, sent.preterminals):
            by_pos.setdefault(pt, Counter())[tag] += 1
    parser = Parser({sent.root for sent in gold}, k=k, time_limit=time_limit)
    inputs = []
    for sent, tags in zip(sentences, gold):
        cands = []
        for tag, pt in zip(tags.tags, tags.preterminals):
            distractors: set[str] = set()
            if noise == "same_pos":
                same = [t for t in by_pos[pt] if t != tag]
                if len(same) <= k - 1:
                    distractors.update(same)
                else:
                    weights = [by_pos[pt][t] for t in same]
                    while len(distractors) < k - 1:
                        distractors.add(rng.choices(same, weights)[0])
            while len(distractors) < min(k - 1, len(vocab) - 1):
                cand = rng.choices(vocab, freq)[0]
                if cand != tag:
                    distractors.add(cand)
            probs = sorted((rng.random() for _ in range(len(distractors) + 1)), reverse=True)
            total = sum(probs)
            order = [tag, *sorted(distractors)]
            if not gold_best:
                rng.shuffle(order)
            cands.append([(t, -math.log(p / total)) for t, p in zip(order, probs)])
        inputs.append((sent.words, cands, tags.preterminals))
    start = time.perf_counter()
    results = [parser.parse(*inp) for inp in inputs]
    seconds = time.perf_counter() - start
    exact = sum(r.tree == restore_tree(prepare_tree(s.tree, h=h, v=v)) for r, s in zip(results, sentences))
    return {
        "sentences": len(sentences),
        "tokens": sum(len(s.words) for s in sentences),
        "k": k,
        "gold_best": gold_best,
        "noise": noise,
        "seconds": seconds,
        "sentences_per_second": len(sentences) / seconds if seconds else math.inf,
        "fallbacks": sum(r.fallback for r in results),
        "exact": exact,
        "mean_items": sum(r.items for r in results) / max(len(results), 1),
        "max_seconds": max((r.seconds for r in results), default=0.0),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--treebank", default=None, help="treebank file or Alpino folder (default: Alpino cdb)")
    ap.add_argument("--format", default=None, help="treebank format (default: guessed from the path)")
    ap.add_argument("--split", default="test", help="train, dev, test or all")
    ap.add_argument("--k", type=int, default=10, help="candidates per token: gold + k - 1 distractors")
    ap.add_argument("--noise", nargs="+", choices=NOISE, default=list(NOISE))
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds per sentence")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    path = Path(args.treebank) if args.treebank else data_root() / "alpino" / "cdb"
    sentences = [move_punctuation_sentence(s) for s in read_treebank(path, args.format)]
    sentences = select_split(split_treebank(sentences), args.split)
    print(f"{path}, {args.split} split: {len(sentences)} sentences, "
          f"{sum(len(s.words) for s in sentences) / max(len(sentences), 1):.1f} tokens on average, k = {args.k}")
    print("| distractors | gold tag | sentences/s | fallbacks | gold tree recovered |")
    print("|---|---|---:|---:|---:|")
    rows = []
    for noise in args.noise:
        for gold_best in (True, False):
            row = benchmark_parser(sentences, args.k, seed=args.seed, gold_best=gold_best, noise=noise,
                                   time_limit=args.time_limit)
            rows.append(row)
            print(f"| {args.k - 1} by {noise} | {'best' if gold_best else 'random rank'} | "
                  f"{row['sentences_per_second']:,.0f} | {row['fallbacks']} | {row['exact']} |", flush=True)
    return rows


if __name__ == "__main__":
    main()

"""Choose a supertagger ensemble and k on dev from saved tag files, then score the choice on test.

    python -m reproductions.select_ensemble --treebank alpino --k 10 20 --out ensemble.md \\
        --member seed1 seed1.dev.jsonl.gz seed1.test.jsonl.gz \\
        --member seed2 seed2.dev.jsonl.gz seed2.test.jsonl.gz ...

Tag files come from ``neurocrf-parse ckpt_path=<ckpt> treebank=<name> split=dev save_tags=<file>``
(the same for test): each model is run once per split, every ensemble below only parses. Steps,
all on dev: every member alone and all members together at each ``--k``; then greedy forward
selection (start from the best single member, add the member that raises dev F1 most, stop when
none does; each step at the best of the ``--k``). Test is parsed once per reported row: each
member alone at the first ``--k``, all members at the ``--k`` best on dev (ties: the first), and
the greedy choice at its k. Parsing is the paper's setting (``fallback_k`` off); per-sentence
``--time-limit`` as in ``neurocrf-parse``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from neurocrf.cli.utils import compose_task_config
from neurocrf.parsing.treebank import load_split
from neurocrf.supertagging.pipeline import gold_tags, summarize, tag_and_parse
from neurocrf.supertagging.saved_tags import SavedSupertags
from neurocrf.values import to_plain


class Split:
    """Gold trees and gold supertags of one split, and a cache of parsed configurations."""

    def __init__(self, treebank: dict, name: str) -> None:
        self.name = name
        self.gold = load_split(treebank, name)
        self.ids = [s.id for s in self.gold]
        self.words = [s.words for s in self.gold]
        self.scores: dict[tuple[tuple[str, ...], int], dict] = {}

    def score(self, files: dict[str, str], members: tuple[str, ...], k: int, time_limit: float) -> dict:
        key = (tuple(sorted(members)), k)
        if key not in self.scores:
            tagger = SavedSupertags.read([files[m] for m in key[0]])
            run = tag_and_parse(tagger, self.ids, self.words, k=k, time_limit=time_limit)
            supertags, preterminals = gold_tags(self.gold, tagger.transform)
            self.scores[key] = summarize(run, self.gold, gold_supertags=supertags, gold_preterminals=preterminals)
        return self.scores[key]


def best_k(dev: Split, files: dict[str, str], members: tuple[str, ...], ks: list[int],
           time_limit: float) -> tuple[float, int, tuple[str, ...]]:
    """Dev F1 of ``members`` at the k of ``ks`` that gives the best, that k and the members (ties:
    the k given first)."""
    return max(((dev.score(files, members, k, time_limit)["f1"], k, members) for k in ks), key=lambda t: t[0])


def greedy(dev: Split, files: dict[str, str], ks: list[int], time_limit: float) -> tuple[tuple[str, ...], int, float]:
    """Forward selection on dev F1: the chosen members, their k and dev F1 (ties go to the member
    and the k given first)."""
    def best(members: tuple[str, ...]) -> tuple[float, int, tuple[str, ...]]:
        return best_k(dev, files, members, ks, time_limit)

    f1, k, chosen = max((best((name,)) for name in files), key=lambda t: t[0])
    while len(chosen) < len(files):
        new_f1, new_k, members = max((best(chosen + (name,)) for name in files if name not in chosen),
                                     key=lambda t: t[0])
        if new_f1 <= f1:
            break
        f1, k, chosen = new_f1, new_k, members
        print(f"  greedy: {' + '.join(chosen)} k={k} dev F1 {100 * f1:.2f}", flush=True)
    return chosen, k, f1


def row(label: str, dev: dict | None, test: dict | None, k: int) -> str:
    def cell(report: dict | None, key: str) -> str:
        return f"{100 * report[key]:.2f}" if report else "-"
    return (f"| {label} | {k} | {cell(dev, 'f1')} | {cell(test, 'f1')} | {cell(test, 'dis_f1')} | "
            f"{cell(test, 'coverage')} | {cell(test, 'supertag_accuracy')} | {cell(dev, 'supertag_accuracy')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--member", nargs=3, action="append", required=True, metavar=("NAME", "DEV_TAGS", "TEST_TAGS"))
    ap.add_argument("--treebank", default="alpino", help="treebank config name (configs/treebank/)")
    ap.add_argument("--data-dir", default=None, help="paths.data_dir (default: $NEUROCRF_DATA or ../shared/data)")
    ap.add_argument("--k", type=int, nargs="+", default=[10, 20])
    ap.add_argument("--time-limit", type=float, default=5.0)
    ap.add_argument("--out", required=True, help="markdown file for the table")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    cfg = compose_task_config("parse", Path(args.out).resolve().parent / "select_ensemble_run",
                              [f"treebank={args.treebank}"], args.data_dir)
    treebank = to_plain(cfg.treebank)
    dev, test = Split(treebank, "dev"), Split(treebank, "test")
    dev_files = {name: dev_file for name, dev_file, _ in args.member}
    test_files = {name: test_file for name, _, test_file in args.member}
    names = tuple(dev_files)
    first_k = args.k[0]

    lines = ["| supertagger(s) | k | dev F1 | test F1 | test Dis-F1 | test coverage | test supertag acc"
             " | dev supertag acc |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        lines.append(row(name, dev.score(dev_files, (name,), first_k, args.time_limit),
                         test.score(test_files, (name,), first_k, args.time_limit), first_k))
    if len(names) > 1:
        _, all_k, _ = best_k(dev, dev_files, names, args.k, args.time_limit)
        for k in args.k:
            test_report = test.score(test_files, names, k, args.time_limit) if k == all_k else None
            lines.append(row(f"all {len(names)}", dev.score(dev_files, names, k, args.time_limit), test_report, k))
    chosen, k, _ = greedy(dev, dev_files, args.k, args.time_limit)
    lines.append(row(f"**chosen on dev: {' + '.join(chosen)}**", dev.score(dev_files, chosen, k, args.time_limit),
                     test.score(test_files, chosen, k, args.time_limit), k))
    table = "\n".join(lines) + "\n"
    command = "python -m reproductions.select_ensemble " + " ".join(sys.argv[1:] if argv is None else argv)
    text = f"{table}\n{command}\n({(time.perf_counter() - started) / 60:.1f} minutes)\n"
    print(text)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

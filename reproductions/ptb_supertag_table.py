"""Results table of the Penn Treebank supertagger runs (``reproductions/ptb_supertag_runs.sh``).

    python -m reproductions.ptb_supertag_table --runs <RUNS_DIR>

Reads ``<RUNS_DIR>/<encoder>_seed<N>/parse_{dev,test}_report.json`` (written when a run has
parsed its dev and test splits with its best checkpoint) and prints a markdown table: one row per
finished run (dev F1, test F1, Dis-F1, coverage, supertag accuracy, sentences/s of tagging +
parsing, parsing alone), then per encoder the mean ± sample standard deviation over the finished
seeds (n; sd ``-`` for one seed), and the runs not finished yet.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

_RUN = re.compile(r"^(?P<encoder>.+)_seed(?P<seed>\d+)$")
COLUMNS = (("dev", "f1", "dev F1"), ("test", "f1", "test F1"), ("test", "dis_f1", "test Dis-F1"),
           ("test", "coverage", "coverage"), ("test", "supertag_accuracy", "supertag acc"),
           ("test", "sentences_per_second", "sent/s"), ("test", "parsing_sentences_per_second", "parse sent/s"))


def collect(runs: Path) -> tuple[dict[str, list[tuple[int, dict[str, Any]]]], list[str]]:
    """Finished runs per encoder as ``(seed, {split: report})``, and the unfinished run folders."""
    done: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    pending = []
    for folder in sorted(p for p in runs.iterdir() if p.is_dir() and _RUN.match(p.name)):
        match = _RUN.match(folder.name)
        assert match is not None
        reports = {split: folder / f"parse_{split}_report.json" for split in ("dev", "test")}
        if not all(path.is_file() for path in reports.values()):
            pending.append(folder.name)
            continue
        loaded = {split: json.loads(path.read_text(encoding="utf-8")) for split, path in reports.items()}
        done.setdefault(match["encoder"], []).append((int(match["seed"]), loaded))
    for entries in done.values():
        entries.sort(key=lambda item: item[0])
    return done, pending


def _value(report: dict[str, Any], key: str) -> float:
    value = float(report[key])
    return value if key.endswith("per_second") else 100 * value


def format_table(done: dict[str, list[tuple[int, dict[str, Any]]]], pending: list[str]) -> str:
    header = "| run | " + " | ".join(name for _, _, name in COLUMNS) + " |"
    lines = [header, "|---|" + "---:|" * len(COLUMNS)]
    for encoder, entries in done.items():
        for seed, reports in entries:
            cells = [f"{_value(reports[split], key):.2f}" if not key.endswith("per_second")
                     else f"{_value(reports[split], key):.1f}" for split, key, _ in COLUMNS]
            lines.append(f"| {encoder} seed {seed} | " + " | ".join(cells) + " |")
    for encoder, entries in done.items():
        cells = []
        for split, key, _ in COLUMNS:
            values = [_value(reports[split], key) for _, reports in entries]
            digits = 1 if key.endswith("per_second") else 2
            sd = f"{statistics.stdev(values):.{digits}f}" if len(values) > 1 else "-"
            cells.append(f"{statistics.mean(values):.{digits}f} ± {sd}")
        lines.append(f"| **{encoder}, mean ± sd (n = {len(entries)})** | " + " | ".join(cells) + " |")
    if pending:
        lines.append("")
        lines.append("not finished: " + ", ".join(pending))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, required=True, help="the RUNS_DIR of reproductions/ptb_supertag_runs.sh")
    args = ap.parse_args(argv)
    done, pending = collect(args.runs)
    print(format_table(done, pending), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

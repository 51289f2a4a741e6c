"""Report on a sweep's runs: tables (Markdown and JSON), paired significance tests, a plot.

    neurocrf-report logs/crf_study                       # every corpus of the CRF study grid
    neurocrf-report logs/crf_study/ncbi_disease --output reports/ncbi --baseline first_order

Reads every run directory under the given folder (``summary.json`` and ``test_tags.jsonl``, as
``neurocrf-train`` writes them; folders named ``<kind>-memory-<memory>-seed-<seed>`` without a
summary are reported as missing) and writes ``report.md``, ``report.json`` and
``f1_per_seed.png`` into ``--output`` (default ``<folder>/report``). What the tables hold:
:mod:`neurocrf.study.report`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from neurocrf.study.report import DEFAULT_BASELINE, DEFAULT_RNG_SEED, DEFAULT_SHUFFLES, write_report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="neurocrf-report", description="Tables, significance tests and a plot of a sweep's runs.",
        epilog="exit status: 0 done; 2 a user error (a bad option, a folder without runs), reported in one line",
    )
    parser.add_argument("root", help="a sweep folder (e.g. logs/crf_study) or one corpus's folder in it")
    parser.add_argument("--output", default=None, help="folder for report.md, report.json, f1_per_seed.png"
                        " (default: <root>/report)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"variant every other one is tested against (default: {DEFAULT_BASELINE})")
    parser.add_argument("--shuffles", type=int, default=DEFAULT_SHUFFLES,
                        help=f"approximate randomisation shuffles (default: {DEFAULT_SHUFFLES})")
    parser.add_argument("--rng-seed", type=int, default=DEFAULT_RNG_SEED,
                        help=f"seed of the shuffles (default: {DEFAULT_RNG_SEED})")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.shuffles < 1:
        print("neurocrf-report: error: --shuffles must be >= 1", file=sys.stderr)
        return 2
    try:
        written = write_report(args.root, args.output, baseline=args.baseline, shuffles=args.shuffles,
                               rng_seed=args.rng_seed, plot=not args.no_plot)
    except (OSError, ValueError) as error:
        print(f"neurocrf-report: error: {error}", file=sys.stderr)
        return 2
    print(written["markdown"].read_text(encoding="utf-8"), end="")
    for path in written.values():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

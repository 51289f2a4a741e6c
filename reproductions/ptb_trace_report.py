"""How much discontinuity trace resolution gives a Penn Treebank (docs/results.md, "Penn Treebank
traces as discontinuous constituents").

    python -m reproductions.ptb_trace_report                      # $NEUROCRF_DATA/ptb_sample
    python -m reproductions.ptb_trace_report --path <folder of .mrg files> --json report.json

Reads every ``*.mrg`` file twice, with ``traces="remove"`` and ``traces="resolve"``
(:mod:`neurocrf.parsing.traces`), and prints per mode: sentences, constituents (nodes above the
preterminals, the root included), sentences and constituents with a gap, and the fanout
distribution, both as read and after punctuation is re-attached (what the supertags see: gaps made
only of punctuation closed); then the co-indexed traces found per kind and what became of them.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from neurocrf.parsing.bracket import read_penn
from neurocrf.parsing.punctuation import move_punctuation_sentence
from neurocrf.parsing.traces import RESOLVED_TRACES
from neurocrf.parsing.tree import TreebankSentence, natural_key
from neurocrf.parsing.treebank import data_root

_COINDEXED = re.compile(r"\(-NONE- (\*T\*|\*ICH\*|\*EXP\*|\*RNR\*)-\d+\)")


def discontinuity(sentences: list[TreebankSentence]) -> dict[str, Any]:
    """Sentences, constituents, how many have a gap, and the fanout distribution."""
    fanouts: Counter[int] = Counter()
    disc_sentences = 0
    for sentence in sentences:
        found = [node.fanout() for node in sentence.tree.subtrees() if not node.is_preterminal]
        fanouts.update(found)
        disc_sentences += any(k > 1 for k in found)
    constituents = sum(fanouts.values())
    disc = constituents - fanouts[1]
    return {"sentences": len(sentences), "discontinuous_sentences": disc_sentences,
            "discontinuous_sentence_rate": disc_sentences / max(len(sentences), 1),
            "constituents": constituents, "discontinuous_constituents": disc,
            "discontinuous_constituent_rate": disc / max(constituents, 1),
            "fanout": {str(k): v for k, v in sorted(fanouts.items())}}


def trace_report(folder: Path) -> dict[str, Any]:
    """The report of the module docstring for a folder of ``.mrg`` files."""
    files = sorted(folder.glob("*.mrg"), key=lambda f: natural_key(f.name))
    if not files:
        raise FileNotFoundError(f"no .mrg files in {folder}")
    report: dict[str, Any] = {"path": str(folder), "files": len(files)}
    with_traces = Counter(len(_COINDEXED.findall(tree)) > 0 for f in files
                          for tree in re.split(r"\n(?=\( ?\()", f.read_text(encoding="utf-8")) if "(" in tree)
    report["sentences_with_coindexed_traces"] = with_traces[True]
    for mode in ("remove", "resolve"):
        counts: Counter[str] = Counter()
        sentences = [s for f in files for s in read_penn(f, traces=mode, counts=counts)]
        moved = [move_punctuation_sentence(s) for s in sentences]
        report[mode] = {"as_read": discontinuity(sentences), "punctuation_moved": discontinuity(moved)}
        if mode == "resolve":
            report["traces"] = {kind: {outcome: counts[f"{outcome} {kind}"]
                                       for outcome in ("resolved", "extra", "empty filler", "missing", "cycle")}
                                for kind in RESOLVED_TRACES}
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{report['path']}: {report['files']} files, {report['remove']['as_read']['sentences']} sentences, "
             f"{report['sentences_with_coindexed_traces']} with co-indexed *T*/*ICH*/*EXP*/*RNR* traces", "",
             f"{'traces':<8}{'view':<19}{'disc. sent.':>16}{'disc. const.':>20}  fanout distribution"]
    for mode in ("remove", "resolve"):
        for view in ("as_read", "punctuation_moved"):
            r = report[mode][view]
            fanout = ", ".join(f"{k}: {v}" for k, v in r["fanout"].items())
            lines.append(f"{mode:<8}{view.replace('_', ' '):<19}"
                         f"{r['discontinuous_sentences']:>6} ({100 * r['discontinuous_sentence_rate']:5.2f}%)"
                         f"{r['discontinuous_constituents']:>7} / {r['constituents']} "
                         f"({100 * r['discontinuous_constituent_rate']:.2f}%)  {fanout}")
    lines += ["", f"{'trace':<8}{'resolved':>9}{'extra':>7}{'empty filler':>14}{'missing':>9}{'cycle':>7}"]
    for kind, outcome in report["traces"].items():
        lines.append(f"{kind:<8}{outcome['resolved']:>9}{outcome['extra']:>7}{outcome['empty filler']:>14}"
                     f"{outcome['missing']:>9}{outcome['cycle']:>7}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", type=Path, default=None, help="folder of .mrg files (default: $NEUROCRF_DATA/ptb_sample)")
    ap.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    args = ap.parse_args(argv)
    report = trace_report(args.path or data_root() / "ptb_sample")
    print(format_report(report), end="")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The results of ``reproductions/precursor.py``: its rows (a JSON-lines file, one row per finished
run) and the markdown tables written from them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from neurocrf.structs import CRF_KINDS

CRF_NAMES = {"first_order": "first-order CRF", "second_order": "second-order CRF", "precursor": "precursor-induced CRF"}


class Results:
    """Rows in a JSON-lines file; a finished (name) is skipped on a rerun unless --redo."""

    def __init__(self, path: Path, redo: bool) -> None:
        self.path = path
        self.redo = redo
        self.rows: list[dict[str, Any]] = []
        if path.exists():
            self.rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def done(self, name: str) -> bool:
        return not self.redo and any(row["name"] == name and "error" not in row for row in self.rows)

    def add(self, row: dict[str, Any]) -> None:
        self.rows = [r for r in self.rows if r["name"] != row["name"]] + [row]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def get(self, name: str) -> dict[str, Any] | None:
        return next((row for row in self.rows if row["name"] == name), None)


def _f(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _iterations(row: dict[str, Any]) -> str:
    if "iterations" not in row:
        return "–"
    flag = "" if row.get("converged") else " (not converged: " + str(row.get("reason", "?")) + ")"
    return f"{row['iterations']}{flag}"


def write_tables(results: Results, out: Path) -> None:
    """Markdown tables from the finished rows."""
    lines = ["# Precursor-induced CRF study and feature-CRF checks (reproductions/precursor.py)", ""]
    rows = results.rows
    errors = [row for row in rows if "error" in row]

    jnlpba = [row for row in rows if row.get("study") == "jnlpba" and "error" not in row]
    if jnlpba:
        lines += [
            "## Table 1: JNLPBA test, sparse features, full-batch L-BFGS (sigma^2 = 100), strict IOB2 spans",
            "",
            "| CRF | features | P | R | F1 | L-BFGS iterations | features x tags |",
            "|---|---|---:|---:|---:|---|---|",
        ]
        for row in sorted(jnlpba,
                          key=lambda r: (r["features"], r.get("system") != "neurocrf", CRF_KINDS.index(r["crf"]))):
            crf = CRF_NAMES[row["crf"]] + (f" (memory={row['memory']})" if row.get("memory") else "")
            if row.get("system") == "crfsuite":
                crf = "CRFsuite first-order (peer)"
            size = f"{row.get('num_features')} x {row.get('num_tags', '–')}"
            lines.append(f"| {crf} | {row['features']} | {_f(row['precision'])} | {_f(row['recall'])} | "
                         f"{_f(row['f1'])} | {_iterations(row)} | {size} |")
        lines += ["", "## Table 2: seconds per L-BFGS iteration (JNLPBA train, whole set per iteration)", "",
                  ("| CRF | features | s / iteration (mean) | median | evaluations / iteration | s / evaluation |"
                   " x first order (s / iteration) |"),
                  "|---|---|---:|---:|---:|---:|---:|"]
        base = {row["features"]: row for row in jnlpba
                if row["crf"] == "first_order" and row.get("system") == "neurocrf"}
        for row in sorted(jnlpba,
                          key=lambda r: (r["features"], r.get("system") != "neurocrf", CRF_KINDS.index(r["crf"]))):
            crf = CRF_NAMES[row["crf"]] + (f" (memory={row['memory']})" if row.get("memory") else "")
            if row.get("system") == "crfsuite":
                crf = "CRFsuite first-order (peer)"
            ref = base.get(row["features"])
            ratio = row["seconds_per_iteration"] / ref["seconds_per_iteration"] if ref else None
            evaluations, iterations = row.get("evaluations"), row.get("iterations")
            per_eval = evaluations / max(1, iterations or 1) if evaluations else None
            seconds = row.get("lbfgs_seconds")
            per_second = seconds / row["evaluations"] if row.get("evaluations") and seconds else None
            lines.append(f"| {crf} | {row['features']} | {_f(row['seconds_per_iteration'])} | "
                         f"{_f(row.get('median_seconds_per_iteration'))} | {_f(per_eval)} | {_f(per_second)} | "
                         f"{_f(ratio)} |")
        lines.append("")

    conll = [row for row in rows if row.get("study") == "conll2000" and "error" not in row]
    if conll:
        lines += ["## CoNLL-2000 chunking (test), word + POS n-gram features, first-order CRF, L-BFGS", "",
                  ("| system | P | R | F1 | iterations | L-BFGS wall s | L-BFGS CPU s | wall s / iteration |"
                   " final objective | features | train sentences |"),
                  "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|"]
        for row in conll:
            system = "CRFsuite (python-crfsuite)" if row["system"] == "crfsuite" else f"neurocrf {row['crf']}"
            if row["system"] != "crfsuite" and row["crf"] == "first_order":
                system += " (unconstrained)"
            lines.append(f"| {system} | {_f(row['precision'])} | {_f(row['recall'])} | {_f(row['f1'])} | "
                         f"{_iterations(row)} | {_f(row.get('lbfgs_seconds'), 1)} | "
                         f"{_f(row.get('lbfgs_cpu_seconds'), 1)} | {_f(row.get('seconds_per_iteration'))} | "
                         f"{_f(row.get('objective'), 1)} | {row.get('num_features')} | "
                         f"{row.get('train_sentences', '–')} |")
        lines.append("")

    bilstm = [row for row in rows if row.get("study") == "bilstm" and "error" not in row]
    if bilstm:
        lines += ["## BiLSTM encoder + CRF variants (Adam; test F1)", "",
                  "| corpus | CRF | P | R | F1 | epochs | seconds / epoch | train sentences |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for row in sorted(bilstm, key=lambda r: (r["corpus"], CRF_KINDS.index(r["crf"]))):
            lines.append(f"| {row['corpus']} | {CRF_NAMES[row['crf']]} | {_f(row['precision'])} | "
                         f"{_f(row['recall'])} | {_f(row['f1'])} | {row['epochs']} | "
                         f"{_f(row['seconds_per_epoch'], 1)} | {row['train_sentences']} |")
        lines.append("")
    if errors:
        lines += ["## Failed runs", ""] + [f"- {row['name']}: {row['error']}" for row in errors] + [""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))

"""The report of a multi-seed sweep: per corpus and variant, the test scores over seeds, the cost
per epoch, the epochs to the best dev score, and a paired significance test against a baseline.

Reads the cells :func:`neurocrf.study.runs.find_cells` finds and returns plain values (the JSON
report); :func:`format_markdown` renders them as Markdown tables, :func:`write_report` writes both
and the plot of F1 per seed (:mod:`neurocrf.study.plot`). Per variant (CRF kind, with the memory
for the precursor-induced CRF):

- seeds done, and the missing cells (run directories without ``summary.json``: cells that were
  started and did not finish; a cell never started leaves no trace to report);
- test F1 mean and sample standard deviation over seeds, precision and recall means, F1 per
  entity type (mean and sd);
- seconds per epoch (training plus validation; the mean over the epochs of all seeds), one value
  per device: a CPU run (with its torch thread count) and a GPU run are never averaged together;
- epochs to the best dev score (1-based: mean, min, max);
- against the baseline (``first_order``), on the seeds both have: the per-seed F1 differences
  and one paired approximate randomisation test with the seeds pooled
  (:mod:`neurocrf.study.significance`).

Scores in the JSON are fractions; the Markdown shows them in percent.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from neurocrf.models.metrics import read_tag_rows
from neurocrf.study.runs import Cell, find_cells, variant_order
from neurocrf.study.significance import TEST_NAME, UnitCounts, approximate_randomization, sentence_counts

DEFAULT_BASELINE = "first_order"
DEFAULT_SHUFFLES = 10_000
DEFAULT_RNG_SEED = 0
REPORT_FILES = ("report.md", "report.json", "f1_per_seed.png")


def mean_sd(values: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "sd", "n"}``: the mean and the sample standard deviation (n - 1 in the
    denominator; None for fewer than two values; the mean is None for no values)."""
    values = [float(v) for v in values]
    return {
        "mean": statistics.fmean(values) if values else None,
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "n": len(values),
    }


def device_label(summary: dict[str, Any]) -> str:
    """The device a run trained on; for a CPU run with its torch thread count (speeds differ)."""
    device = str(summary.get("device") or "unknown device")
    threads = summary.get("torch_threads")
    if device.startswith("cpu") and threads:
        device += f", {threads} thread{'s' if int(threads) != 1 else ''}"
    return device


def build_report(
    root: str | os.PathLike[str],
    baseline: str = DEFAULT_BASELINE,
    shuffles: int = DEFAULT_SHUFFLES,
    rng_seed: int = DEFAULT_RNG_SEED,
) -> dict[str, Any]:
    """The report of the sweep under ``root`` as plain values (see the module docstring).

    Raises:
        ValueError: no cells under ``root``; no cell of the ``baseline`` variant; unreadable
            summaries or tag files (naming them); two paired runs whose test sentences or gold
            tags differ.
    """
    cells = find_cells(root)
    if not cells:
        raise ValueError(f"{root}: no runs found (no summary.json, no <kind>-memory-<memory>-seed-<seed> folder)")
    corpora: dict[str, dict[str, list[Cell]]] = {}
    for cell in cells:
        corpora.setdefault(cell.corpus, {}).setdefault(cell.variant, []).append(cell)
    found = sorted({cell.variant for cell in cells}, key=variant_order)
    if baseline not in found:
        raise ValueError(f"{root}: no runs of the baseline {baseline!r}; the variants are {', '.join(found)}")
    report = {
        "root": str(root),
        "baseline": baseline,
        "significance_test": TEST_NAME,
        "shuffles": shuffles,
        "rng_seed": rng_seed,
        "corpora": {},
    }
    for corpus, variants in corpora.items():
        names = sorted(variants, key=variant_order)
        entries = {name: _variant_entry(variants[name], Path(root)) for name in names}
        if baseline in variants:
            for name in names:
                if name != baseline:
                    entries[name]["vs_baseline"] = _compare(variants[name], variants[baseline], shuffles, rng_seed)
        report["corpora"][corpus] = {
            "devices": sorted({d for e in entries.values() for d in e["seconds_per_epoch"]}),
            "types": sorted({t for e in entries.values() for t in e["per_type"]}),
            "variants": entries,
        }
    return report


def _has_scores(cell: Cell) -> bool:
    return cell.summary is not None and bool(cell.summary.get("test"))


def _scored(cells: Iterable[Cell]) -> list[Cell]:
    return [c for c in cells if _has_scores(c)]


def _variant_entry(cells: list[Cell], root: Path) -> dict[str, Any]:
    runs = _scored(cells)
    missing = [
        {"seed": c.seed, "path": _relative(c.path, root), "state": c.state if c.summary is None else "no test scores"}
        for c in cells if not _has_scores(c)
    ]
    per_type: dict[str, list[float]] = {}
    seconds: dict[str, list[float]] = {}
    seconds_runs: dict[str, int] = {}
    to_best: list[int] = []
    rows = []
    for cell in runs:
        summary = cell.summary
        assert summary is not None
        test = summary["test"]
        for name, scores in test.get("per_type", {}).items():
            per_type.setdefault(name, []).append(float(scores["f1"]))
        device = device_label(summary)
        times = [float(e["seconds"]) for e in summary.get("epochs") or [] if e.get("seconds") is not None]
        if times:
            seconds.setdefault(device, []).extend(times)
            seconds_runs[device] = seconds_runs.get(device, 0) + 1
        best = summary.get("best_epoch")
        if best is not None:
            to_best.append(int(best) + 1)
        rows.append({
            "seed": cell.seed, "f1": float(test["f1"]), "precision": float(test["precision"]),
            "recall": float(test["recall"]), "epochs": len(summary.get("epochs") or []),
            "best_epoch": best, "device": device, "path": _relative(cell.path, root),
        })
    return {
        "seeds": [c.seed for c in runs],
        "missing": missing,
        "runs": rows,
        "f1": mean_sd([r["f1"] for r in rows]),
        "precision": mean_sd([r["precision"] for r in rows]),
        "recall": mean_sd([r["recall"] for r in rows]),
        "per_type": {name: mean_sd(values) for name, values in sorted(per_type.items())},
        "seconds_per_epoch": {
            device: {"mean": statistics.fmean(values), "epochs": len(values), "runs": seconds_runs[device]}
            for device, values in sorted(seconds.items())
        },
        "epochs_to_best": (
            {"mean": statistics.fmean(to_best), "min": min(to_best), "max": max(to_best), "n": len(to_best)}
            if to_best else None
        ),
    }


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _compare(cells: list[Cell], baseline: list[Cell], shuffles: int, rng_seed: int) -> dict[str, Any]:
    """Per-seed F1 differences on the seeds both variants finished, and the pooled AR test."""
    mine = {c.seed: c for c in _scored(cells)}
    theirs = {c.seed: c for c in _scored(baseline)}
    seeds = sorted(set(mine) & set(theirs), key=_seed_key)
    differences = {str(seed): _test_f1(mine[seed]) - _test_f1(theirs[seed]) for seed in seeds}
    result: dict[str, Any] = {
        "paired_seeds": seeds,
        "unpaired_seeds": sorted(set(mine) ^ set(theirs), key=_seed_key),
        "differences": differences,
        "difference": mean_sd(list(differences.values())),
        "test": None,
    }
    absent = [str(c.tags_path) for seed in seeds for c in (mine[seed], theirs[seed]) if not c.tags_path.is_file()]
    if not seeds or absent:
        result["note"] = "no paired seeds" if not seeds else f"no per-sentence tags: {', '.join(absent)}"
        return result
    pairs = [_paired_counts(mine[seed], theirs[seed]) for seed in seeds]
    a = UnitCounts.concatenate([p[0] for p in pairs])
    b = UnitCounts.concatenate([p[1] for p in pairs])
    test = approximate_randomization(a, b, shuffles=shuffles, seed=rng_seed)
    result["test"] = {
        "statistic": test.statistic, "p_value": test.p_value, "extreme": test.extreme,
        "shuffles": test.shuffles, "units": test.units, "rng_seed": test.seed,
        "pooled_f1": a.f1(), "pooled_f1_baseline": b.f1(),
    }
    return result


def _test_f1(cell: Cell) -> float:
    assert cell.summary is not None
    return float(cell.summary["test"]["f1"])


def _paired_counts(cell: Cell, baseline: Cell) -> tuple[UnitCounts, UnitCounts]:
    """The span counts per test sentence of two runs, sentences paired by their index."""
    schemes = {c.summary["test"].get("scheme", "BIOES") for c in (cell, baseline)}  # type: ignore[index]
    if len(schemes) != 1:
        raise ValueError(f"{cell.path} and {baseline.path} were scored in different schemes: {sorted(schemes)}")
    scheme = schemes.pop()
    mine = {index: (gold, pred) for index, gold, pred in read_tag_rows(cell.tags_path)}
    theirs = {index: (gold, pred) for index, gold, pred in read_tag_rows(baseline.tags_path)}
    if set(mine) != set(theirs):
        raise ValueError(
            f"{cell.tags_path} and {baseline.tags_path} hold different test sentences"
            f" ({len(mine)} and {len(theirs)}; e.g. index {min(set(mine) ^ set(theirs))} in one only)"
        )
    order = sorted(mine)
    for index in order:
        if mine[index][0] != theirs[index][0]:
            raise ValueError(f"{cell.tags_path} and {baseline.tags_path}: sentence {index} has different gold tags")
    gold = [mine[i][0] for i in order]
    return (
        sentence_counts(gold, [mine[i][1] for i in order], scheme),
        sentence_counts(gold, [theirs[i][1] for i in order], scheme),
    )


# ---------------------------------------------------------------------------------- Markdown


def _pct(value: float | None, sd: float | None = None, signed: bool = False) -> str:
    if value is None:
        return "–"
    text = f"{100 * value:+.2f}" if signed else f"{100 * value:.2f}"
    return text if sd is None else f"{text} ± {100 * sd:.2f}"


def _cell_pct(stats: dict[str, Any] | None, signed: bool = False) -> str:
    return "–" if not stats else _pct(stats["mean"], stats["sd"], signed)


def _seconds(stats: dict[str, Any] | None) -> str:
    return "–" if stats is None else f"{stats['mean']:.1f}"


def _seed_key(seed: Any) -> tuple[int, int, str]:
    """Seeds in numeric order (also as the strings of JSON keys), anything else last."""
    text = str(seed)
    numeric = text.lstrip("-").isdigit()
    return (0 if numeric else 1, int(text) if numeric else 0, text)


def _p(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.4f}" if value >= 0.00005 else f"{value:.1e}"


def _seeds(seeds: Sequence[Any]) -> str:
    return ", ".join(str(s) for s in seeds) if seeds else "–"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: per corpus, the main table, F1 per entity type, the per-seed
    differences against the baseline, and the missing cells."""
    baseline = report["baseline"]
    lines = [
        f"# Sweep report: {report['root']}",
        "",
        "Test scores in percent (strict span matching), mean ± sample standard deviation over seeds;"
        " P and R are means. Seconds per epoch: training plus validation, mean over the epochs of all"
        " seeds, per device. Epochs to best: the epoch of the best dev F1 (1-based), mean (min-max)."
        " Missing: run folders without summary.json (cells never started do not appear).",
        f"Significance against `{baseline}`: {report['significance_test']}; {report['shuffles']:,} shuffles,"
        f" random seed {report['rng_seed']}, p = (r + 1) / (n + 1). ΔF1: mean of the per-seed differences.",
    ]
    for corpus, entry in report["corpora"].items():
        devices = entry["devices"]
        variants = entry["variants"]
        header = ["variant", "seeds", "missing", "test F1", "P", "R",
                  *(f"s/epoch ({d})" for d in devices), "epochs to best", f"ΔF1 vs {baseline}", "p"]
        rows = []
        for name, v in variants.items():
            comparison = v.get("vs_baseline")
            test = (comparison or {}).get("test") or {}
            best = v["epochs_to_best"]
            rows.append([
                f"`{name}`", f"{len(v['seeds'])} ({_seeds(v['seeds'])})", _seeds([m["seed"] for m in v["missing"]]),
                _cell_pct(v["f1"]), _pct(v["precision"]["mean"]), _pct(v["recall"]["mean"]),
                *(_seconds(v["seconds_per_epoch"].get(d)) for d in devices),
                f"{best['mean']:.1f} ({best['min']}-{best['max']})" if best else "–",
                _cell_pct(comparison["difference"], signed=True) if comparison else "–",
                _p(test.get("p_value")),
            ])
        lines += ["", f"## {corpus}", "", *_table(header, rows)]
        if entry["types"]:
            rows = [[f"`{name}`", *(_cell_pct(v["per_type"].get(t)) for t in entry["types"])]
                    for name, v in variants.items()]
            lines += ["", "F1 per entity type:", "", *_table(["variant", *entry["types"]], rows)]
        lines += _differences(variants, baseline)
        missing = [(name, m) for name, v in variants.items() for m in v["missing"]]
        if missing:
            lines += ["", "Missing cells:", ""]
            lines += [f"- `{name}` seed {m['seed']}: {m['path']} ({m['state']})" for name, m in missing]
    return "\n".join(lines) + "\n"


def _differences(variants: dict[str, Any], baseline: str) -> list[str]:
    compared = {name: v["vs_baseline"] for name, v in variants.items() if v.get("vs_baseline")}
    if not compared:
        return []
    seeds = sorted({s for c in compared.values() for s in c["differences"]}, key=_seed_key)
    rows = []
    for name, c in compared.items():
        test = c["test"] or {}
        pooled = (f"{_pct(test['pooled_f1'])} vs {_pct(test['pooled_f1_baseline'])} ({test['units']:,} sentences)"
                  if test else c.get("note", "–"))
        differences = [_pct(c["differences"].get(s), signed=True) for s in seeds]
        mean = _cell_pct(c["difference"], signed=True)
        rows.append([f"`{name}`", *differences, mean, pooled, _p(test.get("p_value"))])
    header = [f"F1 difference vs `{baseline}`", *(f"seed {s}" for s in seeds), "mean ± sd", "pooled F1", "p"]
    return ["", "Per-seed paired differences (percentage points) and the pooled test:", "", *_table(header, rows)]


def write_report(
    root: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    baseline: str = DEFAULT_BASELINE,
    shuffles: int = DEFAULT_SHUFFLES,
    rng_seed: int = DEFAULT_RNG_SEED,
    plot: bool = True,
) -> dict[str, Path]:
    """Build the report of the sweep under ``root`` and write ``report.md``, ``report.json`` and
    (``plot=True``) ``f1_per_seed.png`` into ``output`` (default ``<root>/report``).

    Returns:
        ``{"markdown", "json", "plot"}`` -> the paths written (no ``"plot"`` without one).
    """
    report = build_report(root, baseline=baseline, shuffles=shuffles, rng_seed=rng_seed)
    folder = Path(output) if output is not None else Path(root) / "report"
    folder.mkdir(parents=True, exist_ok=True)
    markdown, data, figure = (folder / name for name in REPORT_FILES)
    markdown.write_text(format_markdown(report), encoding="utf-8")
    data.write_text(json.dumps(_finite(report), indent=1) + "\n", encoding="utf-8")
    written = {"markdown": markdown, "json": data}
    if plot:
        from neurocrf.study.plot import plot_f1_per_seed

        plot_f1_per_seed(report, figure)
        written["plot"] = figure
    return written


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value

"""The figure of a sweep report: test F1 per seed per variant, one panel per corpus.

Each seed is a point (the same colour for the same seed in every variant, so paired runs can be
followed across a panel); a horizontal bar marks the mean over seeds. Drawn with matplotlib's Agg
backend, so it needs no display.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any


def plot_f1_per_seed(report: dict[str, Any], path: str | os.PathLike[str], columns: int = 3) -> Path:
    """Draw test F1 (percent) per seed per variant for every corpus of ``report`` (the plain values
    of :func:`neurocrf.study.report.build_report`) and save it as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure  # a Figure without pyplot: no global state, no GUI
    from matplotlib.lines import Line2D

    corpora = list(report["corpora"].items())
    if not corpora:
        raise ValueError("the report holds no corpus to plot")
    columns = max(1, min(columns, len(corpora)))
    rows = math.ceil(len(corpora) / columns)
    seeds = sorted({run["seed"] for _, entry in corpora for v in entry["variants"].values() for run in v["runs"]},
                   key=lambda s: (s is None, s if s is not None else 0))
    palette = matplotlib.colormaps["tab10"]
    colours = {seed: palette(i % 10) for i, seed in enumerate(seeds)}
    figure = Figure(figsize=(4.6 * columns, 3.6 * rows), dpi=100)
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax, (corpus, entry) in zip(axes.flat, corpora):
        names = list(entry["variants"])
        for x, name in enumerate(names):
            runs = entry["variants"][name]["runs"]
            for offset, run in zip(_offsets(len(runs)), runs):
                ax.scatter(x + offset, 100 * run["f1"], s=22, color=colours[run["seed"]], zorder=3)
            mean = entry["variants"][name]["f1"]["mean"]
            if mean is not None:
                ax.hlines(100 * mean, x - 0.3, x + 0.3, colors="black", linewidth=1.6, zorder=2)
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right")
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_title(corpus)
        ax.set_ylabel("test F1 (%)")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(corpora):]:
        ax.set_visible(False)
    if seeds:
        handles = [Line2D([], [], marker="o", linestyle="", color=colours[seed]) for seed in seeds]
        handles.append(Line2D([], [], color="black", linewidth=1.6))
        figure.legend(handles, [f"seed {seed}" for seed in seeds] + ["mean"], loc="center right", fontsize=8)
    figure.tight_layout(rect=(0, 0, 0.88 if seeds else 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def _offsets(count: int, width: float = 0.36) -> list[float]:
    """Horizontal offsets that spread ``count`` points over ``width`` around their variant."""
    if count <= 1:
        return [0.0] * count
    return [-width / 2 + width * i / (count - 1) for i in range(count)]

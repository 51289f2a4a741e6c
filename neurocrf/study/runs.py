"""The runs (cells) of a sweep, as ``neurocrf-train`` leaves them.

A cell is a run directory; a finished one holds ``summary.json`` (test scores, per-epoch seconds
and dev F1, best epoch, seed, CRF config, corpus, device) and ``test_tags.jsonl`` (gold and
predicted tags per test sentence). The resumable CRF study grid
(``configs/hparams_search/crf_study.yaml``) lays them out as
``<root>/<corpus>/<crf kind>-memory-<memory>-seed-<seed>/``; a directory of that name without
``summary.json`` is a cell that was started and not finished (cut off, or still running).

>>> variant_name({"kind": "precursor", "memory": "tag"}), variant_name({"kind": "first_order"})
('precursor (tag)', 'first_order')
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neurocrf.conventions import SUMMARY_FILE
from neurocrf.models.heads import HEAD_KINDS

TAGS_FILE = "test_tags.jsonl"
CELL_NAME = re.compile(r"(?P<kind>[A-Za-z_]+)-memory-(?P<memory>[A-Za-z_]+)-seed-(?P<seed>-?\d+)")
KIND_ORDER = HEAD_KINDS  # softmax, then the CRF layers in order of their state spaces
MEMORY_ORDER = ("type", "tag")
DEFAULT_MEMORY = "type"  # PrecursorInducedCRF's default memory


@dataclass(frozen=True)
class Cell:
    """One run directory of a sweep.

    ``summary`` is the parsed ``summary.json`` (None for an unfinished cell, whose ``state`` says
    what is there: ``"running or cut off, has last.ckpt"`` or ``"started, no checkpoint yet"``).
    """

    corpus: str
    variant: str
    seed: int | None
    path: Path
    summary: dict[str, Any] | None
    state: str

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def tags_path(self) -> Path:
        return self.path / TAGS_FILE


def variant_name(crf: Mapping[str, Any]) -> str:
    """The variant a CRF config names: its kind, with the memory for the precursor-induced CRF
    (``"precursor (type)"``, ``"precursor (tag)"``)."""
    kind = str(crf.get("kind"))
    if kind == "precursor":
        return f"precursor ({crf.get('memory') or DEFAULT_MEMORY})"
    return kind


def variant_order(name: str) -> tuple[int, int, str]:
    """Sort key of a variant name: softmax, first order, second order, precursor (type, then tag),
    then others."""
    kind, _, memory = name.partition(" ")
    memory = memory.strip("()")
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER),
            MEMORY_ORDER.index(memory) if memory in MEMORY_ORDER else len(MEMORY_ORDER), name)


def find_cells(root: str | os.PathLike[str]) -> list[Cell]:
    """Every cell under ``root`` (a sweep root, one corpus's folder, or one run directory),
    sorted by corpus, variant and seed.

    A directory is a cell if it holds ``summary.json`` or is named like a grid cell; the search does
    not descend into cells. Raises ValueError naming the files for an unreadable summary or for
    two cells of the same corpus, variant and seed.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no sweep directory {root}")
    cells: list[Cell] = []
    for directory, subdirs, files in os.walk(root):
        path = Path(directory)
        if SUMMARY_FILE in files or CELL_NAME.fullmatch(path.name):
            cells.append(_read_cell(path, SUMMARY_FILE in files))
            subdirs[:] = []
        else:
            subdirs.sort()
    seen: dict[tuple[str, str, int | None], Path] = {}
    for cell in cells:
        key = (cell.corpus, cell.variant, cell.seed)
        if key in seen:
            raise ValueError(
                f"two runs of corpus {cell.corpus}, {cell.variant}, seed {cell.seed}: {seen[key]} and {cell.path};"
                " report on one of them (give the folder of one sweep)"
            )
        seen[key] = cell.path
    return sorted(cells, key=lambda c: (c.corpus, variant_order(c.variant), -1 if c.seed is None else c.seed))


def _read_cell(path: Path, has_summary: bool) -> Cell:
    match = CELL_NAME.fullmatch(path.name)
    if not has_summary:
        assert match is not None
        memory = match["memory"]
        variant = variant_name({"kind": match["kind"], "memory": None if memory == "none" else memory})
        started = (path / "checkpoints" / "last.ckpt").is_file()
        state = "running or cut off, has last.ckpt" if started else "started, no checkpoint yet"
        return Cell(path.parent.name, variant, int(match["seed"]), path, None, state)
    file = path / SUMMARY_FILE
    try:
        summary = json.loads(file.read_text(encoding="utf-8"))
        crf = summary["crf"]
        seed = summary.get("seed")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{file}: not a run summary ({type(error).__name__}: {error})") from None
    if not isinstance(crf, Mapping) or "kind" not in crf:
        raise ValueError(f"{file}: 'crf' holds no CRF config with a 'kind'")
    if seed is None and match is not None:
        seed = int(match["seed"])
    corpus = summary.get("corpus") or path.parent.name
    return Cell(str(corpus), variant_name(crf), None if seed is None else int(seed), path, summary, "finished")

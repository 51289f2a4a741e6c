"""Span-level scores with seqeval in strict mode, and the per-type report written at test time.

seqeval's ``mode="strict"`` only counts a span when its whole tag sequence is well formed in the
given scheme; without an explicit ``scheme=`` it silently falls back to the lenient conlleval
reading, so the scheme class is always passed. Our ``BIOES`` is seqeval's ``IOBES``.

>>> scores = span_scores([["B-PER", "E-PER", "O"]], [["B-PER", "E-PER", "O"]], "BIOES")
>>> scores.f1, scores.per_type["PER"].support
(1.0, 1)
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seqeval.metrics import classification_report
from seqeval.scheme import IOB1, IOB2, IOBES

from neurocrf.data.conll import atomic_write_text

_SEQEVAL_SCHEMES = {"IOB1": IOB1, "IOB2": IOB2, "BIOES": IOBES}


@dataclass
class TypeScores:
    """Precision, recall and F1 of one entity type (or an average), plus the gold span count."""

    precision: float
    recall: float
    f1: float
    support: int


@dataclass
class SpanScores:
    """Micro-averaged span scores over a corpus, and the same per entity type."""

    precision: float
    recall: float
    f1: float
    support: int
    per_type: dict[str, TypeScores] = field(default_factory=dict)
    scheme: str = "BIOES"
    sentences: int = 0

    def to_dict(self) -> dict:
        """Plain python values (floats, ints, str), ready for JSON."""
        return asdict(self)


def seqeval_scheme(scheme: str) -> type:
    """The seqeval scheme class for one of our scheme names (``BIOES`` -> ``IOBES``)."""
    try:
        return _SEQEVAL_SCHEMES[scheme]
    except KeyError:
        raise ValueError(
            f"no seqeval scheme for {scheme!r}; expected one of {', '.join(_SEQEVAL_SCHEMES)}"
        ) from None


def span_scores(
    gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], scheme: str
) -> SpanScores:
    """Strict span precision / recall / F1 of ``pred`` against ``gold`` (tag strings in ``scheme``).

    Both are lists of sentences; sentence ``i`` of ``pred`` must have as many tags as sentence
    ``i`` of ``gold``. seqeval's numpy scalars are cast to python floats and ints.
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted ones")
    gold_lists = [list(g) for g in gold]
    pred_lists = [list(p) for p in pred]
    with warnings.catch_warnings():
        # seqeval warns about undefined precision when a type is never predicted; zero_division=0.
        warnings.simplefilter("ignore")
        report = classification_report(
            gold_lists,
            pred_lists,
            mode="strict",
            scheme=seqeval_scheme(scheme),
            output_dict=True,
            zero_division=0,
        )
    per_type = {
        name: _type_scores(values)
        for name, values in report.items()
        if name not in ("micro avg", "macro avg", "weighted avg")
    }
    micro = report.get("micro avg")
    total = _type_scores(micro) if micro is not None else TypeScores(0.0, 0.0, 0.0, 0)
    return SpanScores(
        precision=total.precision,
        recall=total.recall,
        f1=total.f1,
        support=total.support,
        per_type=dict(sorted(per_type.items())),
        scheme=scheme,
        sentences=len(gold_lists),
    )


def _type_scores(values: dict) -> TypeScores:
    return TypeScores(
        precision=float(values["precision"]),
        recall=float(values["recall"]),
        f1=float(values["f1-score"]),
        support=int(values["support"]),
    )


def format_report(scores: SpanScores) -> str:
    """A fixed-width per-type table: type, precision, recall, F1, support, then the micro average."""
    width = max([len("micro avg"), *(len(name) for name in scores.per_type)])
    header = f"{'type':<{width}}  {'precision':>9}  {'recall':>9}  {'f1':>9}  {'support':>8}"
    lines = [header, "-" * len(header)]
    rows = list(scores.per_type.items())
    rows.append(("micro avg", TypeScores(scores.precision, scores.recall, scores.f1, scores.support)))
    for name, row in rows:
        if name == "micro avg":
            lines.append("-" * len(header))
        lines.append(
            f"{name:<{width}}  {row.precision:>9.4f}  {row.recall:>9.4f}  {row.f1:>9.4f}"
            f"  {row.support:>8d}"
        )
    lines.append(f"(strict span matching, scheme {scores.scheme}, {scores.sentences} sentences)")
    return "\n".join(lines) + "\n"


def write_report(scores: SpanScores, directory: str | Path, prefix: str = "test") -> list[Path]:
    """Write ``<prefix>_report.txt`` and ``<prefix>_metrics.json`` into ``directory``."""
    directory = Path(directory)
    text = directory / f"{prefix}_report.txt"
    atomic_write_text(text, format_report(scores))
    metrics = directory / f"{prefix}_metrics.json"
    atomic_write_text(metrics, json.dumps(scores.to_dict(), indent=2) + "\n")
    return [text, metrics]


def write_tag_rows(rows: Sequence[tuple[int, Sequence[str], Sequence[str]]], directory: str | Path,
                   prefix: str = "test") -> Path:
    """Write ``<prefix>_tags.jsonl``: one line ``{"index", "gold", "pred"}`` per sentence (its
    position in the evaluated file, gold and predicted tags), for paired significance tests.
    Read it back with :func:`read_tag_rows`."""
    path = Path(directory) / f"{prefix}_tags.jsonl"
    atomic_write_text(path, "".join(
        json.dumps({"index": int(index), "gold": list(gold), "pred": list(pred)}) + "\n" for index, gold, pred in rows
    ))
    return path


def read_tag_rows(path: str | Path) -> list[tuple[int, list[str], list[str]]]:
    """The rows :func:`write_tag_rows` wrote, in file order."""
    rows = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows.append((int(row["index"]), list(row["gold"]), list(row["pred"])))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}, line {number}: not a tag row ({error})") from None
    return rows

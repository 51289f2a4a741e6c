"""How often an entity has a precursor: the corpus statistic behind the precursor-induced CRF.

Lee & Choi motivate the precursor-induced CRF with entities that follow another entity of the same
sentence with only outside (``O``) tokens in between: a first-order chain forgets the first
entity after one ``O`` token, the precursor states remember it. Per corpus this module counts

- the entities, and those *preceded* by another entity of the same sentence through ``O`` tokens
  only (every entity but the first of its sentence: the tokens between two consecutive spans of a
  well-formed tag sequence are all ``O``), and of those, the ones whose precursor has the same type;
- the distance to the precursor: the number of ``O`` tokens in between (0 for adjacent spans),
  bucketed as 0, 1, 2, 3-5, 6-10, >10.

Corpora are read with the project's reader and the reader settings of a data config
(``configs/data/<corpus>.yaml``: columns, delimiter, document separators, file scheme).

>>> stats = precursor_stats([["B-A", "O", "O", "B-B", "I-B", "B-A"], ["O", "B-A"]], "IOB2")
>>> stats.entities, stats.preceded, stats.same_type, dict(stats.gaps)
(4, 2, 0, {2: 1, 0: 1})
>>> stats.buckets()
{'0': 1, '1': 0, '2': 1, '3-5': 0, '6-10': 0, '>10': 0}
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neurocrf.conventions import SPLITS
from neurocrf.data.conll import read_conll
from neurocrf.data.schemes import get_spans
from neurocrf.values import to_plain

GAP_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3-5", 3, 5), ("6-10", 6, 10), (">10", 11, None),
)
"""(label, smallest, largest or None) of the distance buckets, in O tokens between the entities."""

@dataclass
class PrecursorStats:
    """Entity counts of a corpus; ``gaps[d]``: preceded entities with ``d`` O tokens before them."""

    sentences: int = 0
    entities: int = 0
    preceded: int = 0
    same_type: int = 0
    gaps: Counter = field(default_factory=Counter)

    @property
    def share(self) -> float:
        """Preceded entities / entities (0 for a corpus without entities)."""
        return self.preceded / self.entities if self.entities else 0.0

    def buckets(self) -> dict[str, int]:
        """The preceded entities per distance bucket (:data:`GAP_BUCKETS`), every bucket listed."""
        return {
            label: sum(n for gap, n in self.gaps.items() if low <= gap and (high is None or gap <= high))
            for label, low, high in GAP_BUCKETS
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain values, ready for JSON."""
        return {
            "sentences": self.sentences, "entities": self.entities, "preceded": self.preceded,
            "share": self.share, "same_type": self.same_type, "buckets": self.buckets(),
            "gaps": {str(gap): n for gap, n in sorted(self.gaps.items())},
        }


def precursor_stats(
    tag_sequences: Iterable[Sequence[str]], scheme: str, keep_types: Iterable[str] | None = None
) -> PrecursorStats:
    """Count entities, preceded entities and distances over sentences of tags in ``scheme``.

    Args:
        tag_sequences: one tag list per sentence (IOB1, IOB2 or BIOES as ``scheme`` says).
        keep_types: count only spans of these types (the others read as ``O``), as the data
            option ``keep_types`` does; default: all.
    """
    kept = None if keep_types is None else set(keep_types)
    stats = PrecursorStats()
    for tags in tag_sequences:
        stats.sentences += 1
        spans = [s for s in get_spans(tags, scheme) if kept is None or s.type in kept]
        stats.entities += len(spans)
        for previous, span in zip(spans, spans[1:]):
            stats.preceded += 1
            stats.same_type += previous.type == span.type
            stats.gaps[span.start - previous.end] += 1
    return stats


def resolve_data_config(path: str | os.PathLike[str], shared_data: str | os.PathLike[str],
                        data_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A data config file (``configs/data/<corpus>.yaml``) as plain values, with
    ``${paths.shared_data}`` (and ``${paths.data_dir}``) set."""
    from omegaconf import OmegaConf

    paths = {"shared_data": str(shared_data), "data_dir": str(data_dir if data_dir is not None else shared_data)}
    config = OmegaConf.create({"paths": paths, "data": OmegaConf.load(Path(path))})
    return to_plain(config.data, "data")


def read_split_tags(config: Mapping[str, Any], split: str = "train") -> list[list[str]]:
    """The tag sequences of one split file of a resolved data config, read as the data module reads
    it (its ``reader`` options, validated in its ``file_scheme``). The whole file: a dev split that
    the data module holds out of the training file (``dev_fraction``) is not separated here.

    Raises:
        ValueError: unknown split, or a split without its own file.
        ConllFormatError: a bad file (naming file and line).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    path = config.get(f"{split}_path")
    if not path:
        raise ValueError(f"the data config has no {split} file ({split}_path is empty; a held-out split"
                         " comes from the training file)")
    sentences = read_conll(path, scheme=config.get("file_scheme", "IOB2"), **dict(config.get("reader") or {}))
    return [list(s.tags or []) for s in sentences]


def corpus_stats(config: Mapping[str, Any], split: str = "train") -> PrecursorStats:
    """:func:`precursor_stats` of one split file of a resolved data config (its ``keep_types`` too)."""
    return precursor_stats(read_split_tags(config, split), config.get("file_scheme", "IOB2"),
                           keep_types=config.get("keep_types"))


def format_table(rows: Mapping[str, PrecursorStats], split: str = "train") -> str:
    """A Markdown table, one row per corpus: sentences, entities, preceded entities (count and
    share), same-type precursors, and the distance buckets as shares of the preceded entities."""
    labels = [label for label, _, _ in GAP_BUCKETS]
    header = ["corpus", "split", "sentences", "entities", "preceded", "same type", *(f"gap {b}" for b in labels)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---", "---"] + ["--:"] * (len(header) - 2)) + "|"]
    for corpus, stats in rows.items():
        buckets = stats.buckets()
        share = (lambda n: f"{100 * n / stats.preceded:.1f}%" if stats.preceded else "–")
        lines.append("| " + " | ".join([
            corpus, split, f"{stats.sentences:,}", f"{stats.entities:,}",
            f"{stats.preceded:,} ({100 * stats.share:.1f}%)", share(stats.same_type),
            *(share(buckets[label]) for label in labels),
        ]) + " |")
    lines.append("")
    lines.append("preceded: entities with another entity before them in the same sentence, only O tokens"
                 " between; same type and gap columns: shares of the preceded entities; gap: O tokens"
                 " between the two entities.")
    return "\n".join(lines) + "\n"

"""Saved supertagger output: tag a corpus once, parse it many times.

A tag file holds, per token, the ``n`` most probable supertags and all preterminals (a few dozen),
sorted, with their log-probabilities, as a supertagger (or an ensemble) computed them. Reading one or several
back gives a :class:`SavedSupertags`, which the parse code takes in place of a model: trying
another ``k``, time limit or evaluation file, or an ensemble of any subset of models, costs
parsing time only::

    neurocrf-parse ckpt_path=seed1.ckpt treebank=alpino split=dev save_tags=seed1.dev.jsonl.gz
    neurocrf-parse ckpt_path=seed2.ckpt treebank=alpino split=dev save_tags=seed2.dev.jsonl.gz
    neurocrf-parse tags='[seed1.dev.jsonl.gz,seed2.dev.jsonl.gz]' treebank=alpino split=dev k=20

Several files are mixed as :class:`~neurocrf.models.supertag_ensemble.SupertaggerEnsemble`
mixes models: per token, the mean of the members' probabilities. A supertag outside a member's
saved ``n`` counts as probability 0 from that member, so the mixture is exact where every member
saved all supertags and otherwise off by less than the ``n``-th probability of a member; the
default ``n = 50`` keeps the gold supertag for over 99% of Alpino tokens.

Format (JSON lines, gzip-compressed when the name ends in ``.gz``): a header line
``{"format": "neurocrf-supertag-distributions", "version": 1, "supertags": [...],
"preterminals": [...], "roots": [...], "transform": {...}, "n": ..., "sources": [...]}``, then one
line per sentence ``{"id", "words", "supertags": [[id, ...] per token], "supertag_log_probs",
"preterminals", "preterminal_log_probs"}`` (ids index the header's lists, best first).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from neurocrf.models.supertag_ensemble import union_labels
from neurocrf.models.supertagger import KBestTags

__all__ = ["FORMAT", "TagDistribution", "SavedSupertags", "tag_distributions", "tag_file_header",
           "write_tag_file", "read_tag_file"]

FORMAT = "neurocrf-supertag-distributions"
VERSION = 1


@dataclass
class TagDistribution:
    """The saved output for one sentence: per token, label ids (best first) and their
    log-probabilities, for supertags (``[T][n]``) and preterminals (``[T][m]``)."""

    id: str
    words: list[str]
    supertags: list[list[int]]
    supertag_log_probs: list[list[float]]
    preterminals: list[list[int]]
    preterminal_log_probs: list[list[float]]


@torch.no_grad()
def tag_distributions(tagger: Any, ids: Sequence[str], sentences: Sequence[Sequence[str]], n: int = 50,
                      batch_size: int = 64) -> list[TagDistribution]:
    """The ``n`` best supertags and all preterminals of every token, with log-probabilities,
    from anything with ``batch_log_probs``, ``supertags`` and ``preterminals`` (a
    :class:`~neurocrf.models.supertagger.Supertagger` or an ensemble). One entry per sentence, in
    input order; an empty sentence gets empty lists."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    n = min(n, len(tagger.supertags))
    m = len(tagger.preterminals)
    out = [TagDistribution(str(i), list(w), [], [], [], []) for i, w in zip(ids, sentences)]
    order = sorted((i for i, w in enumerate(sentences) if w), key=lambda i: len(sentences[i]))
    for begin in range(0, len(order), batch_size):
        chunk = order[begin:begin + batch_size]
        log_probs, pt_log_probs = tagger.batch_log_probs([list(sentences[i]) for i in chunk])
        top_lp, top_ids = (t.cpu() for t in log_probs.topk(n, dim=-1))  # [B, T, n]
        pt_lp, pt_ids = (t.cpu() for t in pt_log_probs.topk(m, dim=-1))  # [B, T, P], sorted
        for b, i in enumerate(chunk):
            length = len(sentences[i])
            entry = out[i]
            entry.supertags = top_ids[b, :length].tolist()
            entry.supertag_log_probs = top_lp[b, :length].tolist()
            entry.preterminals = pt_ids[b, :length].tolist()
            entry.preterminal_log_probs = pt_lp[b, :length].tolist()
    return out


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def tag_file_header(tagger: Any, distributions: Sequence[TagDistribution], sources: Sequence[str] = ()) -> dict[str, Any]:
    """The header line of a tag file holding ``distributions`` computed by ``tagger``."""
    n = max((len(row) for d in distributions for row in d.supertags), default=0)
    return {"format": FORMAT, "version": VERSION, "supertags": list(tagger.supertags),
            "preterminals": list(tagger.preterminals), "roots": list(tagger.roots),
            "transform": dict(tagger.transform), "n": n, "sources": [str(s) for s in sources]}


def write_tag_file(path: str | Path, header: dict[str, Any], distributions: Sequence[TagDistribution]) -> Path:
    """Write a tag file: ``header`` (:func:`tag_file_header`) and one line per sentence."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "w") as handle:
        handle.write(json.dumps(header, ensure_ascii=False) + "\n")
        for d in distributions:
            handle.write(json.dumps({"id": d.id, "words": d.words, "supertags": d.supertags,
                                     "supertag_log_probs": d.supertag_log_probs,
                                     "preterminals": d.preterminals,
                                     "preterminal_log_probs": d.preterminal_log_probs},
                                    ensure_ascii=False) + "\n")
    return path


def read_tag_file(path: str | Path) -> tuple[dict[str, Any], list[TagDistribution]]:
    """The header and the sentences of a tag file. Raises ValueError naming the file and line for
    anything that is not such a file (wrong header, bad JSON, lengths or ids out of range)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tag file not found: {path}")
    sentences: list[TagDistribution] = []
    with _open(path, "r") as handle:
        header: dict[str, Any] | None = None
        for lineno, line in enumerate(handle, 1):
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not a JSON line ({error.msg})") from None
            if header is None:
                if not isinstance(record, dict) or record.get("format") != FORMAT:
                    raise ValueError(f"{where}: not a supertag distribution file (header 'format' must be {FORMAT!r})")
                if record.get("version") != VERSION:
                    raise ValueError(f"{where}: version {record.get('version')!r}, this reader knows {VERSION}")
                header = record
                continue
            sentences.append(_sentence(record, header, where))
    if header is None:
        raise ValueError(f"{path}: empty file, no header")
    return header, sentences


def _sentence(record: Any, header: dict[str, Any], where: str) -> TagDistribution:
    keys = ("id", "words", "supertags", "supertag_log_probs", "preterminals", "preterminal_log_probs")
    if not isinstance(record, dict) or any(key not in record for key in keys):
        raise ValueError(f"{where}: a sentence line needs the keys {list(keys)}")
    entry = TagDistribution(*(record[key] for key in keys))
    length = len(entry.words)
    for ids_key, lp_key, labels in (("supertags", "supertag_log_probs", header["supertags"]),
                                    ("preterminals", "preterminal_log_probs", header["preterminals"])):
        ids, lps = getattr(entry, ids_key), getattr(entry, lp_key)
        if len(ids) != length or len(lps) != length:
            raise ValueError(f"{where}: {len(entry.words)} words but {len(ids)} rows of {ids_key} and "
                             f"{len(lps)} of {lp_key}")
        for token, (row, row_lp) in enumerate(zip(ids, lps)):
            if not row or len(row) != len(row_lp):
                raise ValueError(f"{where}: token {token}: {len(row)} {ids_key} ids, {len(row_lp)} log-probabilities")
            if any(not 0 <= i < len(labels) for i in row):
                raise ValueError(f"{where}: token {token}: a {ids_key} id outside the header's {len(labels)} labels")
    return entry


class SavedSupertags:
    """Saved tagger output read as a supertagger: ``predict_kbest`` looks the sentences up.

    Args:
        headers: the header of each member file (see the module docstring).
        members: per member file, its sentences; a sentence is found by its words.
        names: the member files, for error messages.
    """

    def __init__(self, headers: Sequence[dict[str, Any]], members: Sequence[Sequence[TagDistribution]],
                 names: Sequence[str]) -> None:
        if not headers:
            raise ValueError("need at least one tag file")
        for name, header in zip(names[1:], headers[1:]):
            if header["transform"] != headers[0]["transform"]:
                raise ValueError(f"{name} was tagged for trees prepared with {header['transform']}, {names[0]} "
                                 f"with {headers[0]['transform']}: their supertags are not comparable")
        self.names = list(names)
        self.transform: dict[str, Any] = dict(headers[0]["transform"])
        self.supertags = union_labels(h["supertags"] for h in headers)
        self.preterminals = union_labels(h["preterminals"] for h in headers)
        self.roots = sorted(set().union(*(h["roots"] for h in headers)))
        self._headers = list(headers)
        self._members = [{tuple(s.words): s for s in sentences} for sentences in members]
        supertag_ids = {tag: i for i, tag in enumerate(self.supertags)}
        preterminal_ids = {tag: i for i, tag in enumerate(self.preterminals)}
        self._supertag_maps = [[supertag_ids[t] for t in h["supertags"]] for h in headers]
        self._preterminal_maps = [[preterminal_ids[t] for t in h["preterminals"]] for h in headers]

    @classmethod
    def read(cls, paths: str | Path | Sequence[str | Path]) -> SavedSupertags:
        """One tag file, or several mixed (the mean of their distributions)."""
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        read = [read_tag_file(path) for path in paths]
        return cls([h for h, _ in read], [s for _, s in read], [str(p) for p in paths])

    @property
    def max_k(self) -> int:
        """The largest ``k`` the files answer: the smallest ``n`` a member saved, unless it saved
        all its supertags."""
        partial = [h["n"] for h in self._headers if h["n"] < len(h["supertags"])]
        return min(partial) if partial else len(self.supertags)

    def predict_kbest(self, sentences: Sequence[Sequence[str] | str], k: int = 10,
                      batch_size: int = 64) -> list[KBestTags]:
        """As :meth:`~neurocrf.models.supertagger.Supertagger.predict_kbest`, from the saved
        distributions (``batch_size`` is not used). Raises ValueError for a sentence that a
        member file does not hold, or for ``k`` above the ``n`` a member saved."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        for name, header in zip(self.names, self._headers):
            if k > header["n"] and header["n"] < len(header["supertags"]):
                raise ValueError(f"k = {k} but {name} holds only the {header['n']} best supertags per token")
        out = []
        for sentence in sentences:
            words = sentence.split() if isinstance(sentence, str) else list(sentence)
            if not words:
                out.append(KBestTags([], [], [], []))
                continue
            found = []
            for name, member in zip(self.names, self._members):
                entry = member.get(tuple(words))
                if entry is None:
                    raise ValueError(f"{name} holds no tags for the sentence {' '.join(words)!r}")
                found.append(entry)
            out.append(self._kbest(words, found, k))
        return out

    def _kbest(self, words: list[str], entries: Sequence[TagDistribution], k: int) -> KBestTags:
        candidates, preterminals, best_probs = [], [], []
        for token in range(len(words)):
            supertag = _mean([(self._supertag_maps[j], e.supertags[token], e.supertag_log_probs[token])
                              for j, e in enumerate(entries)])
            # a probability that underflowed to 0 cannot be weighted; the best one never does
            top = [item for item in sorted(supertag.items(), key=lambda item: (-item[1], item[0]))[:k]
                   if item[1] > 0.0]
            total = sum(p for _, p in top)
            candidates.append([(self.supertags[i], math.log(total) - math.log(p)) for i, p in top])
            best_probs.append(top[0][1])
            pt = _mean([(self._preterminal_maps[j], e.preterminals[token], e.preterminal_log_probs[token])
                        for j, e in enumerate(entries)])
            preterminals.append(self.preterminals[min(pt, key=lambda i: (-pt[i], i))])
        return KBestTags(words, candidates, preterminals, best_probs)


def _mean(rows: Sequence[tuple[list[int], list[int], list[float]]]) -> dict[int, float]:
    """Mean probability per label over the members' ``(label map, ids, log-probs)`` rows."""
    total: dict[int, float] = {}
    for mapping, ids, log_probs in rows:
        for i, lp in zip(ids, log_probs):
            label = mapping[i]
            total[label] = total.get(label, 0.0) + math.exp(lp)
    count = len(rows)
    return {label: p / count for label, p in total.items()}


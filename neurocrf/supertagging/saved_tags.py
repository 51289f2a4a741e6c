"""Saved supertagger output: tag a corpus once, parse it many times.

A tag file holds, per token, the ``n`` most probable supertags and all preterminals (a few dozen),
sorted, with their log-probabilities, as a supertagger (or an ensemble) computed them. Reading one or several
back gives a :class:`SavedSupertags`, which the parse code takes in place of a model: trying
another ``k``, time limit or evaluation file, or an ensemble of any subset of models, costs
parsing time only::

    neurocrf-parse ckpt_path=seed1.ckpt treebank=alpino split=dev save_tags=seed1.dev.jsonl.gz
    neurocrf-parse ckpt_path=seed2.ckpt treebank=alpino split=dev save_tags=seed2.dev.jsonl.gz
    neurocrf-parse tags='[seed1.dev.jsonl.gz,seed2.dev.jsonl.gz]' treebank=alpino split=dev k=20

Several files are mixed as :class:`~neurocrf.supertagging.ensemble.SupertaggerEnsemble`
mixes models: per token, the mean of the members' probabilities. A supertag outside a member's
saved ``n`` counts as probability 0 from that member, so the mixture is exact where every member
saved all supertags and otherwise off by less than the ``n``-th probability of a member.

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
from torch import Tensor

from neurocrf.supertagging.ensemble import union_labels
from neurocrf.supertagging.source import KBestTags, SupertagScorer, SupertagSource

__all__ = ["FORMAT", "TagDistribution", "SavedSupertags", "tag_distributions", "tag_and_save",
           "tag_file_header", "write_tag_file", "read_tag_file"]

FORMAT = "neurocrf-supertag-distributions"
"""The ``format`` field of a saved-tags file's header."""
VERSION = 1


@dataclass(eq=False)
class TagDistribution:
    """The saved output for one sentence: per token, label ids (best first) and their
    log-probabilities, for supertags (``[T, n]``) and preterminals (``[T, P]``)."""

    id: str
    words: list[str]
    supertags: Tensor  # [T, n] long
    supertag_log_probs: Tensor  # [T, n] float
    preterminals: Tensor  # [T, P] long
    preterminal_log_probs: Tensor  # [T, P] float

    @classmethod
    def empty(cls, sentence_id: str, words: Sequence[str]) -> TagDistribution:
        none = torch.zeros(0, 0)
        return cls(sentence_id, list(words), none.long(), none, none.long(), none)


@torch.no_grad()
def tag_distributions(tagger: SupertagScorer, ids: Sequence[str], sentences: Sequence[Sequence[str]],
                      n: int = 50, batch_size: int = 64) -> list[TagDistribution]:
    """The ``n`` best supertags and all preterminals of every token, with log-probabilities,
    from a :class:`~neurocrf.supertagging.supertagger.Supertagger` or an ensemble. One entry per
    sentence, in input order; an empty sentence gets ``[0, 0]`` tensors."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    n = min(n, len(tagger.supertags))
    out = [TagDistribution.empty(str(i), w) for i, w in zip(ids, sentences)]
    order = sorted((i for i, w in enumerate(sentences) if w), key=lambda i: len(sentences[i]))
    for begin in range(0, len(order), batch_size):
        chunk = order[begin:begin + batch_size]
        log_probs, pt_log_probs = tagger.batch_log_probs([list(sentences[i]) for i in chunk])
        top_lp, top_ids = (t.cpu() for t in log_probs.topk(n, dim=-1))  # [B, T, n]
        pt_lp, pt_ids = (t.cpu() for t in pt_log_probs.sort(dim=-1, descending=True))  # [B, T, P]
        for b, i in enumerate(chunk):
            length = len(sentences[i])
            out[i] = TagDistribution(out[i].id, out[i].words, top_ids[b, :length].clone(),
                                     top_lp[b, :length].clone(), pt_ids[b, :length].clone(),
                                     pt_lp[b, :length].clone())
    return out


def tag_and_save(tagger: SupertagScorer, path: str | Path, ids: Sequence[str], sentences: Sequence[Sequence[str]],
                 *, n: int = 50, batch_size: int = 64, sources: Sequence[str] = ()) -> SavedSupertags:
    """Compute ``tagger``'s distributions over ``sentences`` once (:func:`tag_distributions`),
    write them to the tag file ``path`` with ``sources`` (its checkpoints) in the header, and
    return them read as :class:`SavedSupertags`."""
    distributions = tag_distributions(tagger, ids, sentences, n=n, batch_size=batch_size)
    header = tag_file_header(tagger, distributions, sources)
    path = write_tag_file(path, header, distributions)
    return SavedSupertags([header], [distributions], [str(path)])


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def tag_file_header(tagger: SupertagSource, distributions: Sequence[TagDistribution],
                    sources: Sequence[str] = ()) -> dict[str, Any]:
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
            handle.write(json.dumps({"id": d.id, "words": d.words, "supertags": d.supertags.tolist(),
                                     "supertag_log_probs": _rounded(d.supertag_log_probs),
                                     "preterminals": d.preterminals.tolist(),
                                     "preterminal_log_probs": _rounded(d.preterminal_log_probs)},
                                    ensure_ascii=False) + "\n")
    return path


def _rounded(log_probs: Tensor) -> list[list[float]]:
    """Log-probabilities to 6 decimals (a relative error of 1e-6 in the probabilities; -inf kept)."""
    return [[round(lp, 6) if lp > -math.inf else -1e30 for lp in row] for row in log_probs.tolist()]


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
    sentence_id, words = str(record["id"]), list(record["words"])
    if not words:
        return TagDistribution.empty(sentence_id, words)
    tensors = []
    for ids_key, lp_key, labels in (("supertags", "supertag_log_probs", header["supertags"]),
                                    ("preterminals", "preterminal_log_probs", header["preterminals"])):
        ids, lps = record[ids_key], record[lp_key]
        if len(ids) != len(words) or len(lps) != len(words):
            raise ValueError(f"{where}: {len(words)} words but {len(ids)} rows of {ids_key} and "
                             f"{len(lps)} of {lp_key}")
        width = len(ids[0])
        for token, (row, row_lp) in enumerate(zip(ids, lps)):
            if not row or len(row) != width or len(row_lp) != width:
                raise ValueError(f"{where}: token {token}: {len(row)} {ids_key} ids and {len(row_lp)} "
                                 f"log-probabilities (token 0 has {width})")
        id_tensor = torch.tensor(ids, dtype=torch.long)
        if bool(((id_tensor < 0) | (id_tensor >= len(labels))).any()):
            raise ValueError(f"{where}: a {ids_key} id outside the header's {len(labels)} labels")
        tensors += [id_tensor, torch.tensor(lps, dtype=torch.float)]
    return TagDistribution(sentence_id, words, *tensors)


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
        # member label id -> label id of the union
        self._supertag_maps = [torch.tensor([supertag_ids[t] for t in h["supertags"]]) for h in headers]
        self._preterminal_maps = [torch.tensor([preterminal_ids[t] for t in h["preterminals"]]) for h in headers]

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
        """As :meth:`~neurocrf.supertagging.supertagger.Supertagger.predict_kbest`, from the saved
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
        supertag_probs = self._mean([(self._supertag_maps[j], e.supertags, e.supertag_log_probs)
                                     for j, e in enumerate(entries)], len(self.supertags))
        top_p, top_ids = supertag_probs.topk(min(k, supertag_probs.shape[1]), dim=-1)  # [T, k]
        candidates = []
        for row_p, row_ids in zip(top_p.tolist(), top_ids.tolist()):
            # a probability that underflowed to 0 cannot be weighted; the best one never does
            kept = [(i, p) for i, p in zip(row_ids, row_p) if p > 0.0]
            log_total = math.log(sum(p for _, p in kept))
            candidates.append([(self.supertags[i], log_total - math.log(p)) for i, p in kept])
        preterminal_probs = self._mean([(self._preterminal_maps[j], e.preterminals, e.preterminal_log_probs)
                                        for j, e in enumerate(entries)], len(self.preterminals))
        preterminals = [self.preterminals[i] for i in preterminal_probs.argmax(-1).tolist()]
        return KBestTags(words, candidates, preterminals, top_p[:, 0].tolist())

    @staticmethod
    def _mean(rows: Sequence[tuple[Tensor, Tensor, Tensor]], labels: int) -> Tensor:
        """``[T, labels]``: the mean probability over the members' ``(label map, [T, n] ids,
        [T, n] log-probs)`` (float64, so that one member's probabilities come back unchanged)."""
        total = torch.zeros(rows[0][1].shape[0], labels, dtype=torch.float64)
        for mapping, ids, log_probs in rows:
            total.scatter_add_(1, mapping[ids], log_probs.double().exp())
        return total / len(rows)

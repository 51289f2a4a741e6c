"""Supertag corpora: a treebank read, split and turned into words + supertags + preterminals.

:func:`~neurocrf.parsing.treebank.load_treebank` reads and splits the treebank of a treebank
config (``configs/treebank/*.yaml``; trees as read: the gold standard of evaluation);
:func:`supertag_corpus` extracts one supertag and one preterminal per token from the prepared
trees (:func:`~neurocrf.parsing.supertags.extract_supertags`); :class:`SupertagDataModule`
batches them for the :class:`~neurocrf.supertagging.supertagger.Supertagger`.

The supertag corpus file (:func:`write_supertag_corpus`) is a column file, one token per line::

    word<TAB>supertag<TAB>preterminal

with a blank line after each sentence (supertags contain spaces, never tabs).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, RandomSampler

from neurocrf.data.datamodule import BucketBatchSampler
from neurocrf.parsing import move_punctuation_sentence
from neurocrf.parsing.supertags import extract_supertags
from neurocrf.parsing.tree import TreebankSentence
from neurocrf.parsing.treebank import SPLITS, load_treebank, treebank_options


@dataclass
class SupertagSentence:
    """One sentence of a supertag corpus: ``words``, ``supertags`` and ``preterminals`` ``[n]``,
    and the treebank's per-token ``annotations`` (name -> ``[n]``, targets of auxiliary heads)."""

    id: str
    words: list[str]
    supertags: list[str]
    preterminals: list[str]
    annotations: dict[str, list[str]] = field(default_factory=dict)


# ---------------------------------------------------------------------------- extraction

def prepare_for_extraction(sentence: TreebankSentence, move_punctuation: bool) -> TreebankSentence:
    """The sentence with punctuation re-attached (when asked), as the supertags see it."""
    return move_punctuation_sentence(sentence) if move_punctuation else sentence


def supertag_corpus(sentences: Sequence[TreebankSentence], *, move_punctuation: bool = True,
                    h: int = 0, v: int = 1) -> tuple[list[SupertagSentence], set[str]]:
    """Supertags and preterminals of every sentence, and the root labels of the prepared trees.

    Raises ValueError naming the sentence when a tree cannot be turned into supertags."""
    corpus: list[SupertagSentence] = []
    roots: set[str] = set()
    for sentence in sentences:
        sentence = prepare_for_extraction(sentence, move_punctuation)
        extracted = extract_supertags(sentence, h=h, v=v)
        roots.add(extracted.root)
        corpus.append(SupertagSentence(sentence.id, list(sentence.words), extracted.tags,
                                       extracted.preterminals, dict(sentence.annotations)))
    return corpus, roots


def corpus_statistics(corpora: Mapping[str, Sequence[SupertagSentence]],
                      treebanks: Mapping[str, Sequence[TreebankSentence]] | None = None) -> dict[str, Any]:
    """Plain-value statistics of the split supertag corpora (JSON-ready).

    Per split: sentences, tokens, distinct supertags and preterminals; for dev/test also the
    supertags not seen in train (distinct and token share). Overall: the same on all splits,
    plus ``discontinuity_rate`` (share of sentences whose tree has a discontinuous constituent)
    and ``max_fanout`` of the trees in ``treebanks`` (when given; pass them with punctuation
    moved to measure what the supertags see)."""
    train_counts = Counter(t for s in corpora.get("train", ()) for t in s.supertags)
    train_tags = set(train_counts)
    train_pts = {p for s in corpora.get("train", ()) for p in s.preterminals}
    stats: dict[str, Any] = {}
    all_tags: Counter[str] = Counter()
    all_pts: Counter[str] = Counter()
    for split, sentences in corpora.items():
        tags = Counter(t for s in sentences for t in s.supertags)
        pts = Counter(p for s in sentences for p in s.preterminals)
        all_tags.update(tags)
        all_pts.update(pts)
        entry: dict[str, Any] = {
            "sentences": len(sentences),
            "tokens": sum(tags.values()),
            "supertags": len(tags),
            "preterminals": len(pts),
        }
        if split != "train":
            unseen = {t: c for t, c in tags.items() if t not in train_tags}
            entry["unseen_supertags"] = len(unseen)
            entry["unseen_supertag_tokens"] = sum(unseen.values())
            entry["unseen_supertag_rate"] = sum(unseen.values()) / max(sum(tags.values()), 1)
            entry["unseen_preterminals"] = len([p for p in pts if p not in train_pts])
        stats[split] = entry
    stats["total"] = {
        "sentences": sum(e["sentences"] for e in stats.values()),
        "tokens": sum(all_tags.values()),
        "supertags": len(all_tags),
        "preterminals": len(all_pts),
        "supertags_only_in_dev_test": len([t for t in all_tags if t not in train_tags]),
        "singleton_supertags_train": sum(1 for c in train_counts.values() if c == 1),
    }
    if treebanks is not None:
        trees = [s.tree for split in treebanks.values() for s in split]
        discontinuous = sum(any(node.fanout() > 1 for node in tree.subtrees()) for tree in trees)
        stats["total"]["discontinuity_rate"] = discontinuous / max(len(trees), 1)
        stats["total"]["max_fanout"] = max((node.fanout() for tree in trees for node in tree.subtrees()),
                                           default=1)
    return stats


def write_supertag_corpus(path: str | Path, sentences: Sequence[SupertagSentence]) -> None:
    """Write ``word<TAB>supertag<TAB>preterminal`` lines, a blank line after each sentence."""
    from neurocrf.data.conll import Sentence, write_conll

    rows = [Sentence(tokens=s.words, tags=s.supertags) for s in sentences]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_conll(path, rows, extra_tag_columns={"preterminal": [s.preterminals for s in sentences]},
                docstart=None)


def read_supertag_corpus(path: str | Path) -> list[SupertagSentence]:
    """Read a file written by :func:`write_supertag_corpus` (ids: 0-based sentence numbers).

    Raises ``neurocrf.data.conll.ConllFormatError`` naming file and line on a malformed line."""
    from neurocrf.data.conll import read_conll

    rows = read_conll(path, token_column=0, tag_column=1, delimiter="\t", docstart=None,
                      min_columns=3)
    return [SupertagSentence(str(i), list(r.tokens), list(r.tags or []),
                             [columns[2] for columns in (r.columns or [])])
            for i, r in enumerate(rows)]


def teacher_distributions(paths: Sequence[str], corpus: Sequence[SupertagSentence],
                          supertags: Sequence[str]) -> list[tuple[Tensor, Tensor]]:
    """A teacher's supertag distributions over ``corpus``, for knowledge distillation.

    ``paths``: tag files (:mod:`neurocrf.supertagging.saved_tags`) holding every sentence of
    ``corpus``; several are mixed like an ensemble. Per sentence: ids into ``supertags`` ``[T, n]``
    and their probabilities ``[T, n]`` (the teacher's ``n`` best, tags the student does not have
    dropped, renormalised to sum to 1; padding id -1, probability 0)."""
    from neurocrf.supertagging.saved_tags import SavedSupertags

    teacher = SavedSupertags.read(list(paths))
    n = teacher.max_k
    index = {tag: i for i, tag in enumerate(supertags)}
    try:
        kbest = teacher.predict_kbest([s.words for s in corpus], k=n)
    except ValueError as error:
        raise ValueError(f"teacher tags (data.teacher): {error}") from None
    out = []
    for tags in kbest:
        ids = torch.full((len(tags.tokens), n), -1, dtype=torch.long)
        probs = torch.zeros(len(tags.tokens), n)
        for token, candidates in enumerate(tags.candidates):
            kept = [(index[t], math.exp(-w)) for t, w in candidates if t in index]
            total = sum(p for _, p in kept)
            for j, (tag_id, p) in enumerate(kept):
                ids[token, j] = tag_id
                probs[token, j] = p / total
        out.append((ids, probs))
    return out


# ---------------------------------------------------------------------------- data module

class SupertagDataModule(pl.LightningDataModule):
    """Batches of a supertag corpus built from a treebank config.

    ``setup`` reads and splits the treebank, extracts the supertags, and fixes the label lists
    from the training split: ``supertags`` and ``preterminals`` (most frequent first, ties
    alphabetical), ``roots`` (root labels of the prepared training trees, for the parser) and
    ``auxiliary_labels`` (name -> labels of each per-token annotation named in ``auxiliary``,
    e.g. ``function``: targets of auxiliary heads; the treebank's reader must provide them).
    Dev/test labels unseen in training get id -1: ignored by the loss, always wrong in accuracy.

    Batches are dicts: ``tokens`` (list of word lists), ``supertags`` / ``preterminals``
    LongTensor ``[B, T]`` (-1 for padding and unknown labels), ``auxiliary`` (name -> LongTensor
    ``[B, T]``, the same way), ``mask`` BoolTensor ``[B, T]``, ``index`` LongTensor ``[B]``
    (position in the split), ``inputs`` (the input builder's tensors, see
    :meth:`set_input_builder`); training batches also ``teacher_ids`` LongTensor ``[B, T, n]``
    and ``teacher_probs`` FloatTensor ``[B, T, n]`` when ``teacher`` names saved tag files of the
    training split (:func:`teacher_distributions`; knowledge distillation, ``heads.distill``).
    """

    def __init__(self, treebank: Mapping[str, Any], batch_size: int = 32, eval_batch_size: int = 64,
                 num_workers: int = 0, seed: int = 0, bucket: bool = True,
                 auxiliary: Sequence[str] = (), teacher: str | Sequence[str] | None = None) -> None:
        super().__init__()
        self.treebank_config = treebank_options(treebank)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size)
        self.num_workers = int(num_workers)
        self.seed = int(seed)
        self.bucket = bool(bucket)
        self.auxiliary = list(auxiliary)
        self.auxiliary_labels: dict[str, list[str]] = {}
        self.teacher = [teacher] if isinstance(teacher, str) else list(teacher or [])
        self.teacher_train: list[tuple[Tensor, Tensor]] | None = None
        self.treebanks: dict[str, list[TreebankSentence]] = {}
        self.corpora: dict[str, list[SupertagSentence]] = {}
        self.supertags: list[str] = []
        self.preterminals: list[str] = []
        self.roots: list[str] = []
        self.input_builder: Callable[[list[list[str]]], dict[str, Tensor]] | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.corpora:
            return
        options = self.treebank_config
        self.treebanks = load_treebank(options)
        roots: set[str] = set()
        for split in SPLITS:
            corpus, split_roots = supertag_corpus(self.treebanks[split],
                                                  move_punctuation=bool(options["move_punctuation"]),
                                                  h=int(options["h"]), v=int(options["v"]))
            self.corpora[split] = corpus
            if split == "train":
                roots = split_roots
        if not self.corpora["train"]:
            raise ValueError(f"treebank {options['path']}: the training split is empty")
        self.supertags = _by_frequency(t for s in self.corpora["train"] for t in s.supertags)
        self.preterminals = _by_frequency(p for s in self.corpora["train"] for p in s.preterminals)
        self.roots = sorted(roots)
        for name in self.auxiliary:
            for split in SPLITS:
                for s in self.corpora[split]:
                    if name not in s.annotations:
                        raise ValueError(
                            f"treebank {options['path']}, sentence {s.id}: an auxiliary head needs the "
                            f"per-token annotation {name!r}, which this treebank does not provide "
                            f"(it has: {sorted(s.annotations) or 'none'}; format {options['format']})")
            self.auxiliary_labels[name] = _by_frequency(a for s in self.corpora["train"]
                                                        for a in s.annotations[name])
        if self.teacher:
            self.teacher_train = teacher_distributions(self.teacher, self.corpora["train"], self.supertags)

    def summary(self) -> dict[str, Any]:
        """Sentences per split and label counts (plain values)."""
        return {**{f"{split}_sentences": len(self.corpora.get(split, [])) for split in SPLITS},
                "supertags": len(self.supertags), "preterminals": len(self.preterminals),
                "roots": list(self.roots),
                **{f"auxiliary_{name}": len(labels) for name, labels in self.auxiliary_labels.items()}}

    def set_input_builder(self, builder: Callable[[list[list[str]]], dict[str, Tensor]]) -> None:
        """``tokens -> encoder inputs`` (the encoder's ``preparer``), run in the collate step."""
        self.input_builder = builder

    def gold_treebank(self, split: str) -> list[TreebankSentence]:
        """The trees of ``split`` as read (the gold standard of parse evaluation)."""
        return self.treebanks[split]

    # -------------------------------------------------------------- loaders
    def train_dataloader(self) -> DataLoader:
        return self.dataloader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.dataloader("dev")

    def test_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        """Batches of ``split``: in order, or shuffled (``shuffle``) and of similar lengths unless
        ``bucket`` is false (:class:`~neurocrf.data.datamodule.BucketBatchSampler`)."""
        if split not in self.corpora:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS} (call setup first)")
        collate = SupertagCollator(self.supertags, self.preterminals, self.input_builder,
                                   self.auxiliary_labels, self.teacher_train if split == "train" else None)
        corpus = self.corpora[split]
        dataset = _Indexed(corpus)
        if not shuffle:
            return DataLoader(dataset, batch_size=self.eval_batch_size, shuffle=False,
                              num_workers=self.num_workers, collate_fn=collate)
        generator = torch.Generator().manual_seed(self.seed)
        if not self.bucket:
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, generator=generator,
                              num_workers=self.num_workers, collate_fn=collate)
        # the BatchSampler signature lets Lightning put a DistributedSampler in under DDP
        sampler = BucketBatchSampler(RandomSampler(dataset, generator=generator), self.batch_size, False,
                                     lengths=[len(s.words) for s in corpus], seed=self.seed)
        return DataLoader(dataset, batch_sampler=sampler, num_workers=self.num_workers, collate_fn=collate)


class _Indexed(torch.utils.data.Dataset):
    """``i -> (i, sentence)``, so that batches know their sentences' positions."""

    def __init__(self, corpus: Sequence[SupertagSentence]) -> None:
        self.corpus = corpus

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, i: int) -> tuple[int, SupertagSentence]:
        return i, self.corpus[i]


def _by_frequency(items: Any) -> list[str]:
    counts = Counter(items)
    return sorted(counts, key=lambda item: (-counts[item], item))


class SupertagCollator:
    """Sentences -> a batch dict (see :class:`SupertagDataModule`)."""

    def __init__(self, supertags: Sequence[str], preterminals: Sequence[str],
                 input_builder: Callable[[list[list[str]]], dict[str, Tensor]] | None,
                 auxiliary_labels: Mapping[str, Sequence[str]] | None = None,
                 teacher: Sequence[tuple[Tensor, Tensor]] | None = None) -> None:
        self.supertag_ids = {t: i for i, t in enumerate(supertags)}
        self.preterminal_ids = {p: i for i, p in enumerate(preterminals)}
        self.auxiliary_ids = {name: {a: i for i, a in enumerate(labels)}
                              for name, labels in (auxiliary_labels or {}).items()}
        self.input_builder = input_builder
        self.teacher = teacher  # per sentence of the split: ([T, n] ids, [T, n] probabilities)

    def __call__(self, items: Sequence[tuple[int, SupertagSentence]]) -> dict[str, Any]:
        index = [i for i, _ in items]
        sentences = [s for _, s in items]
        width = max((len(s.words) for s in sentences), default=0)
        batch = len(sentences)
        supertags = torch.full((batch, width), -1, dtype=torch.long)
        preterminals = torch.full((batch, width), -1, dtype=torch.long)
        mask = torch.zeros(batch, width, dtype=torch.bool)
        auxiliary = {name: torch.full((batch, width), -1, dtype=torch.long) for name in self.auxiliary_ids}
        for b, s in enumerate(sentences):
            n = len(s.words)
            mask[b, :n] = True
            supertags[b, :n] = torch.tensor([self.supertag_ids.get(t, -1) for t in s.supertags], dtype=torch.long)
            preterminals[b, :n] = torch.tensor([self.preterminal_ids.get(p, -1) for p in s.preterminals],
                                               dtype=torch.long)
            for name, ids in self.auxiliary_ids.items():
                auxiliary[name][b, :n] = torch.tensor([ids.get(a, -1) for a in s.annotations[name]],
                                                      dtype=torch.long)
        tokens = [list(s.words) for s in sentences]
        out = {
            "tokens": tokens,
            "supertags": supertags,
            "preterminals": preterminals,
            "auxiliary": auxiliary,
            "mask": mask,
            "index": torch.tensor(list(index), dtype=torch.long),
            "inputs": self.input_builder(tokens) if self.input_builder is not None else {},
        }
        if self.teacher is not None:
            n = self.teacher[0][0].shape[1] if self.teacher else 1
            out["teacher_ids"] = torch.full((batch, width, n), -1, dtype=torch.long)
            out["teacher_probs"] = torch.zeros(batch, width, n)
            for b, i in enumerate(index):
                ids, probs = self.teacher[i]
                out["teacher_ids"][b, :ids.shape[0]] = ids
                out["teacher_probs"][b, :probs.shape[0]] = probs
        return out

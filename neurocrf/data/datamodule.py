"""A LightningDataModule for sequence labeling corpora in column format.

Batches are plain dicts (:class:`Batch`)::

    tokens  list[list[str]]      the words of each sentence
    tags    LongTensor [B, T]     tag ids in the model scheme, -1 at padding (and if unlabeled)
    mask    BoolTensor [B, T]     True at real tokens
    index   LongTensor [B]        position of each sentence in its split
    inputs  dict[str, Tensor]     whatever the encoder's input builder makes of ``tokens``

Training batches group sentences of similar length (:class:`BucketBatchSampler`); evaluation
batches keep the file order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler

from neurocrf.conventions import SPLITS
from neurocrf.data.conll import ConllFormatError, Sentence, read_conll
from neurocrf.data.sample import ensure_sample_corpus
from neurocrf.data.schemes import (
    all_tags,
    check_scheme,
    convert_tags,
    get_spans,
    spans_to_tags,
    tag_types,
)
from neurocrf.data.splits import hold_out, split_by_fractions
from neurocrf.values import to_plain

InputBuilder = Callable[[list[list[str]]], dict[str, Tensor]]


class Batch(TypedDict):
    tokens: list[list[str]]
    tags: Tensor
    mask: Tensor
    index: Tensor
    inputs: dict[str, Tensor]


class SentenceDataset(Dataset):
    """Items ``(index, tokens, tag_ids or None)`` of a list of sentences."""

    def __init__(self, sentences: Sequence[Sentence], tag_to_id: Mapping[str, int]) -> None:
        self.sentences = list(sentences)
        self.tag_ids: list[list[int] | None] = []
        for sentence in self.sentences:
            if sentence.tags is None:
                self.tag_ids.append(None)
            else:
                self.tag_ids.append([tag_to_id[tag] for tag in sentence.tags])

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, index: int) -> tuple[int, list[str], list[int] | None]:
        return index, self.sentences[index].tokens, self.tag_ids[index]

    @property
    def lengths(self) -> list[int]:
        return [len(sentence.tokens) for sentence in self.sentences]


class _BuilderSlot:
    """Shared, replaceable reference to the input builder (set by the model after the loaders)."""

    def __init__(self) -> None:
        self.fn: InputBuilder | None = None


class Collator:
    """Pads a list of dataset items into a :class:`Batch`."""

    def __init__(self, slot: _BuilderSlot) -> None:
        self.slot = slot

    def __call__(self, items: Sequence[tuple[int, list[str], list[int] | None]]) -> Batch:
        batch_size = len(items)
        width = max(len(tokens) for _, tokens, _ in items)
        lengths = torch.tensor([len(tokens) for _, tokens, _ in items], dtype=torch.long)
        mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
        # one tensor from padded lists: a tensor per row costs more than the rest of the batch
        rows = [(tag_ids if tag_ids is not None else []) for _, _, tag_ids in items]
        tags = torch.tensor([row + [-1] * (width - len(row)) for row in rows], dtype=torch.long)
        tags = tags.view(batch_size, width)
        tokens = [list(tokens) for _, tokens, _ in items]
        inputs = self.slot.fn(tokens) if self.slot.fn is not None else {}
        return Batch(
            tokens=tokens,
            tags=tags,
            mask=mask,
            index=torch.tensor([index for index, _, _ in items], dtype=torch.long),
            inputs=inputs,
        )


class BucketBatchSampler(BatchSampler):
    """Batches of sentences of similar length, in a shuffled order.

    Takes the indices of ``sampler`` (a shuffling or distributed sampler) in pools of
    ``pool_batches * batch_size``, sorts each pool by length, cuts it into batches and shuffles
    all batches (a fresh seeded order each epoch). Every index of ``sampler`` is in exactly one
    batch. It follows the ``BatchSampler`` signature so Lightning can swap in a distributed
    sampler.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Sequence[int],
        batch_size: int,
        drop_last: bool = False,
        *,
        lengths: Sequence[int],
        pool_batches: int = 50,
        seed: int = 0,
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        if pool_batches < 1:
            raise ValueError(f"pool_batches must be >= 1, got {pool_batches}")
        self.lengths = list(lengths)
        self.pool_batches = pool_batches
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        indices = list(self.sampler)
        pool = self.batch_size * self.pool_batches
        batches: list[list[int]] = []
        for start in range(0, len(indices), pool):
            chunk = sorted(indices[start : start + pool], key=self.lengths.__getitem__)
            size = self.batch_size
            batches.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
        if self.drop_last:
            batches = [batch for batch in batches if len(batch) == self.batch_size]
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        for position in torch.randperm(len(batches), generator=generator).tolist():
            yield batches[position]


class SequenceDataModule(pl.LightningDataModule):
    """Train/dev/test column files -> padded, bucketed batches of tag ids.

    Args:
        train_path, dev_path, test_path: column files (dev/test may be None; see the splits).
        file_scheme: tag scheme of the files (validated on reading).
        scheme: tag scheme of the model; tags are converted to it.
        reader: keyword arguments of :func:`~neurocrf.data.conll.read_conll` (columns, ...).
        batch_size, eval_batch_size: sentences per training / evaluation batch.
        bucket: group training sentences of similar length (else plain shuffling).
        num_workers: DataLoader worker processes.
        sample_dir: if set, the built-in sample corpus is generated there when needed, and
            missing (None) paths default to its files.
        sample_seed: seed of the generated sample corpus.
        dev_fraction: hold out the last fraction of the training documents (of sentences, if the
            file has no document separators) as dev; needs ``dev_path=None``.
        split_fractions: ``(train, dev, test)`` fractions to split ``train_path`` by sentence
            index (first part train, then dev, then test); needs dev/test paths None.
        seed: seed of the training order.
        pool_batches: batches per sorting pool of the bucketing sampler.
        token_columns: columns joined with a tab into each token the encoder sees (e.g. ``[0, 1]``
            for word and POS, read by the feature templates ``col1[...]``); default: the word only.
        keep_types: keep only spans of these types in every split, the others become ``O``
            (e.g. ``["NP"]``: base-NP chunking on CoNLL-2000); default: all types.

    After :meth:`setup`: ``tags`` (``"O"`` first, then sorted; every tag of ``scheme`` for each
    type seen in train), ``tag_to_id``, ``train_sentences``, ``dev_sentences``,
    ``test_sentences``. A dev/test tag whose type does not occur in train raises
    ConllFormatError naming file and line.
    """

    def __init__(
        self,
        train_path: str | os.PathLike[str] | None = None,
        dev_path: str | os.PathLike[str] | None = None,
        test_path: str | os.PathLike[str] | None = None,
        *,
        file_scheme: str = "IOB2",
        scheme: str = "BIOES",
        reader: Mapping[str, Any] | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 64,
        bucket: bool = True,
        num_workers: int = 0,
        sample_dir: str | os.PathLike[str] | None = None,
        sample_seed: int = 13,
        dev_fraction: float | None = None,
        split_fractions: Sequence[float] | None = None,
        seed: int | None = 0,
        pool_batches: int = 50,
        token_columns: Sequence[int] | None = None,
        keep_types: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.keep_types = None if keep_types is None else {str(t) for t in keep_types}
        if self.keep_types is not None and not self.keep_types:
            raise ValueError("keep_types is empty: nothing would be left to tag")
        self.token_columns = None if token_columns is None else [int(c) for c in token_columns]
        self.file_scheme = check_scheme(file_scheme)
        self.scheme = check_scheme(scheme)
        self.reader = dict(to_plain(reader, "reader") or {})
        self.paths: dict[str, str | None] = {
            "train": _optional_path(train_path),
            "dev": _optional_path(dev_path),
            "test": _optional_path(test_path),
        }
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError("batch_size and eval_batch_size must be >= 1")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.bucket = bucket
        self.num_workers = num_workers
        self.sample_dir = _optional_path(sample_dir)
        self.sample_seed = sample_seed
        self.dev_fraction = dev_fraction
        self.split_fractions = None if split_fractions is None else list(split_fractions)
        self.seed = 0 if seed is None else int(seed)  # Hydra configs may say `seed: null`
        self.pool_batches = pool_batches
        self._check_split_options()
        self._slot = _BuilderSlot()
        self.tags: list[str] = []
        self.tag_to_id: dict[str, int] = {}
        self.splits: dict[str, list[Sentence] | None] = {split: None for split in SPLITS}

    @classmethod
    def from_sentences(
        cls,
        train: Sequence[Sentence],
        dev: Sequence[Sentence] | None = None,
        test: Sequence[Sentence] | None = None,
        **options: Any,
    ) -> SequenceDataModule:
        """A data module over in-memory sentences (tags in ``file_scheme``); no files read."""
        module = cls(**options)
        module._load({"train": list(train), "dev": _maybe_list(dev), "test": _maybe_list(test)})
        return module

    def _check_split_options(self) -> None:
        if self.split_fractions is not None:
            if len(self.split_fractions) != 3 or any(f < 0 for f in self.split_fractions):
                raise ValueError(
                    f"split_fractions must be 3 non-negative numbers, got {self.split_fractions}"
                )
            if not math.isclose(sum(self.split_fractions), 1.0, abs_tol=1e-6):
                raise ValueError(f"split_fractions must sum to 1, got {self.split_fractions}")
            if self.paths["dev"] or self.paths["test"] or self.dev_fraction:
                raise ValueError(
                    "split_fractions splits train_path: leave dev_path, test_path"
                    " and dev_fraction unset"
                )
        if self.dev_fraction is not None:
            if not 0 < self.dev_fraction < 1:
                raise ValueError(f"dev_fraction must be in (0, 1), got {self.dev_fraction}")
            if self.paths["dev"]:
                raise ValueError("dev_fraction holds dev out of train: leave dev_path unset")

    # ---- Lightning hooks ------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self.sample_dir is not None and self._needs_sample():
            ensure_sample_corpus(self.sample_dir, seed=self.sample_seed)

    def setup(self, stage: str | None = None) -> None:
        """Read (once) the files, convert their tags to ``scheme`` and build the tag list."""
        if self.splits["train"] is not None:
            return
        if self.sample_dir is not None and self._needs_sample():
            sample = ensure_sample_corpus(self.sample_dir, seed=self.sample_seed)
            for split in SPLITS:
                if self.paths[split] is None and not self._derived(split):
                    self.paths[split] = str(sample[split])
        if self.paths["train"] is None:
            raise ValueError("SequenceDataModule needs train_path (or sample_dir)")
        options = {"scheme": self.file_scheme, **self.reader}
        loaded: dict[str, list[Sentence] | None] = {}
        for split, path in self.paths.items():
            loaded[split] = None if path is None else read_conll(path, **options)
        self._load(loaded)

    def _needs_sample(self) -> bool:
        for split, path in self.paths.items():
            if path is None and not self._derived(split):
                return True
            if path is not None and not Path(path).exists():
                return True
        return False

    def _derived(self, split: str) -> bool:
        """Whether ``split`` is cut out of the training file."""
        if self.split_fractions is not None:
            return split in SPLITS[1:]
        return split == "dev" and self.dev_fraction is not None

    def _load(self, loaded: dict[str, list[Sentence] | None]) -> None:
        train = loaded["train"]
        if not train:
            raise ValueError("the training split is empty")
        if self.split_fractions is not None:
            loaded = split_by_fractions(train, self.split_fractions)
        elif self.dev_fraction is not None:
            loaded = {**loaded, **hold_out(train, self.dev_fraction)}
        for split, sentences in loaded.items():
            loaded[split] = None if sentences is None else [self._convert(s) for s in sentences]
        train = loaded["train"]
        assert train is not None
        unlabeled = next((s for s in train if s.tags is None), None)
        if unlabeled is not None:
            raise ConllFormatError(f"{unlabeled.location()}: training sentences need tags")
        if self.keep_types is not None:
            missing = self.keep_types - tag_types(t for s in train for t in s.tags or ())
            if missing:
                raise ValueError(f"keep_types names {sorted(missing)}, which never occur in the training data"
                                 f" ({self.paths['train']})")
            for split, sentences in loaded.items():
                loaded[split] = None if sentences is None else [self._keep_types(s) for s in sentences]
            train = loaded["train"]
        self.tags = all_tags(tag_types(t for s in train for t in s.tags or ()), self.scheme)
        self.tag_to_id = {tag: i for i, tag in enumerate(self.tags)}
        for split in SPLITS[1:]:
            for sentence in loaded[split] or ():
                self._check_known(sentence, split)
        self.splits = loaded

    def _convert(self, sentence: Sentence) -> Sentence:
        if self.token_columns is not None:
            sentence = dataclasses.replace(sentence, tokens=sentence.joined_columns(self.token_columns))
        if sentence.tags is None or self.file_scheme == self.scheme:
            return sentence
        return dataclasses.replace(
            sentence, tags=convert_tags(sentence.tags, self.file_scheme, self.scheme)
        )

    def _keep_types(self, sentence: Sentence) -> Sentence:
        if sentence.tags is None:
            return sentence
        kept = [span for span in get_spans(sentence.tags, self.scheme) if span.type in self.keep_types]
        return dataclasses.replace(sentence, tags=spans_to_tags(kept, len(sentence.tags), self.scheme))

    def _check_known(self, sentence: Sentence, split: str) -> None:
        for position, tag in enumerate(sentence.tags or ()):
            if tag not in self.tag_to_id:
                raise ConllFormatError(
                    f"{sentence.location(position)}: {split} tag {tag!r} ({self.scheme}) has a type"
                    f" that never occurs in the training data ({self.paths['train']});"
                    f" known tags: {', '.join(self.tags)}"
                )

    # ---- access -----------------------------------------------------------------------------

    @property
    def num_tags(self) -> int:
        return len(self.tags)

    @property
    def train_sentences(self) -> list[Sentence]:
        return self._split("train")

    @property
    def dev_sentences(self) -> list[Sentence]:
        return self._split("dev")

    @property
    def test_sentences(self) -> list[Sentence]:
        return self._split("test")

    def _split(self, split: str) -> list[Sentence]:
        if self.splits["train"] is None:
            raise RuntimeError("call setup() first")
        sentences = self.splits[split]
        if sentences is None:
            raise RuntimeError(f"this data module has no {split} split")
        return sentences

    def has_split(self, split: str) -> bool:
        return self.splits.get(split) is not None

    def summary(self) -> dict[str, Any]:
        """Plain counts (sentences, tokens per split; the tag list) for logging."""
        counts: dict[str, Any] = {"tags": list(self.tags), "scheme": self.scheme}
        for split, sentences in self.splits.items():
            if sentences is not None:
                counts[f"{split}_sentences"] = len(sentences)
                counts[f"{split}_tokens"] = sum(len(s.tokens) for s in sentences)
        return counts

    def set_input_builder(self, fn: InputBuilder | None) -> None:
        """Set the function that turns a batch's tokens into encoder inputs (``Batch.inputs``):
        the encoder's preparer (``model.encoder.preparer``), a small picklable object.

        Applies to every loader of this module, also ones created before the call. A bound method
        of a torch module (``model.encoder.prepare``) works but warns: DataLoader worker processes
        would each receive a copy of the whole module with its weights.
        """
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            warnings.warn(
                f"set_input_builder got the bound method {type(owner).__name__}.{getattr(fn, '__name__', '?')},"
                " which carries the whole module into DataLoader workers; pass the encoder's preparer"
                " (model.encoder.preparer)",
                stacklevel=2,
            )
        self._slot.fn = fn

    # ---- loaders ----------------------------------------------------------------------------

    def dataloader(
        self, sentences: Sequence[Sentence], batch_size: int | None = None
    ) -> DataLoader:
        """An evaluation-style loader (file order) over any sentences (tags optional)."""
        dataset = SentenceDataset(sentences, self._tag_lookup())
        return self._loader(dataset, batch_size=batch_size or self.eval_batch_size)

    def train_dataloader(self) -> DataLoader:
        dataset = SentenceDataset(self.train_sentences, self.tag_to_id)
        generator = torch.Generator().manual_seed(self.seed)
        if not self.bucket:
            return self._loader(
                dataset, batch_size=self.batch_size, shuffle=True, generator=generator
            )
        sampler = BucketBatchSampler(
            RandomSampler(dataset, generator=generator),
            self.batch_size,
            False,
            lengths=dataset.lengths,
            pool_batches=self.pool_batches,
            seed=self.seed,
        )
        return self._loader(dataset, batch_sampler=sampler)

    def val_dataloader(self) -> DataLoader | list:
        """The dev loader; no loader (validation skipped) when there is no dev split."""
        return self.dataloader(self.dev_sentences) if self.has_split("dev") else []

    def test_dataloader(self) -> DataLoader:
        return self.dataloader(self.test_sentences)

    def predict_dataloader(self) -> DataLoader:
        return self.dataloader(self.test_sentences)

    def _tag_lookup(self) -> Mapping[str, int]:
        if not self.tag_to_id:
            raise RuntimeError("call setup() first")
        return _StrictTags(self.tag_to_id)

    def _loader(self, dataset: SentenceDataset, **options: Any) -> DataLoader:
        return DataLoader(
            dataset,
            collate_fn=Collator(self._slot),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            **options,
        )


class _StrictTags(dict):
    """tag -> id, with an error naming the tag list for an unknown tag."""

    def __missing__(self, tag: str) -> int:
        raise KeyError(f"tag {tag!r} is not one of the model's tags {list(self)}")


def _optional_path(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.fspath(path)


def _maybe_list(sentences: Sequence[Sentence] | None) -> list[Sentence] | None:
    return None if sentences is None else list(sentences)

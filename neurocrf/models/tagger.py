"""The sequence tagger: an encoder, a projection to tag scores, and a CRF or softmax head.

::

    words --encoder--> [B, T, H] --dropout, linear--> emissions [B, T, L] --head--> loss / tags

(The feature encoder emits scores itself, no projection; with label-pair features they are pair
emissions ``[B, T, L + 1, L]`` for the first-order CRF.)

Everything the model is built from is a plain value (dicts, lists, strings, numbers), saved as
hyperparameters, so a checkpoint loads with ``torch.load(path, weights_only=True)`` and
:meth:`Tagger.load` rebuilds the model without the training config or corpus.

>>> tagger = Tagger.load("logs/train/runs/.../checkpoints/last.ckpt")      # doctest: +SKIP
>>> [p.spans for p in tagger.predict(["Peter lives in Berlin"])]           # doctest: +SKIP
[[PredictedSpan(type='PER', start=0, end=1, confidence=0.98), ...]]
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from neurocrf.encoders import build_encoder
from neurocrf.models.checkpoints import TAGGER, load_module
from neurocrf.models.heads import build_head
from neurocrf.models.lbfgs import FullBatchLBFGS
from neurocrf.models.metrics import SpanScores, span_scores, write_report, write_tag_rows
from neurocrf.models.optim import (
    DEFAULT_LBFGS_SIGMA2,
    configure_optimizers,
    is_full_batch,
    l2_penalty,
)
from neurocrf.models.prediction import NBestPath, Prediction, build_predictions
from neurocrf.models.records import Record, dedupe_records, pad_records, unpad_records
from neurocrf.structs import SecondOrderCRF

log = logging.getLogger(__name__)

OUTSIDE = "O"
PREDICT_PRECISIONS = ("32", "bf16")


class LBFGSNotConvergedWarning(UserWarning):
    """A full-batch L-BFGS run stopped before its convergence test passed."""


def plain(value: Any, where: str = "value") -> Any:
    """A copy of ``value`` made of dicts (str keys), lists, str, int, float, bool and None only.

    OmegaConf containers, tuples, paths and numpy scalars are converted; anything else raises
    TypeError naming where it sits, because it would break ``weights_only`` checkpoint loading.
    """
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} is not a string")
            out[key] = plain(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
        return value.item()
    raise TypeError(f"{where}: {type(value).__name__} is not a plain value (dict, list, str, number)")


class Tagger(pl.LightningModule):
    """Encoder + projection + CRF (first order, second order, precursor) or softmax head.

    Args:
        encoder: encoder config, ``name`` in {bilstm, transformer, features} plus its options.
        head: ``kind`` in {softmax, first_order, second_order, precursor}; ``constrained``
            (default true: scheme-invalid transitions are forbidden), ``dropout`` before the
            projection (default 0.5), ``reduction`` of the training loss (default ``mean`` over
            sentences; ``sum`` with L-BFGS), and CRF options (``memory``, ``state_bias`` ...).
        tags: the tag list (ids index it); scheme: its scheme (IOB1, IOB2, BIOES).
        vocabularies: from :func:`neurocrf.encoders.build_vocabularies` (plain values).
        optimizer, scheduler: see :mod:`neurocrf.models.optim`.
        config: the resolved run config, kept in the checkpoint for the record (optional).
        restore: the weights will come from a checkpoint: the encoder skips reading pretrained
            weights / vectors (not a hyperparameter; :meth:`load` sets it).
    """

    def __init__(
        self,
        encoder: dict[str, Any],
        head: dict[str, Any],
        tags: list[str],
        scheme: str,
        vocabularies: dict[str, Any],
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        restore: bool = False,
    ) -> None:
        super().__init__()
        hparams = {
            "encoder": plain(encoder, "encoder"),
            "head": plain(head, "head"),
            "tags": plain(tags, "tags"),
            "scheme": scheme,
            "vocabularies": plain(vocabularies, "vocabularies"),
            "optimizer": plain(optimizer or {"name": "adam", "lr": 1e-3}, "optimizer"),
            "scheduler": plain(scheduler, "scheduler"),
            "config": plain(config, "config"),
        }
        # The vocabularies can be large: loggers get the run config from the CLI instead.
        self.save_hyperparameters(hparams, logger=False)
        if len(set(tags)) != len(tags) or not tags:
            raise ValueError(f"tags must be a non-empty list without duplicates, got {tags}")
        if all(tag == OUTSIDE for tag in tags):
            raise ValueError(
                f"the tag list {list(tags)} holds no entity tag: the training data has no entities,"
                " so there is nothing to learn and span F1 is undefined; check the tag column"
            )
        self.tags: list[str] = list(tags)
        self.scheme = scheme
        self.optimizer_config: dict[str, Any] = hparams["optimizer"]
        self.scheduler_config: dict[str, Any] | None = hparams["scheduler"]
        head_config: dict[str, Any] = hparams["head"]
        # Full batch (L-BFGS): one optimizer step sees the whole training set, chunked inside its
        # closure; the objective is the summed NLL plus the Gaussian prior (MALLET, CRFsuite).
        self.full_batch = is_full_batch(self.optimizer_config)
        self.automatic_optimization = not self.full_batch
        self.reduction = head_config.get("reduction", "sum" if self.full_batch else "mean")
        if self.full_batch and self.reduction != "sum":
            raise ValueError(
                f"full-batch L-BFGS minimises the summed NLL; head.reduction must be 'sum', got"
                f" {self.reduction!r}"
            )
        self._chunks: list[dict[str, Any]] | None = None
        self._warned_extra_batches = False
        self.lbfgs_summary: dict[str, Any] | None = None  # set at the end of a full-batch fit

        self.encoder = build_encoder(
            hparams["encoder"], hparams["vocabularies"], len(self.tags), restore=restore
        )
        if self.encoder.emits_scores:
            self.dropout: nn.Module = nn.Identity()
            self.projection: nn.Module = nn.Identity()
        else:
            self.dropout = nn.Dropout(float(head_config.get("dropout", 0.5)))
            self.projection = nn.Linear(self.encoder.output_dim, len(self.tags))
        self.head = build_head(head_config, self.tags, scheme)
        if self.encoder.emits_pairs and not getattr(self.head, "accepts_pair_emissions", False):
            raise ValueError(
                f"the encoder scores tag pairs (label-pair features, encoder.pair_templates) but the"
                f" {head_config.get('kind', 'first_order')} head takes tag scores only; use the first_order CRF"
            )

        self.report_dir: str | None = None  # where test reports go (default: the logger's dir)
        self.report_prefix = "test"  # <prefix>_report.txt, <prefix>_metrics.json
        self.test_scores: SpanScores | None = None
        self.val_f1_best = 0.0
        self._records: dict[str, list[Record]] = {"val": [], "test": []}

    # ------------------------------------------------------------------ scoring

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """Emission scores ``[B, T, num_tags]`` for prepared ``inputs`` (see ``encoder.prepare``)."""
        hidden = self.encoder(inputs)
        return self.projection(self.dropout(hidden))

    def _emissions(self, batch: dict[str, Any]) -> Tensor:
        emissions = self(batch["inputs"])
        mask = batch["mask"]
        if emissions.shape[:2] != mask.shape:
            raise ValueError(
                f"encoder output {tuple(emissions.shape)} does not match the batch mask"
                f" {tuple(mask.shape)}: the encoder must return one vector per word"
            )
        return emissions

    def regularizer(self) -> Tensor | None:
        """Extra training loss terms: the Gaussian prior ``||w||^2 / (2 sigma^2)`` of
        ``optimizer.l2_sigma2`` (L-BFGS default: sigma^2 = 100, i.e. sigma = 10; ``null`` turns
        it off; other optimizers: off unless set)."""
        default = DEFAULT_LBFGS_SIGMA2 if self.full_batch else None
        sigma2 = self.optimizer_config.get("l2_sigma2", default)
        if sigma2 is None:
            return None
        return l2_penalty(self.parameters(), sigma2).to(self.device)

    def training_objective(self, batch: dict[str, Any]) -> Tensor:
        """The loss minimised on a training batch (override to change the objective)."""
        emissions = self._emissions(batch)
        loss = self.head(emissions, batch["tags"], batch["mask"], reduction=self.reduction)
        penalty = self.regularizer()
        return loss if penalty is None else loss + penalty

    # ------------------------------------------------------------------ Lightning steps

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        if self.full_batch:
            return self._full_batch_step(batch_idx)
        loss = self.training_objective(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(batch["tokens"]))
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluation_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluation_step(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> list[Prediction]:
        emissions = self._emissions(batch)
        return build_predictions(self.head, emissions, batch["mask"], batch["tokens"], self.tags, self.scheme)

    def _evaluation_step(self, batch: dict[str, Any], stage: str) -> None:
        emissions = self._emissions(batch)
        mask, gold = batch["mask"], batch["tags"]
        loss = self.head(emissions, gold, mask, reduction="mean")
        self.log(f"{stage}/loss", loss, on_epoch=True, sync_dist=True, batch_size=len(batch["tokens"]))
        paths = self.head.decode(emissions, mask)
        lengths = mask.sum(-1).tolist()
        index = batch["index"].tolist()
        gold_rows, path_rows = gold.tolist(), paths.tolist()
        for i, n in enumerate(lengths):
            self._records[stage].append((index[i], gold_rows[i][:n], path_rows[i][:n]))

    def on_validation_epoch_start(self) -> None:
        self._records["val"] = []

    def on_test_epoch_start(self) -> None:
        self._records["test"] = []

    def on_validation_epoch_end(self) -> None:
        scores = self._epoch_scores("val")
        self.log("val/f1", scores.f1, sync_dist=True)
        self.log("val/precision", scores.precision, sync_dist=True)
        self.log("val/recall", scores.recall, sync_dist=True)
        if not self.trainer.sanity_checking:
            self.val_f1_best = max(self.val_f1_best, scores.f1)
        self.log("val/f1_best", max(self.val_f1_best, 0.0), sync_dist=True, prog_bar=True)

    def on_test_epoch_end(self) -> None:
        records = self._gather(self._records["test"])
        self._records["test"] = []
        scores = self._scores(records)
        if scores.support == 0:
            log.warning("the test data holds no gold entities: precision, recall and F1 are 0 by convention")
        self.test_scores = scores
        self.log("test/f1", scores.f1, sync_dist=True)
        self.log("test/precision", scores.precision, sync_dist=True)
        self.log("test/recall", scores.recall, sync_dist=True)
        if self.trainer.is_global_zero:
            directory = self._report_directory()
            if directory is not None:
                paths = write_report(scores, directory, prefix=self.report_prefix)
                write_tag_rows(self._tag_rows(records), directory, prefix=self.report_prefix)
                log.info("test report written to %s", paths[0])

    def _report_directory(self) -> str | None:
        if self.report_dir:
            return self.report_dir
        return self.trainer.log_dir or self.trainer.default_root_dir

    def _epoch_scores(self, stage: str) -> SpanScores:
        records = self._gather(self._records[stage])
        self._records[stage] = []
        return self._scores(records)

    def _tag_rows(self, records: list[Record]) -> list[tuple[int, list[str], list[str]]]:
        """``(dataset index, gold tags, predicted tags)`` per sentence, in dataset order."""
        return [(index, [self.tags[t] for t in gold], [self.tags[t] for t in pred]) for index, gold, pred in records]

    def _scores(self, records: list[Record]) -> SpanScores:
        rows = self._tag_rows(records)
        return span_scores([gold for _, gold, _ in rows], [pred for _, _, pred in rows], self.scheme)

    def _gather(self, records: list[Record]) -> list[Record]:
        """All ranks' records, deduplicated by dataset index and sorted by it.

        Under DDP the lists are padded into tensors of one shape (``all_gather`` needs equal
        shapes on every rank) and unpadded afterwards; the distributed sampler repeats a few
        sentences to even out the ranks, hence the deduplication.
        """
        if self._trainer is not None and self.trainer.world_size > 1:
            size = torch.tensor([len(records), max((len(r[1]) for r in records), default=0)], device=self.device)
            sizes = self.all_gather(size).reshape(-1, 2)  # [world, 2]
            padded = pad_records(records, int(sizes[:, 0].max()), int(sizes[:, 1].max()), self.device)
            gathered = [self.all_gather(tensor) for tensor in padded]  # each [world, rows, ...]
            records = unpad_records(*gathered)
        return dedupe_records(records)

    # ------------------------------------------------------------------ optimisation

    def configure_optimizers(self) -> Any:
        return configure_optimizers(self, self.optimizer_config, self.scheduler_config)

    def on_train_start(self) -> None:
        if not self.full_batch:
            return
        if self.trainer.world_size > 1:
            raise RuntimeError("full-batch L-BFGS runs on one device; use devices=1 (or adam/sgd for DDP)")
        batches = self.trainer.num_training_batches
        if batches > 1 and not self._warned_extra_batches:
            self._warned_extra_batches = True
            log.warning(
                "full-batch L-BFGS reads the whole training set itself (once) and ignores the %s"
                " loader batches of each epoch: set trainer.limit_train_batches=1 to skip reading them",
                batches,
            )

    # ------------------------------------------------------------------ full-batch L-BFGS

    def full_batch_chunks(self, max_tokens: int | None = None) -> list[dict[str, Any]]:
        """The whole training set as padded batches on the model's device, built once.

        Read from the trainer's training loader (its dataset and collate function), sentences
        sorted by length and cut into chunks of at most ``max_tokens`` padded tokens
        (``optimizer.chunk_tokens``; default :meth:`default_chunk_tokens`) so that padding stays
        small and memory bounded.
        """
        if self._chunks is not None:
            return self._chunks
        loader = self.trainer.train_dataloader
        dataset, collate = getattr(loader, "dataset", None), getattr(loader, "collate_fn", None)
        if dataset is None or collate is None or not hasattr(dataset, "__len__"):
            raise TypeError("full-batch L-BFGS needs a training DataLoader over a map-style dataset")
        budget = int(max_tokens or self.optimizer_config.get("chunk_tokens") or self.default_chunk_tokens())
        size = len(dataset)
        lengths = getattr(dataset, "lengths", None)
        chunks = []
        for group in length_sorted_chunks(lengths if lengths is not None else [1] * size, budget):
            batch = collate([dataset[i] for i in group])
            chunks.append(
                {
                    "tags": batch["tags"].to(self.device),
                    "mask": batch["mask"].to(self.device),
                    "inputs": {key: value.to(self.device) for key, value in batch["inputs"].items()},
                }
            )
        self._chunks = chunks
        tokens = sum(int(chunk["mask"].sum()) for chunk in chunks)
        log.info("full-batch L-BFGS: %d training sentences, %d tokens in %d chunks", size, tokens, len(chunks))
        return chunks

    def default_chunk_tokens(self) -> int:
        """Padded tokens per full-batch chunk when ``optimizer.chunk_tokens`` is null: 20000, and
        fewer where a token holds many scores, so that a chunk's tensors stay small. Pair emissions
        ((L + 1) L scores per token): as many tokens as fit 1.5M scores; a second-order CRF (L^3
        moves per token): 10M, at most 20000. Both are also faster on CPU than larger chunks
        (``scripts/bench_full_batch_chunks.py``, docs/benchmarks.md); a second-order CRF over 23
        tags in 20000-token chunks grew to 19 GB on CoNLL-2000."""
        num_tags = len(self.tags)
        if self.encoder.emits_pairs:
            return max(256, 1_500_000 // ((num_tags + 1) * num_tags))
        if isinstance(self.head, SecondOrderCRF):
            return min(20000, max(256, 10_000_000 // num_tags**3))
        return 20000

    def full_batch_objective(self) -> Tensor:
        """Zero the gradients, then accumulate the gradient of the whole training objective
        (summed NLL over every chunk + prior); returns its value (detached)."""
        for param in self.parameters():  # dense gradients to accumulate into (also sparse ones)
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)
        self.zero_grad(set_to_none=False)
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        sparse = getattr(self.encoder, "sparse_gradients", None)
        if sparse is not None:
            self.encoder.sparse_gradients = True
        try:
            for chunk in self.full_batch_chunks():
                loss = self.head(self._emissions(chunk), chunk["tags"], chunk["mask"], reduction="sum")
                self.manual_backward(loss)
                total += loss.detach().double()
        finally:
            if sparse is not None:
                self.encoder.sparse_gradients = sparse
        penalty = self.regularizer()
        if penalty is not None:
            self.manual_backward(penalty)
            total += penalty.detach().double()
        return total

    def _full_batch_step(self, batch_idx: int) -> None:
        if batch_idx > 0:  # the whole set went through at batch 0 (see on_train_start)
            return
        optimizer = self.optimizers()
        raw = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        optimizer.step(closure=self.full_batch_objective)
        if isinstance(raw, FullBatchLBFGS) and raw.history:
            summary = raw.summary()
            record = raw.history[-1]
            self.log("train/loss", record["objective"], on_step=False, on_epoch=True, prog_bar=True, batch_size=1)
            self.log("train/objective", record["objective"], on_step=False, on_epoch=True, batch_size=1)
            self.log("train/lbfgs_iterations", float(raw.iterations), on_step=False, on_epoch=True, batch_size=1)
            self.log("train/lbfgs_converged", float(raw.converged), on_step=False, on_epoch=True, batch_size=1)
            self.log("train/lbfgs_seconds_per_iteration", float(summary["seconds_per_iteration"]),
                     on_step=False, on_epoch=True, batch_size=1)
            if raw.finished:
                self.trainer.should_stop = True
        return

    def on_train_end(self) -> None:
        if not self.full_batch or not self.trainer.optimizers:
            return
        raw = self.trainer.optimizers[0]
        if not isinstance(raw, FullBatchLBFGS):
            return
        self.lbfgs_summary = raw.summary()
        last = raw.history[-1] if raw.history else {}
        if raw.converged:
            log.info("L-BFGS converged after %d iterations (%s)", raw.iterations, raw.reason)
            return
        why = raw.reason if raw.finished else "the trainer stopped it: max_epochs or a callback"
        message = (
            f"L-BFGS did NOT converge: stopped after {raw.iterations} iterations ({why});"
            f" last relative objective change {last.get('relative_change', float('nan')):.3g}"
            f" (tolerance {raw.tolerance_change:g}), gradient norm {last.get('grad_norm', float('nan')):.3g};"
            " the weights are not the optimum of the objective: raise optimizer.max_iterations"
            " / trainer.max_epochs (train/lbfgs_converged = 0)"
        )
        log.warning(message)
        warnings.warn(message, LBFGSNotConvergedWarning, stacklevel=2)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["neurocrf"] = {"val_f1_best": float(self.val_f1_best)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.val_f1_best = float(checkpoint.get("neurocrf", {}).get("val_f1_best", 0.0))

    # ------------------------------------------------------------------ inference

    @property
    def token_columns(self) -> list[int] | None:
        """The input columns joined into each token at training time (``data.token_columns`` of
        the run config, e.g. ``[0, 1]`` for word + POS), or None when tokens are words only."""
        columns = self._training_data_option("token_columns")
        return None if columns is None else [int(c) for c in columns]

    @property
    def keep_types(self) -> list[str] | None:
        """The span types kept at training time (``data.keep_types``, e.g. ``["NP"]``), or None."""
        types = self._training_data_option("keep_types")
        return None if types is None else [str(t) for t in types]

    def _training_data_option(self, name: str) -> Any:
        return ((self.hparams.get("config") or {}).get("data") or {}).get(name)

    @classmethod
    def load(cls, path: str | Path, map_location: Any = "cpu") -> Tagger:
        """A trained tagger from a checkpoint (weights only), in eval mode; a file that is none
        raises :class:`~neurocrf.models.checkpoints.CheckpointError` naming it and the problem."""
        return load_module(cls, path, TAGGER, map_location)

    @torch.no_grad()
    def predict(
        self,
        sentences: Sequence[Sequence[str] | str],
        batch_size: int = 32,
        nbest: int = 0,
        precision: str = "32",
    ) -> list[Prediction]:
        """Tag sentences (token lists, or strings split on whitespace).

        Returns one :class:`Prediction` per sentence, in input order, with exactly one tag and
        one confidence per token (see :mod:`neurocrf.models.prediction` for the definitions);
        ``nbest > 0`` also gives the n most probable tag sequences. ``precision="bf16"`` runs the
        encoder under bfloat16 autocast (about twice as fast on CPUs with AVX512-BF16 or AMX and
        on GPUs; the CRF still computes in float32 or float64).
        """
        if precision not in PREDICT_PRECISIONS:
            raise ValueError(f"precision must be one of {PREDICT_PRECISIONS}, got {precision!r}")
        tokenised = [s.split() if isinstance(s, str) else list(s) for s in sentences]
        results: list[Prediction | None] = [None] * len(tokenised)
        # Similar lengths together: less padding. Empty sentences need no model (n-best: the empty one).
        order = sorted((i for i, words in enumerate(tokenised) if words), key=lambda i: len(tokenised[i]))
        for i, words in enumerate(tokenised):
            if not words:
                results[i] = Prediction([], [], self.scheme, nbest=[NBestPath([], 1.0, 0.0)] if nbest > 0 else [])
        was_training = self.training
        self.eval()
        try:
            for begin in range(0, len(order), batch_size):
                chunk = order[begin : begin + batch_size]
                batch_tokens = [tokenised[i] for i in chunk]
                inputs = {key: value.to(self.device) for key, value in self.encoder.prepare(batch_tokens).items()}
                lengths = torch.tensor([len(words) for words in batch_tokens], device=self.device)
                mask = torch.arange(int(lengths.max()), device=self.device).unsqueeze(0) < lengths.unsqueeze(1)
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    emissions = self._emissions({"inputs": inputs, "mask": mask})
                predictions = build_predictions(
                    self.head, emissions, mask, batch_tokens, self.tags, self.scheme, nbest=nbest
                )
                for i, prediction in zip(chunk, predictions):
                    results[i] = prediction
        finally:
            self.train(was_training)
        return results  # type: ignore[return-value]


def length_sorted_chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length (stable) and cut into groups whose padded size
    (longest length x group size) is at most ``budget`` tokens; an item longer than the budget
    is a group of its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    width = 0
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        length = lengths[index]
        if current and max(width, length) * (len(current) + 1) > budget:
            groups.append(current)
            current, width = [], 0
        current.append(index)
        width = max(width, length)
    if current:
        groups.append(current)
    return groups

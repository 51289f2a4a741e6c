"""The sequence tagger: an encoder, a projection to tag scores, and a CRF or softmax head.

::

    words --encoder--> [B, T, H] --dropout, linear--> emissions [B, T, L] --head--> loss / tags

(The feature encoder emits scores itself, no projection; with label-pair features they are pair
emissions ``[B, T, L + 1, L]`` for the first-order CRF.)

Everything the model is built from is a plain value (dicts, lists, strings, numbers), saved as
hyperparameters, so a checkpoint loads with ``torch.load(path, weights_only=True)`` and
:meth:`Tagger.load` rebuilds the model without the training config or corpus.

>>> from neurocrf.models import PredictOptions, Tagger
>>> tagger = Tagger.load("logs/train/runs/.../checkpoints/last.ckpt")      # doctest: +SKIP
>>> [p.spans for p in tagger.predict(["Peter lives in Berlin"])]           # doctest: +SKIP
[[PredictedSpan(type='PER', start=0, end=1, confidence=0.98), ...]]
>>> tagger.predict(["Peter lives in Berlin"], PredictOptions(nbest=2))[0].nbest  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from neurocrf.conventions import OUTSIDE
from neurocrf.encoders import build_encoder
from neurocrf.models.batching import plan_batches, windows
from neurocrf.models.checkpoints import TAGGER, Checkpointed
from neurocrf.models.collector import frozen_heap
from neurocrf.models.distributed import ProcessGroupTeardown
from neurocrf.models.full_batch import FullBatchTraining
from neurocrf.models.heads import TaggingHead, build_head
from neurocrf.models.metrics import SpanScores, write_report, write_tag_rows
from neurocrf.models.optim import (
    DEFAULT_LBFGS_SIGMA2,
    configure_optimizers,
    is_full_batch,
    l2_penalty,
)
from neurocrf.models.predict_options import PredictOptions
from neurocrf.models.prediction import NBestPath, Prediction, build_predictions
from neurocrf.models.records import EvaluationRecords, record_scores, tag_rows
from neurocrf.values import plain_values

log = logging.getLogger(__name__)


class Tagger(FullBatchTraining, Checkpointed, ProcessGroupTeardown, pl.LightningModule):
    """Encoder + projection + CRF (first order, second order, precursor) or softmax head.

    Full-batch L-BFGS training comes from :class:`~neurocrf.models.full_batch.FullBatchTraining`,
    loading (:meth:`load`) and the best dev F1 across epochs and resumes (``val/f1_best``) from
    :class:`~neurocrf.models.checkpoints.Checkpointed`.

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

    checkpoint_kind = TAGGER
    best_metric = "val/f1"

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
        hparams = plain_values(encoder=encoder, head=head, tags=tags, scheme=scheme, vocabularies=vocabularies,
                           optimizer=optimizer or {"name": "adam", "lr": 1e-3}, scheduler=scheduler, config=config)
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
        self.encoder = build_encoder(
            hparams["encoder"], hparams["vocabularies"], len(self.tags), restore=restore
        )
        if self.encoder.emits_scores:
            self.dropout: nn.Module = nn.Identity()
            self.projection: nn.Module = nn.Identity()
        else:
            self.dropout = nn.Dropout(float(head_config.get("dropout", 0.5)))
            self.projection = nn.Linear(self.encoder.output_dim, len(self.tags))
        self.head: TaggingHead = build_head(head_config, self.tags, scheme)
        if self.encoder.emits_pairs and not self.head.accepts_pair_emissions:
            raise ValueError(
                f"the encoder scores tag pairs (label-pair features, encoder.pair_templates) but the"
                f" {head_config.get('kind', 'first_order')} head takes tag scores only; use the first_order CRF"
            )

        self.report_dir: str | None = None  # where test reports go (default: the logger's dir)
        self.report_prefix = "test"  # <prefix>_report.txt, <prefix>_metrics.json
        self.test_scores: SpanScores | None = None
        self._records = EvaluationRecords()
        self.predict_options = PredictOptions()  # predict_step's (Lightning's prediction loop)

    # ------------------------------------------------------------------ scoring

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """Emission scores ``[B, T, num_tags]`` for prepared ``inputs`` (see ``encoder.prepare``)."""
        hidden = self.encoder(inputs)
        return self.projection(self.dropout(hidden))

    def _emissions(self, batch: dict[str, Any]) -> Tensor:
        return self._checked(self(batch["inputs"]), batch["mask"])

    @staticmethod
    def _checked(emissions: Tensor, mask: Tensor) -> Tensor:
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
        """Lightning's prediction loop: the predictions for a batch's ``tokens`` (empty sentences
        included), all in one model call, with the ``nbest``, ``confidences`` and ``precision`` of
        ``self.predict_options`` (a :class:`~neurocrf.models.predict_options.PredictOptions`)."""
        tokens = list(batch["tokens"])
        whole = replace(self.predict_options, batch_size=max(1, len(tokens)), max_tokens=None)
        return self._predict_window(tokens, whole)

    def _evaluation_step(self, batch: dict[str, Any], stage: str) -> None:
        emissions = self._emissions(batch)
        mask, gold = batch["mask"], batch["tags"]
        loss = self.head(emissions, gold, mask, reduction="mean")
        self.log(f"{stage}/loss", loss, on_epoch=True, sync_dist=True, batch_size=len(batch["tokens"]))
        self._records.add(stage, batch["index"], gold, self.head.decode(emissions, mask), mask)

    def on_validation_epoch_start(self) -> None:
        self._records.reset("val")

    def on_test_epoch_start(self) -> None:
        self._records.reset("test")

    def on_validation_epoch_end(self) -> None:
        scores = record_scores(self._records.collect("val", self), self.tags, self.scheme)
        self.log("val/f1", scores.f1, sync_dist=True)
        self.log("val/precision", scores.precision, sync_dist=True)
        self.log("val/recall", scores.recall, sync_dist=True)
        self.track_best(scores.f1)

    def on_test_epoch_end(self) -> None:
        records = self._records.collect("test", self)
        scores = record_scores(records, self.tags, self.scheme)
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
                write_tag_rows(tag_rows(records, self.tags), directory, prefix=self.report_prefix)
                log.info("test report written to %s", paths[0])

    def _report_directory(self) -> str | None:
        if self.report_dir:
            return self.report_dir
        return self.trainer.log_dir or self.trainer.default_root_dir

    # ------------------------------------------------------------------ optimisation

    def configure_optimizers(self) -> Any:
        return configure_optimizers(self, self.optimizer_config, self.scheduler_config)

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

    @property
    def file_scheme(self) -> str | None:
        """The tag scheme of the training corpus's files (``data.file_scheme`` of the run config,
        e.g. ``IOB2``; tags are predicted in ``scheme``), or None when the checkpoint does not
        record it."""
        scheme = self._training_data_option("file_scheme")
        return None if scheme is None else str(scheme)

    def _training_data_option(self, name: str) -> Any:
        return ((self.hparams.get("config") or {}).get("data") or {}).get(name)

    def predict(
        self, sentences: Iterable[Sequence[str] | str], options: PredictOptions | None = None
    ) -> list[Prediction]:
        """Tag sentences (token lists, or strings split on whitespace): :meth:`predict_iter` as a list.

        Returns one :class:`Prediction` per sentence, in input order, with exactly one tag and
        one confidence per token (see :mod:`neurocrf.models.prediction` for the definitions).
        ``options``: batch size, token budget, n-best, confidences, precision
        (:class:`~neurocrf.models.predict_options.PredictOptions`; None: its defaults).

        >>> tagger.predict(["EU rejects German call".split()])                  # doctest: +SKIP
        >>> tagger.predict(sentences, PredictOptions(nbest=2, batch_size=64))   # doctest: +SKIP
        """
        return list(self.predict_iter(sentences, options))

    def predict_iter(
        self, sentences: Iterable[Sequence[str] | str], options: PredictOptions | None = None
    ) -> Iterator[Prediction]:
        """Tag any iterable of sentences lazily: one :class:`Prediction` per sentence, in input
        order, holding at most ``options.window`` sentences at a time (they are sorted by length
        inside the window and cut into batches of ``options.batch_size`` sentences and at most
        ``options.max_tokens`` padded tokens). ``options``: see :meth:`predict`.

        >>> lines = open("corpus.txt")                                             # doctest: +SKIP
        >>> for prediction in tagger.predict_iter(lines, PredictOptions(max_tokens=4096)):  # doctest: +SKIP
        ...     print(prediction.tags)
        """
        if options is None:
            options = PredictOptions()
        elif not isinstance(options, PredictOptions):
            raise TypeError(f"options must be a PredictOptions (neurocrf.models.predict_options), got {options!r}")
        tokenised = (s.split() if isinstance(s, str) else list(s) for s in sentences)
        with frozen_heap():
            for chunk in windows(tokenised, options.window):
                yield from self._predict_window(chunk, options)

    def _predict_window(self, tokens: list[list[str]], options: PredictOptions) -> list[Prediction]:
        """Predictions for a window of token lists in their order: batched by length
        (:func:`~neurocrf.models.batching.plan_batches`), each batch by :meth:`_predict_batch`."""
        results: list[Prediction | None] = [None] * len(tokens)
        for batch in plan_batches([len(words) for words in tokens], options.batch_size, options.max_tokens):
            for i, prediction in zip(batch, self._predict_batch([tokens[i] for i in batch], options)):
                results[i] = prediction
        for i, words in enumerate(tokens):
            if not words:  # no model needed; n-best: the one empty sequence
                results[i] = Prediction([], [], self.scheme, nbest=[NBestPath([], 1.0, 0.0)] if options.nbest else [])
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _predict_batch(self, tokens: list[list[str]], options: PredictOptions) -> list[Prediction]:
        """Predictions for one batch of non-empty token lists: one encoder call, one batched CRF
        call per quantity (:func:`~neurocrf.models.prediction.build_predictions`)."""
        was_training = self.training
        if was_training:
            self.eval()
        try:
            lengths = torch.tensor([len(words) for words in tokens], device=self.device)
            mask = torch.arange(int(lengths.max()), device=self.device).unsqueeze(0) < lengths.unsqueeze(1)
            hidden = self.encoder.encode(tokens, options.precision)
            emissions = self._checked(self.projection(self.dropout(hidden)), mask)
            return build_predictions(self.head, emissions, mask, tokens, self.tags, self.scheme,
                                     nbest=options.nbest, confidences=options.confidences)
        finally:
            if was_training:
                self.train()

"""The supertagger: one encoder, two softmax heads (supertag, preterminal), k-best output.

::

    words --encoder--> [B, T, H] --dropout--> linear -> supertag scores     [B, T, S]
                                         \\--> linear -> preterminal scores [B, T, P]
                                         \\--> linear -> auxiliary scores   [B, T, A_name] (optional)

Loss: the sum of the token-level cross-entropies (each averaged over the tokens of the batch);
the preterminal one weighted by ``heads.pos_weight``, each *auxiliary* one by its weight in
``heads.auxiliary``. With ``heads.distill = w > 0`` (knowledge distillation, Hinton et al. 2015)
the supertag term is ``(1 - w)`` times the cross-entropy against the gold supertag plus ``w``
times the cross-entropy against a teacher's distribution (saved tags of the training split from
a model or an ensemble, ``data.teacher``; validation scores the gold term only). Auxiliary heads
(multi-task learning) predict per-token annotations of the
treebank that the supertags do not hold, such as the grammatical function (``function``) or the
function of the phrase a word heads (``projection``; :data:`neurocrf.parsing.tree.ANNOTATIONS`);
they shape the shared encoder during training and are not used for parsing.

For parsing (Ruprecht & Mörbitz 2021), each token keeps its ``k`` most probable supertags with
weights ``-log p`` where the ``k`` probabilities are renormalised to sum to 1
(:meth:`Supertagger.predict_kbest`); the parser (:mod:`neurocrf.parsing.parser`) takes them as
plain ``(string, weight)`` lists.

Built from plain values only (saved as hyperparameters), so checkpoints load with
``weights_only=True``::

    model = Supertagger.load("logs/supertag/runs/.../checkpoints/last.ckpt")
    kbest = model.predict_kbest([["Het", "regent", "."]], k=10)
    kbest[0].candidates[1][:2]   # [('SMAIN 2 x0t @pt -', 0.04), ...]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.trainer.states import TrainerFn
from torch import Tensor, nn

from neurocrf.encoders import build_encoder
from neurocrf.models.checkpoints import SUPERTAGGER, Checkpointed
from neurocrf.models.distributed import ProcessGroupTeardown
from neurocrf.models.optim import configure_optimizers
from neurocrf.parsing.parser import Parser, candidates_from_topk
from neurocrf.supertagging.heads import build_supertag_head
from neurocrf.supertagging.source import KBestTags, predict_kbest
from neurocrf.values import plain_values

log = logging.getLogger(__name__)

PARSING_DEFAULTS: dict[str, Any] = {
    "k": 10,  # supertags per token handed to the parser
    "time_limit": 5.0,  # seconds per sentence before the parser falls back to NOPARSE
    "max_items": 1_000_000,  # chart items per sentence before falling back
    "val_every_n_epochs": 0,  # parse the dev set every n validation epochs (0: never)
    "val_max_sentences": None,  # parse only the first N dev sentences at validation (None: all)
    "val_time_limit": 1.0,  # per-sentence time limit of the validation parses
}


class Supertagger(Checkpointed, ProcessGroupTeardown, pl.LightningModule):
    """Encoder + supertag head + preterminal head.

    Loading (:meth:`load`) and the best dev supertag accuracy across epochs and resumes
    (``val/supertag_acc_best``) come from :class:`~neurocrf.models.checkpoints.Checkpointed`.

    Args:
        encoder: encoder config (``name`` bilstm or transformer, plus options).
        vocabularies: the encoder's vocabularies (:func:`neurocrf.encoders.build_vocabularies`).
        supertags: supertag strings (ids index it), from the training split.
        preterminals: preterminal labels (ids index it).
        roots: root labels of the prepared training trees (the parser's goal labels).
        optimizer, scheduler: see :mod:`neurocrf.models.optim`.
        heads: ``dropout`` before the projections (default 0.2), ``pos_weight`` of the
            preterminal loss (default 1.0), ``factors``: supertag parts whose output vectors are
            shared (:mod:`neurocrf.supertagging.heads`; default none, a plain linear head),
            ``auxiliary``: annotation name -> loss weight of an auxiliary head (default none),
            ``distill``: weight of the teacher's distribution in the supertag loss (default 0).
        auxiliary_labels: annotation name -> its labels (ids index them), one entry per name in
            ``heads.auxiliary`` (from :attr:`SupertagDataModule.auxiliary_labels`).
        parsing: parser settings, see :data:`PARSING_DEFAULTS`.
        transform: how the trees were prepared (``move_punctuation``, ``h``, ``v``), for the record.
        config: the resolved run config (optional, kept for the record).
        restore: weights will come from a checkpoint (not a hyperparameter).
    """

    checkpoint_kind = SUPERTAGGER
    best_metric = "val/supertag_acc"

    def __init__(
        self,
        encoder: dict[str, Any],
        vocabularies: dict[str, Any],
        supertags: list[str],
        preterminals: list[str],
        roots: list[str],
        auxiliary_labels: dict[str, list[str]] | None = None,
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        heads: dict[str, Any] | None = None,
        parsing: dict[str, Any] | None = None,
        transform: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        restore: bool = False,
    ) -> None:
        super().__init__()
        hparams = plain_values(encoder=encoder, vocabularies=vocabularies, supertags=supertags,
                           preterminals=preterminals, roots=roots, auxiliary_labels=auxiliary_labels or {},
                           optimizer=optimizer or {"name": "adam", "lr": 2e-3}, scheduler=scheduler, heads=heads or {},
                           parsing=parsing or {}, transform=transform or {}, config=config)
        self.save_hyperparameters(hparams, logger=False)
        for name, labels in (("supertags", supertags), ("preterminals", preterminals)):
            if not labels or len(set(labels)) != len(labels):
                raise ValueError(f"{name} must be a non-empty list without duplicates")
        if not roots:
            raise ValueError("roots must name at least one root label")
        unknown = sorted(set(hparams["parsing"]) - set(PARSING_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown parsing option(s) {unknown}; expected {sorted(PARSING_DEFAULTS)}")
        self.supertags: list[str] = list(supertags)
        self.preterminals: list[str] = list(preterminals)
        self.roots: list[str] = list(roots)
        self.parsing: dict[str, Any] = {**PARSING_DEFAULTS, **hparams["parsing"]}
        self.optimizer_config: dict[str, Any] = hparams["optimizer"]
        self.scheduler_config: dict[str, Any] | None = hparams["scheduler"]
        heads = hparams["heads"]
        self.pos_weight = float(heads.get("pos_weight", 1.0))
        self.distill = float(heads.get("distill") or 0.0)
        if not 0.0 <= self.distill <= 1.0:
            raise ValueError(f"heads.distill must be in [0, 1], got {self.distill}")
        self.auxiliary_weights: dict[str, float] = {name: float(w) for name, w in
                                                    (heads.get("auxiliary") or {}).items()}
        self.auxiliary_labels: dict[str, list[str]] = hparams["auxiliary_labels"]
        if set(self.auxiliary_weights) != set(self.auxiliary_labels):
            raise ValueError(f"heads.auxiliary names {sorted(self.auxiliary_weights)} and the auxiliary "
                             f"label lists {sorted(self.auxiliary_labels)} must match")

        self.encoder = build_encoder(hparams["encoder"], hparams["vocabularies"], len(self.supertags),
                                     restore=restore)
        if self.encoder.emits_scores:
            raise ValueError(f"encoder {hparams['encoder'].get('name')!r} emits tag scores; the "
                             "supertagger needs a hidden-state encoder (bilstm or transformer)")
        self.dropout = nn.Dropout(float(heads.get("dropout", 0.2)))
        self.supertag_head = build_supertag_head(self.encoder.output_dim, self.supertags,
                                                 heads.get("factors"))
        self.preterminal_head = nn.Linear(self.encoder.output_dim, len(self.preterminals))
        self.auxiliary_heads = nn.ModuleDict({name: nn.Linear(self.encoder.output_dim, len(labels))
                                              for name, labels in self.auxiliary_labels.items()})

        self._counts: dict[str, Tensor] = {}
        self._topk: dict[str, list[tuple[int, list[list[int]], list[list[float]], list[int]]]] = {}
        self.last_parse: dict[str, Any] | None = None  # result of the last validation parse

    # ------------------------------------------------------------------ scoring

    def forward(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Supertag scores ``[B, T, S]`` and preterminal scores ``[B, T, P]`` (unnormalised)."""
        hidden = self.dropout(self.encoder(inputs))
        return self.supertag_head(hidden), self.preterminal_head(hidden)

    def _scores(self, batch: Mapping[str, Any]) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Supertag ``[B, T, S]``, preterminal ``[B, T, P]`` and auxiliary ``[B, T, A_name]`` scores."""
        hidden = self.dropout(self.encoder(batch["inputs"]))
        mask = batch["mask"]
        if hidden.shape[:2] != mask.shape:
            raise ValueError(f"encoder output {tuple(hidden.shape)} does not match the "
                             f"batch mask {tuple(mask.shape)}: the encoder must return one vector per word")
        auxiliary = {name: head(hidden) for name, head in self.auxiliary_heads.items()}
        return self.supertag_head(hidden), self.preterminal_head(hidden), auxiliary

    def loss(self, supertag_scores: Tensor, pt_scores: Tensor, batch: Mapping[str, Any],
             auxiliary_scores: Mapping[str, Tensor] | None = None) -> Tensor:
        """Weighted sum of the token-averaged cross-entropies of the heads (gold -1 is ignored)."""
        mask = batch["mask"]
        gold_st = batch["supertags"].masked_fill(~mask, -1)
        gold_pt = batch["preterminals"].masked_fill(~mask, -1)
        supertag_loss = _cross_entropy(supertag_scores, gold_st)
        if self.distill > 0 and "teacher_ids" in batch:
            soft = _soft_cross_entropy(supertag_scores, batch["teacher_ids"], batch["teacher_probs"], mask)
            supertag_loss = (1.0 - self.distill) * supertag_loss + self.distill * soft
        elif self.distill > 0 and self.training:
            raise ValueError("heads.distill needs the teacher's supertag distributions in the training batches: "
                             "set data.teacher=<tag file(s) of the training split>")
        loss = supertag_loss + self.pos_weight * _cross_entropy(pt_scores, gold_pt)
        for name, scores in (auxiliary_scores or {}).items():
            if name not in batch.get("auxiliary", {}):
                raise ValueError(f"the batch has no {name!r} labels for the auxiliary head: build the "
                                 f"SupertagDataModule with auxiliary={sorted(self.auxiliary_heads)}")
            gold = batch["auxiliary"][name].masked_fill(~mask, -1)
            loss = loss + self.auxiliary_weights[name] * _cross_entropy(scores, gold)
        return loss

    # ------------------------------------------------------------------ Lightning steps

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        supertag_scores, pt_scores, auxiliary_scores = self._scores(batch)
        loss = self.loss(supertag_scores, pt_scores, batch, auxiliary_scores)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True,
                 batch_size=len(batch["tokens"]))
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluation_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluation_step(batch, "test")

    def on_validation_epoch_start(self) -> None:
        self._reset("val")

    def on_test_epoch_start(self) -> None:
        self._reset("test")

    def _reset(self, stage: str) -> None:
        # correct supertags, preterminals, each auxiliary head's labels; tokens with each head's
        # labels (batches may lack them: trainer.validate / test on a data module without them); tokens
        self._counts[stage] = torch.zeros(3 + 2 * len(self.auxiliary_heads), dtype=torch.float64)
        self._topk[stage] = []

    def _parse_due(self, stage: str) -> bool:
        # only while fitting: trainer.validate may run on another split than the dev treebank
        if (stage != "val" or self._trainer is None or self.trainer.sanity_checking
                or self.trainer.state.fn != TrainerFn.FITTING):
            return False
        every = int(self.parsing["val_every_n_epochs"] or 0)
        if every <= 0:
            return False
        return (self.current_epoch + 1) % every == 0 or self.current_epoch + 1 == self.trainer.max_epochs

    def _evaluation_step(self, batch: dict[str, Any], stage: str) -> None:
        supertag_scores, pt_scores, auxiliary_scores = self._scores(batch)
        mask = batch["mask"]
        labelled = batch.get("auxiliary", {})
        auxiliary_scores = {name: scores for name, scores in auxiliary_scores.items() if name in labelled}
        loss = self.loss(supertag_scores, pt_scores, batch, auxiliary_scores)
        self.log(f"{stage}/loss", loss, on_epoch=True, sync_dist=True, batch_size=len(batch["tokens"]))
        pred_st = supertag_scores.argmax(-1)
        pred_pt = pt_scores.argmax(-1)
        correct = [((pred_st == batch["supertags"]) & mask).sum(), ((pred_pt == batch["preterminals"]) & mask).sum()]
        zero = mask.sum() * 0
        correct += [((auxiliary_scores[name].argmax(-1) == labelled[name]) & mask).sum()
                    if name in auxiliary_scores else zero for name in self.auxiliary_heads]
        correct += [mask.sum() if name in auxiliary_scores else zero for name in self.auxiliary_heads]
        counts = torch.stack([*correct, mask.sum()]).double().cpu()
        if stage not in self._counts:
            self._reset(stage)
        self._counts[stage] += counts
        if self._parse_due(stage):
            k = min(int(self.parsing["k"]), len(self.supertags))
            log_probs = supertag_scores.float().log_softmax(-1)
            top_lp, top_ids = log_probs.topk(k, dim=-1)  # [B, T, k]
            lengths = mask.sum(-1).tolist()
            for b, n in enumerate(lengths):
                self._topk.setdefault(stage, []).append((
                    int(batch["index"][b]), top_ids[b, :n].tolist(), top_lp[b, :n].tolist(),
                    pred_pt[b, :n].tolist()))

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")

    def _epoch_end(self, stage: str) -> None:
        if stage not in self._counts:
            self._reset(stage)
        counts = self._counts[stage].to(self.device)
        if self._trainer is not None and self.trainer.world_size > 1:
            counts = self.trainer.strategy.reduce(counts, reduce_op="sum")
        total = max(float(counts[-1]), 1.0)
        self.log(f"{stage}/supertag_acc", float(counts[0]) / total, sync_dist=False, prog_bar=True)
        self.log(f"{stage}/pos_acc", float(counts[1]) / total, sync_dist=False)
        heads = len(self.auxiliary_heads)
        for offset, name in enumerate(self.auxiliary_heads):
            labelled = float(counts[2 + heads + offset])
            if labelled > 0:
                self.log(f"{stage}/{name}_acc", float(counts[2 + offset]) / labelled, sync_dist=False)
        if stage == "val":
            self.track_best(float(counts[0]) / total)
        if self._topk.get(stage):
            result = self._parse_records(stage)
            if result is not None:
                self.last_parse = result
                self.log(f"{stage}/f1", result["f1"])
                self.log(f"{stage}/dis_f1", result["dis_f1"])
                self.log(f"{stage}/coverage", result["coverage"])
        self._topk[stage] = []

    def _parse_records(self, stage: str) -> dict[str, Any] | None:
        """Parse the stored top-k of the dev set and score it against the datamodule's trees."""
        from neurocrf.parsing import evaluate
        from neurocrf.parsing.tree import TreebankSentence

        records = self._topk[stage]
        if self.trainer.world_size > 1:
            import torch.distributed as dist

            gathered: list[Any] = [None] * self.trainer.world_size
            dist.all_gather_object(gathered, records)
            records = [r for part in gathered for r in part]
        datamodule = getattr(self.trainer, "datamodule", None)
        gold_of = getattr(datamodule, "gold_treebank", None)
        if gold_of is None:
            log.warning("validation parse skipped: the datamodule has no gold_treebank(split)")
            return None
        gold = gold_of("dev" if stage == "val" else "test")
        unique = {r[0]: r for r in records}
        order = sorted(unique)
        limit = self.parsing["val_max_sentences"]
        if limit is not None:
            order = order[: int(limit)]
        parser = Parser(self.roots, k=int(self.parsing["k"]), time_limit=self.parsing["val_time_limit"],
                        max_items=self.parsing["max_items"])
        golds, preds, fallbacks = [], [], 0
        for index in order:
            _, ids, lps, pts = unique[index]
            sentence = gold[index]
            candidates = candidates_from_topk(ids, lps, self.supertags)
            result = parser.parse(sentence.words, candidates, [self.preterminals[p] for p in pts])
            fallbacks += result.fallback
            golds.append(sentence)
            preds.append(TreebankSentence(sentence.id, sentence.words, result.tree))
        if not golds:
            return None
        scores = evaluate(golds, preds)
        return {"f1": scores["f1"], "dis_f1": scores["dis_f1"],
                "coverage": 1.0 - fallbacks / len(golds), "sentences": len(golds)}

    # ------------------------------------------------------------------ optimisation

    def configure_optimizers(self) -> Any:
        return configure_optimizers(self, self.optimizer_config, self.scheduler_config)

    # ------------------------------------------------------------------ inference

    @property
    def transform(self) -> dict[str, Any]:
        """How the training trees were prepared (``move_punctuation``, ``h``, ``v``)."""
        return dict(self.hparams.get("transform") or {})

    @torch.no_grad()
    def batch_log_probs(self, tokens: Sequence[Sequence[str]]) -> tuple[Tensor, Tensor]:
        """Supertag ``[B, T, S]`` and preterminal ``[B, T, P]`` log-probabilities of a batch of
        non-empty token lists, in eval mode (positions past a sentence's end are padding)."""
        was_training = self.training
        self.eval()
        try:
            inputs = {key: value.to(self.device) for key, value in self.encoder.prepare(tokens).items()}
            supertag_scores, pt_scores = self(inputs)
        finally:
            self.train(was_training)
        return supertag_scores.float().log_softmax(-1), pt_scores.float().log_softmax(-1)

    def predict_kbest(self, sentences: Sequence[Sequence[str] | str], k: int = 10,
                      batch_size: int = 64) -> list[KBestTags]:
        """The ``k`` best supertags per token (weights ``-log`` of the probabilities renormalised
        over the ``k``) and the best preterminal, for sentences given as token lists (or strings,
        split on whitespace). One :class:`~neurocrf.supertagging.source.KBestTags` per sentence,
        in input order."""
        return predict_kbest(self, sentences, k, batch_size)


def _soft_cross_entropy(scores: Tensor, teacher_ids: Tensor, teacher_probs: Tensor, mask: Tensor) -> Tensor:
    """Mean over the tokens of ``mask`` of ``-sum_j q_j log p(teacher_ids_j)``: the cross-entropy of
    the student's distribution (``scores`` ``[B, T, S]``) against the teacher's ``[B, T, n]``."""
    if not bool(mask.any()):
        return scores.sum() * 0.0
    log_probs = scores.float().log_softmax(-1).gather(-1, teacher_ids.clamp(min=0))  # [B, T, n]
    per_token = -(teacher_probs * log_probs).sum(-1)  # padding ids have probability 0
    return per_token[mask].mean()


def _cross_entropy(scores: Tensor, gold: Tensor) -> Tensor:
    """Mean cross-entropy over positions with ``gold >= 0``; 0 when there are none."""
    flat_gold = gold.reshape(-1)
    if not bool((flat_gold >= 0).any()):
        return scores.sum() * 0.0
    return F.cross_entropy(scores.reshape(-1, scores.shape[-1]).float(), flat_gold, ignore_index=-1)

"""Full-batch training of the tagger by L-BFGS (MALLET, CRFsuite): the loop around
:class:`~neurocrf.models.lbfgs.FullBatchLBFGS`.

With ``optimizer.name = lbfgs`` one Lightning epoch is one optimizer step over the *whole*
training set: :meth:`FullBatchTraining.full_batch_objective` evaluates the summed NLL of every
sentence plus the Gaussian prior, chunk by chunk (:func:`length_sorted_chunks`), and accumulates
the gradient; the optimizer runs ``optimizer.max_iter`` iterations per step (default 1) and says
when the run has converged.

Progress: every ``optimizer.log_every`` iterations (default 10; 0 turns it off) and at the last
one, a log line gives the iteration, the objective and its relative change, the gradient norm, the
seconds per iteration and an estimate of what is left::

    L-BFGS iteration 20 of at most 800: objective 1.8473e+04 (relative change 2.1e-03, tolerance
    1e-05), gradient norm 3.2e+02, 4.05 s/iteration, at most 52m41s left

A run that stops before its convergence test passes warns (:class:`LBFGSNotConvergedWarning`) and
logs ``train/lbfgs_converged = 0``.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from neurocrf.models.lbfgs import FullBatchLBFGS
from neurocrf.structs import SecondOrderCRF

log = logging.getLogger(__name__)

DEFAULT_LOG_EVERY = 10
"""Iterations between two progress lines when ``optimizer.log_every`` is not set."""


class LBFGSNotConvergedWarning(UserWarning):
    """A full-batch L-BFGS run stopped before its convergence test passed."""


class FullBatchTraining:
    """Mixin of the :class:`~neurocrf.models.tagger.Tagger` (a LightningModule with manual
    optimisation when ``full_batch``): the whole-set objective, the optimizer step of each epoch,
    progress lines, and the convergence report at the end.

    The host provides ``full_batch``, ``optimizer_config``, ``encoder``, ``head``, ``tags``,
    ``_emissions(batch)`` and ``regularizer()``.
    """

    full_batch: bool
    optimizer_config: dict[str, Any]
    lbfgs_summary: dict[str, Any] | None = None  # set at the end of a full-batch fit
    _chunks: list[dict[str, Any]] | None = None
    _warned_extra_batches = False

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
        (``benchmarks/full_batch_chunks.py``, docs/benchmarks.md); a second-order CRF over 23
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
        """One epoch's optimizer step (at its first loader batch), its metrics and progress line."""
        if batch_idx > 0:  # the whole set went through at batch 0 (see on_train_start)
            return
        optimizer = self.optimizers()
        raw = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        before = getattr(raw, "iterations", 0)
        optimizer.step(closure=self.full_batch_objective)
        if not isinstance(raw, FullBatchLBFGS) or not raw.history:
            return
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
        self._log_progress(raw, before)

    def _iterations_left(self, raw: FullBatchLBFGS) -> int | None:
        """The most iterations the run may still take (optimizer limit, trainer epochs), or None."""
        limits = []
        if raw.max_iterations is not None:
            limits.append(raw.max_iterations - raw.iterations)
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0:
            limits.append((max_epochs - self.trainer.current_epoch - 1) * raw.iterations_per_step)
        return max(0, min(limits)) if limits else None

    def _log_progress(self, raw: FullBatchLBFGS, before: int) -> None:
        every = self.optimizer_config.get("log_every", DEFAULT_LOG_EVERY)
        if not every:
            return
        left = 0 if raw.finished else self._iterations_left(raw)
        if raw.iterations // int(every) == before // int(every) and left != 0:
            return
        log.info(progress_line(raw, left))

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


def progress_line(optimizer: FullBatchLBFGS, left: int | None) -> str:
    """One line on the run so far: iteration, objective, relative change, gradient norm, seconds
    per iteration (mean of the last 10) and, with ``left`` iterations at most to go, the time
    they take at that pace; the reason when the run has finished."""
    record = optimizer.history[-1]
    recent = [r["seconds"] for r in optimizer.history[-10:]]
    pace = sum(recent) / len(recent)
    of = "" if left is None else f" of at most {optimizer.iterations + left}"
    line = (
        f"L-BFGS iteration {optimizer.iterations}{of}: objective {record['objective']:.4e}"
        f" (relative change {record['relative_change']:.2g}, tolerance {optimizer.tolerance_change:g}),"
        f" gradient norm {record['grad_norm']:.3g}, {pace:.3g} s/iteration"
    )
    if optimizer.finished:
        return f"{line}, finished: {optimizer.reason}"
    if left is None:
        return line
    return f"{line}, at most {_duration(left * pace)} left"


def _duration(seconds: float) -> str:
    """``3h05m``, ``12m40s``, ``9s`` or ``<1s``.

    >>> _duration(3 * 3600 + 5 * 60 + 20), _duration(760), _duration(0.3)
    ('3h05m', '12m40s', '<1s')
    """
    if not math.isfinite(seconds):
        return "?"
    if 0 < seconds < 0.5:
        return "<1s"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def length_sorted_chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length (stable) and cut into groups whose padded size
    (longest length x group size) is at most ``budget`` tokens; an item longer than the budget
    is a group of its own.

    >>> length_sorted_chunks([5, 1, 3, 8, 2], 6)
    [[1, 4], [2], [0], [3]]
    """
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

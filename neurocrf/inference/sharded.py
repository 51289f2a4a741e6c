"""Prediction over several devices and machines, resumable after a preemption, through
Lightning's prediction loop.

The input is cut into *shards* of ``window`` consecutive sentences (shard ``c`` holds sentences
``c * window ..``). Every rank reads the input and predicts the shards ``c`` with
``c % world_size == rank`` (:class:`ShardStream`); a prediction writer
(:class:`ShardWriter`, a ``BasePredictionWriter``) writes each finished shard to
``<output folder>/.<output name>.shards/<c>.part`` (a temporary file renamed into place), then its
completion record ``<c>.done.json`` (sentences, tokens, bytes, the SHA-256 of the shard, and a
fingerprint of the job: input file, its size and time, the checkpoint, the output options). After
the loop, global rank 0 (rank 0 of node 0) merges the shards in input order into the output (whole
or absent, as for one process; :mod:`neurocrf.inference.output`) and removes them. The output is
byte for byte the output of one process: shards are windows of the same reader, written by the
same writer.

On several nodes, every rank reads the input and checkpoint and writes its shards at the same
paths: they must be on a file system that every node shares. Before predicting, the ranks check
that they run the same job into the same output and see the same shard folder
(:mod:`neurocrf.inference.ranks`); rank 0 alone prepares the folder.

A re-run with the same input, checkpoint and options (after a preemption, a failed rank, a
``limit_predict_batches``) finds the shards already complete and predicts only the others. A shard
counts as complete only when its record names this job and its file has the recorded size and
hash: a shard cut off while being written (no rename happened), a deleted or altered one is
predicted again; the records of another job are removed first.

Standard input cannot be shared by several processes: ``input=-`` is refused here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader, IterableDataset

from neurocrf.data.conll import atomic_write_text
from neurocrf.data.streams import STDIN
from neurocrf.inference.output import AtomicOutput, sigterm_raises
from neurocrf.inference.progress import Progress
from neurocrf.inference.ranks import JOB_FILE, SHARED_WAIT_S, agree_on_folder, agree_on_job, gather, read_token
from neurocrf.inference.run import FilePrediction, check_prediction, model_tokens
from neurocrf.models.batching import plan_batches, windows
from neurocrf.models.collector import frozen_heap
from neurocrf.models.distributed import destroy_process_group_at_exit

log = logging.getLogger(__name__)


def is_distributed(trainer: dict[str, Any]) -> bool:
    """Whether a trainer config asks for more than one process (devices, nodes)."""
    devices = trainer.get("devices", 1)
    many = devices not in (1, "1", None, "auto") and not (isinstance(devices, list) and len(devices) == 1)
    return bool(many or int(trainer.get("num_nodes", 1) or 1) > 1)


def shard_dir(output: str) -> Path:
    """Where the shards of ``output`` live while a run is under way."""
    target = Path(output)
    return target.with_name(f".{target.name}.shards")


def job_key(job: FilePrediction, checkpoint: str | None, options: dict[str, Any]) -> str:
    """A fingerprint of what a shard's content depends on: the input file (path, size, time),
    the checkpoint (same), the output and model options."""

    def stat(path: str | None) -> list[Any]:
        if not path:
            return [None]
        info = os.stat(path)
        return [str(Path(path).resolve()), info.st_size, info.st_mtime_ns]

    spec = {k: v for k, v in job.spec.items() if k != "output"}
    described = {"input": stat(job.spec["input"]), "checkpoint": stat(checkpoint), "spec": spec, "options": options}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def complete_record(folder: Path, shard: int, key: str) -> dict[str, Any] | None:
    """The completion record of ``shard`` when the shard is complete (module docstring), else None."""
    record_path, part = folder / f"{shard:08d}.done.json", folder / f"{shard:08d}.part"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record.get("key") != key or part.stat().st_size != record["bytes"] or _digest(part) != record["sha256"]:
            return None
        return record
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Shard:
    """One shard on its way through the loop: its sentences and the predictions so far."""

    def __init__(self, job: FilePrediction, index: int, sentences: list[Any], previous_document: int | None,
                 last: bool) -> None:
        self.job, self.index, self.sentences, self.last = job, index, sentences, last
        self.previous_document = previous_document
        self.predictions: list[Any] = [None] * len(sentences)


class ShardStream(IterableDataset):
    """Batches of this rank's shards that are not complete yet: ``{"tokens", "positions",
    "shard", "done"}``, ``done`` on the last batch of a shard (a shard of empty sentences only
    is one batch without tokens)."""

    def __init__(self, spec: dict[str, Any], key: str, batch_size: int, max_tokens: int | None,
                 token_columns: list[int] | None) -> None:
        self.spec, self.key, self.batch_size, self.max_tokens = spec, key, batch_size, max_tokens
        self.token_columns = token_columns

    def __iter__(self) -> Iterator[dict[str, Any]]:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank = torch.distributed.get_rank() if distributed else 0
        world = torch.distributed.get_world_size() if distributed else 1
        job = FilePrediction(**self.spec)
        folder = shard_dir(job.output)
        previous: int | None = None
        chunks = windows(job.sentences(), job.options.window)
        current = next(chunks, None)
        index = 0
        while current is not None:
            following = next(chunks, None)
            if index % world == rank and complete_record(folder, index, self.key) is None:
                shard = _Shard(job, index, current, previous, following is None)
                tokens = [model_tokens(s, self.token_columns) for s in current]
                plan = plan_batches([len(t) for t in tokens], self.batch_size, self.max_tokens) or [[]]
                for number, positions in enumerate(plan):
                    yield {"tokens": [tokens[i] for i in positions], "positions": positions, "shard": shard,
                           "done": number == len(plan) - 1}
            previous = current[-1].document
            current, index = following, index + 1


def _batch(item: dict[str, Any]) -> dict[str, Any]:
    return item


class ShardWriter(BasePredictionWriter):
    """Writes each finished shard of ``output`` and its completion record (module docstring).

    Before the loop (``setup``, every rank, once the process group is up): the ranks check that
    they run one job into one output, rank 0 prepares the shard folder and its run token
    (``token``, in each record this run writes), then the ranks check that they all see it
    (:mod:`neurocrf.inference.ranks`). At the end of the loop, or when a rank fails in it, the
    ranks meet once more: each learns which rank and host wrote which shard in this run
    (``written_by``), and the others stop with the error of a rank that failed."""

    def __init__(self, key: str, output: str, progress: bool | None = None,
                 shared_wait_s: float = SHARED_WAIT_S) -> None:
        super().__init__(write_interval="batch")
        self.key, self.output, self.folder, self.progress = key, output, shard_dir(output), progress
        self.shared_wait_s = shared_wait_s
        self.token, self._in_loop = "", False
        self.written: list[int] = []
        self.written_by: dict[int, str] = {}
        self._bar: Progress | None = None

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        destroy_process_group_at_exit()  # before anything here can fail (neurocrf.models.distributed)
        views = agree_on_job(trainer.global_rank, self.output, self.key)
        prepared: tuple[int, str] | str | None = None
        if trainer.is_global_zero:
            try:
                prepared = prepare_shards(self.folder, self.key)
            except OSError as error:
                prepared = f"{self.folder}: cannot prepare the shard folder ({error})"
        prepared = trainer.strategy.broadcast(prepared, src=0)
        if isinstance(prepared, str):
            raise OSError(prepared)
        reused, self.token = prepared
        if reused and trainer.is_global_zero:
            log.info("%s: %d complete shard(s) found, predicting the others", self.folder, reused)
        agree_on_folder(views, self.folder, self.token, self.shared_wait_s)
        self._in_loop = True

    def write_on_batch_end(self, trainer: pl.Trainer, pl_module: Any, prediction: Any, batch_indices: Any,
                           batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        shard: _Shard = batch["shard"]
        for position, result in zip(batch["positions"], prediction):
            shard.predictions[position] = result
        if batch["done"]:
            self.write_shard(shard, pl_module)
            if trainer.is_global_zero:  # rank 0 reads the whole input: its position is the run's
                if self._bar is None:
                    self._bar = Progress(shard.job.input.source.size, self.progress, "predict (rank 0)")
                self._bar.update(len(shard.sentences), sum(len(s.tokens) for s in shard.sentences),
                                 shard.job.input.source.bytes_read)

    def write_shard(self, shard: _Shard, model: Any) -> None:
        folder = shard_dir(shard.job.output)
        part = folder / f"{shard.index:08d}.part"
        empty = model.predict([[]], model.predict_options)[0]
        with AtomicOutput(part) as out:
            writer = shard.job.writer(out.handle, document=shard.previous_document)
            for sentence, prediction in zip(shard.sentences, shard.predictions):
                prediction = prediction if sentence.tokens else empty
                check_prediction(sentence, prediction)
                writer.write(sentence, prediction)
            out.commit()
        record = {"key": self.key, "shard": shard.index, "last": shard.last, "sentences": len(shard.sentences),
                  "tokens": sum(len(s.tokens) for s in shard.sentences), "bytes": part.stat().st_size,
                  "sha256": _digest(part), "first_line": shard.sentences[0].line, "run": self.token}
        atomic_write_text(folder / f"{shard.index:08d}.done.json", json.dumps(record) + "\n")
        self.written.append(shard.index)
        log.info("shard %d: %d sentences written", shard.index, record["sentences"])

    def on_predict_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._finish(None)

    def on_exception(self, trainer: pl.Trainer, pl_module: Any, exception: BaseException) -> None:
        # a rank that fails inside the loop still meets the others at the end, so that they stop
        # too (rather than wait for it until the process group's timeout)
        self._finish(f"{type(exception).__name__}: {exception}")

    def _finish(self, error: str | None) -> None:
        """Exchange, once per run and only after ``setup`` succeeded, what each rank wrote and
        whether it failed; a rank that failed stops every other rank."""
        if not self._in_loop:
            return
        self._in_loop = False
        ends = gather({"host": socket.gethostname(), "written": self.written, "error": error})
        for rank, end in enumerate(ends):
            self.written_by.update((shard, f"rank {rank} on {end['host']}") for shard in end["written"])
        failed = [f"rank {rank} on {end['host']} ({end['error']})" for rank, end in enumerate(ends) if end["error"]]
        if failed and error is None:
            raise RuntimeError(f"{'; '.join(failed)} stopped the run; the complete shards are kept in {self.folder}:"
                               f" the same command again predicts only the others")


def prepare_shards(folder: Path, key: str) -> tuple[int, str]:
    """Make ``folder`` hold only this job's shards: records of another job (and their shards)
    are removed, and the job file gets a fresh run token. Returns how many shards are complete
    already, and the token."""
    folder.mkdir(parents=True, exist_ok=True)
    job_file = folder / JOB_FILE
    try:
        previous = json.loads(job_file.read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous != key:
        if previous is not None:
            log.warning("%s holds the shards of another job (input, checkpoint or options changed): removed", folder)
        for path in folder.iterdir():
            path.unlink()
    token = uuid.uuid4().hex
    atomic_write_text(job_file, json.dumps({"key": key, "run": token}) + "\n")
    complete = sum(complete_record(folder, int(p.name[:8]), key) is not None for p in folder.glob("*.done.json"))
    return complete, token


def merge_shards(folder: Path, output: str, key: str, written_by: dict[int, str] | None = None) -> dict[str, Any]:
    """Concatenate the complete shards 0, 1, ... up to the last one into ``output`` (whole or
    absent), then remove the shard folder.

    Raises:
        RuntimeError: naming the shards that are not complete (the folder is kept: a re-run of
            the same command predicts only those), and, among them, those that another rank
            wrote in this run (``written_by``: shard -> rank) but that this process does not see.
    """
    token = read_token(folder)
    records, missing, index = [], [], 0
    last_seen = max((int(p.name[:8]) for p in folder.glob("*.done.json")), default=-1)
    while True:
        record = complete_record(folder, index, key)
        if record is None:
            missing.append(index)
        else:
            records.append(record)
            if record["last"]:
                break
        if index > last_seen and missing:
            break
        index += 1
    unseen = {shard: written_by[shard] for shard in missing if shard in (written_by or {})}
    if unseen:
        raise RuntimeError(
            f"{output}: shard(s) {sorted(unseen)} written in this run ({', '.join(sorted(set(unseen.values())))})"
            f" are not complete in {folder} as {socket.gethostname()} sees it: the output must be on a file system"
            f" that every node shares, at the same path"
        )
    if missing:
        raise RuntimeError(
            f"{output}: shard(s) {missing[:10]}{' ...' if len(missing) > 10 else ''} not complete"
            f"{' (and the last shard not reached)' if not records or not records[-1]['last'] else ''};"
            f" {len(records)} complete shard(s) kept in {folder}: run the same command again to predict the rest"
        )
    with sigterm_raises(), AtomicOutput(output) as out:
        for record in records:
            with open(folder / f"{record['shard']:08d}.part", encoding="utf-8", newline="") as part:
                shutil.copyfileobj(part, out.handle)
        out.commit()
    shutil.rmtree(folder, ignore_errors=True)
    return {"sentences": sum(r["sentences"] for r in records), "tokens": sum(r["tokens"] for r in records),
            "shards": len(records), "reused": sum(r.get("run") != token for r in records)}


def predict_sharded(
    job: FilePrediction,
    model: Any,
    trainer_config: dict[str, Any],
    *,
    checkpoint: str | None = None,
    token_columns: list[int] | None = None,
    progress: bool | None = None,
    shared_wait_s: float = SHARED_WAIT_S,
) -> dict[str, Any]:
    """Run ``job`` with ``model`` and the job's ``options`` through ``Trainer(**trainer_config).predict``
    (module docstring); returns the summary of :meth:`FilePrediction.run` plus ``shards`` and
    ``reused`` (shards found complete). ``checkpoint``: the file ``model`` was loaded from (part of the
    job's fingerprint); ``progress``: rank 0's progress bar (None: when stderr is a terminal);
    ``shared_wait_s``: how long each rank waits to see the shard folder that rank 0 prepared
    (:mod:`neurocrf.inference.ranks`)."""
    if job.input.name == STDIN:
        raise ValueError("input=- (standard input) cannot be shared by several processes or resumed: give a file")
    job.input.source.close()
    columns = model.token_columns if token_columns is None else list(token_columns)
    model.predict_options = job.options
    key = job_key(job, checkpoint, {**asdict(job.options), "columns": columns})
    writer = ShardWriter(key, job.output, progress, shared_wait_s)
    config = {k: v for k, v in trainer_config.items() if k != "_target_"}
    config.update(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer = pl.Trainer(callbacks=[writer], **config)
    stream = ShardStream(job.spec, key, job.options.batch_size, job.options.max_tokens, columns)
    with warnings.catch_warnings(), frozen_heap():  # the stream has no sampler: the writer needs no batch indices
        warnings.filterwarnings("ignore", message="Couldn't infer the batch indices")
        trainer.predict(model, dataloaders=DataLoader(stream, batch_size=None, collate_fn=_batch),
                        return_predictions=False)
    if not trainer.is_global_zero:
        return {"output": job.output, "rank": trainer.global_rank}
    summary = merge_shards(writer.folder, job.output, key, writer.written_by)
    if job.output != STDIN:
        log.info("wrote %d sentences to %s (%d shards, %d reused)", summary["sentences"], job.output,
                 summary["shards"], summary["reused"])
    return {**summary, "input_format": job.input.format, "output": job.output}

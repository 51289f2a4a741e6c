"""Train a tagger from the Hydra config tree (``configs/train.yaml``).

    python -m neurocrf.cli.train                                  # sample corpus, BiLSTM-CRF, CPU
    neurocrf-train crf=precursor encoder=transformer trainer=gpu
    neurocrf-train ckpt_path=logs/train/runs/<run>/checkpoints/last.ckpt   # resume
    neurocrf-train crf=second_order init_from=<first-order checkpoint>     # warm start
    neurocrf-train hparams_search=crf_study experiment=crf_study_ncbi_disease   # resumable sweep

With ``resume=true`` and a fixed run directory, a run whose ``summary.json`` exists is skipped and
one that left ``checkpoints/last.ckpt`` continues from it: a sweep cut off anywhere completes on a
rerun of the same command.

Steps: data module -> vocabularies from the training sentences -> Tagger -> fit -> test the best
checkpoint -> ``summary.json`` (test scores, per-epoch seconds and dev F1, best epoch, device).
A run whose callbacks saved no checkpoint (the full-batch L-BFGS experiments) writes
its final weights to ``checkpoints/final.ckpt`` (``save_final``). Returns
``cfg.optimized_metric`` so that sweepers can optimise it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, open_dict

from neurocrf.cli.utils import best_checkpoint, float_metrics, instantiate_list, log_config, set_seed, training_main
from neurocrf.models.building import build_tagger
from neurocrf.models.checkpoints import TAGGER, CheckpointError, read_checkpoint
from neurocrf.study.runs import SUMMARY_FILE
from neurocrf.values import to_plain

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Fit and test; returns the logged metrics (floats) and the objects built."""
    if cfg.get("resume"):
        finished = _finished_summary(Path(cfg.paths.output_dir))
        if finished is not None:
            log.info("resume: %s holds a finished run (%s): skipped", cfg.paths.output_dir, SUMMARY_FILE)
            return finished["metrics"], {"cfg": cfg, "summary": finished}
        _resume_from_last(cfg)
    set_seed(cfg.get("seed"))

    log.info("instantiating data <%s>", cfg.data.get("_target_"))
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")
    summary = datamodule.summary() if hasattr(datamodule, "summary") else {}
    log.info("data: %s", {k: v for k, v in summary.items() if k != "tags"})

    model = build_tagger(cfg, datamodule)
    model.report_dir = str(cfg.paths.output_dir)
    datamodule.set_input_builder(model.encoder.preparer)

    callbacks: list[pl.Callback] = instantiate_list(cfg.get("callbacks"), "callback")
    no_dev = hasattr(datamodule, "has_split") and not datamodule.has_split("dev")
    if no_dev:
        _check_no_dev_monitors(callbacks)
        log.warning("no dev split (data.dev_path and data.dev_fraction are null): validation is off")
    loggers = instantiate_list(cfg.get("logger"), "logger")
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, _convert_="all",
        **({"limit_val_batches": 0} if no_dev else {}),
    )
    log_config(loggers, cfg, {"data_summary": summary} if summary else None)

    objects = {"cfg": cfg, "datamodule": datamodule, "model": model, "trainer": trainer}
    final_ckpt: str | None = None
    if cfg.get("train", True):
        trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
        # before testing: trainer.test(ckpt_path=...) restores the callbacks' states of that checkpoint
        objects["epochs"], objects["best_epoch"] = _epoch_records(callbacks)
        if best_checkpoint(trainer) is None and cfg.get("save_final", True):
            final_ckpt = str(Path(cfg.paths.output_dir) / "checkpoints" / "final.ckpt")
            trainer.save_checkpoint(final_ckpt, weights_only=True)
            log.info("no checkpoint callback saved the model: final weights written to %s", final_ckpt)
    metrics = float_metrics(trainer.callback_metrics)

    if cfg.get("test", True):
        ckpt_path = best_checkpoint(trainer)
        if ckpt_path is None and not cfg.get("train", True):
            ckpt_path = cfg.get("ckpt_path")
        if ckpt_path is None:
            log.warning("no best checkpoint found: testing the current weights%s",
                        f" (saved as {final_ckpt})" if final_ckpt else "")
        trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path)
        metrics.update(float_metrics(trainer.callback_metrics))
        ckpt_path = ckpt_path or final_ckpt
        if trainer.is_global_zero:
            print(f"test/f1 = {metrics.get('test/f1', float('nan')):.4f}")
            print(f"checkpoint: {ckpt_path or '(none: current weights)'}")
            print(f"report: {cfg.paths.output_dir}/test_report.txt")
        objects["ckpt_path"] = ckpt_path
    objects["final_ckpt"] = final_ckpt
    if trainer.is_global_zero and cfg.get("train", True):
        objects["summary"] = _write_summary(cfg, metrics, objects)
    return metrics, objects


def _finished_summary(output_dir: Path) -> dict[str, Any] | None:
    path = output_dir / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable run summary ({error}); delete it to rerun the run") from None


def _resume_from_last(cfg: DictConfig) -> None:
    """Point ``cfg.ckpt_path`` at the run directory's ``checkpoints/last.ckpt`` when there is one
    (a checkpoint that does not load, e.g. cut off while being written, is set aside)."""
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    if cfg.get("ckpt_path") or not last.is_file():
        return
    try:
        read_checkpoint(last, TAGGER)
    except CheckpointError as error:  # e.g. cut off while being written: start the run again
        broken = last.with_suffix(".ckpt.broken")
        last.rename(broken)
        log.warning("resume: %s does not load (%s); moved to %s, the run starts again", last, error, broken)
        return
    with open_dict(cfg):
        cfg.ckpt_path = str(last)
    log.info("resume: continuing from %s", last)


def _write_summary(cfg: DictConfig, metrics: dict[str, float], objects: dict[str, Any]) -> dict[str, Any]:
    """``<run dir>/summary.json`` (written whole or not at all): what a sweep report needs from one run."""
    from neurocrf.data.conll import atomic_write_text

    model = objects["model"]
    summary = {
        "metrics": metrics,
        "test": model.test_scores.to_dict() if model.test_scores is not None else None,
        "checkpoint": objects.get("ckpt_path"),
        "epochs": objects.get("epochs", []),
        "best_epoch": objects.get("best_epoch"),
        "seed": cfg.get("seed"),
        "crf": to_plain(cfg.crf),
        "data": {key: value for key, value in (to_plain(cfg.data) or {}).items() if key.endswith("_path")},
        "corpus": _hydra_choice("data"),
        "overrides": _task_overrides(),
        "device": _device_name(objects["trainer"]),
        "torch_threads": torch.get_num_threads(),
    }
    atomic_write_text(Path(cfg.paths.output_dir) / SUMMARY_FILE, json.dumps(summary, indent=1) + "\n")
    return summary


def _epoch_records(callbacks: list[pl.Callback]) -> tuple[list[dict[str, Any]], int | None]:
    """The epoch timer's records and best epoch, taken before testing restores another state."""
    from neurocrf.models.callbacks import EpochTimer

    timer = next((c for c in callbacks if isinstance(c, EpochTimer)), None)
    if timer is None:
        return [], None
    return [dict(record) for record in timer.records], timer.best_epoch()


def _task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # no Hydra run (a config composed by a script)
        return []


def _hydra_choice(group: str) -> str | None:
    from hydra.core.hydra_config import HydraConfig

    try:
        return HydraConfig.get().runtime.choices.get(group)
    except ValueError:
        return None


def _device_name(trainer: pl.Trainer) -> str:
    root = trainer.strategy.root_device
    if root.type == "cuda":
        return torch.cuda.get_device_name(root)
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            name = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), name)
    except OSError:
        pass
    return f"cpu ({name})"


def _check_no_dev_monitors(callbacks: list[pl.Callback]) -> None:
    """Without a dev split nothing logs ``val/*``: a callback monitoring it would silently never
    fire (checkpoints, early stopping), so say so before training."""
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if isinstance(monitor, str) and monitor.startswith("val/"):
            raise ValueError(
                f"{type(callback).__name__} monitors {monitor!r}, but the data has no dev split"
                " (data.dev_path and data.dev_fraction are null): give a dev split, or drop the"
                " callback (e.g. callbacks=none, or ~callbacks.model_checkpoint)"
            )


main = training_main(train, "train")


if __name__ == "__main__":
    main()

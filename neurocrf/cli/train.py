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

import logging
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
from omegaconf import DictConfig

from neurocrf.cli.utils import best_checkpoint, float_metrics, instantiate_list, log_config, set_seed, training_main
from neurocrf.conventions import SUMMARY_FILE
from neurocrf.models.building import build_tagger
from neurocrf.models.runs import (
    check_no_dev_monitors,
    epoch_records,
    finished_summary,
    resume_from_last,
    write_summary,
)

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Fit and test; returns the logged metrics (floats) and the objects built."""
    if cfg.get("resume"):
        finished = finished_summary(Path(cfg.paths.output_dir))
        if finished is not None:
            log.info("resume: %s holds a finished run (%s): skipped", cfg.paths.output_dir, SUMMARY_FILE)
            return finished["metrics"], {"cfg": cfg, "summary": finished}
        resume_from_last(cfg)
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
        check_no_dev_monitors(callbacks)
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
        objects["epochs"], objects["best_epoch"] = epoch_records(callbacks)
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
        objects["summary"] = write_summary(cfg, metrics, objects)
    return metrics, objects


main = training_main(train, "train")


if __name__ == "__main__":
    main()

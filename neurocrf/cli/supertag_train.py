"""Train a supertagger on a treebank, test it, and parse with the best checkpoint (``configs/supertag.yaml``).

    python -m neurocrf.cli.supertag_train                        # the tiny generated treebank
    neurocrf-supertag treebank=alpino trainer.max_epochs=30
    neurocrf-supertag treebank=alpino encoder=transformer trainer=gpu
    neurocrf-supertag ... ckpt_path=<run>/checkpoints/last.ckpt          # resume
    neurocrf-supertag ... init_from=<run>/checkpoints/<best>.ckpt optimizer.lr=5e-4 \
        scheduler='{name:linear,warmup_steps:0}' trainer.max_epochs=12   # fine-tune a trained model

``init_from`` starts a new run (epoch 0, fresh optimizer, schedule and weight average) from the
weights of a checkpoint; the model (encoder, vocabularies, heads, auxiliary heads) is the
checkpoint's, the optimizer, scheduler, trainer and data options are this run's config.

Steps: treebank -> :class:`~neurocrf.supertagging.data.SupertagDataModule` (split, supertags
extracted) -> vocabularies from the training words -> :class:`Supertagger` -> fit (checkpoints
by ``val/supertag_acc``) -> test (supertag and preterminal accuracy) -> with the best checkpoint,
parse the splits in ``final_parse.splits`` (default dev and test) and report F1, Dis-F1, coverage
and speed (``parse_<split>.discbracket`` and ``parse_<split>_report.{json,txt}`` in the run
directory). Returns ``cfg.optimized_metric`` for sweepers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
from omegaconf import DictConfig

from neurocrf.cli.tool import tool_main
from neurocrf.cli.utils import best_checkpoint, float_metrics, instantiate_list, log_config, set_seed, training_result
from neurocrf.models.building import start_options
from neurocrf.models.checkpoints import SUPERTAGGER, read_checkpoint
from neurocrf.values import to_plain

log = logging.getLogger(__name__)


def source_checkpoint(cfg: DictConfig) -> tuple[str, dict[str, Any]] | None:
    """``(path, checkpoint)`` of ``cfg.ckpt_path`` (resume) or ``cfg.init_from`` (warm start), if any."""
    ckpt_path, init_from = start_options(cfg)
    path = ckpt_path or init_from
    if not path:
        return None
    return str(path), read_checkpoint(path, SUPERTAGGER)


def build_datamodule(cfg: DictConfig, source: tuple[str, dict[str, Any]] | None = None) -> Any:
    """The (set up) supertag data module of ``cfg.treebank`` with the ``cfg.data`` loader options;
    its auxiliary annotations are those of the ``source`` checkpoint's heads if given, else ``cfg.heads``."""
    from neurocrf.supertagging.data import SupertagDataModule

    data = dict(to_plain(cfg.data) or {})
    data.setdefault("seed", cfg.seed or 0)
    heads = source[1]["hyper_parameters"]["heads"] if source else to_plain(cfg.heads)
    data["auxiliary"] = list((heads or {}).get("auxiliary") or {})
    if bool(data.get("teacher")) != bool((heads or {}).get("distill")):
        raise ValueError("knowledge distillation needs both heads.distill (its weight, > 0) and data.teacher "
                         f"(the teacher's tag files); got heads.distill={(heads or {}).get('distill')} "
                         f"and data.teacher={data.get('teacher')}")
    datamodule = SupertagDataModule(treebank=to_plain(cfg.treebank), **data)
    datamodule.setup("fit")
    return datamodule


def build_model(cfg: DictConfig, datamodule: Any, source: tuple[str, dict[str, Any]] | None = None) -> Any:
    """A new Supertagger for ``datamodule``, or the model of the ``source`` checkpoint: as saved
    (``cfg.ckpt_path``, to resume) or with its weights loaded and this run's optimizer, scheduler
    and config (``cfg.init_from``)."""
    from neurocrf.encoders import build_vocabularies
    from neurocrf.supertagging.supertagger import Supertagger

    run_config = {key: value for key, value in (to_plain(cfg) or {}).items() if key != "hydra"}
    if source:
        path, checkpoint = source
        hparams = dict(checkpoint["hyper_parameters"])
        for name in ("supertags", "preterminals"):
            if hparams[name] != getattr(datamodule, name):
                raise ValueError(f"{path}: the checkpoint's {name} differ from the treebank's")
        if not cfg.init_from:
            return Supertagger(**hparams, restore=True)
        hparams.update(optimizer=to_plain(cfg.optimizer), scheduler=to_plain(cfg.scheduler),
                       config=run_config)
        model = Supertagger(**hparams, restore=True)
        model.load_state_dict(checkpoint["state_dict"])
        log.info("init_from=%s: all %d tensors loaded", path, len(checkpoint["state_dict"]))
        return model
    encoder = to_plain(cfg.encoder)
    vocabularies = build_vocabularies(encoder, [s.words for s in datamodule.corpora["train"]])
    options = datamodule.treebank_config
    return Supertagger(
        encoder=encoder,
        vocabularies=vocabularies,
        supertags=list(datamodule.supertags),
        preterminals=list(datamodule.preterminals),
        roots=list(datamodule.roots),
        auxiliary_labels=dict(datamodule.auxiliary_labels),
        optimizer=to_plain(cfg.optimizer),
        scheduler=to_plain(cfg.scheduler),
        heads=to_plain(cfg.heads),
        parsing=to_plain(cfg.parsing),
        transform={"move_punctuation": bool(options["move_punctuation"]), "h": int(options["h"]),
                   "v": int(options["v"]), "treebank": options.get("name")},
        config=run_config,
    )


def final_parse(cfg: DictConfig, model: Any, datamodule: Any) -> dict[str, float]:
    """Parse ``cfg.final_parse.splits`` with ``model``; returns ``parse_<split>/<metric>`` floats."""
    from neurocrf.supertagging.pipeline import summarize, tag_and_parse, write_run

    settings = to_plain(cfg.final_parse) or {}
    parsing = model.parsing
    metrics: dict[str, float] = {}
    for split in settings["splits"]:
        gold = datamodule.gold_treebank(split)
        if not gold:
            continue
        run = tag_and_parse(model, [s.id for s in gold], [s.words for s in gold],
                            k=int(settings["k"] or parsing["k"]),
                            time_limit=settings["time_limit"],
                            max_items=parsing["max_items"],
                            batch_size=int(settings["batch_size"]),
                            fallback_k=settings["fallback_k"])
        corpus = datamodule.corpora[split]
        report = summarize(run, gold, params=settings["params"],
                           gold_supertags=[s.supertags for s in corpus],
                           gold_preterminals=[s.preterminals for s in corpus],
                           known_supertags=model.supertags)
        paths = write_run(run, report, Path(cfg.paths.output_dir) / f"parse_{split}.discbracket")
        for key in ("f1", "dis_f1", "coverage", "pos_accuracy", "exact_match", "supertag_accuracy",
                    "sentences_per_second", "parsing_sentences_per_second"):
            metrics[f"parse_{split}/{key}"] = float(report[key])
        print(f"{split}: F1 {100 * report['f1']:.2f}  Dis-F1 {100 * report['dis_f1']:.2f}  "
              f"coverage {100 * report['coverage']:.2f}  supertag acc {100 * report['supertag_accuracy']:.2f}"
              f"  ({report['sentences_per_second']:.1f} sentences/s; report {paths[2]})")
    return metrics


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Fit, test and parse; returns the metrics (floats) and the objects built."""
    from neurocrf.supertagging.supertagger import Supertagger

    set_seed(cfg.seed)
    source = source_checkpoint(cfg)
    datamodule = build_datamodule(cfg, source)
    summary = datamodule.summary()
    log.info("data: %s", summary)
    model = build_model(cfg, datamodule, source)
    datamodule.set_input_builder(model.encoder.preparer)

    callbacks: list[pl.Callback] = instantiate_list(cfg.get("callbacks"), "callback")
    loggers = instantiate_list(cfg.get("logger"), "logger")
    trainer: pl.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False,
                                                  _convert_="all")
    log_config(loggers, cfg, {"data": summary})
    objects: dict[str, Any] = {"cfg": cfg, "datamodule": datamodule, "model": model, "trainer": trainer}
    if cfg.train:
        trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    metrics = float_metrics(trainer.callback_metrics)

    best = best_checkpoint(trainer)
    objects["ckpt_path"] = best
    if cfg.test:
        trainer.test(model, datamodule=datamodule, ckpt_path=best)
        metrics.update(float_metrics(trainer.callback_metrics))
    if cfg.final_parse and cfg.final_parse.splits and trainer.is_global_zero:
        parser_model = Supertagger.load(best).to(model.device) if best else model.eval()
        metrics.update(final_parse(cfg, parser_model, datamodule))
    if trainer.is_global_zero:
        print(f"test/supertag_acc = {metrics.get('test/supertag_acc', float('nan')):.4f}")
        print(f"checkpoint: {best or '(none: current weights)'}")
    return metrics, objects


main = tool_main(train, "supertag", "neurocrf-supertag", training_result)


if __name__ == "__main__":
    main()

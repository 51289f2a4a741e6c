"""Evaluate a trained checkpoint on a corpus split (``configs/evaluate.yaml``).

    neurocrf-evaluate ckpt_path=logs/train/runs/<run>/checkpoints/last.ckpt
    neurocrf-evaluate ckpt_path=... data=conll2003 split=dev trainer=gpu

Prints strict span precision / recall / F1 and writes ``<split>_report.txt`` (per entity type)
and ``<split>_metrics.json`` into the run directory (or ``report_dir``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
from omegaconf import DictConfig

from neurocrf.cli.tool import tool_main
from neurocrf.cli.utils import float_metrics, instantiate_list, set_seed, set_threads
from neurocrf.conventions import SPLITS

log = logging.getLogger(__name__)

EVALUATION_SPLITS = SPLITS[1:]  # dev, test


def align_tags(datamodule: Any, tags: list[str], sentences: list[Any], where: str) -> None:
    """Make the data module produce the model's tag ids.

    The data module numbers the tags of its own training file; the checkpoint's numbering wins.
    Raises ValueError naming file and line of a gold tag the model does not know.
    """
    known = set(tags)
    for sentence in sentences:
        for position, tag in enumerate(sentence.tags or ()):
            if tag not in known:
                location = sentence.location(position) if hasattr(sentence, "location") else where
                raise ValueError(
                    f"{location}: gold tag {tag!r} is not one of the checkpoint's tags {tags}"
                )
    if list(datamodule.tags) != list(tags):
        datamodule.tags = list(tags)
        datamodule.tag_to_id = {tag: i for i, tag in enumerate(tags)}


def file_only(data: DictConfig, split: str) -> dict[str, Any]:
    """Options of the data config's module that make it read the evaluated split's file alone
    (as its training and test file: no other file is read, and no sample corpus generated); none
    when that file is the built-in sample's own (generated if missing) or the split is cut out of
    the training file (``dev_fraction``, ``split_fractions``)."""
    path, sample_dir = data.get(f"{split}_path"), data.get("sample_dir")
    if data.get("split_fractions") is not None or (split == "dev" and data.get("dev_fraction") is not None):
        return {}
    if path is None:
        if sample_dir:
            return {}
        raise ValueError(f"data.{split}_path is not set: give data.{split}_path=<a column file>")
    if sample_dir and Path(path).resolve().parent == Path(sample_dir).resolve():
        return {}
    return {"train_path": path, "dev_path": None, "test_path": path, "sample_dir": None, "dev_fraction": None}


def evaluate(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Test ``cfg.ckpt_path`` on ``cfg.split`` of ``cfg.data``; returns metrics and objects."""
    from neurocrf.models.tagger import Tagger

    split = cfg.split
    if split not in EVALUATION_SPLITS:
        raise ValueError(f"split must be one of {EVALUATION_SPLITS}, got {split!r}")
    set_threads(cfg.threads)
    set_seed(cfg.seed)
    model = Tagger.load(cfg.ckpt_path)
    # Read the corpus in the model's scheme so gold and predicted tags compare directly.
    # A model trained on joined columns (word + POS) or on some span types only (data.keep_types)
    # is evaluated the same way unless the data config says otherwise.
    inherited = {key: getattr(model, key) for key in ("token_columns", "keep_types") if cfg.data.get(key) is None}
    alone = file_only(cfg.data, split)
    datamodule = hydra.utils.instantiate(cfg.data, scheme=model.scheme, _convert_="all", **inherited, **alone)
    datamodule.prepare_data()
    datamodule.setup("test")
    sentences = datamodule.dev_sentences if split == "dev" and not alone else datamodule.test_sentences
    align_tags(datamodule, model.tags, sentences, str(cfg.data.get(f"{split}_path")))
    datamodule.set_input_builder(model.encoder.preparer)

    model.report_dir = str(cfg.report_dir or cfg.paths.output_dir)
    model.report_prefix = split
    callbacks = instantiate_list(cfg.get("callbacks"), "callback")
    trainer: pl.Trainer = hydra.utils.instantiate(cfg.trainer, logger=False, callbacks=callbacks, _convert_="all")
    trainer.test(model, dataloaders=datamodule.dataloader(sentences))
    metrics = float_metrics(trainer.callback_metrics)
    if trainer.is_global_zero:
        print(
            f"{split}: precision {metrics.get('test/precision', float('nan')):.4f}"
            f"  recall {metrics.get('test/recall', float('nan')):.4f}"
            f"  f1 {metrics.get('test/f1', float('nan')):.4f}"
        )
        if model.test_scores is not None:
            from neurocrf.models.metrics import format_report

            print(format_report(model.test_scores), end="")
        print(f"report: {model.report_dir}/{split}_report.txt")
    return metrics, {"cfg": cfg, "model": model, "datamodule": datamodule, "trainer": trainer}


main = tool_main(evaluate, "evaluate", "neurocrf-evaluate", lambda cfg, out: out[0].get("test/f1"))


if __name__ == "__main__":
    main()

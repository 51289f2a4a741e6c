"""A Tagger from a run config (``configs/train.yaml`` composed): new, resumed, or started from the
weights of a trained checkpoint. What ``neurocrf-train`` builds, for scripts and tests too::

    model = build_tagger(cfg, datamodule)       # the data module set up (its tags, training words)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from omegaconf import DictConfig

from neurocrf.encoders import build_vocabularies
from neurocrf.models.checkpoints import TAGGER, read_checkpoint
from neurocrf.models.tagger import Tagger
from neurocrf.values import to_plain

log = logging.getLogger(__name__)


def start_options(cfg: DictConfig) -> tuple[Any, Any]:
    """``(cfg.ckpt_path, cfg.init_from)``, refusing both at once: one resumes a run, the other starts
    a new run from a checkpoint's weights."""
    ckpt_path, init_from = cfg.get("ckpt_path"), cfg.get("init_from")
    if ckpt_path and init_from:
        raise ValueError("give ckpt_path (resume a run) or init_from (start a new run from its weights), not both")
    return ckpt_path, init_from


def build_tagger(cfg: DictConfig, datamodule: Any) -> Tagger:
    """A new Tagger for ``datamodule`` (set up), or, with ``cfg.ckpt_path``, the model saved
    in that checkpoint (same vocabularies and tags), ready to resume."""
    ckpt_path, init_from = start_options(cfg)
    if ckpt_path:
        checkpoint = read_checkpoint(ckpt_path, TAGGER)
        hparams = dict(checkpoint["hyper_parameters"])
        if hparams["tags"] != datamodule.tags:
            raise ValueError(
                f"{ckpt_path}: the checkpoint's tags {hparams['tags']} differ from the data's"
                f" {datamodule.tags}"
            )
        return Tagger(**hparams, restore=True)
    encoder = to_plain(cfg.encoder)
    source = _init_checkpoint(init_from, encoder, datamodule.tags) if init_from else None
    if source is not None:
        vocabularies = source["hyper_parameters"]["vocabularies"]
    else:
        vocabularies = build_vocabularies(encoder, [s.tokens for s in datamodule.train_sentences])
    run_config = {key: value for key, value in (to_plain(cfg) or {}).items() if key != "hydra"}
    model = Tagger(
        encoder=encoder,
        head=to_plain(cfg.crf),
        tags=list(datamodule.tags),
        scheme=datamodule.scheme,
        vocabularies=vocabularies,
        optimizer=to_plain(cfg.optimizer),
        scheduler=to_plain(cfg.get("scheduler")),
        config=run_config,
    )
    if source is not None:
        _copy_matching_weights(model, source["state_dict"], init_from)
    return model


def _init_checkpoint(path: str, encoder: dict[str, Any], tags: list[str]) -> dict[str, Any]:
    """The checkpoint ``init_from`` names, checked against the new run's encoder config and tags."""
    checkpoint = read_checkpoint(path, TAGGER)
    hparams = checkpoint["hyper_parameters"]
    if hparams["tags"] != list(tags):
        raise ValueError(
            f"init_from={path}: the checkpoint's tags {hparams['tags']} differ from the data's {list(tags)}"
        )
    if hparams["encoder"] != encoder:
        raise ValueError(f"init_from={path}: the checkpoint's encoder config {hparams['encoder']} differs from this"
                         f" run's {encoder}; feature and word ids would not line up")
    return checkpoint


def _copy_matching_weights(model: Any, state: dict[str, Any], path: str) -> None:
    """Load the tensors of ``state`` whose names and shapes match ``model``'s; the CRF's other
    score tensors start at zero, so that a CRF extending the checkpoint's (second order over first
    order) starts as the checkpoint's model. Logs what was copied."""
    own = model.state_dict()
    matching = {name: value for name, value in state.items() if name in own and own[name].shape == value.shape}
    model.load_state_dict(matching, strict=False)
    fresh = sorted(set(own) - set(matching))
    with torch.no_grad():
        for name, param in model.head.named_parameters(prefix="head"):
            if name in fresh:
                param.zero_()
    log.info("init_from=%s: %d tensors copied, %d start fresh%s", path, len(matching), len(fresh),
             f" ({', '.join(fresh)})" if fresh else "")

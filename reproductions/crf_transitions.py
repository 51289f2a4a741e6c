"""The transition scores of first-order CRF tagger checkpoints: size and range of the allowed ones.

    python -m reproductions.crf_transitions <run>/checkpoints/last.ckpt [<run2>/...] [--initial] [--dev]

For each checkpoint: the Frobenius norm, the smallest and largest value and the mean absolute
value of ``head.transitions`` over the transitions the tagging scheme allows (a constrained
CRF never uses the others, so they keep their initial values), and the dev F1 the checkpoint
was selected at (if logged). With ``--initial`` the run's untrained model is rebuilt from the run
config kept in the checkpoint, as ``neurocrf-train`` builds it (same seed, data and construction
order), and the distance of the trained scores from the initial ones is printed too. With
``--dev`` the dev set of the run is tagged twice, with the learned transitions and with every
transition score set to 0 (the scheme's constraints kept), to show what the learned scores add to
dev F1. Both need the pretrained encoder and the corpus readable where the run read them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import Tensor

from neurocrf.models.checkpoints import TAGGER, read_checkpoint


def allowed_entries(state: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """``head.transitions`` ``[L, L]`` and the boolean mask of its allowed entries."""
    transitions = state["head.transitions"].double()
    allowed = state.get("head.allowed_transitions")
    mask = torch.ones_like(transitions, dtype=torch.bool) if allowed is None else allowed.bool()
    return transitions, mask


def summary(values: Tensor) -> dict[str, float]:
    return {"norm": float(values.norm()), "min": float(values.min()), "max": float(values.max()),
            "mean_abs": float(values.abs().mean())}


def run_data(config: dict[str, Any]) -> tuple[Any, Any]:
    """``(cfg, datamodule)`` of a run config, seeded and set up as ``neurocrf-train`` does."""
    import hydra
    from omegaconf import OmegaConf

    from neurocrf.cli.utils import set_seed

    cfg = OmegaConf.create(config)
    cfg.ckpt_path, cfg.init_from = None, None
    set_seed(cfg.get("seed"))
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")
    return cfg, datamodule


def initial_state(config: dict[str, Any]) -> dict[str, Tensor]:
    """The state dict of the untrained model of a run config (``neurocrf-train``'s steps)."""
    from neurocrf.models.building import build_tagger

    cfg, datamodule = run_data(config)
    return build_tagger(cfg, datamodule).state_dict()


def dev_f1(path: str, zero_transitions: bool) -> float:
    """Span F1 of a checkpoint on its run's dev set (``val/f1``), optionally with the CRF's
    transition scores (start, pair, end) all set to 0."""
    import pytorch_lightning as pl

    from neurocrf.models.tagger import Tagger

    model = Tagger.load(path)
    _, datamodule = run_data(model.hparams["config"])
    datamodule.set_input_builder(model.encoder.preparer)
    if zero_transitions:
        with torch.no_grad():
            for name in ("start_transitions", "transitions", "end_transitions"):
                getattr(model.head, name).zero_()
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    return float(trainer.validate(model, datamodule=datamodule, verbose=False)[0]["val/f1"])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Print one JSON line per checkpoint; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--initial", action="store_true", help="also the distance from the run's initial scores")
    parser.add_argument("--dev", action="store_true", help="also dev F1 with and without the learned transitions")
    args = parser.parse_args(argv)
    rows = []
    for path in args.checkpoints:
        checkpoint = read_checkpoint(path, TAGGER)
        transitions, mask = allowed_entries(checkpoint["state_dict"])
        row: dict[str, Any] = {"checkpoint": path, "allowed": int(mask.sum()), "num_tags": transitions.shape[0],
                               **summary(transitions[mask])}
        optimizer = checkpoint["hyper_parameters"].get("optimizer", {})
        row.update(lr=optimizer.get("lr"), head_lr=optimizer.get("head_lr"), steps=checkpoint.get("global_step"))
        # the best-checkpoint callback's state (the last-epoch callback keeps no score)
        callback = next((v for v in checkpoint.get("callbacks", {}).values()
                         if isinstance(v, dict) and v.get("best_model_score") is not None), None)
        if callback:
            row["best_dev_f1"] = float(callback["best_model_score"])
        if args.initial:
            start, _ = allowed_entries(initial_state(checkpoint["hyper_parameters"]["config"]))
            row["initial"] = summary(start[mask])
            row["moved"] = summary((transitions - start)[mask])
        if args.dev:
            row["dev_f1"] = dev_f1(path, zero_transitions=False)
            row["dev_f1_zero_transitions"] = dev_f1(path, zero_transitions=True)
        print(json.dumps(row))
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()

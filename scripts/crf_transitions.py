"""The transition scores of first-order CRF tagger checkpoints: size and range of the allowed ones.

    python scripts/crf_transitions.py <run>/checkpoints/last.ckpt [<run2>/...] [--initial]

For each checkpoint: the Frobenius norm, the smallest and largest value and the mean absolute
value of ``head.transitions`` over the transitions the tagging scheme allows (a constrained
CRF never uses the others, so they keep their initial values), and the dev F1 the checkpoint
was selected at (if logged). With ``--initial`` the run's untrained model is rebuilt from the run
config kept in the checkpoint, as ``neurocrf-train`` builds it (same seed, data and construction
order), and the distance of the trained scores from the initial ones is printed too (the
pretrained encoder and the corpus must be readable where they were).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import Tensor


def allowed_entries(state: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """``head.transitions`` ``[L, L]`` and the boolean mask of its allowed entries."""
    transitions = state["head.transitions"].double()
    allowed = state.get("head.allowed_transitions")
    mask = torch.ones_like(transitions, dtype=torch.bool) if allowed is None else allowed.bool()
    return transitions, mask


def summary(values: Tensor) -> dict[str, float]:
    return {"norm": float(values.norm()), "min": float(values.min()), "max": float(values.max()),
            "mean_abs": float(values.abs().mean())}


def initial_state(config: dict[str, Any]) -> dict[str, Tensor]:
    """The state dict of the untrained model of a run config (``neurocrf-train``'s steps)."""
    import hydra
    from omegaconf import OmegaConf

    from neurocrf.cli.train import build_model
    from neurocrf.cli.utils import set_seed

    cfg = OmegaConf.create(config)
    cfg.ckpt_path, cfg.init_from = None, None
    set_seed(cfg.get("seed"))
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")
    return build_model(cfg, datamodule).state_dict()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Print one JSON line per checkpoint; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--initial", action="store_true", help="also the distance from the run's initial scores")
    args = parser.parse_args(argv)
    rows = []
    for path in args.checkpoints:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        transitions, mask = allowed_entries(checkpoint["state_dict"])
        row: dict[str, Any] = {"checkpoint": path, "allowed": int(mask.sum()), "num_tags": transitions.shape[0],
                               **summary(transitions[mask])}
        optimizer = checkpoint["hyper_parameters"].get("optimizer", {})
        row.update(lr=optimizer.get("lr"), head_lr=optimizer.get("head_lr"), steps=checkpoint.get("global_step"))
        callback = next((v for k, v in checkpoint.get("callbacks", {}).items() if "ModelCheckpoint" in k), None)
        if callback and callback.get("best_model_score") is not None:
            row["best_dev_f1"] = float(callback["best_model_score"])
        if args.initial:
            start, _ = allowed_entries(initial_state(checkpoint["hyper_parameters"]["config"]))
            row["initial"] = summary(start[mask])
            row["moved"] = summary((transitions - start)[mask])
        print(json.dumps(row))
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()

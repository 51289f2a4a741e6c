"""The precursor-induced CRF study (Lee & Choi 2018) and the classic feature-CRF checks.

Runs, each optional (results are appended to ``<workdir>/results.jsonl`` as they finish, and the
markdown tables are rewritten from that file after every run, so a long grid can be stopped and
its finished rows still reported):

--jnlpba      JNLPBA, sparse features (set1 / set2) x CRF (first_order / second_order / precursor),
              full-batch L-BFGS with sigma^2 = 100 (configs/experiment/precursor_jnlpba.yaml):
              Table 1 (P, R, F1 strict IOB2) and Table 2 (seconds per L-BFGS iteration).
--bilstm      the three CRFs on a BiLSTM encoder (Adam) on the corpora of --bilstm-corpora
              (jnlpba, conll2003): F1 and seconds per epoch.
--conll2000   CoNLL-2000 chunking with the feature CRF (word + POS n-gram templates, the tokens
              carry their POS column) beside python-crfsuite on exactly the same features, data,
              L2 weight (c2 = 1 / (2 sigma^2)) and convergence test; --conll2000-bilstm adds a
              BiLSTM-CRF row.
--crfsuite-jnlpba  the CRFsuite peer on JNLPBA feature set 1 too.

    python -m reproductions.precursor --conll2000 --jnlpba --max-iterations 60 \\
        --workdir runs/precursor --out runs/precursor/tables.md

Every neurocrf run is the Hydra config of its experiment plus overrides (printed in the log and
stored with the row), trained by the same code as ``neurocrf-train``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from neurocrf.cli.utils import CONFIG_DIR, float_metrics, instantiate_list, set_seed
from neurocrf.conventions import SPLITS
from neurocrf.structs import CRF_KINDS
from reproductions.precursor_tables import Results, write_tables

log = logging.getLogger("reproductions.precursor")


# ---------------------------------------------------------------------------------------- runs


def compose(experiment: str, overrides: Sequence[str], output_dir: Path) -> Any:
    """The run config of ``experiment`` with ``overrides``, writing under ``output_dir``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    paths = [f"paths.output_dir={output_dir}", f"paths.log_dir={output_dir.parent}"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose(
            config_name="train", return_hydra_config=True,
            overrides=[f"experiment={experiment}", *paths, *overrides],
        )
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def join_pos_column(sentences: Sequence[Any], column: int = 1) -> None:
    """Make every token ``word<TAB>column`` (in place) so that ``colK`` templates can read it."""
    for sentence in sentences:
        columns = sentence.columns or []
        for i, row in enumerate(columns):
            if len(row) <= column:
                raise ValueError(f"{sentence.location(i)}: token {row!r} has no column {column} (POS)")
        sentence.tokens = [f"{row[0]}\t{row[column]}" for row in columns]


def restrict_splits(datamodule: Any, train_fraction: float, pos_column: int | None) -> None:
    """Keep the first ``train_fraction`` of the training sentences (at least one) of a set-up data
    module; with ``pos_column``, join that column to the words of every split (:func:`join_pos_column`)."""
    if train_fraction < 1.0:
        train = datamodule.splits["train"]
        datamodule.splits["train"] = train[: max(1, round(len(train) * train_fraction))]
    if pos_column is not None:
        for split in SPLITS:
            if datamodule.splits.get(split):
                join_pos_column(datamodule.splits[split], pos_column)


def check_entities(sentences: Sequence[Any], what: str) -> None:
    """A corpus without a single entity makes span F1 meaningless: refuse it."""
    if not any(tag != "O" for sentence in sentences for tag in sentence.tags or ()):
        raise ValueError(f"{what}: no entity / chunk tags at all (every tag is O); nothing to evaluate")


class EpochTimer:
    """Lightning callback: wall seconds of every training epoch (validation excluded)."""

    def __new__(cls) -> Any:
        import pytorch_lightning as pl

        class _Timer(pl.Callback):
            def __init__(self) -> None:
                self.seconds: list[float] = []
                self._began = 0.0

            def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
                self._began = time.perf_counter()

            def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
                self.seconds.append(time.perf_counter() - self._began)

        return _Timer()


def run_neurocrf(
    experiment: str,
    overrides: Sequence[str],
    output_dir: Path,
    *,
    pos_column: int | None = None,
    train_fraction: float = 1.0,
) -> tuple[dict[str, Any], Any]:
    """Train and test one neurocrf model; returns (row values, the data module)."""
    import hydra

    from neurocrf.models.building import build_tagger

    cfg = compose(experiment, overrides, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    set_seed(cfg.get("seed"))
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")
    restrict_splits(datamodule, train_fraction, pos_column)
    check_entities(datamodule.train_sentences, f"{experiment}: training data")
    check_entities(datamodule.test_sentences, f"{experiment}: test data")
    model = build_tagger(cfg, datamodule)
    model.report_dir = str(output_dir)
    datamodule.set_input_builder(model.encoder.preparer)
    timer = EpochTimer()
    callbacks = [timer, *instantiate_list(cfg.get("callbacks"), "callback")]
    loggers = instantiate_list(cfg.get("logger"), "logger")
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, _convert_="all")
    began = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    fit_seconds = time.perf_counter() - began
    checkpoint = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
    trainer.test(model, datamodule=datamodule, ckpt_path=checkpoint or None, verbose=False)
    scores = model.test_scores
    metrics = float_metrics(trainer.callback_metrics)
    row: dict[str, Any] = {
        "precision": scores.precision * 100,
        "recall": scores.recall * 100,
        "f1": scores.f1 * 100,
        "fit_seconds": fit_seconds,
        "epochs": len(timer.seconds),
        "seconds_per_epoch": sum(timer.seconds) / max(1, len(timer.seconds)),
        "train_sentences": len(datamodule.train_sentences),
        "train_tokens": sum(len(s.tokens) for s in datamodule.train_sentences),
        "num_features": len(model.hparams["vocabularies"].get("features", [])),
        "num_tags": len(model.tags),
        "overrides": list(overrides),
        "output_dir": str(output_dir),
        "val_f1": metrics.get("val/f1"),
    }
    if model.lbfgs_summary is not None:
        summary = model.lbfgs_summary
        history = model.trainer.optimizers[0].history
        row.update(
            {
                "iterations": summary["iterations"],
                "evaluations": summary["evaluations"],
                "converged": summary["converged"],
                "reason": summary["reason"],
                "seconds_per_iteration": summary["seconds_per_iteration"],
                "median_seconds_per_iteration": summary["median_seconds_per_iteration"],
                "lbfgs_seconds": sum(record["seconds"] for record in history),
                "lbfgs_cpu_seconds": summary["cpu_seconds"],
                "objective": summary["objective"],
            }
        )
    return row, datamodule


def run_crfsuite(
    train: Sequence[Any],
    test: Sequence[Any],
    templates: Any,
    output_dir: Path,
    *,
    sigma2: float,
    max_iterations: int,
    period: int,
    delta: float,
    epsilon: float,
    history_size: int,
) -> dict[str, Any]:
    """python-crfsuite's first-order CRF (L-BFGS) on the features of ``extract_features``."""
    import pycrfsuite

    from neurocrf.encoders.templates import FeatureTemplates
    from neurocrf.models.lbfgs import sigma2_to_crfsuite_c2
    from neurocrf.models.metrics import span_scores

    features = FeatureTemplates(templates)
    trainer = pycrfsuite.Trainer(verbose=False)
    began = time.perf_counter()
    for sentence in train:
        trainer.append(pycrfsuite.ItemSequence(features(sentence.tokens)), sentence.tags)
    append_seconds = time.perf_counter() - began
    c2 = sigma2_to_crfsuite_c2(sigma2)
    trainer.set_params(
        {
            "c1": 0.0,
            "c2": c2,
            "max_iterations": max_iterations,
            "num_memories": history_size,
            "period": period,
            "delta": delta,
            "epsilon": epsilon,
            # every attribute x label and label x label weight, as in neurocrf's dense model
            "feature.possible_states": True,
            "feature.possible_transitions": True,
        }
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    model_path = output_dir / "model.crfsuite"
    began, cpu_began = time.perf_counter(), time.process_time()
    trainer.train(str(model_path))
    train_seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
    iterations = trainer.logparser.iterations
    tagger = pycrfsuite.Tagger()
    tagger.open(str(model_path))
    predictions = [tagger.tag(pycrfsuite.ItemSequence(features(sentence.tokens))) for sentence in test]
    scores = span_scores([s.tags for s in test], predictions, "IOB2")
    last = iterations[-1] if iterations else {}
    return {
        "precision": scores.precision * 100,
        "recall": scores.recall * 100,
        "f1": scores.f1 * 100,
        "fit_seconds": train_seconds,
        "lbfgs_seconds": train_seconds,
        "lbfgs_cpu_seconds": cpu_seconds,
        "append_seconds": append_seconds,
        "iterations": len(iterations),
        "seconds_per_iteration": train_seconds / max(1, len(iterations)),
        "objective": last.get("loss"),
        "converged": len(iterations) < max_iterations,
        "reason": "crfsuite stopping test" if len(iterations) < max_iterations else "iteration limit",
        "c2": c2,
        "train_sentences": len(train),
        "num_features": trainer.logparser.featgen_num_features,
        "evaluations": sum(record.get("linesearch_trials", 1) for record in iterations),
        "output_dir": str(output_dir),
    }


# ---------------------------------------------------------------------------------------- grid


def _run(results: Results, name: str, study: dict[str, Any], job: Any, out: Path | None) -> None:
    if results.done(name):
        log.info("%s: done already (results.jsonl); skipping", name)
        return
    log.info("=== %s", name)
    began = time.perf_counter()
    try:
        row = job()
    except Exception as error:
        log.exception("%s failed", name)
        row = {"error": f"{type(error).__name__}: {error}"}
    row.update(study)
    row["name"] = name
    row["wall_seconds"] = time.perf_counter() - began
    results.add(row)
    log.info("%s: %s", name,
             {k: row.get(k) for k in ("f1", "iterations", "seconds_per_iteration", "converged", "error")})
    if out is not None:
        write_tables(results, out)


def run_grid(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir)
    results = Results(workdir / "results.jsonl", args.redo)
    out = Path(args.out) if args.out else None
    cap = [f"optimizer.max_iterations={args.max_iterations}", f"trainer.max_epochs={args.max_iterations}"]
    fraction = args.train_fraction

    if args.conll2000:
        templates = "chunking"
        base = [f"encoder.templates={templates}", "crf.constrained=false",
                f"trainer.max_epochs={args.conll2000_iterations}",
                f"optimizer.max_iterations={args.conll2000_iterations}"]
        held: dict[str, Any] = {}

        def neuro() -> dict[str, Any]:
            row, dm = run_neurocrf("chunking_conll2000_features", base, workdir / "conll2000_features_fo",
                                   pos_column=1, train_fraction=fraction)
            held["dm"] = dm
            return row

        _run(results, "conll2000/features/first_order", {"study": "conll2000", "encoder": "features",
             "features": templates, "crf": "first_order", "system": "neurocrf"}, neuro, out)

        def peer() -> dict[str, Any]:
            dm = held.get("dm")
            if dm is None:  # neurocrf's row is already in results.jsonl: rebuild the same data
                dm = _datamodule("chunking_conll2000_features", workdir / "conll2000_data", 1, fraction)
            return run_crfsuite(dm.train_sentences, dm.test_sentences, templates, workdir / "conll2000_crfsuite",
                                max_iterations=args.conll2000_iterations,
                                **_peer_settings("chunking_conll2000_features", workdir / "conll2000_data"))

        _run(results, "conll2000/features/crfsuite", {"study": "conll2000", "encoder": "features",
             "features": templates, "crf": "first_order", "system": "crfsuite"}, peer, out)
        if args.conll2000_constrained:
            _run(results, "conll2000/features/first_order_constrained", {"study": "conll2000", "encoder": "features",
                 "features": templates, "crf": "first_order (constrained)", "system": "neurocrf"},
                 lambda: run_neurocrf("chunking_conll2000_features",
                                      [f"encoder.templates={templates}",
                                       f"trainer.max_epochs={args.conll2000_iterations}",
                                       f"optimizer.max_iterations={args.conll2000_iterations}"],
                                      workdir / "conll2000_features_fo_constrained", pos_column=1,
                                      train_fraction=fraction)[0], out)

    if args.jnlpba:
        for feature_set in args.feature_sets:
            for crf in args.crfs:
                memories = args.precursor_memory if crf == "precursor" else [None]
                for memory in memories:
                    label = crf if memory is None else f"{crf}:{memory}"
                    overrides = [f"crf={crf}", "crf.dropout=0.0", f"encoder.templates={feature_set}", *cap]
                    if crf == "second_order" and args.second_order_iterations:
                        overrides = overrides[:-2] + [
                            f"optimizer.max_iterations={args.second_order_iterations}",
                            f"trainer.max_epochs={args.second_order_iterations}",
                        ]
                    if memory is not None:
                        overrides.append(f"crf.memory={memory}")
                    name = f"jnlpba/features/{feature_set}/{label}"
                    folder = workdir / name.replace("/", "_").replace(":", "_")
                    _run(results, name, {"study": "jnlpba", "encoder": "features", "features": feature_set,
                         "crf": crf, "memory": memory, "system": "neurocrf"},
                         lambda o=overrides, f=folder: run_neurocrf("precursor_jnlpba", o, f,
                                                                     train_fraction=fraction)[0], out)
        if args.crfsuite_jnlpba:
            def jnlpba_peer() -> dict[str, Any]:
                dm = _datamodule("precursor_jnlpba", workdir / "jnlpba_data", None, fraction)
                return run_crfsuite(dm.train_sentences, dm.test_sentences, "set1", workdir / "jnlpba_crfsuite",
                                    max_iterations=args.max_iterations,
                                    **_peer_settings("precursor_jnlpba", workdir / "jnlpba_data"))

            _run(results, "jnlpba/features/set1/crfsuite", {"study": "jnlpba", "encoder": "features",
                 "features": "set1", "crf": "first_order", "system": "crfsuite"}, jnlpba_peer, out)

    if args.bilstm or args.conll2000_bilstm:
        corpora = list(args.bilstm_corpora) if args.bilstm else []
        if args.conll2000_bilstm:
            corpora.append("conll2000")
        for corpus in corpora:
            for crf in args.crfs:
                overrides = [f"crf={crf}", f"trainer.max_epochs={args.bilstm_epochs}", *args.bilstm_overrides]
                if corpus == "conll2003":
                    overrides += ["data=conll2003", "data.scheme=IOB2"]
                if corpus == "conll2000":
                    overrides += ["data=conll2000", "data.scheme=IOB2"]
                name = f"{corpus}/bilstm/{crf}"
                folder = workdir / name.replace("/", "_")
                _run(results, name, {"study": "bilstm", "corpus": corpus, "encoder": "bilstm", "crf": crf,
                     "system": "neurocrf"},
                     lambda o=overrides, f=folder: run_neurocrf("precursor_jnlpba_bilstm", o, f,
                                                                 train_fraction=fraction)[0], out)
    if out is not None:
        write_tables(results, out)


def _peer_settings(experiment: str, output_dir: Path) -> dict[str, Any]:
    """CRFsuite's prior and convergence test, read from neurocrf's experiment config so that the
    two systems always train the same objective to the same criterion."""
    optimizer = compose(experiment, [], output_dir).optimizer
    return {"sigma2": float(optimizer.l2_sigma2), "period": int(optimizer.period),
            "delta": float(optimizer.tolerance_change), "epsilon": float(optimizer.tolerance_grad),
            "history_size": int(optimizer.history_size)}


def _datamodule(experiment: str, output_dir: Path, pos_column: int | None, fraction: float) -> Any:
    import hydra

    cfg = compose(experiment, [], output_dir)
    dm = hydra.utils.instantiate(cfg.data, _convert_="all")
    dm.setup("fit")
    restrict_splits(dm, fraction, pos_column)
    return dm


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="runs/precursor", help="run folders and results.jsonl (kept out of git)")
    parser.add_argument("--out", default=None, help="markdown tables file (rewritten after every run)")
    parser.add_argument("--jnlpba", action="store_true", help="the feature-CRF grid on JNLPBA")
    parser.add_argument("--feature-sets", nargs="+", default=["set1", "set2"])
    parser.add_argument("--crfs", nargs="+", default=list(CRF_KINDS), choices=CRF_KINDS)
    parser.add_argument("--precursor-memory", nargs="+", default=["type"], choices=["type", "tag"])
    parser.add_argument("--max-iterations", type=int, default=500, help="L-BFGS iteration cap (JNLPBA)")
    parser.add_argument("--second-order-iterations", type=int, default=None,
                        help="a lower cap for the second-order CRF (its iterations are the slowest)")
    parser.add_argument("--crfsuite-jnlpba", action="store_true", help="CRFsuite peer on JNLPBA set1")
    parser.add_argument("--conll2000", action="store_true", help="CoNLL-2000 features: neurocrf vs CRFsuite")
    parser.add_argument("--conll2000-iterations", type=int, default=300)
    parser.add_argument("--conll2000-constrained", action="store_true",
                        help="also the constrained (IOB2-valid transitions only) neurocrf CRF")
    parser.add_argument("--conll2000-bilstm", action="store_true", help="BiLSTM-CRF rows on CoNLL-2000")
    parser.add_argument("--bilstm", action="store_true", help="BiLSTM + the three CRFs")
    parser.add_argument("--bilstm-corpora", nargs="+", default=["jnlpba", "conll2003"])
    parser.add_argument("--bilstm-epochs", type=int, default=30)
    parser.add_argument("--bilstm-overrides", nargs="*", default=[], help="extra Hydra overrides of BiLSTM runs")
    parser.add_argument("--train-fraction", type=float, default=1.0, help="use the first part of train only")
    parser.add_argument("--redo", action="store_true", help="rerun rows already in results.jsonl")
    parser.add_argument("--tables-only", action="store_true", help="rewrite --out from results.jsonl")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)
    if args.tables_only:
        if not args.out:
            raise SystemExit("--tables-only needs --out")
        write_tables(Results(Path(args.workdir) / "results.jsonl", False), Path(args.out))
        return
    if not (args.jnlpba or args.bilstm or args.conll2000 or args.conll2000_bilstm):
        raise SystemExit("nothing to run: pass --jnlpba, --conll2000, --bilstm and/or --conll2000-bilstm")
    run_grid(args)


if __name__ == "__main__":
    main()

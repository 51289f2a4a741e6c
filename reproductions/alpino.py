"""Supertag-based discontinuous parsing of the Alpino treebank (Ruprecht & Mörbitz 2021), end to end on CPU.

    python -m reproductions.alpino --epochs 30 --out alpino_results.md
    python -m reproductions.alpino --epochs 1 --limit 400 --out smoke.md   # smoke test

Steps, each one run of an entry point as a user would type it (``python -m neurocrf.cli.<name>``,
its run directory under ``--workdir``), whose files the table is built from:

1. ``neurocrf-extract``: the supertag corpus of ``configs/treebank/alpino.yaml`` and its
   statistics (split by sentence id: last 10% test, the 10% before dev; ``extract/stats.json``);
2. oracle: ``neurocrf-parse oracle=true``, the gold supertags of the test split at k = 1 (the
   upper bound set by extraction, parsing and restoring);
3. ``neurocrf-supertag``: a BiLSTM supertagger (word + char CNN embeddings, supertag and
   preterminal softmax heads), checkpoints by dev supertag accuracy (``train/checkpoints``,
   metrics in ``train/csv/version_0/metrics.csv``);
4. ``neurocrf-parse``: the test split parsed with the best checkpoint at k = 10 (and k = 1),
   tagging and parsing timed separately, evaluated with ``proper.prm`` (root and punctuation
   removed, ADVP = PRT).

Prints and writes (``--out``) a markdown table: F1, Dis-F1, coverage, supertag accuracy,
sentences/s (tagging + parsing) and parsing-only sentences/s. Reads the treebank from
``$NEUROCRF_DATA`` (default ``../shared/data``); writes runs under ``--workdir``.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import time
from pathlib import Path

from benchmarks.common import module_command, module_env


def run_entry_point(module: str, run_dir: Path, overrides: list[str], threads: int) -> None:
    """``python -m neurocrf.cli.<module> <overrides>`` with its run directory at ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = module_env(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    command = module_command(f"neurocrf.cli.{module}", f"hydra.run.dir={run_dir}", *overrides)
    subprocess.run(command, check=True, env=env)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def training_outcome(run_dir: Path) -> tuple[str, dict[str, float], int]:
    """The best checkpoint of a ``neurocrf-supertag`` run, the last logged value of each metric,
    and the number of epochs run."""
    best = sorted((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    if len(best) != 1:
        raise RuntimeError(f"expected one best checkpoint in {run_dir / 'checkpoints'}, found {len(best)}")
    metrics: dict[str, float] = {}
    epochs = 0
    with open(run_dir / "csv" / "version_0" / "metrics.csv", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            metrics.update({key: float(value) for key, value in row.items()
                            if value and key not in ("epoch", "step")})
            if row.get("val/supertag_acc"):
                epochs = max(epochs, int(row["epoch"]) + 1)
    return str(best[0]), metrics, epochs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="markdown file for the results table")
    ap.add_argument("--workdir", default="logs/reproduce_alpino", help="runs, checkpoints, reports")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--max-minutes", type=float, default=40.0, help="wall-clock cap of training")
    ap.add_argument("--hidden", type=int, default=200, help="BiLSTM hidden size per direction")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.3)
    ap.add_argument("--word-dropout", type=float, default=0.0, help="replace training words by <unk>")
    ap.add_argument("--head-dropout", type=float, default=0.2, help="dropout before the two heads")
    ap.add_argument("--char", choices=["cnn", "lstm"], default="cnn")
    ap.add_argument("--char-hidden", type=int, default=50)
    ap.add_argument("--factors", default="",
                    help="comma-separated supertag parts with shared output vectors (heads.factors)")
    ap.add_argument("--ema", type=float, default=0.0, help="moving average of the weights, this decay (0: off)")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--fallback-k", type=int, default=50,
                    help="extra row: NOPARSE sentences at k re-parsed with this many tags (0: off)")
    ap.add_argument("--patience", type=int, default=5)
    ap.add_argument("--limit", type=int, default=None, help="read only the first N sentences (smoke test)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--override", action="append", default=[],
                    help="extra Hydra override of the training config (repeatable), e.g. treebank.v=2")
    args = ap.parse_args(argv)

    work = Path(args.workdir).resolve()
    treebank = ["treebank=alpino"] + ([f"treebank.limit={args.limit}"] if args.limit else [])
    started = time.perf_counter()

    def parse(name: str, overrides: list[str]) -> dict:
        run_entry_point("parse", work / name, [*treebank, *overrides], args.threads)
        return read_json(work / name / "parse_report.json")

    print("== 1. extraction", flush=True)
    run_entry_point("extract", work / "extract", treebank, args.threads)
    stats = read_json(work / "extract" / "stats.json")

    print("== 2. oracle: gold supertags, k = 1", flush=True)
    oracle = parse("oracle", ["oracle=true", "k=1", "split=test"])

    print("== 3. supertagger training", flush=True)
    minutes = int(args.max_minutes)
    seconds = round((args.max_minutes - minutes) * 60)
    ema = ["callbacks=[default,ema]", f"callbacks.ema.decay={args.ema}"] if args.ema else []
    train_overrides = [
        *treebank,
        *ema,
        f"heads.factors=[{args.factors}]",
        f"seed={args.seed}",
        "encoder=bilstm",
        f"encoder.hidden_size={args.hidden}",
        f"encoder.num_layers={args.layers}",
        f"encoder.dropout={args.dropout}",
        f"encoder.word_dropout={args.word_dropout}",
        f"encoder.char={args.char}",
        f"encoder.char_hidden={args.char_hidden}",
        f"heads.dropout={args.head_dropout}",
        f"optimizer.lr={args.lr}",
        f"data.batch_size={args.batch_size}",
        f"trainer.max_epochs={args.epochs}",
        f"+trainer.max_time='00:{minutes // 60:02d}:{minutes % 60:02d}:{seconds:02d}'",
        "trainer.log_every_n_steps=50",
        f"callbacks.early_stopping.patience={args.patience}",
        "~callbacks.progress_bar",
        "+trainer.enable_progress_bar=false",
        f"parsing.k={args.k}",
        "parsing.val_every_n_epochs=5",
        "final_parse.splits=[dev]",
        *args.override,
    ]
    train_start = time.perf_counter()
    run_entry_point("supertag_train", work / "train", train_overrides, args.threads)
    train_minutes = (time.perf_counter() - train_start) / 60
    ckpt, metrics, epochs_run = training_outcome(work / "train")

    print(f"== 4. parsing the test split with {ckpt}", flush=True)
    reports = {}
    for k in sorted({args.k, 1}, reverse=True):
        reports[str(k)] = parse(f"parse_k{k}", [f"ckpt_path={ckpt}", "split=test", f"k={k}", "fallback_k=null"])
    if args.fallback_k > args.k:
        reports[f"{args.k} (+{args.fallback_k})"] = parse("parse_fallback", [
            f"ckpt_path={ckpt}", "split=test", f"k={args.k}", f"fallback_k={args.fallback_k}"])

    total_minutes = (time.perf_counter() - started) / 60
    table = results_table(args, stats, oracle, reports, metrics, epochs_run, train_minutes, total_minutes)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table, encoding="utf-8")
    (work / "results.json").write_text(json.dumps({
        "stats": stats, "oracle": _light(oracle), "reports": {k: _light(r) for k, r in reports.items()},
        "train_metrics": metrics, "checkpoint": ckpt, "args": vars(args)}, indent=2, default=str) + "\n")
    print(f"table written to {out}; details in {work}")
    return 0


def _light(report: dict) -> dict:
    return {key: value for key, value in report.items() if key != "evaluation"}


def results_table(args: argparse.Namespace, stats: dict, oracle: dict, reports: dict, metrics: dict,
                  epochs: int, train_minutes: float, total_minutes: float) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.2f}"

    lines = [
        "# Alpino: supertag-based discontinuous parsing (BiLSTM supertagger, CPU)",
        "",
        (f"Treebank: Alpino `cdb` ({stats['total']['sentences']} sentences"
        f"{'' if not args.limit else f', first {args.limit} only'}), split by sentence id: "
        f"train {stats['train']['sentences']} / dev {stats['dev']['sentences']} / "
        f"test {stats['test']['sentences']} (last 10% test, the 10% before dev). "
        f"Punctuation moved into the tree, unaries collapsed, binarized right-factored (h=0, v=1), "
        f"fanout markers. {stats['train']['supertags']} supertags and "
        f"{stats['train']['preterminals']} preterminals in train; "
        f"{pct(stats['test']['unseen_supertag_rate'])}% of test tokens have a supertag unseen in train; "
        f"{pct(stats['total']['discontinuity_rate'])}% of sentences have a discontinuous constituent "
        f"(max fanout {stats['total']['max_fanout']})."),
        "",
        (f"Supertagger: BiLSTM {args.layers} x {args.hidden} per direction, word (100) + char "
        f"{args.char.upper()} ({args.char_hidden}) embeddings from scratch, dropout {args.dropout}, word dropout "
        f"{args.word_dropout}, head dropout {args.head_dropout}, Adam lr {args.lr}, batch {args.batch_size}"
        + (f", factored supertag head ({args.factors})" if args.factors else "")
        + (f", weight average (EMA {args.ema:g})" if args.ema else "") + "; "
        f"{epochs} epochs in {train_minutes:.1f} min on {args.threads} CPU thread(s) "
        f"({platform.processor() or platform.machine()}); best checkpoint by dev supertag accuracy "
        f"({pct(metrics.get('val/supertag_acc_best', float('nan')))}). "
        "Evaluation: labeled bracket F1 with `neurocrf/parsing/proper.prm` (root and punctuation "
        "removed, ADVP = PRT); Dis-F1 on discontinuous brackets only."),
        "",
        "| test split | k | F1 | Dis-F1 | coverage | supertag acc | gold in k | POS acc | exact | sent/s tag+parse"
        " | sent/s parse only |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, r in reports.items():
        lines.append(
            f"| BiLSTM supertagger | {k} | {pct(r['f1'])} | {pct(r['dis_f1'])} | {pct(r['coverage'])} "
            f"| {pct(r.get('supertag_accuracy', float('nan')))}"
            f" | {pct(r.get('supertag_kbest_accuracy', float('nan')))} "
            f"| {pct(r['pos_accuracy'])} | {pct(r['exact_match'])} | {r['sentences_per_second']:.1f} "
            f"| {r['parsing_sentences_per_second']:.1f} |")
    o = oracle
    lines.append(
        f"| oracle (gold supertags) | 1 | {pct(o['f1'])} | {pct(o['dis_f1'])} | {pct(o['coverage'])} | 100.00 | 100.00 "
        f"| {pct(o['pos_accuracy'])} | {pct(o['exact_match'])} | - | {o['parsing_sentences_per_second']:.1f} |")
    lines += [
        "",
        ("k: supertags per token given to the parser; `10 (+50)`: sentences without a parse at k = 10 "
         "are parsed once more with their 50 best supertags (an extension, not the paper's setting). "
         "Speeds are measured on the machine that trained the model, with its --threads torch threads."),
        "",
        (f"Total wall time {total_minutes:.1f} min. Command: `python -m reproductions.alpino "
         f"--epochs {args.epochs} --max-minutes {args.max_minutes:g} --hidden {args.hidden} --layers {args.layers} "
         f"--dropout {args.dropout} --word-dropout {args.word_dropout} --head-dropout {args.head_dropout} "
         f"--char {args.char} --char-hidden {args.char_hidden} --lr {args.lr:g} --batch-size {args.batch_size} "
         + (f"--factors {args.factors} " if args.factors else "") + (f"--ema {args.ema:g} " if args.ema else "") +
         f"--patience {args.patience} --seed {args.seed} "
         + (f"--limit {args.limit} " if args.limit else "")
         + "".join(f"--override '{o}' " for o in args.override)
         + f"--k {args.k} --fallback-k {args.fallback_k} --threads {args.threads} --out {args.out}`."),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

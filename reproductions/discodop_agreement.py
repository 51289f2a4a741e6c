"""Score the same files with neurocrf and with ``discodop eval``, and compare every figure.

    python -m reproductions.discodop_agreement GOLD PRED [--params proper.prm] [--discodop discodop]
    python -m reproductions.discodop_agreement GOLD PRED --perturb 0   # first write PRED from GOLD

``--perturb SEED`` writes predictions made from the gold trees (punctuation moved, then each phrase
child spliced out with probability 0.15, relabelled with 0.10, given a function tag ``-SU``,
``-OBJ1`` or ``=2`` with 0.10; no ids) to PRED before scoring.

Both files are read as discbracket (``--fmt`` otherwise), paired by position (disco-dop pairs
discbracket trees by line number). For each option set of ``discodop eval`` (its defaults,
``--disconly``, ``--functions=leave``) the script prints sentences, labeled recall, precision,
F1 and exact match from both tools (disco-dop's ``ALL`` column) and exits with 1 if any differs
at two decimals (disco-dop's ``nan`` for an F1 without matches counts as 0). disco-dop's bracket
counts are not compared: its summary prints the number of *distinct* brackets per sentence (a
unary chain with one label counts once there), while both tools score multisets. disco-dop must
be installed (``pip install disco-dop``) or named with ``--discodop``.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence

from neurocrf.parsing.evaluate import DEFAULT_PARAMS_FILE, evaluate, load_params
from neurocrf.parsing.punctuation import move_punctuation_sentence
from neurocrf.parsing.tree import Tree, TreebankSentence
from neurocrf.parsing.treebank import read_treebank, write_treebank

OPTION_SETS = {"defaults": [], "--disconly": ["--disconly"], "--functions=leave": ["--functions=leave"]}
FIGURES = ("sentences", "recall", "precision", "f1", "exact_match")
_SUMMARY = {"number of sentences": "sentences", "labeled recall": "recall", "labeled precision": "precision",
            "labeled f-measure": "f1", "exact match": "exact_match"}


def discodop_figures(output: str) -> dict[str, float]:
    """The ``ALL`` column of a ``discodop eval`` summary (the last number of each line); its
    ``nan`` (an F1 of no matched brackets, 0/0) is read as 0, the figure neurocrf gives."""
    figures = {}
    summary = output[output.rindex("Summary"):]
    for line in summary.splitlines():
        name, _, values = line.partition(":")
        if name.strip() in _SUMMARY:
            value = float(re.split(r"\s+", values.strip())[-1])
            figures[_SUMMARY[name.strip()]] = 0.0 if math.isnan(value) else value  # 0/0: neurocrf says 0
    missing = set(FIGURES) - set(figures)
    if missing:
        raise ValueError(f"no {sorted(missing)} in the discodop eval summary:\n{summary}")
    return figures


def neurocrf_figures(gold: list, pred: list, params: str, options: Sequence[str]) -> dict[str, float]:
    """The same figures from :func:`neurocrf.parsing.evaluate.evaluate`, in percent."""
    r = evaluate(gold, pred, load_params(params), check_ids=False, disc_only="--disconly" in options,
                 functions="leave" if "--functions=leave" in options else "remove")
    return {"sentences": r["sentences"], "recall": round(100 * r["recall"], 2),
            "precision": round(100 * r["precision"], 2), "f1": round(100 * r["f1"], 2),
            "exact_match": round(100 * r["exact_match"], 2)}


def perturbed(gold: list[TreebankSentence], seed: int) -> list[TreebankSentence]:
    """Predictions made from ``gold`` (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for sentence in gold:
        tree = move_punctuation_sentence(sentence).tree
        for node in list(tree.subtrees()):
            for child in [c for c in node.children if isinstance(c, Tree) and not c.is_preterminal]:
                r = rng.random()
                if r < 0.15:
                    i = node.children.index(child)
                    node.children[i:i + 1] = child.children
                elif r < 0.25:
                    child.label = rng.choice(["NP", "PP", "SMAIN", "CONJ", "ADVP", "PRT"])
                elif r < 0.35:
                    child.label += rng.choice(["-SU", "-OBJ1", "=2"])
        out.append(TreebankSentence(sentence.id, sentence.words, tree))
    return out


def compare(gold_path: str, pred_path: str, *, params: str, discodop: str, fmt: str) -> list[dict]:
    """One row per option set: the option set, both tools' figures and whether they agree."""
    gold, pred = read_treebank(gold_path, fmt), read_treebank(pred_path, fmt)
    rows = []
    for name, options in OPTION_SETS.items():
        command = [*shlex.split(discodop), "eval", gold_path, pred_path, params, f"--fmt={fmt}", *options]
        run = subprocess.run(command, capture_output=True, text=True, check=False)
        if run.returncode:
            raise RuntimeError(f"{shlex.join(command)} failed:\n{run.stderr[-2000:]}")
        theirs, ours = discodop_figures(run.stdout), neurocrf_figures(gold, pred, params, options)
        rows.append({"options": name, "discodop": theirs, "neurocrf": ours,
                     "agree": all(abs(theirs[k] - ours[k]) < 0.005 for k in FIGURES)})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gold")
    ap.add_argument("pred")
    ap.add_argument("--params", default=str(DEFAULT_PARAMS_FILE))
    ap.add_argument("--discodop", default="discodop", help="the discodop command (may hold arguments)")
    ap.add_argument("--fmt", default="discbracket")
    ap.add_argument("--perturb", type=int, default=None, metavar="SEED", help="write PRED from GOLD first")
    args = ap.parse_args(argv)
    if args.perturb is not None:
        write_treebank(args.pred, perturbed(read_treebank(args.gold, args.fmt), args.perturb), "discbracket")
    rows = compare(args.gold, args.pred, params=args.params, discodop=args.discodop, fmt=args.fmt)
    print(f"{'options':<18} {'tool':<9} " + " ".join(f"{k:>11}" for k in FIGURES))
    for row in rows:
        for tool in ("discodop", "neurocrf"):
            print(f"{row['options']:<18} {tool:<9} " + " ".join(f"{row[tool][k]:>11g}" for k in FIGURES))
    agree = all(row["agree"] for row in rows)
    print("every figure agrees" if agree else "DIFFERENT: " + ", ".join(r["options"] for r in rows if not r["agree"]))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

"""Labeled bracket evaluation of discontinuous constituency trees (F1, Dis-F1, POS, exact match).

A bracket is ``(label, frozenset of terminal indices)``; gold and predicted brackets are compared
as multisets, summed over the corpus. The parameters (``proper.prm`` next to this file; format in
its header) follow disco-dop's conventions: root/fallback labels deleted, punctuation deleted by
gold POS with the remaining tokens renumbered, ``ADVP`` = ``PRT``, preterminals not counted.
Dis-F1 restricts both sides to brackets whose (renumbered) yield is not contiguous.

>>> from neurocrf.parsing.tree import Tree, TreebankSentence
>>> gold = TreebankSentence("1", ["a", "b", "c"], Tree.parse("(ROOT (VP (V 0) (N 2)) (X 1))"))
>>> pred = TreebankSentence("1", ["a", "b", "c"], Tree.parse("(ROOT (VP (V 0) (N 1)) (X 2))"))
>>> r = evaluate([gold], [pred])
>>> r["matched_brackets"], r["gold_brackets"], r["dis_f1"], r["pos_accuracy"]
(0, 1, 0.0, 0.3333333333333333)
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from neurocrf.parsing.tree import Tree, TreebankSentence

__all__ = ["EvalParams", "load_params", "DEFAULT_PARAMS_FILE", "bracketings", "evaluate",
           "format_report", "main"]

DEFAULT_PARAMS_FILE = Path(__file__).with_name("proper.prm")
Bracket = tuple[str, frozenset[int]]


@dataclass
class EvalParams:
    """Evaluation parameters (see ``proper.prm`` for their meaning)."""

    delete_label: set[str] = field(default_factory=set)
    delete_pos: set[str] = field(default_factory=set)
    delete_word: set[str] = field(default_factory=set)
    eq_label: dict[str, str] = field(default_factory=dict)
    cutoff_len: int = 0
    labeled: bool = True


_LIST_KEYS = {"DELETE_LABEL": "delete_label", "DELETE_POS": "delete_pos",
              "DELETE_WORD": "delete_word"}
_INT_KEYS = {"CUTOFF_LEN": "cutoff_len", "LABELED": "labeled"}


def load_params(path: str | os.PathLike | None = None) -> EvalParams:
    """Read a parameter file (default: the packaged ``proper.prm``). Raises ValueError naming
    file and line for an unknown key, a missing or non-integer value, or a repeated single key."""
    path = Path(path) if path is not None else DEFAULT_PARAMS_FILE
    params = EvalParams()
    seen: set[str] = set()
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = raw.split()
        for k, f in enumerate(fields):  # a field starting with '#' begins a comment
            if f.startswith("#"):
                fields = fields[:k]
                break
        if not fields:
            continue
        key, values = fields[0], fields[1:]
        where = f"{path}:{lineno}"
        if not values:
            raise ValueError(f"{where}: {key} needs a value")
        if key in _LIST_KEYS:
            getattr(params, _LIST_KEYS[key]).update(values)
        elif key == "EQ_LABEL":
            for v in values:
                params.eq_label[v] = values[0]
        elif key in _INT_KEYS:
            if key in seen:
                raise ValueError(f"{where}: {key} given twice")
            if len(values) != 1 or not values[0].isdigit():
                raise ValueError(f"{where}: {key} needs one non-negative integer, got {values}")
            seen.add(key)
            value = int(values[0])
            setattr(params, _INT_KEYS[key], bool(value) if key == "LABELED" else value)
        else:
            raise ValueError(f"{where}: unknown parameter {key!r}; expected one of "
                             f"{sorted([*_LIST_KEYS, 'EQ_LABEL', *_INT_KEYS])}")
    return params


def bracketings(tree: Tree, keep: dict[int, int], params: EvalParams) -> Counter[Bracket]:
    """Multiset of brackets of ``tree``: every node that is not a preterminal and whose label is
    not deleted, with its yield restricted to ``keep`` (old index -> new index) and renumbered;
    nodes whose restricted yield is empty are skipped."""
    out: Counter[Bracket] = Counter()
    for node in tree.subtrees():
        if node.is_preterminal or node.label in params.delete_label:
            continue
        span = frozenset(keep[i] for i in node.leaves() if i in keep)
        if span:
            label = params.eq_label.get(node.label, node.label) if params.labeled else ""
            out[label, span] += 1
    return out


def _is_disc(span: frozenset[int]) -> bool:
    return max(span) - min(span) + 1 != len(span)


def _safe_div(a: float, b: float) -> float:
    return a / b if b else 0.0


def _prf(matched: int, gold: int, pred: int) -> tuple[float, float, float]:
    p, r = _safe_div(matched, pred), _safe_div(matched, gold)
    return p, r, _safe_div(2 * p * r, p + r)


def _check_tree(sentence: TreebankSentence, role: str) -> None:
    leaves = sentence.tree.leaves()
    n = len(sentence.words)
    if len(set(leaves)) != len(leaves) or (leaves and (leaves[0] < 0 or leaves[-1] >= n)):
        raise ValueError(f"{role} sentence {sentence.id}: terminal indices {leaves} are not distinct "
                         f"indices into its {n} words")


def evaluate(gold: Sequence[TreebankSentence], pred: Sequence[TreebankSentence],
             params: EvalParams | str | os.PathLike | None = None, *, check_ids: bool = True) -> dict:
    """Score ``pred`` against ``gold`` (paired by position).

    Args:
        params: an :class:`EvalParams`, a parameter file path, or None for ``proper.prm``.
        check_ids: raise if paired sentences have different ids.

    Returns:
        a dict with counts (``sentences``, ``gold_brackets``, ``pred_brackets``,
        ``matched_brackets``, the same with ``_dis_`` for discontinuous brackets,
        ``pos_correct``, ``pos_total``, ``exact_matches``), scores in [0, 1] (``precision``,
        ``recall``, ``f1``, ``dis_precision``, ``dis_recall``, ``dis_f1``, ``pos_accuracy``,
        ``exact_match``) and ``per_label`` (label -> gold/pred/matched/precision/recall/f1).
    """
    if not isinstance(params, EvalParams):
        params = load_params(params)
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    totals = Counter()
    gold_by_label: Counter[str] = Counter()
    pred_by_label: Counter[str] = Counter()
    match_by_label: Counter[str] = Counter()
    for g, p in zip(gold, pred):
        if check_ids and g.id != p.id:
            raise ValueError(f"sentence ids differ: gold {g.id!r}, predicted {p.id!r}")
        if len(g.words) != len(p.words):
            raise ValueError(f"sentence {g.id}: gold has {len(g.words)} words, prediction "
                             f"{len(p.words)}")
        _check_tree(g, "gold")
        _check_tree(p, "predicted")
        gold_tags = g.pos_tags
        kept = [i for i in range(len(g.words))
                if gold_tags[i] not in params.delete_pos and g.words[i] not in params.delete_word]
        if params.cutoff_len and len(kept) > params.cutoff_len:
            continue
        keep = {old: new for new, old in enumerate(kept)}
        gb, pb = bracketings(g.tree, keep, params), bracketings(p.tree, keep, params)
        common = gb & pb
        pred_tags = p.pos_tags
        totals["sentences"] += 1
        totals["gold_brackets"] += sum(gb.values())
        totals["pred_brackets"] += sum(pb.values())
        totals["matched_brackets"] += sum(common.values())
        totals["gold_dis_brackets"] += sum(c for (_, s), c in gb.items() if _is_disc(s))
        totals["pred_dis_brackets"] += sum(c for (_, s), c in pb.items() if _is_disc(s))
        totals["matched_dis_brackets"] += sum(c for (_, s), c in common.items() if _is_disc(s))
        totals["pos_total"] += len(kept)
        totals["pos_correct"] += sum(gold_tags[i] == pred_tags[i] for i in kept)
        totals["exact_matches"] += gb == pb
        for (label, _), c in gb.items():
            gold_by_label[label] += c
        for (label, _), c in pb.items():
            pred_by_label[label] += c
        for (label, _), c in common.items():
            match_by_label[label] += c

    keys = ["sentences", "gold_brackets", "pred_brackets", "matched_brackets", "gold_dis_brackets",
            "pred_dis_brackets", "matched_dis_brackets", "pos_correct", "pos_total", "exact_matches"]
    result: dict = {k: int(totals[k]) for k in keys}
    result["precision"], result["recall"], result["f1"] = _prf(
        totals["matched_brackets"], totals["gold_brackets"], totals["pred_brackets"])
    result["dis_precision"], result["dis_recall"], result["dis_f1"] = _prf(
        totals["matched_dis_brackets"], totals["gold_dis_brackets"], totals["pred_dis_brackets"])
    result["pos_accuracy"] = _safe_div(totals["pos_correct"], totals["pos_total"])
    result["exact_match"] = _safe_div(totals["exact_matches"], totals["sentences"])
    per_label = {}
    for label in sorted(gold_by_label.keys() | pred_by_label.keys()):
        p_, r_, f_ = _prf(match_by_label[label], gold_by_label[label], pred_by_label[label])
        per_label[label] = {"gold": gold_by_label[label], "pred": pred_by_label[label],
                            "matched": match_by_label[label], "precision": p_, "recall": r_, "f1": f_}
    result["per_label"] = per_label
    return result


def format_report(result: dict, *, max_labels: int = 20) -> str:
    """Human-readable summary of an :func:`evaluate` result (percentages)."""
    r = result
    lines = [
        f"sentences           {r['sentences']}",
        f"brackets            gold {r['gold_brackets']}  predicted {r['pred_brackets']}  "
        f"matched {r['matched_brackets']}",
        f"labeled precision   {100 * r['precision']:6.2f}",
        f"labeled recall      {100 * r['recall']:6.2f}",
        f"labeled F1          {100 * r['f1']:6.2f}",
        f"disc. brackets      gold {r['gold_dis_brackets']}  predicted {r['pred_dis_brackets']}  "
        f"matched {r['matched_dis_brackets']}",
        f"disc. precision     {100 * r['dis_precision']:6.2f}",
        f"disc. recall        {100 * r['dis_recall']:6.2f}",
        f"disc. F1 (Dis-F1)   {100 * r['dis_f1']:6.2f}",
        f"POS accuracy        {100 * r['pos_accuracy']:6.2f}  ({r['pos_correct']}/{r['pos_total']})",
        f"exact match         {100 * r['exact_match']:6.2f}  ({r['exact_matches']}/{r['sentences']})",
    ]
    labels = sorted(r.get("per_label", {}).items(), key=lambda kv: -kv[1]["gold"])[:max_labels]
    if labels:
        lines.append("")
        lines.append(f"{'label':<12} {'gold':>7} {'pred':>7} {'P':>7} {'R':>7} {'F1':>7}")
        for label, s in labels:
            lines.append(f"{label or '-':<12} {s['gold']:>7} {s['pred']:>7} {100 * s['precision']:7.2f}"
                         f" {100 * s['recall']:7.2f} {100 * s['f1']:7.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m neurocrf.parsing.evaluate GOLD PRED [--params FILE] [--fmt FMT]``."""
    from neurocrf.parsing.treebank import read_treebank

    ap = argparse.ArgumentParser(description="Discontinuous labeled bracket evaluation.")
    ap.add_argument("gold")
    ap.add_argument("pred")
    ap.add_argument("--params", default=None, help="parameter file (default: proper.prm)")
    ap.add_argument("--fmt", default=None, help="treebank format of both files (default: guess)")
    args = ap.parse_args(argv)
    gold = read_treebank(args.gold, args.fmt)
    pred = read_treebank(args.pred, args.fmt)
    print(format_report(evaluate(gold, pred, args.params)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

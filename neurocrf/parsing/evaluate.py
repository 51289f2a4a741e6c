"""Labeled bracket evaluation of discontinuous constituency trees (F1, Dis-F1, POS, exact match).

A bracket is ``(label, frozenset of terminal indices)``; gold and predicted brackets are compared
as multisets, summed over the corpus. The parameters are an EVALB parameter file as disco-dop
reads it (``proper.prm`` next to this file is the default), and the options are those of
``discodop eval``, with its defaults, so that
``discodop eval GOLD PRED proper.prm --fmt=discbracket`` gives the same figures:

* function tags are stripped from every label before scoring (``NP-SBJ`` -> ``NP``, ``NP=2`` ->
  ``NP``; ``functions="remove"``, disco-dop's ``--functions=remove``); ``functions="leave"``
  keeps them;
* both the all-bracket scores and Dis-F1 (both sides restricted to brackets whose renumbered
  yield is not contiguous, the figures of ``discodop eval --disconly``) are always reported; a
  ``DISC_ONLY`` line in a parameter file is ignored with a warning, as disco-dop ignores it, and
  ``disc_only=True`` (``--disconly``) restricts the whole report to discontinuous brackets.

With ``proper.prm``: root and fallback labels deleted, punctuation deleted by its gold POS tag
with the remaining tokens renumbered, ``ADVP`` = ``PRT``, preterminals not counted.

Paired sentences must hold the same words (up to ``EQ_WORD``) and, unless ``check_ids=False``,
the same ids; a difference is an error naming the sentence, never a silent score.

>>> from neurocrf.parsing.tree import Tree, TreebankSentence
>>> gold = TreebankSentence("1", ["a", "b", "c"], Tree.parse("(ROOT (VP-HD (V 0) (N 2)) (X 1))"))
>>> pred = TreebankSentence("1", ["a", "b", "c"], Tree.parse("(ROOT (VP (V 0) (N 1)) (X 2))"))
>>> r = evaluate([gold], [pred])
>>> r["matched_brackets"], r["gold_brackets"], r["dis_f1"], r["pos_accuracy"]
(0, 1, 0.0, 0.3333333333333333)
>>> evaluate([gold], [gold], functions="leave")["per_label"]["VP-HD"]["f1"]
1.0
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from neurocrf.parsing.bracket import strip_function_tags
from neurocrf.parsing.tree import Tree, TreebankSentence

__all__ = ["EvalParams", "load_params", "DEFAULT_PARAMS_FILE", "FUNCTIONS", "without_function_tags",
           "scored_terminals", "labeled_spans", "bracketings", "evaluate", "format_report", "main"]

DEFAULT_PARAMS_FILE = Path(__file__).with_name("proper.prm")
"""The evaluation parameters used unless others are given: ``proper.prm``, beside this module."""
Bracket = tuple[str, frozenset[int]]
#: what :func:`evaluate` does with function tags (``discodop eval --functions``; ``add``,
#: ``replace`` and ``between`` need the separate function field that discbracket lacks)
FUNCTIONS = ("remove", "leave")


@dataclass
class EvalParams:
    """Evaluation parameters: the keys of a parameter file in lower case (meaning in ``proper.prm``)."""

    delete_label: set[str] = field(default_factory=set)
    delete_label_for_length: set[str] = field(default_factory=set)
    delete_word: set[str] = field(default_factory=set)
    eq_label: dict[str, str] = field(default_factory=dict)
    eq_word: dict[str, str] = field(default_factory=dict)
    cutoff_len: int = 0
    labeled: bool = True
    delete_root_preterms: bool = False


# one label or word per line, accumulated
_SET_KEYS = {"DELETE_LABEL": "delete_label", "DELETE_LABEL_FOR_LENGTH": "delete_label_for_length",
             "DELETE_WORD": "delete_word"}
# two values per line: an undirected pair; the classes are the transitive closure
_PAIR_KEYS = {"EQ_LABEL": "eq_label", "EQ_WORD": "eq_word"}
# one integer, at most once
_INT_KEYS = {"CUTOFF_LEN": "cutoff_len", "LABELED": "labeled", "DELETE_ROOT_PRETERMS": "delete_root_preterms"}
# read and checked, no effect: disco-dop's output options, and DISC_ONLY, which discodop eval
# overrides with its --disconly option (both tools report Dis-F1 beside F1 anyway)
_NO_EFFECT = ("DEBUG", "MAX_ERROR", "DISC_ONLY")
_NOT_COMPUTED = {"LA": "leaf-ancestor", "TED": "tree-edit distance", "DEP": "dependency"}
_KEYS = sorted([*_SET_KEYS, *_PAIR_KEYS, *_INT_KEYS, *_NO_EFFECT, *_NOT_COMPUTED])


def load_params(path: str | os.PathLike | None = None) -> EvalParams:
    """Read a parameter file (default: the packaged ``proper.prm``) in EVALB's syntax exactly as
    disco-dop reads it, so that both tools read a file the same way: ``KEY value`` per line, a
    line starting with ``#`` is a comment (there are no comments after a value), one label or
    word per ``DELETE_*`` line, two per ``EQ_*`` line, integer keys at most once.

    Raises ValueError naming file and line for an unknown key (e.g. ``DELETE_POS``: EVALB deletes
    words by their gold POS tag through ``DELETE_LABEL``), a missing or malformed value, a line
    that disco-dop would read differently (several labels on a ``DELETE_*`` line, trailing
    whitespace after a label, a line of spaces), a repeated integer key, or ``LA`` / ``TED`` /
    ``DEP`` asking for scores that are not computed here.

    ``DISC_ONLY 1`` is read and ignored with a warning, as ``discodop eval`` ignores it (only its
    ``--disconly`` option restricts the scores): the same file gives the same scores in both
    tools. Dis-F1 is reported beside F1 anyway; ``evaluate(..., disc_only=True)`` restricts the
    whole report.
    """
    path = Path(path) if path is not None else DEFAULT_PARAMS_FILE
    params = EvalParams()
    seen: set[str] = set()
    pairs: dict[str, list[tuple[str, str]]] = {key: [] for key in _PAIR_KEYS}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{lineno}"
        fields = line.split()
        if not fields:
            raise ValueError(f"{where}: a blank line must be empty (disco-dop cannot read a line of spaces)")
        key, values = fields[0], fields[1:]
        if key not in _KEYS:
            hint = (" (EVALB and disco-dop delete words by their gold POS tag: list the tags as "
                    "DELETE_LABEL lines)" if key == "DELETE_POS" else "")
            raise ValueError(f"{where}: unknown parameter {key!r}{hint}; expected one of {_KEYS}")
        if not values:
            raise ValueError(f"{where}: {key} needs a value")
        if key in _SET_KEYS:
            if len(values) != 1:
                raise ValueError(f"{where}: one value per {key} line, got {values} (disco-dop would read "
                                 f"{' '.join(values)!r} as a single label)")
            if line != line.rstrip():
                raise ValueError(f"{where}: trailing whitespace after {key} {values[0]} (disco-dop would "
                                 f"keep it in the label)")
            getattr(params, _SET_KEYS[key]).add(values[0])
        elif key in _PAIR_KEYS:
            if len(values) != 2:
                raise ValueError(f"{where}: {key} takes two values (a pair of equivalent ones), got {values}")
            pairs[key].append((values[0], values[1]))
        else:
            if key in seen:
                raise ValueError(f"{where}: {key} given twice")
            seen.add(key)
            if len(values) != 1 or not values[0].isdigit():
                raise ValueError(f"{where}: {key} needs one non-negative integer, got {values}")
            value = int(values[0])
            if key in _NOT_COMPUTED and value:
                raise ValueError(f"{where}: {key} {value} asks for {_NOT_COMPUTED[key]} scores, which neurocrf "
                                 f"does not compute (set it to 0; discodop eval computes them)")
            if key == "DISC_ONLY" and value:
                warnings.warn(f"{where}: DISC_ONLY {value} is ignored, as discodop eval ignores it; the report "
                              f"holds Dis-F1 (discontinuous brackets only) beside F1, and evaluate(..., "
                              f"disc_only=True) / --disconly / disc_only=true restricts every score to "
                              f"discontinuous brackets", UserWarning, stacklevel=2)
            if key in _INT_KEYS:
                kind = type(getattr(params, _INT_KEYS[key]))
                setattr(params, _INT_KEYS[key], kind(value))
    for key, name in _PAIR_KEYS.items():
        setattr(params, name, _equivalence_classes(pairs[key]))
    return params


def _equivalence_classes(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Undirected pairs -> every member's representative, the member of its class that comes
    first in ``pairs``.

    >>> _equivalence_classes([("ADVP", "PRT"), ("X", "Y"), ("PRT", "Z")])
    {'ADVP': 'ADVP', 'PRT': 'ADVP', 'Z': 'ADVP', 'X': 'X', 'Y': 'X'}
    """
    neighbours: dict[str, list[str]] = defaultdict(list)
    for a, b in pairs:
        neighbours[a].append(b)
        neighbours[b].append(a)
    representative: dict[str, str] = {}
    for first in neighbours:  # insertion order: first appearance
        stack = [first]
        while stack:
            member = stack.pop()
            if member not in representative:
                representative[member] = first
                stack.extend(neighbours[member])
    return representative


def scored_terminals(gold: TreebankSentence, params: EvalParams) -> dict[int, int]:
    """The words that are scored, old index -> new index (0, 1, ...): all but those deleted by
    their gold POS tag (``DELETE_LABEL``), their form (``DELETE_WORD``) or, with
    ``DELETE_ROOT_PRETERMS``, as a preterminal under the gold root."""
    gold_tags = gold.pos_tags
    under_root = ({c.children[0] for c in gold.tree.children if isinstance(c, Tree) and c.is_preterminal}
                  if params.delete_root_preterms else set())
    kept = [i for i in range(len(gold.words)) if gold_tags[i] not in params.delete_label
            and gold.words[i] not in params.delete_word and i not in under_root]
    return {old: new for new, old in enumerate(kept)}


def labeled_spans(tree: Tree, keep: dict[int, int], params: EvalParams, *, disc_only: bool = False,
                  functions: str = "leave") -> list[tuple[int, Bracket]]:
    """The brackets of ``tree`` with the preorder number of their node (the order of
    ``tree.subtrees()``): every node that is not a preterminal and whose label is not deleted,
    with its yield restricted to ``keep`` (old index -> new index) and renumbered; nodes whose
    restricted yield is empty (or, with ``disc_only``, contiguous) are skipped. ``functions``:
    ``"remove"`` strips function tags from the labels first."""
    out: list[tuple[int, Bracket]] = []
    for number, node in enumerate(tree.subtrees()):
        label = strip_function_tags(node.label) if functions == "remove" else node.label
        if node.is_preterminal or label in params.delete_label:
            continue
        span = frozenset(keep[i] for i in node.leaves() if i in keep)
        if span and (not disc_only or _is_disc(span)):
            out.append((number, (params.eq_label.get(label, label) if params.labeled else "", span)))
    return out


def bracketings(tree: Tree, keep: dict[int, int], params: EvalParams, *,
                disc_only: bool = False) -> Counter[Bracket]:
    """Multiset of the brackets of :func:`labeled_spans`."""
    return Counter(bracket for _, bracket in labeled_spans(tree, keep, params, disc_only=disc_only))


def _is_disc(span: frozenset[int]) -> bool:
    return max(span) - min(span) + 1 != len(span)


def _safe_div(a: float, b: float) -> float:
    return a / b if b else 0.0


def _prf(matched: int, gold: int, pred: int) -> tuple[float, float, float]:
    p, r = _safe_div(matched, pred), _safe_div(matched, gold)
    return p, r, _safe_div(2 * p * r, p + r)


def _check_tree(sentence: TreebankSentence, role: str, name: str) -> None:
    leaves = sentence.tree.leaves()
    n = len(sentence.words)
    if len(set(leaves)) != len(leaves) or (leaves and (leaves[0] < 0 or leaves[-1] >= n)):
        raise ValueError(f"{name}: the {role} terminal indices {leaves} are not distinct indices into "
                         f"its {n} words")


def _check_words(gold: TreebankSentence, pred: TreebankSentence, params: EvalParams, name: str) -> None:
    """Raise ValueError naming the sentence and the differing words unless ``pred`` holds the
    words of ``gold`` (up to ``EQ_WORD``)."""
    same = params.eq_word.get
    differ = [i for i, (g, p) in enumerate(zip(gold.words, pred.words)) if same(g, g) != same(p, p)]
    if len(gold.words) != len(pred.words):
        i = differ[0] if differ else min(len(gold.words), len(pred.words))
        word = {role: repr(words[i]) if i < len(words) else "none" for role, words in
                (("gold", gold.words), ("predicted", pred.words))}
        raise ValueError(f"{name}: gold has {len(gold.words)} words, prediction {len(pred.words)} (first "
                         f"difference at word {i}: gold {word['gold']}, predicted {word['predicted']})")
    if differ:
        shown = ", ".join(f"word {i}: gold {gold.words[i]!r}, predicted {pred.words[i]!r}" for i in differ[:5])
        more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
        raise ValueError(f"{name}: gold and predicted words differ ({shown}{more})")


def without_function_tags(sentence: TreebankSentence) -> TreebankSentence:
    """A copy whose labels (POS tags too) have their function tags and co-indices stripped, as
    ``discodop eval`` strips them (``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``; a label starting
    with ``-``, such as ``-NONE-`` or ``-LRB-``, is kept whole)."""
    def strip(node: Tree) -> Tree:
        return Tree(strip_function_tags(node.label),
                    [strip(c) if isinstance(c, Tree) else c for c in node.children])

    return TreebankSentence(sentence.id, sentence.words, strip(sentence.tree))


def _check_ids(gold: Sequence[TreebankSentence], pred: Sequence[TreebankSentence],
               sources: tuple[str, str]) -> None:
    """Raise ValueError naming the predictions, the first sentence whose ids differ, the likely
    cause and the fix (``check_ids=false``: pair by position) unless the ids agree."""
    first = next((k for k, (g, p) in enumerate(zip(gold, pred)) if g.id != p.id), None)
    if first is None:
        return
    gold_name, pred_name = sources
    g, p = gold[first], pred[first]
    pred_ids = [s.id for s in pred]
    if sorted(pred_ids) == sorted(s.id for s in gold):
        cause = " (the same ids in another order: write the predictions in the order of the gold sentences)"
    elif pred_ids[0] == "1" and all(i.isdigit() for i in pred_ids) and pred_ids == sorted(pred_ids, key=int):
        cause = (f" ({pred_name} holds no sentence ids: its sentences are numbered 1, 2, ... by line, as "
                 f"disco-dop numbers discbracket lines without an 'id=' comment)")
    else:
        cause = ""
    raise ValueError(f"{pred_name}: sentence {first + 1} has id {p.id!r}, but gold sentence {first + 1} "
                     f"({gold_name}) has id {g.id!r}{cause}; to pair gold and predicted sentences by position "
                     f"instead, pass check_ids=false (evaluate(..., check_ids=False); python -m "
                     f"neurocrf.parsing.evaluate --no-check-ids)")


def evaluate(gold: Sequence[TreebankSentence], pred: Sequence[TreebankSentence],
             params: EvalParams | str | os.PathLike | None = None, *, check_ids: bool = True,
             functions: str = "remove", disc_only: bool = False,
             sources: tuple[str, str] = ("gold", "predictions")) -> dict:
    """Score ``pred`` against ``gold`` (paired by position).

    Args:
        params: an :class:`EvalParams`, a parameter file path, or None for ``proper.prm``.
        check_ids: raise if paired sentences have different ids.
        functions: ``"remove"`` strips function tags from every label first (``NP-SBJ`` ->
            ``NP``), ``"leave"`` keeps labels as they are (:data:`FUNCTIONS`; ``discodop eval
            --functions``, whose default is ``remove`` too).
        disc_only: count discontinuous brackets only (``discodop eval --disconly``): F1 then
            equals Dis-F1, and sentences and exact matches count only the sentences with a
            discontinuous bracket on either side.
        sources: names of the gold and predicted files, for error messages.

    Raises ValueError naming the sentence (number and id) when paired sentences have different
    ids (naming the predictions file, and the fix), different words (up to ``EQ_WORD``) or
    terminal indices that are not their words'. ``CUTOFF_LEN`` keeps the sentences of at most
    that many words counted as EVALB counts them, punctuation included (the figures of
    disco-dop's ``<= CUTOFF_LEN`` column; 0: all).

    Returns:
        a dict with counts (``sentences``, ``gold_brackets``, ``pred_brackets``,
        ``matched_brackets``, the same with ``_dis_`` for discontinuous brackets,
        ``pos_correct``, ``pos_total``, ``exact_matches``), scores in [0, 1] (``precision``,
        ``recall``, ``f1``, ``dis_precision``, ``dis_recall``, ``dis_f1``, ``pos_accuracy``,
        ``exact_match``), ``per_label`` (label -> gold/pred/matched/precision/recall/f1) and the
        options ``functions`` and ``disc_only``.
    """
    if not isinstance(params, EvalParams):
        params = load_params(params)
    if functions not in FUNCTIONS:
        raise ValueError(f"functions must be one of {FUNCTIONS}, got {functions!r}")
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences ({sources[0]}) but {len(pred)} predicted ones ({sources[1]})")
    if check_ids:
        _check_ids(gold, pred, sources)
    totals = Counter()
    gold_by_label: Counter[str] = Counter()
    pred_by_label: Counter[str] = Counter()
    match_by_label: Counter[str] = Counter()
    for number, (g, p) in enumerate(zip(gold, pred), 1):
        name = f"sentence {number} (id {g.id})"
        if functions == "remove":
            g, p = without_function_tags(g), without_function_tags(p)
        _check_words(g, p, params, name)
        _check_tree(g, "gold", name)
        _check_tree(p, "predicted", name)
        gold_tags = g.pos_tags
        # the length as EVALB counts it: every word but those tagged DELETE_LABEL_FOR_LENGTH
        if params.cutoff_len and sum(t not in params.delete_label_for_length for t in gold_tags) > params.cutoff_len:
            continue
        keep = scored_terminals(g, params)
        kept = sorted(keep)
        gb = bracketings(g.tree, keep, params, disc_only=disc_only)
        pb = bracketings(p.tree, keep, params, disc_only=disc_only)
        common = gb & pb
        pred_tags = p.pos_tags
        counted = not disc_only or bool(gb or pb)
        totals["sentences"] += counted
        totals["gold_brackets"] += sum(gb.values())
        totals["pred_brackets"] += sum(pb.values())
        totals["matched_brackets"] += sum(common.values())
        totals["gold_dis_brackets"] += sum(c for (_, s), c in gb.items() if _is_disc(s))
        totals["pred_dis_brackets"] += sum(c for (_, s), c in pb.items() if _is_disc(s))
        totals["matched_dis_brackets"] += sum(c for (_, s), c in common.items() if _is_disc(s))
        totals["pos_total"] += len(kept)
        totals["pos_correct"] += sum(gold_tags[i] == pred_tags[i] for i in kept)
        totals["exact_matches"] += counted and gb == pb
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
    result["functions"], result["disc_only"] = functions, disc_only
    return result


def format_report(result: dict, *, max_labels: int = 20) -> str:
    """Human-readable summary of an :func:`evaluate` result (percentages)."""
    r = result
    lines = ["(discontinuous brackets only)"] if r.get("disc_only") else []
    lines += [
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
    """``python -m neurocrf.parsing.evaluate GOLD PRED [--params FILE] [--fmt FMT] [--disconly]
    [--functions remove|leave] [--no-check-ids]``."""
    from neurocrf.parsing.treebank import read_treebank

    ap = argparse.ArgumentParser(description="Discontinuous labeled bracket evaluation.")
    ap.add_argument("gold")
    ap.add_argument("pred")
    ap.add_argument("--params", default=None, help="parameter file (default: proper.prm)")
    ap.add_argument("--fmt", default=None, help="treebank format of both files (default: guess)")
    ap.add_argument("--disconly", action="store_true", help="count discontinuous brackets only")
    ap.add_argument("--functions", choices=FUNCTIONS, default="remove",
                    help="strip function tags from labels (default) or leave them")
    ap.add_argument("--no-check-ids", dest="check_ids", action="store_false",
                    help="pair gold and predicted sentences by position whatever their ids")
    args = ap.parse_args(argv)
    gold = read_treebank(args.gold, args.fmt)
    pred = read_treebank(args.pred, args.fmt)
    print(format_report(evaluate(gold, pred, args.params, check_ids=args.check_ids, functions=args.functions,
                                 disc_only=args.disconly, sources=(args.gold, args.pred))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

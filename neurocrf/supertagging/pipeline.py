"""The parse pipeline: supertag -> parse (with a wider retry) -> summary -> report.

    source = load_supertagger("best.ckpt")                      # or an ensemble, or SavedSupertags
    run = tag_and_parse(source, ids, words, k=10, fallback_k=50)
    report = summarize(run, gold, gold_supertags=..., gold_preterminals=..., known_supertags=source.supertags)
    write_run(run, report, "parse.discbracket")                  # trees + parse_report.{json,txt}

Steps: tokens -> :meth:`~neurocrf.supertagging.source.SupertagSource.predict_kbest` (k best
supertags per token, weights renormalised over the k, and a preterminal) ->
:class:`neurocrf.parsing.parser.Parser` -> trees (``NOPARSE`` fallback trees where the supertags
do not combine). :func:`oracle_parse` puts the gold supertags and preterminals of a treebank
(weight 0, k = 1) in place of the tagger: an upper bound that also checks the extraction ->
parsing -> restoring path. The entry points ``neurocrf-parse`` and ``neurocrf-supertag`` and
``reproductions/select_ensemble.py`` run it.

The report (:func:`summarize`) holds coverage (NOPARSE count), parser statuses, skipped (unknown
or invalid) supertags, sentences per second of tagging and of parsing separately and together,
and, with gold trees, F1 / Dis-F1 / POS accuracy / exact match and supertag accuracy.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neurocrf.parsing.parser import Parser, ParseResult
from neurocrf.parsing.tree import TreebankSentence
from neurocrf.supertagging.source import KBestTags, SupertagSource


@dataclass
class ParseRun:
    """Everything one parse run produced: predicted trees (same ids and words as the input), the
    parser results, the seconds spent tagging and parsing, and the k-best tags (None for the
    oracle)."""

    predictions: list[TreebankSentence]
    results: list[ParseResult]
    tagging_seconds: float
    parsing_seconds: float
    k: int
    kbest: list[KBestTags] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_candidates(parser: Parser, ids: Sequence[str], words: Sequence[Sequence[str]],
                     candidates: Sequence[Sequence[Sequence[tuple[str, float]]]],
                     preterminals: Sequence[Sequence[str]]) -> tuple[list[TreebankSentence], list[ParseResult], float]:
    """Parse every sentence from its candidates; returns trees, results and the seconds taken."""
    predictions: list[TreebankSentence] = []
    results: list[ParseResult] = []
    start = time.perf_counter()
    for sent_id, sent_words, sent_cands, sent_pts in zip(ids, words, candidates, preterminals):
        result = parser.parse(sent_words, sent_cands, sent_pts)
        results.append(result)
        predictions.append(TreebankSentence(sent_id, list(sent_words), result.tree))
    return predictions, results, time.perf_counter() - start


def tag_and_parse(source: SupertagSource, ids: Sequence[str], words: Sequence[Sequence[str]], *,
                  k: int = 10, time_limit: float | None = 5.0, max_items: int | None = 1_000_000,
                  batch_size: int = 64, fallback_k: int | None = None) -> ParseRun:
    """Supertag ``words`` with ``source`` (a supertagger, an ensemble or saved tags) and parse
    with its root labels; tagging and parsing are timed separately.

    ``fallback_k`` (> k): sentences whose ``k`` best supertags do not combine are parsed once
    more with their ``fallback_k`` best (an extension of the paper's setting; None: off);
    ``extra`` then counts the retried and rescued sentences. The parser keeps the ``k``
    lowest-weight candidates itself, and renormalising over ``fallback_k`` instead of ``k``
    shifts every weight of a token by the same constant, so first attempts are unchanged."""
    wide = max(k, fallback_k or 0)
    start = time.perf_counter()
    kbest = source.predict_kbest(words, k=wide, batch_size=batch_size)
    tagging = time.perf_counter() - start
    parser = Parser(source.roots, k=k, time_limit=time_limit, max_items=max_items)
    candidates = [t.candidates for t in kbest]
    preterminals = [t.preterminals for t in kbest]
    predictions, results, parsing = parse_candidates(parser, ids, words, candidates, preterminals)
    extra: dict[str, Any] = {}
    if fallback_k and fallback_k > k:
        retry = [i for i, r in enumerate(results) if r.status == "noparse"]
        wider = Parser(source.roots, k=fallback_k, time_limit=time_limit, max_items=max_items)
        again, again_results, seconds = parse_candidates(
            wider, [ids[i] for i in retry], [words[i] for i in retry], [candidates[i] for i in retry],
            [preterminals[i] for i in retry])
        parsing += seconds
        rescued = 0
        for i, prediction, result in zip(retry, again, again_results):
            if not result.fallback:
                predictions[i], results[i] = prediction, result
                rescued += 1
        extra = {"fallback_k": fallback_k, "retried": len(retry), "rescued": rescued}
    return ParseRun(predictions, results, tagging, parsing, k, kbest, extra)


def oracle_parse(gold: Sequence[TreebankSentence], roots: Sequence[str], *, move_punctuation: bool = True,
                 h: int = 0, v: int = 1, time_limit: float | None = 5.0,
                 max_items: int | None = 1_000_000) -> ParseRun:
    """Parse ``gold`` from its own supertags and preterminals (weight 0, k = 1)."""
    supertags, preterminals = gold_tags(gold, {"move_punctuation": move_punctuation, "h": h, "v": v})
    parser = Parser(roots, k=1, time_limit=time_limit, max_items=max_items)
    predictions, results, parsing = parse_candidates(
        parser, [s.id for s in gold], [s.words for s in gold],
        [[[(tag, 0.0)] for tag in tags] for tags in supertags], preterminals)
    return ParseRun(predictions, results, 0.0, parsing, 1)


def gold_tags(gold: Sequence[TreebankSentence],
              transform: Mapping[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """The gold supertags and preterminals of ``gold`` (per sentence, per token), its trees
    prepared as ``transform`` says (``move_punctuation``, ``h``, ``v``: a source's
    :attr:`~neurocrf.supertagging.source.SupertagSource.transform`)."""
    from neurocrf.supertagging.data import supertag_corpus

    corpus, _ = supertag_corpus(gold, move_punctuation=bool(transform.get("move_punctuation", True)),
                                h=int(transform.get("h", 0)), v=int(transform.get("v", 1)))
    return [s.supertags for s in corpus], [s.preterminals for s in corpus]


def summarize(run: ParseRun, gold: Sequence[TreebankSentence] | None = None, *,
              params: str | None = None, gold_supertags: Sequence[Sequence[str]] | None = None,
              gold_preterminals: Sequence[Sequence[str]] | None = None,
              known_supertags: Sequence[str] | None = None) -> dict[str, Any]:
    """A plain-value report of ``run`` (and its evaluation against ``gold`` if given).

    ``gold_supertags`` / ``gold_preterminals`` (per sentence, per token) add the 1-best and
    k-best supertag accuracy and the preterminal accuracy of the tagger; ``known_supertags``
    (the model's supertag list) adds how many gold supertags the model cannot predict."""
    n = len(run.results)
    tokens = sum(len(p.words) for p in run.predictions)
    noparse = sum(r.fallback for r in run.results)
    total_seconds = run.tagging_seconds + run.parsing_seconds
    report: dict[str, Any] = {
        "sentences": n,
        "tokens": tokens,
        "k": run.k,
        "parsed": n - noparse,
        "noparse": noparse,
        "coverage": (n - noparse) / n if n else 0.0,
        "statuses": dict(Counter(r.status for r in run.results)),
        "skipped_supertags": sum(r.skipped for r in run.results),
        "tagging_seconds": run.tagging_seconds,
        "parsing_seconds": run.parsing_seconds,
        "tagging_sentences_per_second": _rate(n, run.tagging_seconds),
        "parsing_sentences_per_second": _rate(n, run.parsing_seconds),
        "sentences_per_second": _rate(n, total_seconds),
        "mean_chart_items": sum(r.items for r in run.results) / n if n else 0.0,
        "max_parse_seconds": max((r.seconds for r in run.results), default=0.0),
    }
    report.update(run.extra)
    if run.kbest is not None and gold_supertags is not None:
        flat = [(cands, g) for kb, gs in zip(run.kbest, gold_supertags) for cands, g in zip(kb.candidates, gs)]
        total = max(len(flat), 1)
        report["supertag_accuracy"] = sum(c[0][0] == g for c, g in flat if c) / total
        report["supertag_kbest_accuracy"] = sum(any(t == g for t, _ in c[: run.k]) for c, g in flat) / total
        if gold_preterminals is not None:
            pts = [(p, g) for kb, gp in zip(run.kbest, gold_preterminals) for p, g in zip(kb.preterminals, gp)]
            report["preterminal_accuracy"] = sum(p == g for p, g in pts) / max(len(pts), 1)
        if known_supertags is not None:
            known = set(known_supertags)
            report["unknown_gold_supertags"] = sum(g not in known for _, g in flat)
    if gold is not None:
        from neurocrf.parsing import evaluate

        scores = evaluate(gold, run.predictions, params)
        report["evaluation"] = scores
        for key in ("f1", "dis_f1", "precision", "recall", "pos_accuracy", "exact_match"):
            report[key] = scores[key]
    return report


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def format_parse_report(report: Mapping[str, Any]) -> str:
    """Human-readable summary of :func:`summarize` (plus the evaluation report, if any)."""
    r = report
    lines = [
        f"sentences           {r['sentences']}  ({r['tokens']} tokens), k = {r['k']}",
        f"coverage            {100 * r['coverage']:6.2f}  (NOPARSE: {r['noparse']}; statuses {r['statuses']})",
        f"skipped supertags   {r['skipped_supertags']}",
        *([f"fallback k = {r['fallback_k']}: retried {r['retried']}, rescued {r['rescued']}"]
          if "fallback_k" in r else []),
        f"tagging             {r['tagging_seconds']:.2f} s  ({r['tagging_sentences_per_second']:.1f} sentences/s)",
        f"parsing             {r['parsing_seconds']:.2f} s  ({r['parsing_sentences_per_second']:.1f} sentences/s)",
        f"tagging + parsing   {r['sentences_per_second']:.1f} sentences/s",
    ]
    for key, name in (("supertag_accuracy", "supertag accuracy"),
                      ("supertag_kbest_accuracy", "gold in k best"),
                      ("preterminal_accuracy", "preterminal acc.")):
        if key in r:
            lines.append(f"{name:<20}{100 * r[key]:6.2f}")
    if "unknown_gold_supertags" in r:
        lines.append(f"unknown gold tags   {r['unknown_gold_supertags']}")
    if "evaluation" in r:
        from neurocrf.parsing import format_report

        lines += ["", format_report(r["evaluation"])]
    return "\n".join(lines) + "\n"


def write_run(run: ParseRun, report: Mapping[str, Any], output: str | Path,
              report_prefix: str | Path | None = None) -> tuple[Path, Path, Path]:
    """Write the trees (discbracket with ids) and the report (JSON + text); returns the paths.
    Each file is written whole or not at all (a temporary file renamed into place)."""
    import io

    from neurocrf.data.conll import atomic_write_text
    from neurocrf.parsing import write_treebank

    output = Path(output)
    trees = io.StringIO()
    write_treebank(trees, [p for p in run.predictions if p.words], "discbracket", write_ids=True)
    atomic_write_text(output, trees.getvalue())
    prefix = Path(report_prefix) if report_prefix is not None else output.with_suffix("")
    json_path = prefix.parent / f"{prefix.name}_report.json"
    text_path = prefix.parent / f"{prefix.name}_report.txt"
    atomic_write_text(json_path, json.dumps(report, indent=2, default=str) + "\n")
    atomic_write_text(text_path, format_parse_report(report))
    return output, json_path, text_path


def read_sentences(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """Whitespace-tokenised sentences, one per non-empty line; ids are the 1-based line numbers.
    A UTF-8 byte order mark is dropped; bytes that are not UTF-8 are an error naming file and line."""
    from neurocrf.data.inputs import read_text_sentences

    if not Path(path).is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    sentences = [s for s in read_text_sentences(path) if s.tokens]
    return [str(s.line) for s in sentences], [s.tokens for s in sentences]

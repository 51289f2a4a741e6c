"""Parse sentences with a trained supertagger and the k-best LCFRS parser (``configs/parse.yaml``).

    neurocrf-parse ckpt_path=.../best.ckpt input=sentences.txt          # one sentence per line
    neurocrf-parse ckpt_path=.../best.ckpt treebank=alpino split=test   # parse + evaluate
    neurocrf-parse oracle=true treebank=alpino split=test k=1           # gold supertags
    neurocrf-parse ckpt_path='[a.ckpt,b.ckpt]' treebank=alpino           # ensemble of supertaggers
    neurocrf-parse ckpt_path=a.ckpt treebank=alpino save_tags=a.jsonl.gz # also save the tagger output
    neurocrf-parse tags='[a.jsonl.gz,b.jsonl.gz]' treebank=alpino k=20   # parse saved output (mixed)

Steps: tokens -> :meth:`Supertagger.predict_kbest` (k best supertags per token, weights
renormalised over the k, and a preterminal) -> :class:`neurocrf.parsing.parser.Parser` ->
discbracket trees (``NOPARSE`` fallback trees where the supertags do not combine). With
``oracle=true`` the gold supertags and preterminals of the treebank (weight 0, k=1) replace the
supertagger: an upper bound that also checks the extraction -> parsing -> restoring path.
A list of checkpoints is an ensemble (:class:`neurocrf.models.supertag_ensemble.SupertaggerEnsemble`):
the parser gets the k best of the members' mean supertag distribution.
``save_tags=<file>`` writes the tagger's distributions (the ``save_tags_n`` best supertags per
token) and ``tags=<file or list>`` parses from such files instead of a model, mixing several like
an ensemble (:mod:`neurocrf.models.supertag_cache`): tag once, then parse at any ``k``.
``fallback_k=<n>`` (50 in ``configs/parse.yaml``; ``null`` is the paper's setting) parses
sentences whose k best supertags do not combine once more with their n best.

Writes ``<output>`` (discbracket, ``id<TAB>tree`` per line) and ``parse_report.json`` /
``parse_report.txt`` next to it: coverage (NOPARSE count), parser statuses, skipped (unknown or
invalid) supertags, sentences per second of tagging and of parsing separately and together,
and, for treebank input, F1 / Dis-F1 / POS accuracy / exact match and supertag accuracy.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from neurocrf.cli.utils import CONFIG_DIR, to_plain
from neurocrf.parsing.parser import Parser, ParseResult
from neurocrf.parsing.tree import TreebankSentence

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test", "all")


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
    kbest: list[Any] | None = None
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


def tag_and_parse(model: Any, ids: Sequence[str], words: Sequence[Sequence[str]], *, k: int = 10,
                  time_limit: float | None = 5.0, max_items: int | None = 1_000_000,
                  batch_size: int = 64, fallback_k: int | None = None) -> ParseRun:
    """Supertag ``words`` with ``model`` (a :class:`~neurocrf.models.supertagger.Supertagger`) and
    parse; tagging and parsing are timed separately.

    ``fallback_k`` (> k): sentences whose ``k`` best supertags do not combine are parsed once
    more with their ``fallback_k`` best (an extension of the paper's setting; None: off);
    ``extra`` then counts the retried and rescued sentences. The parser keeps the ``k``
    lowest-weight candidates itself, and renormalising over ``fallback_k`` instead of ``k``
    shifts every weight of a token by the same constant, so first attempts are unchanged."""
    wide = max(k, fallback_k or 0)
    start = time.perf_counter()
    kbest = model.predict_kbest(words, k=wide, batch_size=batch_size)
    tagging = time.perf_counter() - start
    parser = Parser(model.roots, k=k, time_limit=time_limit, max_items=max_items)
    candidates = [t.candidates for t in kbest]
    preterminals = [t.preterminals for t in kbest]
    predictions, results, parsing = parse_candidates(parser, ids, words, candidates, preterminals)
    extra: dict[str, Any] = {}
    if fallback_k and fallback_k > k:
        retry = [i for i, r in enumerate(results) if r.status == "noparse"]
        wider = Parser(model.roots, k=fallback_k, time_limit=time_limit, max_items=max_items)
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
    from neurocrf.models.supertag_data import supertag_corpus

    corpus, _ = supertag_corpus(gold, move_punctuation=move_punctuation, h=h, v=v)
    parser = Parser(roots, k=1, time_limit=time_limit, max_items=max_items)
    predictions, results, parsing = parse_candidates(
        parser, [s.id for s in gold], [s.words for s in gold],
        [[[(tag, 0.0)] for tag in s.supertags] for s in corpus], [s.preterminals for s in corpus])
    return ParseRun(predictions, results, 0.0, parsing, 1)


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
    """Write the trees (discbracket with ids) and the report (JSON + text); returns the paths."""
    from neurocrf.parsing import write_treebank

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_treebank(output, [p for p in run.predictions if p.words], "discbracket", write_ids=True)
    prefix = Path(report_prefix) if report_prefix is not None else output.with_suffix("")
    json_path = prefix.parent / f"{prefix.name}_report.json"
    text_path = prefix.parent / f"{prefix.name}_report.txt"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    text_path.write_text(format_parse_report(report), encoding="utf-8")
    return output, json_path, text_path


def read_sentences(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """Whitespace-tokenised sentences, one per non-empty line; ids are the 1-based line numbers.
    A UTF-8 byte order mark is dropped; bytes that are not UTF-8 are an error naming file and line."""
    from neurocrf.data.inputs import read_text_sentences

    if not Path(path).is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    sentences = [s for s in read_text_sentences(path) if s.tokens]
    return [str(s.line) for s in sentences], [s.tokens for s in sentences]


def select_split(splits: Mapping[str, list[TreebankSentence]], split: str) -> list[TreebankSentence]:
    """``splits[split]``, or all three splits in order for ``split="all"``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "all":
        return [s for name in ("train", "dev", "test") for s in splits[name]]
    return list(splits[split])


def gold_split(treebank: Mapping[str, Any], split: str) -> list[TreebankSentence]:
    """Sentences of ``split`` (train/dev/test, or ``all``) of a treebank config."""
    from neurocrf.models.supertag_data import load_treebank

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return select_split(load_treebank(treebank), split)


def load_tagger(cfg: DictConfig, ids: Sequence[str], words: Sequence[Sequence[str]]) -> tuple[Any, float]:
    """The supertagger of ``cfg``: saved tag files (``tags``), or the model(s) of ``ckpt_path``.
    With ``save_tags``, the model's distributions over ``words`` are computed once, written there
    and parsed from; returns the tagger and the seconds that took (0 otherwise)."""
    import torch

    from neurocrf.models.supertag_cache import SavedSupertags, tag_distributions, tag_file_header, write_tag_file
    from neurocrf.models.supertag_ensemble import load_supertagger

    if cfg.get("tags"):
        return SavedSupertags.read(to_plain(cfg.tags)), 0.0
    checkpoints = to_plain(cfg.ckpt_path)
    model = load_supertagger(checkpoints).to(torch.device(cfg.get("device", "cpu")))
    if not cfg.get("save_tags"):
        return model, 0.0
    start = time.perf_counter()
    n = max(int(cfg.get("save_tags_n", 50)), int(cfg.get("k", 10)), int(cfg.get("fallback_k") or 0))
    distributions = tag_distributions(model, ids, words, n=n, batch_size=int(cfg.get("batch_size", 64)))
    header = tag_file_header(model, distributions,
                             [checkpoints] if isinstance(checkpoints, str) else list(checkpoints))
    path = write_tag_file(cfg.save_tags, header, distributions)
    return SavedSupertags([header], [distributions], [str(path)]), time.perf_counter() - start


def parse(cfg: DictConfig) -> dict[str, Any]:
    """Run the parse described by ``cfg``; returns the report (with ``output`` paths)."""
    from neurocrf.models.supertag_data import (
        load_treebank,
        supertag_corpus,
        treebank_options,
    )

    k = int(cfg.get("k", 10))
    time_limit = cfg.get("time_limit", 5.0)
    max_items = cfg.get("max_items", 1_000_000)
    split = cfg.get("split", "test")
    options = treebank_options(to_plain(cfg.get("treebank"))) if cfg.get("treebank") else None
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    oracle = bool(cfg.get("oracle", False))
    tag_files = to_plain(cfg.get("tags"))
    if oracle and (cfg.get("input") or options is None):
        raise ValueError("oracle=true needs gold trees: give treebank=<name> and split, not input")
    sources = [name for name, given in (("ckpt_path", cfg.get("ckpt_path")), ("tags", tag_files),
                                        ("oracle=true", oracle)) if given]
    if not sources:
        raise ValueError("ckpt_path is required (or tags=<saved tag files>, or oracle=true)")
    if len(sources) > 1:
        raise ValueError(f"give one of ckpt_path, tags and oracle=true, not {' and '.join(sources)}")
    if cfg.get("save_tags") and not cfg.get("ckpt_path"):
        raise ValueError("save_tags writes a model's output: it needs ckpt_path")
    gold: list[TreebankSentence] | None = None
    if cfg.get("input"):
        ids, words = read_sentences(cfg.input)
    elif options is not None:
        splits = load_treebank(options)
        gold = select_split(splits, split)
        ids, words = [s.id for s in gold], [s.words for s in gold]
    else:
        raise ValueError("give input=<text file> or treebank=<name> (with split=...)")

    if oracle:
        assert gold is not None and options is not None
        transform = {key: options[key] for key in ("move_punctuation", "h", "v")}
        train_roots = supertag_corpus(splits["train"], **transform)[1]
        run = oracle_parse(gold, sorted(train_roots), **transform, time_limit=time_limit,
                           max_items=max_items)
        report = summarize(run, gold, params=cfg.get("params"))
    else:
        tagger, saving_seconds = load_tagger(cfg, ids, words)
        run = tag_and_parse(tagger, ids, words, k=k, time_limit=time_limit, max_items=max_items,
                            batch_size=int(cfg.get("batch_size", 64)), fallback_k=cfg.get("fallback_k"))
        run.tagging_seconds += saving_seconds
        gold_tags = gold_pts = None
        if gold is not None:
            transform = tagger.transform
            corpus, _ = supertag_corpus(gold, move_punctuation=bool(transform.get("move_punctuation", True)),
                                        h=int(transform.get("h", 0)), v=int(transform.get("v", 1)))
            gold_tags = [s.supertags for s in corpus]
            gold_pts = [s.preterminals for s in corpus]
        report = summarize(run, gold, params=cfg.get("params"), gold_supertags=gold_tags,
                           gold_preterminals=gold_pts, known_supertags=tagger.supertags)
        if tag_files:
            report["tags"] = tag_files
        if cfg.get("save_tags"):
            report["saved_tags"] = str(cfg.save_tags)

    output = cfg.get("output") or str(Path(cfg.paths.output_dir) / "parse.discbracket")
    paths = write_run(run, report, output)
    report["output"] = [str(p) for p in paths]
    print(format_parse_report(report), end="")
    print(f"trees: {paths[0]}\nreport: {paths[2]}", file=sys.stderr)
    return report


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="parse")
def main(cfg: DictConfig) -> float | None:
    report = parse(cfg)
    return report.get("f1")


if __name__ == "__main__":
    main()

"""Parse sentences with a trained supertagger and the k-best LCFRS parser (``configs/parse.yaml``).

    neurocrf-parse ckpt_path=.../best.ckpt input=sentences.txt          # one sentence per line
    neurocrf-parse ckpt_path=.../best.ckpt treebank=alpino split=test   # parse + evaluate
    neurocrf-parse oracle=true treebank=alpino split=test k=1           # gold supertags
    neurocrf-parse ckpt_path='[a.ckpt,b.ckpt]' treebank=alpino           # ensemble of supertaggers
    neurocrf-parse ckpt_path=a.ckpt treebank=alpino save_tags=a.jsonl.gz # also save the tagger output
    neurocrf-parse tags='[a.jsonl.gz,b.jsonl.gz]' treebank=alpino k=20   # parse saved output (mixed)

The steps are those of :mod:`neurocrf.supertagging.pipeline`. A list of checkpoints is an
ensemble (:class:`~neurocrf.supertagging.ensemble.SupertaggerEnsemble`): the parser gets the k
best of the members' mean supertag distribution. ``save_tags=<file>`` writes the tagger's
distributions (the ``save_tags_n`` best supertags per token) and ``tags=<file or list>`` parses
from such files instead of a model, mixing several like an ensemble
(:mod:`neurocrf.supertagging.saved_tags`): tag once, then parse at any ``k``.
``fallback_k=<n>`` (50 in ``configs/parse.yaml``; ``null`` is the paper's setting) parses
sentences whose k best supertags do not combine once more with their n best.

Writes ``<output>`` (discbracket as disco-dop reads it: ``tree<TAB>id=<id>`` per line) and
``parse_report.json`` / ``parse_report.txt`` next to it (:func:`~neurocrf.supertagging.pipeline.summarize`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from neurocrf.cli.tool import tool_main
from neurocrf.cli.utils import to_plain
from neurocrf.parsing.tree import TreebankSentence
from neurocrf.parsing.treebank import (
    check_split,
    load_treebank,
    select_split,
    treebank_options,
)
from neurocrf.supertagging.pipeline import (
    format_parse_report,
    gold_tags,
    oracle_parse,
    read_sentences,
    summarize,
    tag_and_parse,
    write_run,
)
from neurocrf.supertagging.source import SupertagSource


def load_source(cfg: DictConfig, ids: Sequence[str], words: Sequence[Sequence[str]]) -> tuple[SupertagSource, float]:
    """The supertags of ``cfg``: saved tag files (``tags``), or the model(s) of ``ckpt_path``.
    With ``save_tags``, the model's distributions over ``words`` are computed once, written there
    and parsed from; returns the source and the seconds that took (0 otherwise)."""
    import torch

    from neurocrf.supertagging.ensemble import load_supertagger
    from neurocrf.supertagging.saved_tags import SavedSupertags, tag_and_save

    if cfg.tags:
        return SavedSupertags.read(to_plain(cfg.tags)), 0.0
    checkpoints = to_plain(cfg.ckpt_path)
    model = load_supertagger(checkpoints).to(torch.device(cfg.device))
    if not cfg.save_tags:
        return model, 0.0
    start = time.perf_counter()
    n = max(int(cfg.save_tags_n), int(cfg.k), int(cfg.fallback_k or 0))
    saved = tag_and_save(model, cfg.save_tags, ids, words, n=n, batch_size=int(cfg.batch_size),
                         sources=[checkpoints] if isinstance(checkpoints, str) else list(checkpoints))
    return saved, time.perf_counter() - start


def check_sources(cfg: DictConfig, has_treebank: bool) -> None:
    """Exactly one of ``ckpt_path``, ``tags`` and ``oracle=true``, and what each needs."""
    oracle = bool(cfg.oracle)
    check_split(cfg.split)
    if oracle and (cfg.input or not has_treebank):
        raise ValueError("oracle=true needs gold trees: give treebank=<name> and split, not input")
    sources = [name for name, given in (("ckpt_path", cfg.ckpt_path), ("tags", cfg.tags),
                                        ("oracle=true", oracle)) if given]
    if not sources:
        raise ValueError("ckpt_path is required (or tags=<saved tag files>, or oracle=true)")
    if len(sources) > 1:
        raise ValueError(f"give one of ckpt_path, tags and oracle=true, not {' and '.join(sources)}")
    if cfg.save_tags and not cfg.ckpt_path:
        raise ValueError("save_tags writes a model's output: it needs ckpt_path")


def parse(cfg: DictConfig) -> dict[str, Any]:
    """Run the parse described by ``cfg``; returns the report (with ``output`` paths)."""
    from neurocrf.supertagging.data import supertag_corpus

    options = treebank_options(to_plain(cfg.get("treebank"))) if cfg.get("treebank") else None
    check_sources(cfg, options is not None)
    limits = {"time_limit": cfg.time_limit, "max_items": cfg.max_items}
    gold: list[TreebankSentence] | None = None
    if cfg.input:
        ids, words = read_sentences(cfg.input)
    elif options is not None:
        splits = load_treebank(options)
        gold = select_split(splits, cfg.split)
        ids, words = [s.id for s in gold], [s.words for s in gold]
    else:
        raise ValueError("give input=<text file> or treebank=<name> (with split=...)")

    if cfg.oracle:
        assert gold is not None and options is not None
        transform = {key: options[key] for key in ("move_punctuation", "h", "v")}
        train_roots = supertag_corpus(splits["train"], **transform)[1]
        run = oracle_parse(gold, sorted(train_roots), **transform, **limits)
        report = summarize(run, gold, params=cfg.params)
    else:
        source, saving_seconds = load_source(cfg, ids, words)
        run = tag_and_parse(source, ids, words, k=int(cfg.k), **limits,
                            batch_size=int(cfg.batch_size), fallback_k=cfg.fallback_k)
        run.tagging_seconds += saving_seconds
        supertags, preterminals = gold_tags(gold, source.transform) if gold is not None else (None, None)
        report = summarize(run, gold, params=cfg.params, gold_supertags=supertags,
                           gold_preterminals=preterminals, known_supertags=source.supertags)
        if cfg.tags:
            report["tags"] = to_plain(cfg.tags)
        if cfg.save_tags:
            report["saved_tags"] = str(cfg.save_tags)

    output = cfg.output or str(Path(cfg.paths.output_dir) / "parse.discbracket")
    paths = write_run(run, report, output)
    report["output"] = [str(p) for p in paths]
    print(format_parse_report(report), end="")
    print(f"trees: {paths[0]}\nreport: {paths[2]}", file=sys.stderr)
    return report


main = tool_main(parse, "parse", "neurocrf-parse", lambda cfg, report: report.get("f1"))


if __name__ == "__main__":
    main()

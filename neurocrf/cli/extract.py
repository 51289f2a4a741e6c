"""Extract a supertag corpus from a treebank (``configs/extract.yaml``).

    neurocrf-extract treebank=alpino
    python -m neurocrf.cli.extract treebank=tiny output_dir=/tmp/tiny_supertags

Reads and splits the treebank (deterministic split by sentence id), prepares every tree
(punctuation moved, unaries collapsed, binarized, fanout markers) and writes into ``output_dir``:

- ``train.supertags``, ``dev.supertags``, ``test.supertags``: ``word<TAB>supertag<TAB>preterminal``
  per token, a blank line after each sentence;
- ``roots.txt``: root labels of the prepared training trees (the parser's goal labels);
- ``stats.json``: sentences, tokens, distinct supertags / preterminals per split, supertags seen
  only in dev/test, discontinuity rate (sentences with a discontinuous constituent) and max
  fanout, both measured after punctuation is moved (gaps made only of punctuation closed).

The statistics are printed as well.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from neurocrf.cli.tool import tool_main
from neurocrf.cli.utils import to_plain

log = logging.getLogger(__name__)


def extract(cfg: DictConfig) -> dict[str, Any]:
    """Write the supertag corpus of ``cfg.treebank`` into ``cfg.output_dir``; returns the stats."""
    from neurocrf.data.conll import atomic_write_text
    from neurocrf.parsing.treebank import SPLITS, load_treebank, treebank_options
    from neurocrf.supertagging.data import (
        corpus_statistics,
        prepare_for_extraction,
        supertag_corpus,
        write_supertag_corpus,
    )

    options = treebank_options(to_plain(cfg.treebank))
    output = Path(cfg.output_dir or cfg.paths.output_dir)
    treebanks = load_treebank(options)
    corpora = {}
    roots: set[str] = set()
    for split in SPLITS:
        try:
            corpora[split], split_roots = supertag_corpus(
                treebanks[split], move_punctuation=bool(options["move_punctuation"]),
                h=int(options["h"]), v=int(options["v"]))
        except ValueError as err:  # names the sentence; add the treebank it comes from
            raise ValueError(f"treebank {options['path']}: {err}") from None
        if split == "train":
            roots = split_roots
        write_supertag_corpus(output / f"{split}.supertags", corpora[split])
    moved = {split: [prepare_for_extraction(s, bool(options["move_punctuation"])) for s in sentences]
             for split, sentences in treebanks.items()}
    stats = corpus_statistics(corpora, moved)
    stats["treebank"] = {key: options[key] for key in ("name", "path", "format", "move_punctuation",
                                                       "dev", "test", "h", "v", "limit")}
    stats["treebank"]["path"] = str(stats["treebank"]["path"])
    stats["roots"] = sorted(roots)
    atomic_write_text(output / "roots.txt", "".join(f"{r}\n" for r in sorted(roots)))
    atomic_write_text(output / "stats.json", json.dumps(stats, indent=2) + "\n")
    print(format_statistics(stats), end="")
    print(f"supertag corpus written to {output}")
    return stats


def format_statistics(stats: dict[str, Any]) -> str:
    """The statistics of :func:`extract` as a small table."""
    lines = [(f"{'split':<8}{'sentences':>10}{'tokens':>9}{'supertags':>11}{'preterm.':>10}"
             f"{'unseen tags':>13}{'unseen tok.%':>14}")]
    for split in ("train", "dev", "test", "total"):
        s = stats[split]
        unseen = s.get("unseen_supertags", s.get("supertags_only_in_dev_test", "-"))
        rate = f"{100 * s['unseen_supertag_rate']:.2f}" if "unseen_supertag_rate" in s else "-"
        lines.append(f"{split:<8}{s['sentences']:>10}{s['tokens']:>9}{s['supertags']:>11}"
                     f"{s['preterminals']:>10}{unseen:>13}{rate:>14}")
    total = stats["total"]
    if "discontinuity_rate" in total:
        lines.append(f"sentences with a discontinuous constituent: {100 * total['discontinuity_rate']:.2f}%"
                     f"; max fanout {total['max_fanout']}")
    lines.append(f"roots: {', '.join(stats.get('roots', []))}")
    return "\n".join(lines) + "\n"


main = tool_main(extract, "extract", "neurocrf-extract")


if __name__ == "__main__":
    main()

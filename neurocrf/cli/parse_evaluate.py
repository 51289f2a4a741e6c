"""Score predicted discontinuous trees against a gold treebank (``configs/parse_evaluate.yaml``).

    neurocrf-parse-evaluate predictions=parse.discbracket treebank=alpino split=test
    neurocrf-parse-evaluate predictions=parse.discbracket gold=gold.export

Prints labeled bracket precision / recall / F1, the same on discontinuous brackets (Dis-F1), POS
accuracy and exact match (:func:`neurocrf.parsing.evaluate` with ``params``, default the
packaged ``proper.prm``, and the options of ``discodop eval``: ``functions=remove`` strips
function tags, ``disc_only=true`` counts discontinuous brackets only), and writes
``parse_evaluation.json`` / ``.txt`` into ``report_dir`` (default: the run directory), with
``gold.discbracket``, the gold trees as scored, so that disco-dop can check the figures::

    discodop eval <report_dir>/gold.discbracket parse.discbracket proper.prm --fmt=discbracket

Sentences are paired by position; their ids must agree unless ``check_ids=false``.
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


def read_gold(cfg: DictConfig) -> tuple[list, str]:
    """The gold trees ``cfg`` names (``gold=<file>`` or ``treebank=<name>`` with ``split``) and
    a name for them in messages."""
    from neurocrf.parsing import read_treebank
    from neurocrf.parsing.treebank import load_split

    if cfg.gold:
        return read_treebank(cfg.gold, cfg.gold_format), str(cfg.gold)
    if cfg.get("treebank"):  # an optional group: absent unless chosen
        split = cfg.split
        name = cfg.treebank.get("name") or cfg.treebank.path
        return load_split(to_plain(cfg.treebank), split), f"treebank {name} ({split})"
    raise ValueError("give gold=<treebank file> or treebank=<name> with split=...")


def evaluate_predictions(cfg: DictConfig) -> dict[str, Any]:
    """Read gold and predicted trees as configured and score them; returns the scores."""
    from neurocrf.parsing import evaluate, format_report, read_treebank, write_treebank

    gold, gold_name = read_gold(cfg)
    pred = read_treebank(cfg.predictions, cfg.predictions_format)
    scores = evaluate(gold, pred, cfg.params, check_ids=bool(cfg.check_ids),
                      functions=str(cfg.functions), disc_only=bool(cfg.disc_only),
                      sources=(gold_name, str(cfg.predictions)))
    text = format_report(scores)
    print(text)
    directory = Path(cfg.report_dir or cfg.paths.output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "parse_evaluation.json").write_text(json.dumps(scores, indent=2) + "\n", encoding="utf-8")
    (directory / "parse_evaluation.txt").write_text(text + "\n", encoding="utf-8")
    try:
        write_treebank(directory / "gold.discbracket", gold, "discbracket", write_ids=True)
    except ValueError as error:  # a word or id discbracket cannot hold: the scores stand
        log.warning("gold.discbracket not written: %s", error)
    return scores


main = tool_main(evaluate_predictions, "parse_evaluate", "neurocrf-parse-evaluate",
                 lambda cfg, report: float(report["f1"]))


if __name__ == "__main__":
    main()

"""Draw discontinuous trees as SVG into an HTML page (``configs/draw.yaml``).

    neurocrf-draw gold=trees.discbracket
    neurocrf-draw treebank=alpino split=test predictions=parse.discbracket limit=20
    neurocrf-draw gold=trees.discbracket ids='[17]' output=tree17.svg

Reads the gold trees as ``neurocrf-parse-evaluate`` does (``gold=<file>`` in any format the
readers know, or ``treebank=<name>`` with ``split``) and, with ``predictions=<file>``, the predicted
trees paired with them by position; draws the chosen sentences (``ids``, or the first ``limit``)
with :func:`neurocrf.parsing.draw.trees_html`: words in sentence order along the bottom,
discontinuous constituents and their crossing branches in their own colour, gold beside
predicted with the constituents found in only one of them marked, F1 per sentence. Writes
``output`` (default ``<run dir>/trees.html``; a ``.svg`` name: one sentence's tree).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from neurocrf.cli.tool import tool_main
from neurocrf.cli.utils import to_plain

log = logging.getLogger(__name__)


def draw(cfg: DictConfig) -> Path:
    """Write the page (or SVG) ``cfg`` asks for; returns its path."""
    from neurocrf.cli.parse_evaluate import read_gold
    from neurocrf.parsing import load_params, read_treebank
    from neurocrf.parsing.draw import difference_marks, tree_svg, trees_html

    gold, gold_name = read_gold(cfg)
    pred = None
    if cfg.predictions:
        pred = read_treebank(cfg.predictions, cfg.predictions_format)
        if len(pred) != len(gold):
            raise ValueError(f"{len(gold)} gold sentences ({gold_name}) but {len(pred)} predicted ones "
                             f"({cfg.predictions})")
    ids = to_plain(cfg.ids)
    if ids is not None:
        wanted = [str(i) for i in ([ids] if isinstance(ids, (str, int)) else ids)]
        chosen = [k for k, s in enumerate(gold) if s.id in set(wanted)]
        missing = sorted(set(wanted) - {gold[k].id for k in chosen})
        if missing:
            raise ValueError(f"no sentence with id(s) {missing} in {gold_name}")
    else:
        limit = cfg.limit
        chosen = list(range(len(gold) if limit is None else min(int(limit), len(gold))))
    gold = [gold[k] for k in chosen]
    pred = [pred[k] for k in chosen] if pred is not None else None
    params = load_params(cfg.params)
    functions = str(cfg.functions)
    output = Path(cfg.output or Path(cfg.paths.output_dir) / "trees.html")
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix.lower() == ".svg":
        if len(gold) != 1:
            raise ValueError(f"an .svg output holds one tree; {len(gold)} sentences chosen (give ids='[<id>]')")
        if pred is None:
            text = tree_svg(gold[0])
        else:
            text = tree_svg(pred[0], marks=difference_marks(gold[0], pred[0], params, functions=functions)[1])
    else:
        title = cfg.title or (f"{cfg.predictions} against {gold_name}" if pred is not None else gold_name)
        text = trees_html(gold, pred, params=params, functions=functions,
                          check_ids=bool(cfg.check_ids), title=str(title))
    output.write_text(text, encoding="utf-8")
    log.info("%d tree(s) drawn into %s", len(gold), output)
    print(f"wrote {output}")
    return output


main = tool_main(draw, "draw", "neurocrf-draw")


if __name__ == "__main__":
    main()

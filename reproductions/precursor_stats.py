"""Precursor statistics of the NER corpora (Lee & Choi): how many entities follow another entity of
the same sentence through outside tokens only, and how far behind it (O tokens in between).

    python -m reproductions.precursor_stats                          # the five corpora of the CRF study
    python -m reproductions.precursor_stats ncbi_disease wnut17 --split test --json stats.json

Reads each corpus as its data config (``configs/data/<corpus>.yaml``) says, from ``--data``
(default ``$NEUROCRF_DATA``, else ``../shared/data`` beside the project), and prints a Markdown
table (:func:`neurocrf.study.precursor_stats.format_table`). ``--split train`` reads the whole
training file: for JNLPBA that includes the documents the study holds out as dev.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from neurocrf.cli.utils import CONFIG_DIR
from neurocrf.parsing.treebank import data_root
from neurocrf.study.precursor_stats import SPLITS, corpus_stats, format_table, resolve_data_config

CORPORA = ("ncbi_disease", "bc5cdr", "wnut17", "jnlpba", "conll2003")


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpora", nargs="*", default=list(CORPORA),
                        help=f"data configs (default: {' '.join(CORPORA)})")
    parser.add_argument("--split", choices=SPLITS, default="train", help="which file of each corpus (default: train)")
    parser.add_argument("--data", type=Path, default=data_root(), help="folder of the corpora (NEUROCRF_DATA)")
    parser.add_argument("--configs", type=Path, default=Path(CONFIG_DIR) / "data", help="folder of the data configs")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts as JSON here")
    args = parser.parse_args(argv)
    rows = {}
    for corpus in args.corpora:
        config_path = args.configs / f"{corpus}.yaml"
        if not config_path.is_file():
            parser.error(f"no data config {config_path}")
        rows[corpus] = corpus_stats(resolve_data_config(config_path, args.data), args.split)
    table = format_table(rows, args.split)
    print(table, end="")
    if args.json is not None:
        data = {corpus: {"split": args.split, **stats.to_dict()} for corpus, stats in rows.items()}
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return table


if __name__ == "__main__":
    main()

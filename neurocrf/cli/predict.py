"""Tag a file with a trained checkpoint (``configs/predict.yaml``).

    neurocrf-predict ckpt_path=.../last.ckpt input=corpus.conll                  # CoNLL out
    neurocrf-predict ckpt_path=.../last.ckpt input=sentences.txt format=jsonl nbest=5

Input: a CoNLL column file (its columns are kept; the predicted tag is appended) or plain text,
one whitespace-tokenised sentence per line. The format is ``input_format`` (``conll`` or
``text``), else the file's extension (``.conll``, ``.iob2``, ``.tsv``, ...), else read off the
whole file; a file that reads both ways (every line with the same number of fields and no tag
column) is refused with a message naming it: see :mod:`neurocrf.data.inputs`.

Output: CoNLL (input columns + predicted tag [+ marginal confidence] [+ the n-best tag columns])
or JSON lines, one object per input sentence (per line for text input, empty lines included)::

    {"tokens": [...], "tags": [...], "scheme": "BIOES", "confidences": [...],
     "spans": [{"type": "PER", "start": 0, "end": 2, "confidence": 0.97}],
     "nbest": [{"tags": [...], "probability": 0.91, "log_probability": -0.094}, ...], "gold": [...]}

(with ``nbest``, an empty sentence has the one empty sequence, probability 1). CoNLL output of
text input has one block per input line, each ended by a blank line, so an empty input line is a
blank line of its own: the n-th blank line ends the n-th input line.

The output file is written at the end, atomically (a temporary file in its folder renamed onto
it): a failed run leaves no partial file. What can be checked before predicting is: the output
folder is writable, the output scheme exists, and every token (every column of CoNLL input) can
be written as a CoNLL column.

Every output sentence has exactly as many tokens as the input sentence. A model trained on joined
columns (``data.token_columns``, e.g. word + POS for the chunking features) reads the same columns
of CoNLL input (``token_columns: null`` takes them from the checkpoint).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import hydra
from omegaconf import DictConfig

from neurocrf.cli.utils import CONFIG_DIR
from neurocrf.values import to_plain

log = logging.getLogger(__name__)

FORMATS = ("conll", "jsonl")


def write_jsonl(handle: TextIO, sentences: Sequence[Any], predictions: Sequence[Any], scheme: str | None) -> None:
    for sentence, prediction in zip(sentences, predictions):
        record = prediction.to_dict(scheme)
        if sentence.tags is not None:
            record["gold"] = list(sentence.tags)
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_conll_predictions(
    handle: TextIO,
    sentences: Sequence[Any],
    predictions: Sequence[Any],
    scheme: str | None,
    confidence: bool,
    nbest: int,
) -> None:
    """Input columns (or the tokens) + predicted tag [+ confidence] [+ n-best tag columns]; an
    empty sentence (an empty line of text input) is a blank line of its own."""
    from neurocrf.data.conll import write_conll

    columns: dict[str, list[list[str]]] = {"pred": [p.tags_in(scheme or p.scheme) for p in predictions]}
    if confidence:
        columns["confidence"] = [[f"{c:.4f}" for c in p.confidences] for p in predictions]
    for k in range(nbest):
        columns[f"nbest_{k + 1}"] = [
            _convert(p.nbest[k].tags, p.scheme, scheme) if k < len(p.nbest) else ["-"] * len(p.tokens)
            for p in predictions
        ]
    write_conll(handle, sentences, extra_tag_columns=columns, raw_columns=_raw_columns(sentences))


def _raw_columns(sentences: Sequence[Any]) -> bool:
    """Whether CoNLL output repeats the input's columns (CoNLL input) or its tokens (text)."""
    return all(s.columns is not None for s in sentences)


def _convert(tags: list[str], source: str, target: str | None) -> list[str]:
    from neurocrf.data.schemes import convert_tags

    return tags if not target or target == source else convert_tags(tags, source, target)


def check_output(output: str, cfg: DictConfig, sentences: Sequence[Any]) -> None:
    """Find the output's problems before any prediction: an unknown format or scheme, a folder
    that cannot be written, values that CoNLL output cannot hold (naming file and line)."""
    import tempfile

    from neurocrf.data.conll import ConllFormatError, check_writable
    from neurocrf.data.schemes import check_scheme

    if cfg.format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {cfg.format!r}")
    if cfg.get("scheme"):
        check_scheme(str(cfg.scheme))
    if cfg.format == "conll":
        try:
            check_writable(sentences, raw_columns=_raw_columns(sentences))
        except ConllFormatError as error:
            raise ConllFormatError(f"{error}; format=jsonl can hold it") from None
    if output == "-":
        return
    target = Path(output)
    if target.is_dir():
        raise IsADirectoryError(f"output={output} is a folder; name a file")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"):
            pass
    except OSError as error:
        raise OSError(f"output={output}: cannot write there ({error.strerror or error})") from None


def predict(cfg: DictConfig) -> dict[str, Any]:
    """Run the prediction described by ``cfg``; returns a summary (sentences, tokens, output)."""
    import io

    import torch

    from neurocrf.data.conll import atomic_write_text
    from neurocrf.data.inputs import read_input
    from neurocrf.models.tagger import Tagger

    reader = to_plain(cfg.get("reader"), "reader") or {}
    sentences, read_as = read_input(str(cfg.input), cfg.get("input_format", "auto"), reader)  # type: ignore[arg-type]
    log.info("read %s as %s: %d sentences", cfg.input, read_as, len(sentences))
    output = str(cfg.get("output") or Path(cfg.paths.output_dir) / f"predictions.{cfg.format}")
    check_output(output, cfg, sentences)
    model = Tagger.load(cfg.ckpt_path, map_location="cpu").to(torch.device(cfg.get("device", "cpu")))
    nbest = int(cfg.get("nbest", 0))
    columns = cfg.get("token_columns")
    columns = model.token_columns if columns is None else [int(c) for c in columns]
    inputs = [s.tokens for s in sentences] if columns is None else [s.joined_columns(columns) for s in sentences]
    predictions = model.predict(inputs, batch_size=int(cfg.get("batch_size", 32)), nbest=nbest,
                                precision=str(cfg.get("precision", "32")))
    for sentence, prediction in zip(sentences, predictions):
        if len(prediction.tags) != len(sentence.tokens):  # the contract of Tagger.predict
            raise RuntimeError(f"{sentence.location()}: {len(sentence.tokens)} tokens but {len(prediction.tags)} tags")

    buffer = io.StringIO()
    if cfg.format == "jsonl":
        write_jsonl(buffer, sentences, predictions, cfg.get("scheme"))
    else:
        write_conll_predictions(buffer, sentences, predictions, cfg.get("scheme"),
                                bool(cfg.get("confidence", False)), nbest)
    if output == "-":
        sys.stdout.write(buffer.getvalue())
    else:
        atomic_write_text(output, buffer.getvalue())
        print(f"wrote {len(predictions)} sentences to {output}", file=sys.stderr)
    return {
        "sentences": len(sentences),
        "tokens": sum(len(s.tokens) for s in sentences),
        "input_format": read_as,
        "output": output,
    }


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="predict")
def main(cfg: DictConfig) -> None:
    predict(cfg)


if __name__ == "__main__":
    main()

"""Tag a file with a trained checkpoint (``configs/predict.yaml``).

    neurocrf-predict ckpt_path=.../last.ckpt input=corpus.conll                  # CoNLL out
    neurocrf-predict ckpt_path=.../last.ckpt input=sentences.txt format=jsonl nbest=5

Input: a CoNLL column file (its columns are kept; the predicted tag is appended) or plain text,
one whitespace-tokenised sentence per line. ``input_format=auto`` reads a file as CoNLL when it
has a blank line and all its token lines (document and comment lines aside) have the same number
of fields, as plain text otherwise.

Output: CoNLL (input columns + predicted tag [+ marginal confidence] [+ the n-best tag columns])
or JSON lines, one object per input sentence (per line for text input, empty lines included)::

    {"tokens": [...], "tags": [...], "scheme": "BIOES", "confidences": [...],
     "spans": [{"type": "PER", "start": 0, "end": 2, "confidence": 0.97}],
     "nbest": [{"tags": [...], "probability": 0.91, "log_probability": -0.094}, ...], "gold": [...]}

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
from statistics import median
from typing import Any, TextIO

import hydra
from omegaconf import DictConfig, OmegaConf

from neurocrf.cli.utils import CONFIG_DIR

log = logging.getLogger(__name__)

FORMATS = ("conll", "jsonl")
INPUT_FORMATS = ("auto", "conll", "text")
_SKIP_PREFIXES = ("-DOCSTART-", "###MEDLINE:", "#")


def detect_input_format(path: str | Path, sample_lines: int = 500) -> str:
    """``"conll"`` or ``"text"`` by the rule in the module docstring."""
    fields: list[int] = []
    blank = False
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle):
            if number >= sample_lines:
                break
            stripped = line.strip()
            if not stripped:
                blank = blank or bool(fields)
                continue
            if stripped.startswith(_SKIP_PREFIXES):
                continue
            fields.append(len(stripped.split()))
    if blank and fields and len(set(fields)) == 1:
        return "conll"
    if blank and fields and median(fields) <= 2 and max(fields) <= 3:
        return "conll"  # a token-only file with a few odd lines is still one token per line
    return "text"


def read_input(path: str, input_format: str, reader: dict[str, Any]) -> tuple[list[Any], str]:
    """Sentences (``neurocrf.data.conll.Sentence``) of the input file and the format read."""
    from neurocrf.data.conll import Sentence, read_conll

    if not Path(path).is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
    if input_format == "auto":
        input_format = detect_input_format(path)
        log.info("reading %s as %s", path, input_format)
    if input_format == "conll":
        options = {"tag_column": None, **reader}
        return read_conll(path, **options), "conll"
    sentences = []
    with open(path, encoding=reader.get("encoding", "utf-8")) as handle:
        for number, line in enumerate(handle, start=1):
            sentences.append(Sentence(tokens=line.split(), source=path, line=number))
    return sentences, "text"


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
    """Input columns (or the tokens) + predicted tag [+ confidence] [+ n-best tag columns]."""
    from neurocrf.data.conll import write_conll

    kept = [(s, p) for s, p in zip(sentences, predictions) if s.tokens]  # no empty blocks
    sentences = [s for s, _ in kept]
    predictions = [p for _, p in kept]
    columns: dict[str, list[list[str]]] = {"pred": [p.tags_in(scheme or p.scheme) for p in predictions]}
    if confidence:
        columns["confidence"] = [[f"{c:.4f}" for c in p.confidences] for p in predictions]
    for k in range(nbest):
        columns[f"nbest_{k + 1}"] = [
            _convert(p.nbest[k].tags, p.scheme, scheme) if k < len(p.nbest) else ["-"] * len(p.tokens)
            for p in predictions
        ]
    raw = all(s.columns is not None for s in sentences)
    write_conll(handle, sentences, extra_tag_columns=columns, raw_columns=raw)


def _convert(tags: list[str], source: str, target: str | None) -> list[str]:
    from neurocrf.data.schemes import convert_tags

    return tags if not target or target == source else convert_tags(tags, source, target)


def predict(cfg: DictConfig) -> dict[str, Any]:
    """Run the prediction described by ``cfg``; returns a summary (sentences, tokens, output)."""
    import torch

    from neurocrf.models.tagger import Tagger

    if cfg.format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {cfg.format!r}")
    reader = OmegaConf.to_container(cfg.get("reader") or OmegaConf.create({}), resolve=True)
    sentences, read_as = read_input(str(cfg.input), cfg.get("input_format", "auto"), reader)  # type: ignore[arg-type]
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

    output = cfg.get("output") or str(Path(cfg.paths.output_dir) / f"predictions.{cfg.format}")
    scheme = cfg.get("scheme")
    if output == "-":
        _write(sys.stdout, cfg, sentences, predictions, scheme, nbest)
    else:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", encoding="utf-8", newline="\n") as handle:
            _write(handle, cfg, sentences, predictions, scheme, nbest)
        print(f"wrote {len(predictions)} sentences to {output}", file=sys.stderr)
    return {
        "sentences": len(sentences),
        "tokens": sum(len(s.tokens) for s in sentences),
        "input_format": read_as,
        "output": output,
    }


def _write(handle: TextIO, cfg: DictConfig, sentences: list[Any], predictions: list[Any], scheme: str | None, nbest: int) -> None:
    if cfg.format == "jsonl":
        write_jsonl(handle, sentences, predictions, scheme)
    else:
        write_conll_predictions(handle, sentences, predictions, scheme, bool(cfg.get("confidence", False)), nbest)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="predict")
def main(cfg: DictConfig) -> None:
    predict(cfg)


if __name__ == "__main__":
    main()

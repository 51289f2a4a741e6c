"""Export a trained BiLSTM tagger as one program (``configs/export.yaml``).

    neurocrf-export ckpt_path=.../last.ckpt output=tagger.onnx                 # ONNX
    neurocrf-export ckpt_path=.../last.ckpt output=tagger.pt2 format=pt2       # torch.export

The program takes word ids ``[batch, seq_len]``, the bool mask ``[batch, seq_len]`` and, for a
model with a character encoder, character ids ``[batch, seq_len, max_chars]``, and returns tag ids
``[batch, seq_len]`` (-1 at padding), for any batch size and sentence length (see
:mod:`neurocrf.models.export`). The vocabularies that map tokens to those ids and ids to tags are
written next to it as ``<name>.vocab.json`` (:class:`neurocrf.models.export.TaggerVocabulary`).
With ``check=true`` the exported file is run on generated sentences of other lengths than the
export example and must give the tags of ``Tagger.predict``. Transformer and feature encoders
cannot be exported (a clear error says so).
"""

from __future__ import annotations

import logging
import random
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from neurocrf.cli.tool import tool_main

log = logging.getLogger(__name__)


def vocabulary_path(output: str | Path) -> Path:
    """``tagger.onnx`` -> ``tagger.vocab.json``."""
    output = Path(output)
    return output.with_name(f"{output.stem}.vocab.json")


def check_sentences(words: list[str], seed: int = 0) -> list[list[str]]:
    """Sentences of 1, 2, 7 and 13 tokens drawn from ``words`` plus an unknown word."""
    rng = random.Random(seed)
    pool = [w for w in words if not w.startswith("<")] or ["x"]
    sentences = [[rng.choice(pool) for _ in range(n)] for n in (1, 2, 7, 13)]
    sentences[2][3] = "qzxjvw-unknown"
    return sentences


def run_exported(path: Path, fmt: str, inputs: dict[str, Any]) -> Any:
    """Tag ids of the exported file at ``path`` for numpy ``inputs``."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {name: inputs[name] for name in names})[0]
    import torch

    module = torch.export.load(str(path)).module()
    names = ["words", "mask", "chars"] if "chars" in inputs else ["words", "mask"]
    return module(*(torch.from_numpy(inputs[name]) for name in names)).numpy()


def export(cfg: DictConfig) -> dict[str, Any]:
    """Run the export described by ``cfg``; returns the written paths and the check result."""
    from neurocrf.models.export import EXPORT_FORMATS, TaggerVocabulary, export_tagger
    from neurocrf.models.tagger import Tagger

    logging.getLogger("onnx_ir").setLevel(logging.WARNING)  # one INFO line per rewritten initializer
    fmt = str(cfg.format)
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {fmt!r}")
    output = Path(cfg.output or Path(cfg.paths.output_dir) / f"tagger.{fmt}")
    tagger = Tagger.load(cfg.ckpt_path, map_location="cpu")
    export_tagger(tagger, output, fmt)
    vocabulary = TaggerVocabulary.from_tagger(tagger)
    vocabulary.save(vocabulary_path(output))
    checked = None
    if cfg.check:
        sentences = check_sentences(vocabulary.words)
        inputs = vocabulary.encode(sentences)
        exported = vocabulary.decode(run_exported(output, fmt, inputs), inputs["mask"])
        expected = [prediction.tags for prediction in tagger.predict(sentences)]
        if exported != expected:
            raise RuntimeError(f"the exported model's tags {exported} differ from Tagger.predict's {expected}")
        checked = len(sentences)
    print(f"wrote {output} and {vocabulary_path(output)}", file=sys.stderr)
    return {"output": str(output), "vocabulary": str(vocabulary_path(output)), "format": fmt, "checked": checked}


main = tool_main(export, "export", "neurocrf-export")


if __name__ == "__main__":
    main()

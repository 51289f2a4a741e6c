"""Export a trained BiLSTM :class:`~neurocrf.models.tagger.Tagger` as one program: token ids in,
tag ids out, for any batch size and sentence length.

The program takes the tensors that the encoder's ``prepare`` builds from tokens (word ids
``[batch, seq_len]``, character ids ``[batch, seq_len, max_chars]`` when the model reads
characters) plus the bool mask ``[batch, seq_len]``, runs the embeddings, the BiLSTM, the
projection and the CRF's exportable Viterbi (:mod:`neurocrf.structs.export`), and returns the tag
ids ``[batch, seq_len]`` (-1 at padding): the same tags as :meth:`Tagger.predict`.
:class:`TaggerVocabulary` maps tokens to those ids and ids back to tag strings; it is a JSON file
written next to the model by ``neurocrf-export``, so running the model needs no checkpoint.

>>> export_tagger(Tagger.load("last.ckpt"), "tagger.onnx")                    # doctest: +SKIP
>>> vocabulary = TaggerVocabulary.from_tagger(Tagger.load("last.ckpt"))       # doctest: +SKIP
>>> inputs = vocabulary.encode([["Peter", "lives", "in", "Berlin"]])          # doctest: +SKIP
>>> session = onnxruntime.InferenceSession("tagger.onnx")                     # doctest: +SKIP
>>> vocabulary.decode(session.run(None, inputs)[0], inputs["mask"])           # doctest: +SKIP
[['B-PER', 'O', 'O', 'B-LOC']]
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from neurocrf.encoders.bilstm import BiLSTMEncoder, BiLSTMPreparer
from neurocrf.encoders.chars import run_lstm
from neurocrf.structs import ChainCRF
from neurocrf.structs.export import MAX_BATCH, MAX_SEQ_LEN

EXPORT_FORMATS = ("onnx", "pt2")
MAX_WORD_LENGTH = 1 << 10


class ExportableTagger(nn.Module):
    """``forward(words, mask[, chars])`` -> tag ids ``[batch, seq_len]`` (-1 at padding) of a
    BiLSTM tagger with a CRF head, in eval mode.

    Inputs:
        words: ``[batch, seq_len]`` long word ids; mask: ``[batch, seq_len]`` bool, True at the
            words (each row's words first, as ``prepare`` makes them); chars: ``[batch, seq_len,
            max_chars]`` long character ids, only for a model with a character encoder.
    """

    def __init__(self, tagger: nn.Module) -> None:
        super().__init__()
        encoder = tagger.encoder
        if not isinstance(encoder, BiLSTMEncoder):
            raise ValueError(
                f"only BiLSTM taggers can be exported; this model's encoder is {type(encoder).__name__} "
                "(the transformer encoder tokenises in Python and splits long sentences into windows, the "
                "feature encoder extracts string features in Python)"
            )
        if encoder.casing_embedding is not None or encoder.preparer.zero_digits:
            raise ValueError(
                "taggers whose word lookup reads casing classes (encoder.casing_dim) or maps digits to 0 "
                "(encoder.zero_digits) cannot be exported: the exported inputs carry neither"
            )
        if not isinstance(tagger.head, ChainCRF):
            raise ValueError(f"only taggers with a CRF head can be exported, got {type(tagger.head).__name__}")
        # copies: putting them in eval mode (no dropout) leaves the tagger as it was
        self.encoder = copy.deepcopy(encoder)
        self.projection = copy.deepcopy(tagger.projection)
        self.decoder = copy.deepcopy(tagger.head).decoder()
        self.reads_chars = encoder.char_encoder is not None
        self.eval()

    def input_names(self) -> list[str]:
        return ["words", "mask", "chars"] if self.reads_chars else ["words", "mask"]

    def forward(self, words: Tensor, mask: Tensor, chars: Tensor | None = None) -> Tensor:
        encoder = self.encoder
        features = encoder.embedding(words)  # [B, T, word_dim]
        if encoder.char_encoder is not None:
            if chars is None:
                raise ValueError("this tagger reads characters: pass chars [batch, seq_len, max_chars]")
            batch, width, length = chars.shape
            # Char features at every position, padding included, then zeroed there: the encoder's
            # own forward keeps the real words only, a data-dependent size that the char BiLSTM's
            # while_loop cannot carry through torch.export. Otherwise this is Tagger.forward in eval mode.
            char_features = encoder.char_encoder(chars.reshape(batch * width, length)).view(batch, width, -1)
            char_features = torch.where(mask.unsqueeze(-1), char_features, torch.zeros_like(char_features))
            features = torch.cat([features, char_features], dim=-1)
        hidden = run_lstm(encoder.lstm, features, mask.sum(dim=1)) * mask.unsqueeze(-1)
        return self.decoder(self.projection(hidden), mask)

    def example_inputs(self) -> tuple[Tensor, ...]:
        """Inputs of two sentences (3 and 5 words, up to 4 characters) to trace the export with."""
        mask = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
        words = torch.where(mask, 1, 0)
        if not self.reads_chars:
            return words, mask
        chars = torch.where(mask.unsqueeze(-1), 1, 0).expand(2, 5, 4).contiguous()
        return words, mask, chars

    def dynamic_shapes(self, max_seq_len: int = MAX_SEQ_LEN, max_batch: int = MAX_BATCH) -> dict[str, Any]:
        batch = torch.export.Dim("batch", min=1, max=max_batch)
        seq_len = torch.export.Dim("seq_len", min=1, max=max_seq_len)
        shapes: dict[str, Any] = {"words": {0: batch, 1: seq_len}, "mask": {0: batch, 1: seq_len}}
        if self.reads_chars:
            shapes["chars"] = {0: batch, 1: seq_len, 2: torch.export.Dim("max_chars", min=1, max=MAX_WORD_LENGTH)}
        return shapes


def export_program(tagger: nn.Module) -> torch.export.ExportedProgram:
    """``torch.export`` program of :class:`ExportableTagger` over ``tagger``."""
    module = ExportableTagger(tagger)
    with torch.no_grad(), _lstm_over_symbolic_length():
        return torch.export.export(module, module.example_inputs(), dynamic_shapes=module.dynamic_shapes())


def export_tagger(tagger: nn.Module, output: str | Path, fmt: str | None = None) -> Path:
    """Write ``tagger`` as an ONNX model (``fmt="onnx"``) or a ``torch.export`` archive
    (``"pt2"``, load with ``torch.export.load(path).module()``); ``fmt=None`` goes by the file suffix."""
    output = Path(output)
    fmt = fmt or output.suffix.lstrip(".")
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {fmt!r}")
    program = export_program(tagger)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "pt2":
        torch.export.save(program, str(output))
        return output
    names = ExportableTagger(tagger).input_names()
    with _lstm_over_symbolic_length():
        onnx_program = torch.onnx.export(program, dynamo=True, input_names=names, output_names=["tags"], verbose=False)
    onnx_program.save(str(output))
    return output


def _lstm_over_symbolic_length() -> Any:
    """A context in which the LSTM op decomposes into a ``while_loop`` over the sequence.

    The stock decomposition steps through time in Python: the ONNX exporter, which decomposes
    every op, would record the example's length (a model that fails or errs on other lengths)."""
    try:
        from torch.export._patches import register_lstm_while_loop_decomposition
    except ImportError as error:  # older torch releases
        raise RuntimeError(f"exporting a BiLSTM tagger needs a torch release with the while_loop LSTM decomposition "
                           f"(torch.export._patches; tested with 2.13), this is {torch.__version__}") from error
    return register_lstm_while_loop_decomposition()


@dataclass
class TaggerVocabulary:
    """Tokens -> the id arrays an exported tagger takes; tag ids -> tag strings. Plain values,
    saved as JSON next to an exported model, so running it needs no checkpoint."""

    words: list[str]
    chars: list[str] | None
    lowercase: bool
    max_word_length: int
    tags: list[str]
    scheme: str

    @classmethod
    def from_tagger(cls, tagger: nn.Module) -> TaggerVocabulary:
        preparer = tagger.encoder.preparer
        chars = preparer.chars.items if preparer.chars is not None else None
        return cls(list(preparer.words.items), chars, bool(preparer.lowercase), int(preparer.max_word_length),
                   list(tagger.tags), str(tagger.scheme))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.__dict__, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> TaggerVocabulary:
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))

    def encode(self, sentences: list[list[str]]) -> dict[str, Any]:
        """Sentences -> numpy arrays ``words`` ``[B, T]`` int64, ``mask`` ``[B, T]`` bool and,
        for a model that reads characters, ``chars`` ``[B, T, C]`` int64: the encoder's
        ``prepare`` output, the inputs of the exported program."""
        preparer = BiLSTMPreparer(self.words, self.chars, self.lowercase, self.max_word_length)
        return {name: value.numpy() for name, value in preparer(sentences).items()}

    def decode(self, tag_ids: Any, mask: Any) -> list[list[str]]:
        """``[B, T]`` tag ids and the mask -> one tag list per sentence."""
        return [[self.tags[int(i)] for i, on in zip(row, row_mask) if on] for row, row_mask in zip(tag_ids, mask)]

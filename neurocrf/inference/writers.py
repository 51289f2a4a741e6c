"""Prediction output, one sentence at a time: CoNLL columns or JSON lines.

CoNLL: the input's columns (CoNLL input) or its tokens (text, JSON lines), then the predicted tag
[+ its marginal confidence] [+ the n-best tag columns, ``-`` where a sentence has fewer paths],
a blank line after each sentence, so an empty sentence is a blank line of its own. A document
separator line (``-DOCSTART-`` then ``O`` columns) is written where the input had one before a
document (CoNLL input).

JSON lines: :meth:`~neurocrf.models.prediction.Prediction.to_dict` per sentence, with the gold
tags as ``"gold"`` when the input had them, and the other fields of a JSON-lines input record
(an ``"id"``, say) before them.

>>> import io
>>> from neurocrf.data.conll import Sentence
>>> from neurocrf.models.prediction import Prediction
>>> out = io.StringIO()
>>> writer = ConllWriter(out, scheme="IOB2")
>>> writer.write(Sentence(["EU", "rejects"]), Prediction(["EU", "rejects"], ["S-ORG", "O"], "BIOES"))
>>> out.getvalue()
'EU\\tB-ORG\\nrejects\\tO\\n\\n'
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TextIO

from neurocrf.data.conll import ConllFormatError, Sentence, sentence_block
from neurocrf.data.schemes import convert_tags
from neurocrf.models.prediction import Prediction

OUTPUT_FORMATS = ("conll", "jsonl")
DOCSTART = "-DOCSTART-"


class Writer(Protocol):
    def write(self, sentence: Sentence, prediction: Prediction) -> None: ...


class JsonlWriter:
    """One JSON object per line (see the module docstring); tags in ``scheme`` when given."""

    def __init__(self, handle: TextIO, scheme: str | None = None) -> None:
        self.handle, self.scheme = handle, scheme

    def write(self, sentence: Sentence, prediction: Prediction) -> None:
        record: dict[str, Any] = dict(sentence.fields or {})
        record.update(prediction.to_dict(self.scheme))
        if sentence.tags is not None:
            record["gold"] = list(sentence.tags)
        self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")


class ConllWriter:
    """Column output (see the module docstring). ``raw_columns``: repeat the input's columns
    (CoNLL input) rather than its tokens; ``leading_separator``: the input's first document
    began with a separator line; ``document``: that of the sentence before the first one this
    writer writes (None: it writes the first sentence of the output)."""

    def __init__(
        self,
        handle: TextIO,
        scheme: str | None = None,
        confidence: bool = False,
        nbest: int = 0,
        raw_columns: bool = False,
        leading_separator: bool = False,
        document: int | None = None,
    ) -> None:
        self.handle, self.scheme, self.confidence, self.nbest = handle, scheme, confidence, nbest
        self.raw_columns = raw_columns
        self._document = document  # of the sentence before (None: the first of the output)
        self._leading_separator = leading_separator

    def write(self, sentence: Sentence, prediction: Prediction) -> None:
        columns: dict[str, list[str]] = {"pred": prediction.tags_in(self.scheme or prediction.scheme)}
        if self.confidence:
            columns["confidence"] = [f"{c:.4f}" for c in prediction.confidences]
        for k in range(self.nbest):
            columns[f"nbest_{k + 1}"] = (
                self._convert(prediction.nbest[k].tags, prediction.scheme) if k < len(prediction.nbest)
                else ["-"] * len(prediction.tokens)
            )
        try:
            block = sentence_block(sentence, columns, raw_columns=self.raw_columns)
        except ConllFormatError as error:
            raise ConllFormatError(f"{error}; format=jsonl can hold it") from None
        document = sentence.document
        if document is not None and (document != self._document if self._document is not None
                                     else self._leading_separator):
            width = block.split("\n", 1)[0].count("\t")  # the columns after the first
            self.handle.write("\t".join([DOCSTART, *["O"] * width]) + "\n\n")
        self._document = document
        self.handle.write(block)

    def _convert(self, tags: list[str], source: str) -> list[str]:
        return tags if not self.scheme or self.scheme == source else convert_tags(tags, source, self.scheme)

"""One prediction run over a file: reader -> windows of sentences, sorted by length and batched ->
model -> order restored -> writer -> the output, renamed into place at the end.

Memory is bounded by the window (``window`` sentences and their predictions), whatever the size of
the input; the output is whole or absent (:mod:`neurocrf.inference.output`), and a run that
stops (bad input, an error, Ctrl-C, SIGTERM) says which input line it reached.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import chain, islice
from typing import Any

from neurocrf.data.conll import ConllFormatError, Sentence, check_writable
from neurocrf.data.inputs import InputReader
from neurocrf.data.schemes import check_scheme
from neurocrf.inference.output import AtomicOutput, check_output_path, sigterm_raises
from neurocrf.inference.progress import Progress
from neurocrf.inference.writers import OUTPUT_FORMATS, ConllWriter, JsonlWriter, Writer
from neurocrf.models.batching import windows
from neurocrf.models.collector import frozen_heap
from neurocrf.models.predict_options import PredictOptions

log = logging.getLogger(__name__)


class FilePrediction:
    """A prediction job from ``input`` to ``output`` (``"-"``: standard input / output).

    Everything that can be checked before a model is loaded is checked on construction: the
    output format and scheme, that the output folder can be written, the input's format
    (:class:`~neurocrf.data.inputs.InputReader`) and that the first ``window`` sentences can
    be written (later ones are checked as they come). :meth:`run` then predicts.

    Args:
        output_format: ``conll`` or ``jsonl`` (:mod:`neurocrf.inference.writers`).
        scheme: the output tags' scheme (None: the model's); confidence: a CoNLL column of
            token confidences.
        options: how the model predicts (:class:`~neurocrf.models.predict_options.PredictOptions`:
            batches, window, n-best, precision); its ``confidences`` is set by the output (JSON
            lines and the CoNLL confidence column need them, plain CoNLL does not).
    """

    def __init__(
        self,
        input: str | os.PathLike[str],
        output: str | os.PathLike[str],
        *,
        input_format: str = "auto",
        reader: dict[str, Any] | None = None,
        output_format: str = "conll",
        scheme: str | None = None,
        confidence: bool = False,
        options: PredictOptions | None = None,
    ) -> None:
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(f"format must be one of {OUTPUT_FORMATS}, got {output_format!r}")
        if scheme:
            check_scheme(scheme)
        options = options or PredictOptions()
        self.spec = {"input": os.fspath(input), "output": os.fspath(output), "input_format": input_format,
                     "reader": dict(reader or {}), "output_format": output_format, "scheme": scheme,
                     "confidence": confidence, "options": options}
        self.output = os.fspath(output)
        self.output_format, self.scheme, self.confidence = output_format, scheme, confidence
        self.options = replace(options, confidences=output_format == "jsonl" or confidence)
        check_output_path(self.output)
        self.input = InputReader(input, input_format, reader)
        self._rest = iter(self.input)
        self._first: list[Sentence] | None = list(islice(self._rest, options.window))
        if output_format == "conll":
            try:
                check_writable(self._first, raw_columns=self.raw_columns)
            except ConllFormatError as error:
                raise ConllFormatError(f"{error}; format=jsonl can hold it") from None

    @property
    def raw_columns(self) -> bool:
        """CoNLL output repeats the input's columns (CoNLL input) rather than its tokens."""
        return self.input.format == "conll"

    def sentences(self) -> Iterator[Sentence]:
        """The input's sentences, read once."""
        if self._first is None:
            raise RuntimeError(f"{self.input.name}: the input was read already")
        first, self._first = self._first, None
        return chain(first, self._rest)

    def writer(self, handle: Any, document: int | None = None) -> Writer:
        """The output format's writer on ``handle``; ``document``: that of the sentence before
        the first one written (a shard that continues the output)."""
        if self.output_format == "jsonl":
            return JsonlWriter(handle, self.scheme)
        return ConllWriter(handle, self.scheme, self.confidence, self.options.nbest, self.raw_columns,
                           self.input.leading_separator, document)

    def run(
        self,
        model: Any,
        *,
        token_columns: Sequence[int] | None = None,
        progress: bool | None = None,
    ) -> dict[str, Any]:
        """Predict every sentence with ``model`` (a :class:`~neurocrf.models.tagger.Tagger`: its
        :meth:`~neurocrf.models.tagger.Tagger.predict` with this job's ``options``) and write the
        output; returns a summary (sentences, tokens, input format, output, seconds).

        ``token_columns`` (None: the model's ``token_columns``) joins CoNLL columns into each
        token; ``progress`` shows the bar (None: when stderr is a terminal)."""
        columns = model.token_columns if token_columns is None else list(token_columns)
        start = time.perf_counter()
        with (sigterm_raises(), frozen_heap(), AtomicOutput(self.output) as out,
              Progress(self.input.source.size, progress) as bar):
            writer = self.writer(out.handle)
            try:
                for window in windows(self.sentences(), self.options.window):
                    predictions = model.predict([model_tokens(s, columns) for s in window], self.options)
                    for sentence, prediction in zip(window, predictions):
                        check_prediction(sentence, prediction)
                        writer.write(sentence, prediction)
                    bar.update(len(window), sum(len(s.tokens) for s in window), self.input.source.bytes_read)
            except BaseException as error:
                where = "" if self.output == "-" else f"; nothing was written to {self.output}"
                print(f"prediction stopped after {self.input.name}:{self.input.line} (the last line read;"
                      f" {bar.sentences} sentences predicted) by {type(error).__name__}: {error}{where}",
                      file=sys.stderr)
                raise
            out.commit()
        seconds = time.perf_counter() - start
        if self.output != "-":
            print(f"wrote {bar.sentences} sentences to {self.output}", file=sys.stderr)
        return {"sentences": bar.sentences, "tokens": bar.tokens, "input_format": self.input.format,
                "output": self.output, "seconds": seconds}


def model_tokens(sentence: Sentence, columns: Sequence[int] | None) -> list[str]:
    """What the model reads of a sentence: its tokens, or the named columns joined."""
    return sentence.tokens if columns is None else sentence.joined_columns(columns)


def check_prediction(sentence: Sentence, prediction: Any) -> None:
    """Every token back: exactly one predicted tag per input token."""
    if len(prediction.tags) != len(sentence.tokens):
        raise RuntimeError(f"{sentence.location()}: {len(sentence.tokens)} tokens but {len(prediction.tags)} tags")

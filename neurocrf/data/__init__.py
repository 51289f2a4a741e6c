"""neurocrf.data: column corpora, tag schemes, the sample corpus, splits, batching.

``conll``       read_conll / write_conll / Sentence / ConllFormatError
``inputs``      InputReader: files to tag, read lazily (CoNLL, plain text, JSON lines; format from a prefix)
``streams``     LineSource: lines of a file, a .gz file or standard input, with file:line errors
``schemes``     IOB1, IOB2, BIOES: convert_tags, get_spans, validate_tags
``sample``      ensure_sample_corpus (the built-in generated corpus)
``splits``      dev and test splits cut out of a training file
``datamodule``  SequenceDataModule (Lightning), Batch; imported lazily (it pulls in Lightning)
"""

from importlib import import_module
from typing import Any

from neurocrf.data.conll import ConllFormatError, Sentence, read_conll, write_conll
from neurocrf.data.sample import ensure_sample_corpus, generate_sample_corpus
from neurocrf.data.schemes import (
    SCHEMES,
    InvalidTagError,
    Span,
    convert_tags,
    get_spans,
    validate_tags,
)

_LAZY = {"SequenceDataModule", "Batch", "BucketBatchSampler"}

__all__ = [
    "SCHEMES",
    "ConllFormatError",
    "InvalidTagError",
    "Sentence",
    "Span",
    "convert_tags",
    "ensure_sample_corpus",
    "generate_sample_corpus",
    "get_spans",
    "read_conll",
    "validate_tags",
    "write_conll",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module("neurocrf.data.datamodule"), name)
    raise AttributeError(f"module 'neurocrf.data' has no attribute {name!r}")

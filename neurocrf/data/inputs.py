"""Input files to tag: plain text (one whitespace-tokenised sentence per line) or CoNLL columns.

The format is never guessed from a part of the file. It is, in order:

1. ``input_format="conll"`` or ``"text"`` when given;
2. ``"conll"`` for a file named ``*.conll``, ``*.iob``, ``*.iob1``, ``*.iob2``, ``*.bio``,
   ``*.bioes``, ``*.tsv`` or ``*.col``;
3. otherwise read off the whole file (:func:`detect_input_format`): *token lines* are the
   non-blank lines that are neither document separators nor comments (the CoNLL reader's
   ``docstart`` and ``comment_prefix``), split into fields as the CoNLL reader splits them.

   - CoNLL when the most common number of fields is 2 or more and each line with that number ends
     in a tag (``O``, ``B-X``, ``I-X``, ``E-X``, ``S-X``, ``L-X``, ``U-X``, ``M-X``; a line of
     another width is then an error of the CoNLL reader naming it), or when every token line has
     the same number of fields and the file has a document separator line;
   - plain text when token lines have different numbers of fields (no column file does), or
     when they have two or more fields, no tag column, and no two of them are adjacent (as CoNLL,
     every sentence would be one token: a single line of words is text);
   - otherwise refused with :class:`~neurocrf.data.conll.ConllFormatError` naming the file and
     line: every line has the same number of fields but no tag column, so the file reads both
     as one token per line and as one sentence per line, with different sentences (and, with more
     than one field, different tokens). ``input_format`` settles it.

Text input: a UTF-8 byte order mark is dropped, bytes not valid in the encoding are an error
naming file and line, every line is one sentence (an empty line an empty sentence), and a final
line break ends the last line rather than starting an empty one.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neurocrf.data.conll import (
    DOC_PREFIXES,
    SEPARATOR,
    TOKEN,
    ConllFormatError,
    Sentence,
    column_lines,
    read_conll,
    read_text,
)

INPUT_FORMATS = ("auto", "conll", "text")
CONLL_SUFFIXES = (".conll", ".iob", ".iob1", ".iob2", ".bio", ".bioes", ".tsv", ".col")
TAG_PATTERN = re.compile(r"O|[BIESLUM]-\S+")
"""What a value of a tag column looks like (the schemes of :mod:`neurocrf.data.schemes`, BILOU, BMES)."""


def read_text_sentences(path: str | os.PathLike[str], encoding: str = "utf-8") -> list[Sentence]:
    """One :class:`Sentence` per line of a text file (tokens split on whitespace; an empty line is
    a sentence without tokens), each with its file and 1-based line.

    Raises:
        FileNotFoundError: no such file.
        ConllFormatError: naming file and line of bytes not valid in ``encoding``.
    """
    name = os.fspath(path)
    return _text_sentences(name, read_text(name, encoding))


def _text_sentences(name: str, text: str) -> list[Sentence]:
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final line break ends the last line
    sentences = []
    for number, line in enumerate(lines, start=1):
        tokens = line.split()
        sentences.append(Sentence(tokens=tokens, source=name, line=number, token_lines=[number] * len(tokens)))
    return sentences


def detect_input_format(path: str | os.PathLike[str], reader: Mapping[str, Any] | None = None) -> str:
    """``"conll"`` or ``"text"`` for a file whose name does not tell, by the rule of the module
    docstring, read over the whole file with the CoNLL ``reader`` options (``delimiter``,
    ``docstart``, ``comment_prefix``, ``encoding``).

    Raises:
        ConllFormatError: naming file and line when the file reads both ways, or has no tokens.
    """
    options = dict(reader or {})
    name = os.fspath(path)
    text = read_text(name, options.get("encoding", "utf-8"))
    token_lines: list[tuple[int, list[str]]] = []
    blocks, separator, in_block = 0, False, False
    lines = column_lines(text, options.get("delimiter"), options.get("docstart", DOC_PREFIXES),
                         options.get("comment_prefix"))
    for number, kind, _, fields in lines:
        separator = separator or kind == SEPARATOR
        if kind == TOKEN:
            blocks += not in_block
            token_lines.append((number, fields))
        in_block = kind == TOKEN
    if not token_lines:
        raise ConllFormatError(f"{name}:1: no tokens to tag (empty file or only blank lines)")
    widths = Counter(len(fields) for _, fields in token_lines)
    width = widths.most_common(1)[0][0]
    not_tags = [(n, f[-1]) for n, f in token_lines if len(f) == width and not TAG_PATTERN.fullmatch(f[-1])]
    if width >= 2 and not not_tags:
        return "conll"
    if len(widths) > 1 or (width >= 2 and blocks == len(token_lines)):
        return "text"
    if separator:
        return "conll"
    first = not_tags[0][0] if width >= 2 else token_lines[0][0]
    what = f"no tag column ({not_tags[0][1]!r} here is not a tag)" if width >= 2 else "no tag column"
    as_text = _text_sentences(name, text)
    raise ConllFormatError(
        f"{name}:{first}: cannot tell whether this is a CoNLL column file or plain text: every token"
        f" line has {width} field(s) and {what}. As CoNLL it holds {blocks} sentence(s) of"
        f" {len(token_lines)} token(s), as text {len(as_text)} sentence(s) of"
        f" {sum(len(s.tokens) for s in as_text)} token(s)."
        " Give input_format=conll or input_format=text (or name the file *.conll)"
    )


def read_input(
    path: str | os.PathLike[str], input_format: str = "auto", reader: Mapping[str, Any] | None = None
) -> tuple[list[Sentence], str]:
    """The sentences of an input file and the format it was read as (``"conll"`` or ``"text"``).

    CoNLL input is read with :func:`~neurocrf.data.conll.read_conll` and the ``reader`` options
    (``tag_column`` defaults to None: every column is kept, none is taken as gold tags).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown ``input_format``.
        ConllFormatError: naming file and line (see the module docstring and ``read_conll``).
    """
    name = os.fspath(path)
    options = dict(reader or {})
    if not Path(name).is_file():
        raise FileNotFoundError(f"input file not found: {name}")
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
    if input_format == "auto":
        suffix = Path(name).suffix.lower()
        input_format = "conll" if suffix in CONLL_SUFFIXES else detect_input_format(name, options)
    if input_format == "conll":
        return read_conll(name, **{"tag_column": None, **options}), "conll"
    sentences = read_text_sentences(name, options.get("encoding", "utf-8"))
    if not any(s.tokens for s in sentences):
        raise ConllFormatError(f"{name}:1: no tokens to tag (empty file or only blank lines)")
    return sentences, "text"

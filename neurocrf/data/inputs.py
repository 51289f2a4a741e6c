"""Input files to tag, read lazily: plain text (one whitespace-tokenised sentence per line), CoNLL
columns, or JSON lines (one object per line with a ``"tokens"`` list, the form the predict
entry point writes). A name ending in ``.gz`` is decompressed on the fly; ``"-"`` reads
standard input (see :mod:`neurocrf.data.streams`).

The format is, in order:

1. ``input_format="conll"``, ``"text"`` or ``"jsonl"`` when given;
2. the file's extension (``.gz`` aside): ``"conll"`` for ``*.conll``, ``*.iob``, ``*.iob1``,
   ``*.iob2``, ``*.bio``, ``*.bioes``, ``*.tsv``, ``*.col``; ``"jsonl"`` for ``*.jsonl``,
   ``*.ndjson``;
3. otherwise read off a bounded prefix of the file (:data:`PREFIX_TOKEN_LINES` token lines or
   :data:`PREFIX_CHARS` characters, whichever comes first; the whole file when it is shorter), so
   that choosing never reads a whole corpus (:func:`detect_format`). *Token lines* are the
   non-blank lines that are neither document separators nor comments (the CoNLL reader's
   ``docstart`` and ``comment_prefix``), split into fields as the CoNLL reader splits them.

   - JSON lines when the first non-blank line is a JSON object with a ``"tokens"`` list;
   - CoNLL when the most common number of fields is 2 or more and each line with that number ends
     in a tag (``O``, ``B-X``, ``I-X``, ``E-X``, ``S-X``, ``L-X``, ``U-X``, ``M-X``; a line of
     another width is then an error of the CoNLL reader naming it), or when every token line has
     the same number of fields and there is a document separator line;
   - plain text when token lines have different numbers of fields (no column file does), or
     when they have two or more fields, no tag column, and no two of them are adjacent (as CoNLL,
     every sentence would be one token: a single line of words is text);
   - otherwise refused with :class:`~neurocrf.data.conll.ConllFormatError` naming the file and
     line: every line has the same number of fields but no tag column, so the file reads both
     as one token per line and as one sentence per line, with different sentences (and, with more
     than one field, different tokens). ``input_format`` settles it.

Text input: a UTF-8 byte order mark is dropped, bytes not valid in the encoding are an error
naming file and line, every line is one sentence (an empty line an empty sentence), and a final
line break ends the last line rather than starting an empty one. Every reader raises
``ConllFormatError("<file>:1: no tokens to tag ...")`` for an input without any token, after the
last line (the readers are lazy: nothing before).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

from neurocrf.data.conll import (
    DOC_PREFIXES,
    SEPARATOR,
    TOKEN,
    ConllFormatError,
    Sentence,
    column_lines,
    iter_conll,
)
from neurocrf.data.streams import LineSource, plain_name

INPUT_FORMATS = ("auto", "conll", "text", "jsonl")
CONLL_SUFFIXES = (".conll", ".iob", ".iob1", ".iob2", ".bio", ".bioes", ".tsv", ".col")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
TAG_PATTERN = re.compile(r"O|[BIESLUM]-\S+")
"""What a value of a tag column looks like (the schemes of :mod:`neurocrf.data.schemes`, BILOU, BMES)."""
PREFIX_TOKEN_LINES = 2000
PREFIX_CHARS = 1 << 20
JSONL_PREDICTED = ("tokens", "tags", "scheme", "confidences", "spans", "nbest", "gold")
"""Keys of a JSON-lines record that the prediction writes (any other key is carried over)."""


class InputReader:
    """The sentences of an input file, one at a time, in the format chosen as the module
    docstring says (``format``). ``line`` is the last line read so far.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "in.txt")
    >>> _ = open(path, "w").write("Peter lives in Berlin\\n\\nMary too\\n")
    >>> reader = InputReader(path)
    >>> reader.format, [s.tokens for s in reader]
    ('text', [['Peter', 'lives', 'in', 'Berlin'], [], ['Mary', 'too']])
    """

    def __init__(
        self, path: str | os.PathLike[str], input_format: str = "auto", reader: Mapping[str, Any] | None = None
    ) -> None:
        if input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
        self.name = os.fspath(path)
        self.options = dict(reader or {})
        self.source = LineSource(self.name, self.options.get("encoding", "utf-8"))
        lines: Iterable[str] = iter(self.source)
        if input_format == "auto":
            input_format = format_from_name(self.name) or ""
        if not input_format:
            prefix, complete = read_prefix(lines)  # type: ignore[arg-type]
            input_format = detect_format(prefix, self.name, self.options, complete)
            lines = chain(prefix, lines)
        self.format: str = input_format
        self.leading_separator = False  # CoNLL input: a document separator line before the first token
        self._lines = self._watch_start(lines) if input_format == "conll" else lines

    @property
    def line(self) -> int:
        return self.source.line

    def _watch_start(self, lines: Iterable[str]) -> Iterator[str]:
        iterator = iter(lines)
        kinds = {"delimiter": self.options.get("delimiter"), "docstart": self.options.get("docstart", DOC_PREFIXES),
                 "comment_prefix": self.options.get("comment_prefix")}
        for line in iterator:
            yield line
            kind = next((kind for _, kind, _, _ in column_lines([line], **kinds)), None)
            if kind == TOKEN:
                break
            self.leading_separator = self.leading_separator or kind == SEPARATOR
        yield from iterator

    def __iter__(self) -> Iterator[Sentence]:
        if self.format == "conll":
            options = {k: v for k, v in self.options.items() if k != "encoding"}
            return iter_conll(self._lines, self.name, **{"tag_column": None, **options})
        if self.format == "jsonl":
            return _jsonl_sentences(self._lines, self.name)
        return _text_sentences(self._lines, self.name)


def format_from_name(name: str) -> str | None:
    """``"conll"`` or ``"jsonl"`` when the extension (``.gz`` aside) tells, else None."""
    suffix = Path(plain_name(name)).suffix.lower()
    return "conll" if suffix in CONLL_SUFFIXES else "jsonl" if suffix in JSONL_SUFFIXES else None


def read_prefix(lines: Iterator[str]) -> tuple[list[str], bool]:
    """The first lines of a file, up to :data:`PREFIX_TOKEN_LINES` non-blank lines or
    :data:`PREFIX_CHARS` characters, and whether they are all of it."""
    prefix: list[str] = []
    chars = token_lines = 0
    for line in lines:
        prefix.append(line)
        chars += len(line)
        token_lines += bool(line.strip())
        if token_lines >= PREFIX_TOKEN_LINES or chars >= PREFIX_CHARS:
            return prefix, False
    return prefix, True


def read_text_sentences(path: str | os.PathLike[str], encoding: str = "utf-8") -> list[Sentence]:
    """One :class:`Sentence` per line of a text file (tokens split on whitespace; an empty line is
    a sentence without tokens), each with its file and 1-based line.

    Raises:
        FileNotFoundError: no such file.
        ConllFormatError: naming file and line of bytes not valid in ``encoding``.
    """
    name = os.fspath(path)
    return [_text_sentence(name, number, line) for number, line in enumerate(LineSource(name, encoding), start=1)]


def _text_sentence(name: str, number: int, line: str) -> Sentence:
    tokens = line.split()
    return Sentence(tokens=tokens, source=name, line=number, token_lines=[number] * len(tokens))


def _text_sentences(lines: Iterable[str], name: str) -> Iterator[Sentence]:
    any_token = False
    for number, line in enumerate(lines, start=1):
        sentence = _text_sentence(name, number, line)
        any_token = any_token or bool(sentence.tokens)
        yield sentence
    if not any_token:
        raise ConllFormatError(f"{name}:1: no tokens to tag (empty file or only blank lines)")


def _jsonl_sentences(lines: Iterable[str], name: str) -> Iterator[Sentence]:
    """One sentence per non-blank line: an object with ``"tokens"`` (a list of strings) and
    optionally ``"gold"`` tags; its other keys are carried to the output."""
    any_token = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConllFormatError(f"{name}:{number}: not a JSON object ({error.msg}, column {error.colno})") from None
        tokens = record.get("tokens") if isinstance(record, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
            raise ConllFormatError(f'{name}:{number}: a JSON-lines input record needs "tokens": a list of'
                                   " non-empty strings")
        gold = record.get("gold")
        if gold is not None and (not isinstance(gold, list) or len(gold) != len(tokens)):
            raise ConllFormatError(f'{name}:{number}: "gold" must be a list of one tag per token')
        any_token = any_token or bool(tokens)
        fields = {k: v for k, v in record.items() if k not in JSONL_PREDICTED}
        yield Sentence(tokens=tokens, tags=gold, source=name, line=number, token_lines=[number] * len(tokens),
                       fields=fields or None)
    if not any_token:
        raise ConllFormatError(f"{name}:1: no tokens to tag (empty file or only blank lines)")


def detect_format(lines: list[str], name: str, reader: Mapping[str, Any] | None = None, complete: bool = True) -> str:
    """``"conll"``, ``"text"`` or ``"jsonl"`` for a file whose name does not tell, by the rule
    of the module docstring, from its first ``lines`` (the whole file when ``complete``), read
    with the CoNLL ``reader`` options (``delimiter``, ``docstart``, ``comment_prefix``).

    Raises:
        ConllFormatError: naming file and line when the lines read both ways, or hold no tokens.
    """
    options = dict(reader or {})
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("{"):
        try:
            if isinstance(json.loads(first).get("tokens"), list):
                return "jsonl"
        except (json.JSONDecodeError, AttributeError):
            pass
    token_lines: list[tuple[int, list[str]]] = []
    blocks, separator, in_block = 0, False, False
    for number, kind, _, fields in column_lines(lines, options.get("delimiter"),
                                                options.get("docstart", DOC_PREFIXES), options.get("comment_prefix")):
        separator = separator or kind == SEPARATOR
        if kind == TOKEN:
            blocks += not in_block
            token_lines.append((number, fields))
        in_block = kind == TOKEN
    where = "" if complete else f" in its first {len(lines)} lines"
    if not token_lines:
        raise ConllFormatError(f"{name}:1: no tokens to tag{where} (empty file or only blank lines)")
    widths = Counter(len(fields) for _, fields in token_lines)
    width = widths.most_common(1)[0][0]
    not_tags = [(n, f[-1]) for n, f in token_lines if len(f) == width and not TAG_PATTERN.fullmatch(f[-1])]
    if width >= 2 and not not_tags:
        return "conll"
    if len(widths) > 1 or (width >= 2 and blocks == len(token_lines)):
        return "text"
    if separator:
        return "conll"
    line = not_tags[0][0] if width >= 2 else token_lines[0][0]
    what = f"no tag column ({not_tags[0][1]!r} here is not a tag)" if width >= 2 else "no tag column"
    holds = "it holds" if complete else f"its first {len(lines)} lines hold"
    raise ConllFormatError(
        f"{name}:{line}: cannot tell whether this is a CoNLL column file or plain text: every token"
        f" line{where} has {width} field(s) and {what}. As CoNLL {holds} {blocks} sentence(s) of"
        f" {len(token_lines)} token(s), as text {len(lines)} sentence(s) of"
        f" {sum(len(line.split()) for line in lines)} token(s)."
        " Give input_format=conll or input_format=text (or name the file *.conll)"
    )


def detect_input_format(path: str | os.PathLike[str], reader: Mapping[str, Any] | None = None) -> str:
    """The format :class:`InputReader` reads ``path`` as (``input_format="auto"``): from the
    extension, else from a bounded prefix of the file."""
    opened = InputReader(path, "auto", reader)
    opened.source.close()
    return opened.format


def read_input(
    path: str | os.PathLike[str], input_format: str = "auto", reader: Mapping[str, Any] | None = None
) -> tuple[list[Sentence], str]:
    """The sentences of an input file, all in memory, and the format it was read as (for small
    files; :class:`InputReader` reads one sentence at a time).

    CoNLL input is read with the ``reader`` options of :func:`~neurocrf.data.conll.read_conll`
    (``tag_column`` defaults to None: every column is kept, none is taken as gold tags).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown ``input_format``.
        ConllFormatError: naming file and line (see the module docstring and ``read_conll``).
    """
    sentences = InputReader(path, input_format, reader)
    return list(sentences), sentences.format

"""CoNLL-style column files: one token per line, columns separated by whitespace or a delimiter,
a blank line after each sentence.

Handled on reading: document separator lines (``-DOCSTART-`` of CoNLL-2003, also when it is the
file's last line without a final newline, and ``###MEDLINE:<id>`` of JNLPBA), comment lines,
several blank lines in a row, a missing final newline, ``\\r\\n`` line ends and a UTF-8 byte
order mark. Every problem raises :class:`ConllFormatError` naming the file, the line and what is
wrong.

>>> import io
>>> buffer = io.StringIO()
>>> write_conll(buffer, [Sentence(["EU", "rejects"], ["B-ORG", "O"])])
>>> buffer.getvalue()
'EU\\tB-ORG\\nrejects\\tO\\n\\n'
"""

from __future__ import annotations

import io
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from neurocrf.data.schemes import InvalidTagError, check_scheme, validate_tags
from neurocrf.data.streams import ConllFormatError, LineSource

DOC_PREFIXES: tuple[str, ...] = ("-DOCSTART-", "###MEDLINE:")
"""Default document separator prefixes (matched against a line's first field)."""

_ASCII_SPACE = re.compile(r"[ \t\f\v]+")


@dataclass
class Sentence:
    """One sentence of a column file.

    ``columns[i]`` holds every raw column of token ``i``; ``source`` and ``line`` (1-based line of
    the first token) locate it, ``token_lines[i]`` is the line of token ``i``; ``document`` counts
    the documents of the file from 0 (a new one starts after each document separator line);
    ``fields`` holds the other fields of a JSON-lines input record (written back with its
    prediction).
    """

    tokens: list[str]
    tags: list[str] | None = None
    columns: list[list[str]] | None = None
    source: str | None = None
    line: int | None = None
    document: int | None = None
    token_lines: list[int] | None = None
    fields: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def location(self, index: int = 0) -> str:
        """``"path:line"`` of token ``index`` (for error messages)."""
        if self.token_lines is not None and 0 <= index < len(self.token_lines):
            line: int | None = self.token_lines[index]
        else:
            line = None if self.line is None else self.line + index
        return f"{self.source or '<unknown>'}:{line if line is not None else '?'}"

    def joined_columns(self, columns: Sequence[int], separator: str = "\t") -> list[str]:
        """Each token as the named raw columns joined by ``separator`` (``"word\tPOS"``), what a
        model trained with ``data.token_columns`` reads.

        Raises:
            ConllFormatError: naming file and line when the sentence has no raw columns (plain
                text) or a line lacks one of the columns.
        """
        if self.columns is None:
            raise ConllFormatError(
                f"{self.location(0)}: token columns {list(columns)} need a column file (CoNLL input),"
                " this sentence has no columns"
            )
        joined = []
        for i, fields in enumerate(self.columns):
            missing = [c for c in columns if not -len(fields) <= c < len(fields)]
            if missing:
                raise ConllFormatError(
                    f"{self.location(i)}: token columns {list(columns)} name column(s) {missing},"
                    f" but the line has {len(fields)} columns"
                )
            joined.append(separator.join(fields[c] for c in columns))
        return joined


def read_text(path: str | os.PathLike[str], encoding: str = "utf-8") -> str:
    """The decoded text of a file, without a UTF-8 byte order mark.

    Raises:
        ConllFormatError: naming file and line of the first bytes not valid in ``encoding``.
        ValueError: for an unknown encoding.
    """
    name = os.fspath(path)
    with open(name, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ConllFormatError(
            f"{name}:{line}: bytes {data[error.start:error.end]!r} are not valid {encoding}"
            f" ({error.reason})"
        ) from None
    except LookupError:
        raise ValueError(f"unknown encoding {encoding!r} for {name}") from None
    return text[1:] if text.startswith("\ufeff") else text


def _split(line: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        # ASCII whitespace only: str.split() would also cut tokens at U+00A0, U+2009, ...
        return _ASCII_SPACE.split(line.strip(" \t\f\v"))
    return line.split(delimiter)


BLANK, SEPARATOR, TOKEN = "blank", "separator", "token"


def column_lines(
    text: str | Iterable[str],
    delimiter: str | None = None,
    docstart: str | Sequence[str] | None = DOC_PREFIXES,
    comment_prefix: str | None = None,
) -> Iterator[tuple[int, str, str, list[str]]]:
    """The lines of a column file (its whole text, or its lines without line ends) as
    ``(line number, kind, line, fields)``: ``kind`` is :data:`BLANK` (a sentence end),
    :data:`SEPARATOR` (a document separator line, also a sentence end) or :data:`TOKEN`; comment
    lines are skipped, a ``\\r`` before the line end dropped."""
    prefixes = (docstart,) if isinstance(docstart, str) else tuple(docstart or ())
    for number, raw in enumerate(text.split("\n") if isinstance(text, str) else text, start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip(" \t\f\v"):
            yield number, BLANK, line, []
            continue
        if comment_prefix is not None and line.startswith(comment_prefix):
            continue
        fields = _split(line, delimiter)
        yield number, SEPARATOR if prefixes and fields[0].startswith(prefixes) else TOKEN, line, fields


def read_conll(
    path: str | os.PathLike[str],
    *,
    token_column: int = 0,
    tag_column: int | None = -1,
    delimiter: str | None = None,
    docstart: str | Sequence[str] | None = DOC_PREFIXES,
    comment_prefix: str | None = None,
    encoding: str = "utf-8",
    scheme: str | None = None,
    min_columns: int | None = None,
) -> list[Sentence]:
    """Read a column file into sentences (a ``.gz`` file is decompressed; ``"-"`` reads
    standard input).

    Args:
        path: the file.
        token_column, tag_column: column indices (negative counts from the end); ``tag_column=None``
            reads tokens only (``Sentence.tags`` is None).
        delimiter: column separator; None splits on any run of spaces or tabs.
        docstart: prefix(es) of document separator lines, matched against the first field
            (default: ``-DOCSTART-`` and ``###MEDLINE:``); these lines also end a sentence.
        comment_prefix: lines starting with it are skipped (anywhere in the file).
        encoding: text encoding; a UTF-8 byte order mark is dropped.
        scheme: if given ("IOB1", "IOB2", "BIOES"), every sentence's tags are validated in it.
        min_columns: every token line must have at least this many columns.

    Every token line must have as many columns as the file's first token line.

    Raises:
        ConllFormatError: naming file and line, for inconsistent or too few columns, an empty tag
            or one with whitespace around it (``"B-PER "`` in a tab-delimited file), tags invalid
            in ``scheme``, bytes not valid in ``encoding``, or a file without any sentence.
    """

    name = os.fspath(path)
    return list(iter_conll(LineSource(name, encoding), name, token_column=token_column, tag_column=tag_column,
                           delimiter=delimiter, docstart=docstart, comment_prefix=comment_prefix, scheme=scheme,
                           min_columns=min_columns))


def iter_conll(
    lines: Iterable[str],
    name: str,
    *,
    token_column: int = 0,
    tag_column: int | None = -1,
    delimiter: str | None = None,
    docstart: str | Sequence[str] | None = DOC_PREFIXES,
    comment_prefix: str | None = None,
    scheme: str | None = None,
    min_columns: int | None = None,
) -> Iterator[Sentence]:
    """The sentences of a column file's ``lines`` (without line ends), one at a time, as
    :func:`read_conll` reads them (same options, same errors naming ``name`` and the line)."""
    if scheme is not None:
        check_scheme(scheme)
    needed = max(_needed_columns(token_column), _needed_columns(tag_column), min_columns or 0)
    rows: list[list[str]] = []
    numbers: list[int] = []
    document, doc_has_sentences, any_sentence = 0, False, False
    width: int | None = None
    width_line = 0

    for number, kind, line, fields in column_lines(lines, delimiter, docstart, comment_prefix):
        if kind != TOKEN:
            if rows:
                yield _make_sentence(rows, numbers, token_column, tag_column, name, document, scheme)
                doc_has_sentences = any_sentence = True
                rows, numbers = [], []
            if kind == SEPARATOR and doc_has_sentences:
                document += 1
                doc_has_sentences = False
            continue
        if width is None:
            if len(fields) < needed:
                raise ConllFormatError(
                    f"{name}:{number}: found {len(fields)} column(s), need at least {needed}"
                    f" (token_column={token_column}, tag_column={tag_column},"
                    f" min_columns={min_columns}): {line!r}"
                )
            width, width_line = len(fields), number
        elif len(fields) != width:
            raise ConllFormatError(
                f"{name}:{number}: found {len(fields)} column(s), expected {width} as on line"
                f" {width_line}: {line!r}"
            )
        rows.append(fields)
        numbers.append(number)
    if rows:
        yield _make_sentence(rows, numbers, token_column, tag_column, name, document, scheme)
        any_sentence = True
    if not any_sentence:
        raise ConllFormatError(f"{name}:1: no sentences found (empty file or only separators)")


def _needed_columns(column: int | None) -> int:
    if column is None:
        return 0
    return column + 1 if column >= 0 else -column


def _make_sentence(
    rows: list[list[str]],
    lines: list[int],
    token_column: int,
    tag_column: int | None,
    source: str,
    document: int,
    scheme: str | None,
) -> Sentence:
    tokens = [row[token_column] for row in rows]
    tags = None if tag_column is None else [row[tag_column] for row in rows]
    for position, tag in enumerate(tags or ()):
        if not tag or tag != tag.strip():
            raise ConllFormatError(
                f"{source}:{lines[position]}: tag {tag!r} is empty or has whitespace around it"
                " (a trailing space before the line end or the delimiter?); remove it"
            )
    if tags is not None and scheme is not None:
        try:
            validate_tags(tags, scheme)
        except InvalidTagError as error:
            position = error.position if error.position is not None else 0
            raise ConllFormatError(f"{source}:{lines[position]}: {error}") from None
    return Sentence(
        tokens=tokens,
        tags=tags,
        columns=rows,
        source=source,
        line=lines[0],
        document=document,
        token_lines=lines,
    )


def write_conll(
    path_or_file: str | os.PathLike[str] | TextIO,
    sentences: Iterable[Sentence],
    *,
    delimiter: str = "\t",
    extra_tag_columns: Mapping[str, Sequence[Sequence[str]]] | None = None,
    raw_columns: bool = False,
    docstart: str | None = "-DOCSTART-",
    encoding: str = "utf-8",
) -> None:
    """Write sentences as a column file: ``token [tag] [extra...]`` per line, blank line after each.

    Args:
        path_or_file: a path (written atomically: temp file + rename) or an open text file.
        sentences: what to write; ``tags`` of None writes the token column only.
        extra_tag_columns: more columns after the tag, ``{name: per-sentence lists of values}``
            in the order given (e.g. predictions next to gold tags).
        raw_columns: write each sentence's ``columns`` as read instead of token and tag, so that
            a file read with any column options reads back identically.
        docstart: when the sentences come from more than one document (``Sentence.document``),
            a line ``docstart<delimiter>O...`` precedes each document; None never writes one.

    Raises ValueError when a sentence's tags, columns or extra columns do not match its tokens,
    ConllFormatError (a ValueError) naming file and line when a value is empty or contains the
    delimiter or a line break (it could not be read back).
    """
    sentences = list(sentences)
    extra = dict(extra_tag_columns or {})
    for name, values in extra.items():
        if len(values) != len(sentences):
            raise ValueError(
                f"extra column {name!r} has {len(values)} sentences, expected {len(sentences)}"
            )
    documents = {s.document for s in sentences}
    separate = docstart is not None and len(documents) > 1
    out = io.StringIO()
    previous_document: object = object()
    for index, sentence in enumerate(sentences):
        rows = _rows(sentence, index, extra, raw_columns)
        if separate and sentence.document != previous_document:
            filler = ["O"] * (len(rows[0]) - 1 if rows else 0)
            out.write(delimiter.join([str(docstart), *filler]) + "\n\n")
            previous_document = sentence.document
        _check_values(sentence, rows, delimiter)
        for row in rows:
            out.write(delimiter.join(row) + "\n")
        out.write("\n")
    text = out.getvalue()
    if isinstance(path_or_file, (str, os.PathLike)):
        atomic_write_text(path_or_file, text, encoding)
    else:
        path_or_file.write(text)


def sentence_block(
    sentence: Sentence,
    extra_columns: Mapping[str, Sequence[str]] | None = None,
    *,
    raw_columns: bool = False,
    delimiter: str = "\t",
) -> str:
    """One sentence as :func:`write_conll` writes it (its lines and the blank line after them),
    with ``extra_columns`` ``{name: one value per token}``; for writing one sentence at a time.

    Raises ValueError / ConllFormatError as :func:`write_conll` does.

    >>> sentence_block(Sentence(["EU", "rejects"]), {"pred": ["B-ORG", "O"]})
    'EU\\tB-ORG\\nrejects\\tO\\n\\n'
    """
    extras = list((extra_columns or {}).values())
    n = len(sentence.tokens)
    base: Sequence[str] | None = None
    if all(len(values) == n for values in extras):
        if raw_columns and sentence.columns is not None and len(sentence.columns) == n:
            base, fields = [delimiter.join(row) for row in sentence.columns], sum(map(len, sentence.columns))
        elif not raw_columns and sentence.tags is None:
            base, fields = sentence.tokens, n
        elif not raw_columns and len(sentence.tags or ()) == n:
            base, fields = [t + delimiter + g for t, g in zip(sentence.tokens, sentence.tags or ())], 2 * n
    if base is not None and n:
        text = "\n".join(delimiter.join(parts) for parts in zip(base, *extras))
        # every value non-empty and without the delimiter or a line break (else the slow path names it)
        if (text.count(delimiter) == fields + n * (len(extras) - 1) and text.count("\n") == n - 1
                and "\r" not in text and delimiter * 2 not in text and "\n\n" not in text
                and f"\n{delimiter}" not in text and f"{delimiter}\n" not in text
                and text[:1] not in ("", "\n") and text[-1:] != "\n" and not text.startswith(delimiter)
                and not text.endswith(delimiter)):
            return text + "\n\n"
    rows = _rows(sentence, 0, {name: [values] for name, values in (extra_columns or {}).items()}, raw_columns)
    _check_values(sentence, rows, delimiter)
    return "".join(delimiter.join(row) + "\n" for row in rows) + "\n"


def check_writable(sentences: Iterable[Sentence], *, delimiter: str = "\t", raw_columns: bool = False) -> None:
    """Check, before any work is done, that :func:`write_conll` can write the sentences' tokens
    (or all their raw columns with ``raw_columns``).

    Raises:
        ConllFormatError: naming file and line of the first value that cannot be written.
    """
    for sentence in sentences:
        rows = sentence.columns if raw_columns and sentence.columns is not None else [[t] for t in sentence.tokens]
        _check_values(sentence, rows, delimiter)


def _check_values(sentence: Sentence, rows: Sequence[Sequence[str]], delimiter: str) -> None:
    """Raise ConllFormatError naming file and line of a value that is empty or holds the delimiter
    or a line break: it would not read back."""
    for position, row in enumerate(rows):
        for value in row:
            if not value or delimiter in value or "\n" in value or "\r" in value:
                raise ConllFormatError(
                    f"{sentence.location(position)}: value {value!r} is empty or contains the"
                    f" delimiter {delimiter!r} or a line break: a column file cannot hold it"
                )


def _rows(
    sentence: Sentence, index: int, extra: Mapping[str, Sequence[Sequence[str]]], raw: bool
) -> list[list[str]]:
    n = len(sentence.tokens)
    where = f"sentence {index} ({sentence.location()})"
    if raw:
        if sentence.columns is None or len(sentence.columns) != n:
            raise ValueError(f"{where}: raw_columns=True needs one column list per token")
        columns = [list(row) for row in sentence.columns]
    else:
        columns = [[token] for token in sentence.tokens]
        if sentence.tags is not None:
            if len(sentence.tags) != n:
                raise ValueError(f"{where}: {len(sentence.tags)} tags for {n} tokens")
            for row, tag in zip(columns, sentence.tags):
                row.append(tag)
    for name, values in extra.items():
        if len(values[index]) != n:
            raise ValueError(
                f"{where}: extra column {name!r} has {len(values[index])} values for {n} tokens"
            )
        for row, value in zip(columns, values[index]):
            row.append(value)
    return columns


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to a temp file in the same folder, then ``os.replace`` it onto ``path``.

    Readers never see a half-written file, and two processes writing the same content race safely.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "x", encoding=encoding, newline="\n") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        if temp.exists():
            temp.unlink()
        raise

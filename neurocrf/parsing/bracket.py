"""Bracketed tree formats: discbracket (read + write) and Penn Treebank brackets (read).

discbracket (disco-dop's format): one tree per line, terminals written ``index=word``, e.g.
``(S (VP (VB 0=is) (NN 2=x)) (X 1=y))``; ``(`` / ``)`` in words are ``#LRB#`` / ``#RRB#``. Blank
lines are skipped. A tree may be followed by a tab and a comment, free text that disco-dop keeps
with the tree and writes back (its parser puts ``prob=...`` there, its Alpino conversion the
annotator's comment): it becomes :attr:`TreebankSentence.comment`, never the id. The id is the
1-based line number, the key disco-dop gives every line, unless the comment starts with
``id=``: ``(S ...)<TAB>id=17`` has the id ``17``, ``(S ...)<TAB>id=17 checked`` the id ``17`` and
the comment ``checked``. That is how ids are written (``write_ids``): disco-dop reads the file
(the ``id=`` field as a comment) and writes it back with the ids. A line of disco-dop's
``--sentid`` output, ``17|(S ...)``, has the id ``17``. ``id_from_comment=True`` takes a whole
comment as the id (files written as ``(S ...)<TAB>17``).

Penn brackets (e.g. the WSJ ``.mrg`` files): any number of trees per file, spread over lines.
With ``traces="resolve"`` the fillers of co-indexed ``*T*``, ``*ICH*``, ``*EXP*`` and ``*RNR*``
traces move to their traces, which makes their new ancestors discontinuous (Evang & Kallmeyer's
DPTB; :mod:`.traces`); with ``traces="remove"`` (the default) the trees stay continuous. Then
``-NONE-`` elements are removed, and so are constituents left empty by that; function tags and
co-indices are stripped from labels (``NP-SBJ-1`` -> ``NP``, ``PP=2`` -> ``PP``; ``-LRB-``-style
labels are kept) and ``ADVP|PRT`` keeps its first alternative; the unlabeled outer bracket
``( (S ...) )`` becomes ``ROOT``.
"""

from __future__ import annotations

import bisect
import io
import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, TextIO

from neurocrf.parsing.traces import TRACE_MODES, penn_node, penn_to_tree, resolve_traces, strip_function_tags
from neurocrf.parsing.tree import (
    TreebankFormatError,
    TreebankSentence,
    _tokenize,
    parse_bracketed,
    read_text_lines,
)

log = logging.getLogger(__name__)

__all__ = ["read_discbracket", "parse_discbracket", "write_discbracket", "discbracket_line",
           "read_penn", "parse_penn", "strip_function_tags"]


# ---------------------------------------------------------------------------- discbracket
def read_discbracket(path: str | os.PathLike, *, encoding: str = "utf-8",
                     id_from_comment: bool = False) -> list[TreebankSentence]:
    """Read a discbracket file (see the module docstring)."""
    return parse_discbracket(read_text_lines(path, encoding), source=str(path), id_from_comment=id_from_comment)


def parse_discbracket(lines: Iterable[str] | str, *, source: str | None = None,
                      id_from_comment: bool = False) -> list[TreebankSentence]:
    r"""Parse discbracket text (a string or an iterable of lines; ids and comments as the module
    docstring says).

    >>> [(s.id, s.comment) for s in parse_discbracket(
    ...     "(S (A 0=a))\tprob=0.5\n(S (A 0=b))\tid=s7 checked\n8|(S (A 0=c))\n")]
    [('1', 'prob=0.5'), ('s7', 'checked'), ('8', None)]
    """
    if isinstance(lines, str):
        lines = io.StringIO(lines)
    out = []
    for lineno, raw in enumerate(lines, 1):
        line, _, comment = raw.strip("\r\n").partition("\t")
        line, comment = line.strip(), comment.strip()
        if not line and not comment:
            continue
        sent_id = str(lineno)
        key, bar, rest = line.partition("|(")
        if bar and key and not line.startswith("(") and not any(c.isspace() or c in "()" for c in key):
            sent_id, line = key, "(" + rest  # disco-dop's --sentid output: ID|(tree)
        if not line.startswith("("):
            hint = (" (an 'id<TAB>tree' line: discbracket puts the tree first, then a tab and the id)"
                    if comment.startswith("(") else "")
            raise TreebankFormatError(source, lineno, f"expected a tree or 'tree<TAB>comment', got "
                                      f"{raw.strip()[:40]!r}{hint}")
        if id_from_comment:
            sent_id, comment = comment or sent_id, ""
        elif comment.startswith("id="):
            fields = comment[3:].split(None, 1)
            if not fields or comment[3].isspace():
                raise TreebankFormatError(source, lineno, f"the comment {comment[:40]!r} names no id after 'id='")
            sent_id, comment = fields[0], (fields[1] if len(fields) > 1 else "")
        try:
            tree, words = parse_bracketed(line)
        except ValueError as err:
            raise TreebankFormatError(source, lineno, str(err)) from None
        n = len(words)
        try:
            tree.validate(n)
        except ValueError:
            leaves = tree.leaves()
            unnamed = sorted(set(leaves) - set(words))
            problem = (f"terminal(s) {unnamed} have no '=word'" if unnamed else
                       f"terminal indices {leaves} are not 0..{n - 1} (each once)")
            raise TreebankFormatError(source, lineno, problem) from None
        out.append(TreebankSentence(sent_id, [words[i] for i in range(n)], tree, comment=comment or None))
    return out


def discbracket_line(sentence: TreebankSentence, *, write_id: bool = False) -> str:
    r"""One sentence as a discbracket line (without newline): the tree, then a tab and the
    comment field if there is one: ``id=<id>`` if ``write_id``, then the sentence's comment.

    >>> from neurocrf.parsing.tree import Tree
    >>> discbracket_line(TreebankSentence("s7", ["a"], Tree.parse("(S (A 0))"), comment="checked"), write_id=True)
    '(S (A 0=a))\tid=s7 checked'
    """
    for word in sentence.words:
        if not word or any(ch.isspace() for ch in word):
            raise ValueError(f"sentence {sentence.id}: word {word!r} is empty or contains "
                             f"whitespace, which discbracket cannot hold")
    fields = []
    if write_id:
        if not sentence.id or any(c.isspace() for c in sentence.id):
            raise ValueError(f"sentence id {sentence.id!r} is empty or holds whitespace, which the id= field "
                             f"of a discbracket comment cannot hold")
        fields.append(f"id={sentence.id}")
    comment = sentence.comment
    if comment:
        if comment != comment.strip() or any(c in comment for c in "\t\r\n"):
            raise ValueError(f"sentence {sentence.id}: comment {comment!r} has surrounding whitespace or holds a "
                             f"tab or line break, which a discbracket comment cannot hold")
        if not write_id and comment.startswith("id="):
            raise ValueError(f"sentence {sentence.id}: comment {comment!r} would read back as an id; write it "
                             f"with write_ids=True")
        fields.append(comment)
    text = sentence.tree.discbracket(sentence.words)
    return f"{text}\t{' '.join(fields)}" if fields else text


def write_discbracket(target: str | os.PathLike | TextIO, sentences: Iterable[TreebankSentence],
                      *, write_ids: bool = False) -> None:
    """Write one discbracket tree per line, followed by a tab, ``id=<id>`` if ``write_ids`` and
    the sentence's comment, if either is there."""
    text = "".join(discbracket_line(s, write_id=write_ids) + "\n" for s in sentences)
    if isinstance(target, (str, os.PathLike)):
        Path(target).write_text(text, encoding="utf-8")
    else:
        target.write(text)


# ---------------------------------------------------------------------------- Penn brackets
def read_penn(path: str | os.PathLike, *, encoding: str = "utf-8", root_label: str = "ROOT",
              traces: str = "remove", counts: Counter[str] | None = None) -> list[TreebankSentence]:
    """Read a Penn Treebank bracket file; ids are ``<file stem>:<n>`` (1-based).

    ``traces``: ``"resolve"`` or ``"remove"`` (see the module docstring); ``counts``, if given, is
    updated with the trace counts of :func:`~neurocrf.parsing.traces.resolve_traces`; traces
    left unresolved are logged (file and tree id) either way."""
    path = Path(path)
    return parse_penn("".join(read_text_lines(path, encoding)), source=str(path),
                      id_prefix=path.stem + ":", root_label=root_label, traces=traces, counts=counts)


def parse_penn(text: str, *, source: str | None = None, id_prefix: str = "", root_label: str = "ROOT",
               traces: str = "remove", counts: Counter[str] | None = None) -> list[TreebankSentence]:
    """Parse Penn bracket text holding any number of trees (see the module docstring)."""
    if traces not in TRACE_MODES:
        raise ValueError(f"traces must be one of {TRACE_MODES}, got {traces!r}")
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_right(line_starts, offset)

    out: list[TreebankSentence] = []
    unresolved: dict[str, dict[str, int]] = {}  # tree id -> unresolved trace counts
    stack: list[tuple[str, list, int]] = []  # (label, children, offset of "(")
    tokens = list(_tokenize(text))
    pos = 0
    while pos < len(tokens):
        tok, off = tokens[pos]
        if tok == "(":
            label = ""
            if pos + 1 < len(tokens) and tokens[pos + 1][0] not in "()":
                label = tokens[pos + 1][0]
                pos += 1
            stack.append((label, [], off))
        elif tok == ")":
            if not stack:
                raise TreebankFormatError(source, line_of(off), "unbalanced ')'")
            node = stack.pop()
            if not node[1]:
                raise TreebankFormatError(source, line_of(node[2]), f"empty bracket {node[0]!r}")
            if stack:
                stack[-1][1].append(node)
            else:
                sent_id = f"{id_prefix}{len(out) + 1}"
                sentence = _penn_sentence(node, sent_id, root_label, traces == "resolve", counts, unresolved)
                if sentence is None:
                    raise TreebankFormatError(source, line_of(node[2]), "tree without words")
                out.append(sentence)
        else:
            if not stack:
                raise TreebankFormatError(source, line_of(off), f"text {tok!r} outside a tree")
            if stack[-1][1]:
                raise TreebankFormatError(source, line_of(off), f"unexpected token {tok!r}: a "
                                          f"bracket holds either one word or subtrees")
            stack[-1][1].append(tok)
        pos += 1
    if stack:
        raise TreebankFormatError(source, line_of(stack[0][2]), "tree not closed at end of input")
    if unresolved:
        log.info("%s: traces left unresolved (kept as empty elements, removed) in %d tree(s): %s",
                 source or "<input>", len(unresolved), unresolved)
    return out


def _penn_sentence(raw: tuple, sent_id: str, root_label: str, resolve: bool, counts: Counter[str] | None,
                   unresolved: dict[str, dict[str, int]]) -> TreebankSentence | None:
    words: list[str] = []
    node = penn_node(raw, words)
    if resolve:
        found = resolve_traces(node)
        left = {k: v for k, v in found.items() if k.split()[0] in ("missing", "cycle") and v}
        if left:
            unresolved[sent_id] = left
        if counts is not None:
            counts.update(found)
    tree = penn_to_tree(node)
    if tree is None:
        return None
    if not tree.label:
        tree.label = root_label
    return TreebankSentence(sent_id, words, tree)

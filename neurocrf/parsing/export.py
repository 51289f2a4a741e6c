"""NeGra export format (versions 3 and 4): reader and writer.

A sentence is a block ``#BOS <id> ...`` .. ``#EOS <id>``. Inside it, one line per terminal, then
one line per nonterminal, fields separated by whitespace::

    format 3:  word       tag  morph  edge  parent  [secedge secparent]...
    format 4:  word lemma tag  morph  edge  parent  [secedge secparent]...
    nonterminal lines have ``#<id>`` (500..999) as the word and the label as the tag.

``parent`` 0 is the virtual root, read as a node labeled ``root_label`` (``VROOT``). Each
terminal becomes a preterminal labeled with its tag. Per-token annotations
(:data:`~neurocrf.parsing.tree.ANNOTATIONS`): ``function`` (the terminal's edge label), ``morph``
and ``projection`` (``label/edge`` of the largest constituent the word heads through ``HD``
edges, ``-/<edge>`` for a word that heads none). Lemmas, the edge labels of nonterminals and
secondary edges are not kept otherwise. Lines outside blocks (``#FORMAT``, the
``#BOT``..``#EOT`` tables of format 4, ``%%`` comments) are skipped; the version comes from a
``#FORMAT`` line, else from the argument, else from the parity of the field count (format 3 lines
have an odd number of fields, format 4 lines an even one). A comment on the ``#BOS`` line,
``#BOS 7 %% checked``, is the sentence's :attr:`~neurocrf.parsing.tree.TreebankSentence.comment`,
read and written as disco-dop does.

The writer numbers nonterminals bottom-up from 500 (children before parents) and writes ``--``
for lemma and nonterminal edges, and for morphology and terminal edges unless the sentence has
``morph`` / ``function`` annotations. A tree whose root is not labeled ``root_label`` is written with
its root as an ordinary nonterminal under the virtual root.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Iterable, TextIO

from neurocrf.parsing.tree import Tree, TreebankFormatError, TreebankSentence, read_text_lines

__all__ = ["read_export", "parse_export", "write_export", "export_block"]

_NONTERMINAL = re.compile(r"^#(\d+)$")


def read_export(path: str | os.PathLike, fmt: int | None = None, *, root_label: str = "VROOT",
                encoding: str = "utf-8") -> list[TreebankSentence]:
    """Read an export file (see the module docstring)."""
    return parse_export(read_text_lines(path, encoding), fmt, root_label=root_label, source=str(path))


def parse_export(lines: Iterable[str] | str, fmt: int | None = None, *, root_label: str = "VROOT",
                 source: str | None = None) -> list[TreebankSentence]:
    """Parse export text (a string or an iterable of lines)."""
    if isinstance(lines, str):
        lines = io.StringIO(lines)
    if fmt not in (None, 3, 4):
        raise ValueError(f"export format must be 3 or 4, got {fmt!r}")
    out: list[TreebankSentence] = []
    block: list[tuple[int, list[str]]] | None = None
    bos_id, bos_line, comment = "", 0, ""
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("%%"):
            continue
        fields = line.split()
        if fields[0] == "#FORMAT":
            if len(fields) < 2 or fields[1] not in ("3", "4"):
                raise TreebankFormatError(source, lineno, f"unsupported #FORMAT line {line!r}")
            fmt = int(fields[1])
        elif fields[0] == "#BOS":
            if block is not None:
                raise TreebankFormatError(source, lineno, f"#BOS before #EOS of sentence {bos_id}")
            if len(fields) < 2:
                raise TreebankFormatError(source, lineno, "#BOS without a sentence id")
            block, bos_id, bos_line = [], fields[1], lineno
            comment = line.partition("%%")[2].strip()
        elif fields[0] == "#EOS":
            if block is None:
                raise TreebankFormatError(source, lineno, "#EOS without #BOS")
            if len(fields) > 1 and fields[1] != bos_id:
                raise TreebankFormatError(source, lineno, f"#EOS {fields[1]} closes #BOS {bos_id}")
            if fmt is None and block:
                fmt = 3 if len(block[0][1]) % 2 == 1 else 4
            out.append(_build(bos_id, block, fmt or 3, root_label, source, bos_line))
            out[-1].comment = comment or None
            block = None
        elif block is not None:
            block.append((lineno, fields))
        # anything else outside a block (#BOT/#EOT tables, headers) is ignored
    if block is not None:
        raise TreebankFormatError(source, bos_line, f"sentence {bos_id} has no #EOS")
    return out


_HEAD_EDGE = "HD"


def _build(sent_id: str, block: list[tuple[int, list[str]]], fmt: int, root_label: str,
           source: str | None, bos_line: int) -> TreebankSentence:
    offset = 1 if fmt == 4 else 0  # lemma column
    min_fields = 5 + offset
    words: list[str] = []
    nodes: dict[int, Tree] = {0: Tree(root_label)}
    node_line: dict[int, int] = {}
    edges: list[tuple[int, Tree, int]] = []  # (parent id, child, line)
    nt_edge: dict[int, tuple[str, int]] = {}  # node id -> (edge label, parent id)
    term_fields: list[tuple[str, str, int]] = []  # (morph, edge, parent id) per terminal
    for lineno, fields in block:
        if len(fields) < min_fields:
            raise TreebankFormatError(source, lineno, f"format {fmt} needs at least {min_fields} "
                                      f"fields, found {len(fields)}")
        tag, parent_text = fields[1 + offset], fields[4 + offset]
        if not parent_text.isdigit():
            raise TreebankFormatError(source, lineno, f"parent {parent_text!r} is not a number")
        match = _NONTERMINAL.match(fields[0])
        if match and int(match.group(1)) >= 500:
            node_id = int(match.group(1))
            if node_id in nodes:
                raise TreebankFormatError(source, lineno, f"node #{node_id} defined twice")
            nodes[node_id] = Tree(tag)
            node_line[node_id] = lineno
            nt_edge[node_id] = (fields[3 + offset], int(parent_text))
            edges.append((int(parent_text), nodes[node_id], lineno))
        else:
            if node_line:
                raise TreebankFormatError(source, lineno, "terminal line after nonterminal lines")
            edges.append((int(parent_text), Tree(tag, [len(words)]), lineno))
            words.append(fields[0])
            term_fields.append((fields[2 + offset], fields[3 + offset], int(parent_text)))
    if not words:
        raise TreebankFormatError(source, bos_line, f"sentence {sent_id} has no terminals")
    parent_of: dict[int, int] = {}
    for parent, child, lineno in edges:
        if parent not in nodes:
            raise TreebankFormatError(source, lineno, f"parent #{parent} is not defined in "
                                      f"sentence {sent_id}")
        nodes[parent].children.append(child)
        if not child.is_preterminal:
            parent_of[id(child)] = parent
    for node_id, node in nodes.items():  # every nonterminal must reach the root
        seen, current = set(), node_id
        while current != 0:
            if current in seen:
                raise TreebankFormatError(source, node_line[node_id],
                                          f"node #{node_id} is part of a cycle")
            seen.add(current)
            current = parent_of[id(nodes[current])]
        if not node.children:
            raise TreebankFormatError(source, node_line.get(node_id, bos_line),
                                      f"node #{node_id} ({node.label}) has no children")
    projections = []
    for _, edge, parent in term_fields:
        label = "-"
        while edge == _HEAD_EDGE and parent != 0:
            label = nodes[parent].label
            edge, parent = nt_edge[parent]
        projections.append(f"{label}/{edge}")
    annotations = {"function": [edge for _, edge, _ in term_fields],
                   "morph": [morph for morph, _, _ in term_fields], "projection": projections}
    return TreebankSentence(sent_id, words, nodes[0].sort(), annotations)


def export_block(sentence: TreebankSentence, fmt: int = 3, *, root_label: str = "VROOT") -> str:
    """One sentence as an export ``#BOS``..``#EOS`` block (ending in a newline)."""
    if fmt not in (3, 4):
        raise ValueError(f"export format must be 3 or 4, got {fmt!r}")
    tree, words = sentence.tree, sentence.words
    tree.validate(len(words))
    top = tree.children if tree.label == root_label and not tree.is_preterminal else [tree]
    nonterminals: list[Tree] = []  # preorder
    nt_parent: list[int | None] = []
    term_parent: dict[int, int | None] = {}
    tags: dict[int, str] = {}

    def visit(node: Tree | int, parent: int | None) -> None:
        if isinstance(node, int):
            raise ValueError(f"sentence {sentence.id}: terminal {node} is not under a preterminal "
                             f"(export needs a POS tag per word)")
        if node.is_preterminal:
            index: int = node.children[0]  # type: ignore[assignment]
            tags[index], term_parent[index] = node.label, parent
            return
        k = len(nonterminals)
        nonterminals.append(node)
        nt_parent.append(parent)
        for c in node.children:
            visit(c, k)

    for child in top:
        visit(child, None)
    if len(nonterminals) > 500:
        raise ValueError(f"sentence {sentence.id}: more than 500 nonterminals")
    # a child comes after its parent in preorder, so reversed preorder numbers bottom-up
    ids = [500 + len(nonterminals) - 1 - k for k in range(len(nonterminals))]

    def number(parent: int | None) -> str:
        return "0" if parent is None else str(ids[parent])

    lemma = ["--"] if fmt == 4 else []
    if sentence.comment and any(c in sentence.comment for c in "\r\n"):
        raise ValueError(f"sentence {sentence.id}: comment {sentence.comment!r} holds a line break")
    lines = [f"#BOS {sentence.id}" + (f" %% {sentence.comment}" if sentence.comment else "")]
    morph = sentence.annotations.get("morph") or ["--"] * len(words)
    function = sentence.annotations.get("function") or ["--"] * len(words)
    for i, word in enumerate(words):
        for value, what in ((word, "word"), (tags[i], "tag"), (morph[i], "morph"), (function[i], "edge")):
            _check_field(value, sentence.id, what)
        lines.append("\t".join([word, *lemma, tags[i], morph[i], function[i], number(term_parent[i])]))
    for k in sorted(range(len(nonterminals)), key=ids.__getitem__):
        _check_field(nonterminals[k].label, sentence.id, "label")
        lines.append("\t".join([f"#{ids[k]}", *lemma, nonterminals[k].label, "--", "--",
                                number(nt_parent[k])]))
    lines.append(f"#EOS {sentence.id}")
    return "\n".join(lines) + "\n"


def _check_field(value: str, sent_id: str, what: str) -> None:
    if not value or any(ch.isspace() for ch in value):
        raise ValueError(f"sentence {sent_id}: {what} {value!r} is empty or contains whitespace, "
                         f"which the export format cannot hold")


def write_export(target: str | os.PathLike | TextIO, sentences: Iterable[TreebankSentence],
                 fmt: int = 3, *, root_label: str = "VROOT") -> None:
    """Write sentences in export format ``fmt`` (3 or 4), preceded by a ``#FORMAT`` line."""
    blocks = [export_block(s, fmt, root_label=root_label) for s in sentences]
    text = f"#FORMAT {fmt}\n" + "".join(blocks)
    if isinstance(target, (str, os.PathLike)):
        Path(target).write_text(text, encoding="utf-8")
    else:
        target.write(text)

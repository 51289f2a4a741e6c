"""Discontinuous constituent trees.

A :class:`Tree` node has a ``label`` and an ordered list of ``children``; a child is either another
``Tree`` or an ``int``, the 0-based index of a terminal (word) in the sentence. Because terminals are
indices rather than positions in the child list, a node's yield may have gaps: that is what makes a
constituent discontinuous. By convention every terminal sits alone under a *preterminal* (a node
whose only child is an int), whose label is the POS tag.

Equality is structural and ignores the order in which children are stored: two trees are equal if
their labels match and their children, each ordered by its smallest terminal, are pairwise equal.

Text form (``str(tree)``) is the *discbracket* format: ``(S (VP (VB 0) (NN 2)) (X 1))``, with words
``(S (VP (VB 0=is) (NN 2=x)) (X 1=y))``. As in disco-dop, brackets inside words are written
``#LRB#`` / ``#RRB#`` and brackets inside labels as square brackets (the STTS tag ``$(`` is
written ``$[``); reading undoes both.

>>> t = Tree.parse("(S (VP (VB 0) (NN 2)) (X 1))")
>>> t.children[0].blocks(), t.children[0].fanout()
([(0, 1), (2, 3)], 2)
>>> t == Tree.parse("(S (X 1) (VP (NN 2) (VB 0)))")
True
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

__all__ = [
    "ANNOTATIONS",
    "Tree",
    "TreebankSentence",
    "TreebankFormatError",
    "parse_bracketed",
    "escape_word",
    "unescape_word",
    "escape_label",
    "unescape_label",
    "random_tree",
    "natural_key",
]


def natural_key(text: str) -> tuple:
    """Sort key that orders the digit runs of ``text`` by number: ``wsj_0001:2`` before
    ``wsj_0001:10``, ``2.xml`` before ``10.xml`` (ties such as ``01`` / ``1``: by the text).

    >>> sorted(["s:10", "s:2", "t:1", "s:1"], key=natural_key)
    ['s:1', 's:2', 's:10', 't:1']
    """
    parts = re.split(r"(\d+)", text)  # text, number, text, ...: same types at the same places
    return (tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text)

def escape_word(word: str) -> str:
    """Word -> bracket-safe token: ``(`` and ``)`` become ``#LRB#`` / ``#RRB#``, as disco-dop
    writes them (a Penn-style word ``-LRB-`` stays as it is)."""
    return word.replace("(", "#LRB#").replace(")", "#RRB#")


def unescape_word(token: str) -> str:
    """Inverse of :func:`escape_word` (so the literal word ``#LRB#`` reads back as ``(``)."""
    return token.replace("#LRB#", "(").replace("#RRB#", ")")


def escape_label(label: str) -> str:
    """Label -> bracket-safe token: ``(`` and ``)`` become ``[`` / ``]``, as disco-dop reads
    tags such as ``$(`` from the export format."""
    return label.replace("(", "[").replace(")", "]")


def unescape_label(token: str) -> str:
    """Inverse of :func:`escape_label` (so a literal ``[`` in a label reads back as ``(``)."""
    return token.replace("[", "(").replace("]", ")")


class Tree:
    """A node of a discontinuous constituent tree.

    Args:
        label: the node's label (phrase category, or POS tag for a preterminal).
        children: ``Tree`` nodes and/or terminal indices (0-based ints).
    """

    __slots__ = ("label", "children")
    __hash__ = None  # type: ignore[assignment]  # mutable

    def __init__(self, label: str, children: Sequence["Tree | int"] | None = None) -> None:
        self.label = label
        self.children: list[Tree | int] = list(children) if children is not None else []

    # ------------------------------------------------------------------ structure
    @property
    def is_preterminal(self) -> bool:
        """True for a node whose only child is a terminal index."""
        return len(self.children) == 1 and isinstance(self.children[0], int)

    def leaves(self) -> list[int]:
        """Sorted terminal indices of the yield."""
        out: list[int] = []
        stack: list[Tree | int] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, int):
                out.append(node)
            else:
                stack.extend(node.children)
        out.sort()
        return out

    def min_leaf(self) -> int:
        """Smallest terminal index of the yield (a large number for an empty node)."""
        leaves = self.leaves()
        return leaves[0] if leaves else 1 << 62

    def blocks(self) -> list[tuple[int, int]]:
        """Maximal contiguous ranges ``(start, end)`` (end exclusive) of the yield, left to right."""
        return leaf_blocks(self.leaves())

    def fanout(self) -> int:
        """Number of blocks of the yield (1 = continuous)."""
        return len(self.blocks())

    def subtrees(self) -> Iterator["Tree"]:
        """All nodes, preorder (a node before its children, children in stored order)."""
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(c for c in reversed(node.children) if isinstance(c, Tree))

    def postorder(self) -> Iterator["Tree"]:
        """All nodes, children before their parent."""
        for child in self.children:
            if isinstance(child, Tree):
                yield from child.postorder()
        yield self

    def preterminals(self) -> list["Tree"]:
        """Preterminal nodes ordered by their terminal index."""
        pts = [t for t in self.subtrees() if t.is_preterminal]
        pts.sort(key=lambda t: t.children[0])  # type: ignore[arg-type, return-value]
        return pts

    def pos(self) -> list[tuple[int, str]]:
        """``(terminal index, POS tag)`` pairs ordered by index."""
        return [(t.children[0], t.label) for t in self.preterminals()]  # type: ignore[misc]

    def height(self) -> int:
        """1 for a preterminal (or a node with only terminals), 1 + max child height otherwise."""
        sub = [c.height() for c in self.children if isinstance(c, Tree)]
        return 1 + max(sub, default=0)

    def copy(self) -> "Tree":
        """Deep copy."""
        return Tree(self.label, [c.copy() if isinstance(c, Tree) else c for c in self.children])

    def sort(self) -> "Tree":
        """Order children by their smallest terminal, recursively, in place; returns self."""
        for node in self.postorder():
            node.children.sort(key=_child_key)
        return self

    def validate(self, num_words: int | None = None) -> None:
        """Raise ValueError unless every terminal occurs once, no node is empty, and (if given)
        the yield is exactly ``range(num_words)``."""
        for node in self.subtrees():
            if not node.children:
                raise ValueError(f"empty constituent {node.label!r} in {self}")
            for c in node.children:
                if isinstance(c, bool) or not isinstance(c, (int, Tree)):
                    raise ValueError(f"child {c!r} of {node.label!r} is neither a Tree nor an int")
                if isinstance(c, int) and c < 0:
                    raise ValueError(f"negative terminal index {c} under {node.label!r}")
        leaves = self.leaves()
        if len(set(leaves)) != len(leaves):
            dup = sorted({i for i in leaves if leaves.count(i) > 1})
            raise ValueError(f"terminal(s) {dup} occur more than once in {self}")
        if num_words is not None and leaves != list(range(num_words)):
            raise ValueError(f"yield {leaves} is not 0..{num_words - 1} in {self}")

    # ------------------------------------------------------------------ comparison
    def _canonical(self) -> tuple:
        return (self.label, tuple(c if isinstance(c, int) else c._canonical()
                                  for c in sorted(self.children, key=_child_key)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return self._canonical() == other._canonical()

    # ------------------------------------------------------------------ text
    def discbracket(self, words: Sequence[str] | None = None) -> str:
        """One-line discbracket string; children ordered by their smallest terminal.

        With ``words``, terminals are written ``index=word`` (brackets escaped)."""
        parts: list[str] = []
        self._write(parts, words)
        return "".join(parts)

    def _write(self, parts: list[str], words: Sequence[str] | None) -> None:
        parts.append("(" + escape_label(self.label))
        for c in sorted(self.children, key=_child_key):
            parts.append(" ")
            if isinstance(c, Tree):
                c._write(parts, words)
            elif words is None:
                parts.append(str(c))
            else:
                parts.append(f"{c}={escape_word(words[c])}")
        parts.append(")")

    def pretty(self, words: Sequence[str] | None = None, indent: str = "  ") -> str:
        """Multi-line indented form; each preterminal on one line, e.g. ``(NN 2=x)``."""
        lines: list[str] = []

        def walk(node: Tree, depth: int) -> None:
            if all(isinstance(c, int) for c in node.children):
                lines.append(indent * depth + node.discbracket(words))
                return
            lines.append(indent * depth + "(" + escape_label(node.label))
            for c in sorted(node.children, key=_child_key):
                if isinstance(c, Tree):
                    walk(c, depth + 1)
                else:
                    lines.append(indent * (depth + 1)
                                 + (str(c) if words is None else f"{c}={escape_word(words[c])}"))
            lines[-1] += ")"

        walk(self, 0)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.discbracket()

    def __repr__(self) -> str:
        return f"Tree({self.discbracket()!r})"

    @classmethod
    def parse(cls, text: str) -> "Tree":
        """Parse a discbracket string (terminals ``i`` or ``i=word``); words are discarded."""
        return parse_bracketed(text)[0]


def _child_key(child: "Tree | int") -> int:
    return child if isinstance(child, int) else child.min_leaf()


def leaf_blocks(leaves: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct ints -> maximal contiguous ``(start, end)`` ranges, end exclusive."""
    out: list[tuple[int, int]] = []
    for i in leaves:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _tokenize(text: str) -> Iterator[tuple[str, int]]:
    """Yield ``(token, offset)``; tokens are ``(``, ``)`` and whitespace-free atoms."""
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "()":
            yield ch, i
            i += 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "()":
                j += 1
            yield text[i:j], i
            i = j


def parse_bracketed(text: str) -> tuple[Tree, dict[int, str]]:
    """Parse one discbracket tree.

    Returns the tree and a map terminal index -> word for terminals written ``i=word`` (words
    and labels unescaped). Raises ValueError (with the character offset) on malformed input. A node with an
    empty label, as in ``( (S ...))``, gets the label ``""``.
    """
    words: dict[int, str] = {}
    stack: list[Tree] = []
    root: Tree | None = None
    tokens = list(_tokenize(text))
    pos = 0
    while pos < len(tokens):
        tok, off = tokens[pos]
        if root is not None:
            raise ValueError(f"text after the end of the tree at offset {off}: {tok!r}")
        if tok == "(":
            label = ""
            if pos + 1 < len(tokens) and tokens[pos + 1][0] not in "()":
                label = unescape_label(tokens[pos + 1][0])
                pos += 1
            node = Tree(label)
            if stack:
                stack[-1].children.append(node)
            stack.append(node)
        elif tok == ")":
            if not stack:
                raise ValueError(f"unbalanced ')' at offset {off}")
            node = stack.pop()
            if not node.children:
                raise ValueError(f"empty constituent {node.label!r} ending at offset {off}")
            if not stack:
                root = node
        else:
            if not stack:
                raise ValueError(f"terminal {tok!r} outside any bracket at offset {off}")
            index_text, sep, word = tok.partition("=")
            if not index_text.isdigit():
                raise ValueError(f"terminal {tok!r} at offset {off} is not 'index' or 'index=word'")
            index = int(index_text)
            if sep:
                if index in words:
                    raise ValueError(f"terminal index {index} repeated at offset {off}")
                words[index] = unescape_word(word)
            stack[-1].children.append(index)
        pos += 1
    if stack:
        raise ValueError(f"unbalanced '(': {len(stack)} bracket(s) not closed at end of input")
    if root is None:
        raise ValueError("no tree found")
    return root, words


#: Per-token annotations the readers keep (:attr:`TreebankSentence.annotations`).
ANNOTATIONS: dict[str, str] = {
    "function": "the word's grammatical function (Alpino rel, export edge label)",
    "projection": "label/function of the largest constituent the word heads, following head "
                  "functions (Alpino hd, export HD) upwards; '-/<function>' for a word that heads none",
    "postag": "the fine-grained tag with morphology (Alpino postag, the CGN tag)",
    "morph": "the morphology column of the export format",
}


class TreebankFormatError(ValueError):
    """Malformed treebank input; the message names the file and line."""

    def __init__(self, source: str | os.PathLike | None, line: int | None, problem: str) -> None:
        where = str(source) if source is not None else "<input>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


def read_text_lines(path: str | os.PathLike, encoding: str = "utf-8") -> list[str]:
    """The lines of a treebank file (line ends kept), without a leading byte order mark; bytes the
    encoding cannot read are a :class:`TreebankFormatError` naming the file and line."""
    with open(path, "rb") as handle:
        raw = handle.read()
    lines = []
    for number, line in enumerate(raw.splitlines(keepends=True), 1):
        try:
            lines.append(line.decode(encoding))
        except UnicodeDecodeError as error:
            bad = line[error.start:error.end]
            raise TreebankFormatError(path, number, f"bytes {bad!r} are not valid {encoding}"
                                      f" ({error.reason})") from None
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


@dataclass
class TreebankSentence:
    """One treebank entry: ``tree``'s terminal indices point into ``words``.

    ``annotations``: per-token annotations the treebank has beside the tree, name -> one string
    per word (:data:`ANNOTATIONS`); readers fill what their format holds, ``_`` where a token has
    none. ``comment``: free text the treebank keeps with the tree (a discbracket comment), or
    None. Neither is part of equality: two entries with the same id, words and tree are equal."""

    id: str
    words: list[str]
    tree: Tree
    annotations: dict[str, list[str]] = field(default_factory=dict, compare=False)
    comment: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name, values in self.annotations.items():
            if len(values) != len(self.words):
                raise ValueError(f"sentence {self.id}: annotation {name!r} has {len(values)} values "
                                 f"for {len(self.words)} words")

    @property
    def pos_tags(self) -> list[str]:
        """POS tag (preterminal label) per word."""
        tags = [""] * len(self.words)
        for i, tag in self.tree.pos():
            tags[i] = tag
        return tags


def random_tree(
    rng: random.Random,
    num_words: int,
    *,
    labels: Sequence[str] = ("S", "VP", "NP", "PP", "AP"),
    pos_tags: Sequence[str] = ("N", "V", "D", "A", "P"),
    root: str = "ROOT",
    p_disc: float = 0.3,
    p_unary: float = 0.15,
    max_children: int = 4,
) -> Tree:
    """A random (possibly discontinuous) tree over terminals ``0..num_words-1``, for tests.

    Bottom-up: start from one preterminal per word, then repeatedly group 2..``max_children``
    current nodes under a new node; with probability ``p_disc`` the group is a random subset
    (usually discontinuous), otherwise a run of neighbours. With probability ``p_unary`` a new node
    (or preterminal) gets an extra unary parent. The remaining nodes go under ``root``.
    """
    if num_words < 1:
        raise ValueError("num_words must be >= 1")
    nodes: list[Tree] = []
    for i in range(num_words):
        node = Tree(rng.choice(pos_tags), [i])
        if rng.random() < p_unary:
            node = Tree(rng.choice(labels), [node])
        nodes.append(node)
    while len(nodes) > 1 and not (len(nodes) <= max_children and rng.random() < 0.3):
        k = rng.randint(2, min(max_children, len(nodes)))
        if rng.random() < p_disc:
            picked = set(rng.sample(range(len(nodes)), k))
        else:
            start = rng.randint(0, len(nodes) - k)
            picked = set(range(start, start + k))
        new = Tree(rng.choice(labels), [nodes[i] for i in sorted(picked)])
        if rng.random() < p_unary:
            new = Tree(rng.choice(labels), [new])
        rest = [n for i, n in enumerate(nodes) if i not in picked]
        rest.append(new)
        rest.sort(key=Tree.min_leaf)
        nodes = rest
    return Tree(root, nodes)

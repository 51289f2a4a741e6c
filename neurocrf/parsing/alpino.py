"""Reader for the Alpino treebank (``alpino_ds`` 1.3 XML, one sentence per file).

Conversion to a :class:`~neurocrf.parsing.tree.Tree`:

* a ``<node>`` with ``word`` is a terminal: a preterminal labeled with the node's ``pos``
  attribute (the coarse Alpino tag, e.g. ``noun``, ``verb``, ``punct``; chosen over the CGN
  ``postag``/``pt`` because it is the small tag set Alpino itself parses with, and it is present
  on every terminal) over the index ``begin``;
* a ``<node>`` with ``cat`` is a phrase labeled ``cat`` in upper case (``np`` -> ``NP``, the root
  ``top`` -> ``TOP``; the disco-dop convention), with its converted children;
* a ``<node>`` with ``index`` but neither ``word`` nor ``cat`` and no children is a secondary
  (co-indexed) occurrence of the node with the same ``index`` that holds the content; it is
  dropped. The primary occurrence keeps the words, so a phrase that shared a dependent through
  co-indexing keeps only its own terminals, which is what makes constituents discontinuous;
* a phrase left without children by this is dropped too.

Per-token annotations (:attr:`TreebankSentence.annotations`, see
:data:`~neurocrf.parsing.tree.ANNOTATIONS`): ``function`` (the word's ``rel``), ``projection``
(``cat/rel`` of the largest phrase the word heads through ``rel="hd"`` links, e.g. ``np/su`` for
the noun of a subject NP, ``-/det`` for a determiner) and ``postag`` (the CGN tag with morphology,
``N(soort,mv,basis)``); ``_`` where an attribute is absent. Lemmas are not kept. The
``<sentence>`` text is checked against the terminals. Sentence ids are the file names without
``.xml``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

from neurocrf.parsing.tree import Tree, TreebankFormatError, TreebankSentence, natural_key

__all__ = ["read_alpino", "read_alpino_file", "parse_alpino_xml", "TreebankFormatError"]


@dataclass
class _Element:
    tag: str
    attrs: dict[str, str]
    line: int
    children: list["_Element"] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


def _parse_xml(text: bytes | str, source: str | None) -> _Element:
    """XML -> light element tree that remembers each element's line."""
    parser = expat.ParserCreate()
    stack: list[_Element] = []
    roots: list[_Element] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        el = _Element(tag, attrs, parser.CurrentLineNumber)
        (stack[-1].children if stack else roots).append(el)
        stack.append(el)

    def end(tag: str) -> None:
        stack.pop()

    def chars(data: str) -> None:
        if stack:
            stack[-1].text.append(data)

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(text, True)
    except expat.ExpatError as err:
        raise TreebankFormatError(source, err.lineno, f"XML parse error: {expat.errors.messages[err.code]}"
                                  f" (column {err.offset})") from None
    return roots[0]


def parse_alpino_xml(text: bytes | str, sent_id: str = "", source: str | None = None) -> TreebankSentence:
    """Convert the XML text of one ``alpino_ds`` document (see the module docstring)."""
    root = _parse_xml(text, source)
    if root.tag != "alpino_ds":
        raise TreebankFormatError(source, root.line, f"root element is <{root.tag}>, expected <alpino_ds>")
    top = [el for el in root.children if el.tag == "node"]
    if len(top) != 1:
        raise TreebankFormatError(source, root.line, f"expected one top <node>, found {len(top)}")
    words: dict[int, str] = {}
    per_token: dict[int, dict[str, str]] = {}
    tree = _convert(top[0], words, per_token, source, projection="-/_")
    if tree is None:
        raise TreebankFormatError(source, top[0].line, "the tree has no terminals")
    n = len(words)
    if sorted(words) != list(range(n)):
        missing = sorted(set(range(max(words) + 1)) - set(words))
        raise TreebankFormatError(source, top[0].line, f"terminals do not cover 0..{max(words)}: "
                                  f"missing {missing}")
    word_list = [words[i] for i in range(n)]
    for el in root.children:
        if el.tag == "sentence":
            tokens = "".join(el.text).split()
            if tokens and len(tokens) != n:
                raise TreebankFormatError(source, el.line, f"<sentence> has {len(tokens)} tokens "
                                          f"but the tree has {n} terminals")
    annotations = {name: [per_token[i][name] for i in range(n)] for name in _ANNOTATIONS}
    return TreebankSentence(sent_id, word_list, tree, annotations)


def _int_attr(el: _Element, name: str, source: str | None) -> int:
    value = el.attrs.get(name)
    if value is None or not value.lstrip("-").isdigit():
        raise TreebankFormatError(source, el.line, f"<node> needs an integer {name!r}, got {value!r}")
    return int(value)


_ANNOTATIONS = ("function", "projection", "postag")
_HEAD = "hd"


def _convert(el: _Element, words: dict[int, str], per_token: dict[int, dict[str, str]],
             source: str | None, projection: str) -> Tree | None:
    """``projection``: the ``cat/rel`` of the largest phrase this node heads if it is a head."""
    attrs = el.attrs
    nodes = [c for c in el.children if c.tag == "node"]
    rel = attrs.get("rel", "_")
    if rel != _HEAD:
        projection = f"{attrs.get('cat', '-')}/{rel}"
    if "word" in attrs:
        if nodes:
            raise TreebankFormatError(source, el.line, "a <node> with 'word' has child nodes")
        begin, end = _int_attr(el, "begin", source), _int_attr(el, "end", source)
        if end != begin + 1 or begin < 0:
            raise TreebankFormatError(source, el.line, f"terminal {attrs['word']!r} spans "
                                      f"begin={begin} end={end}, expected one word")
        if begin in words:
            raise TreebankFormatError(source, el.line, f"two terminals at position {begin}")
        if "pos" not in attrs:
            raise TreebankFormatError(source, el.line, f"terminal {attrs['word']!r} has no 'pos'")
        words[begin] = attrs["word"]
        per_token[begin] = {"function": rel, "projection": projection, "postag": attrs.get("postag", "_")}
        return Tree(attrs["pos"], [begin])
    if "cat" in attrs:
        children = [t for t in (_convert(c, words, per_token, source, projection) for c in nodes)
                    if t is not None]
        return Tree(attrs["cat"].upper(), children) if children else None
    if "index" in attrs and not nodes:
        return None  # secondary occurrence of a co-indexed node
    raise TreebankFormatError(source, el.line, "<node> has neither 'word', 'cat' nor a bare 'index'")


def read_alpino_file(path: str | os.PathLike) -> TreebankSentence:
    """Read one Alpino XML file; the sentence id is the file name without extension."""
    path = Path(path)
    return parse_alpino_xml(path.read_bytes(), sent_id=path.stem, source=str(path))


def read_alpino(directory: str | os.PathLike, limit: int | None = None) -> list[TreebankSentence]:
    """Read every ``*.xml`` file of a folder, ordered by file name with numbers compared as
    numbers (``2.xml`` before ``10.xml``; :func:`~neurocrf.parsing.tree.natural_key`)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"Alpino treebank folder not found: {directory}")
    files = sorted(directory.glob("*.xml"), key=lambda f: natural_key(f.name))
    if not files:
        raise TreebankFormatError(directory, None, "no *.xml files in this folder")
    if limit is not None:
        files = files[:limit]
    return [read_alpino_file(f) for f in files]

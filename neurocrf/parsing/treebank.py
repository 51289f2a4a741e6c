"""One entry point for reading and writing treebanks, and the deterministic Alpino split.

Formats: ``alpino`` (a folder of ``alpino_ds`` XML files, :mod:`.alpino`), ``export`` (NeGra
export 3/4, :mod:`~neurocrf.parsing.export`), ``discbracket`` and ``bracket`` (Penn; read only) (:mod:`.bracket`).
All readers return ``list[TreebankSentence]`` and raise :class:`TreebankFormatError` (a
ValueError naming file and line) on malformed input.

Split (:func:`split_treebank`): sentences are ordered by id, numbers inside ids compared as
numbers (:func:`~neurocrf.parsing.tree.natural_key`: ``wsj_0001:2`` before ``wsj_0001:10``); the
last 10% (rounded down) are the test set, the 10% before them the dev set, the rest train. A
treebank of several files can be split by file instead (``split_files``, :func:`split_by_file`).
For the Alpino ``cdb`` folder (7,136 files with ids 0..7153, a few numbers unused) that is train = ids 0..5724 (5,710
sentences), dev = ids 5725..6440 (713), test = ids 6441..7153 (713).

A *treebank config* (``configs/treebank/*.yaml``, a plain dict; :data:`TREEBANK_DEFAULTS`) says
where the trees are, how to split them and how the supertags see them; :func:`load_treebank`
reads and splits it::

    path: ${paths.shared_data}/alpino/cdb   # a file or an Alpino folder
    format: alpino                          # alpino | export | discbracket | bracket | null (guess)
    reader: {}                              # options of read_treebank
    limit: null                             # keep only the first N sentences (debugging)
    move_punctuation: true                  # re-attach punctuation inside the tree first
    dev: 0.1                                # split fractions (deterministic, by sentence id)
    test: 0.1
    split_files: null                       # or {dev: [first, last], test: [first, last]}: the
                                            # files (id before the last ':') in these ranges,
                                            # numbers compared as numbers; the rest is train
    h: 0                                    # markovization of the binarization
    v: 1
    generate: null                          # {sentences, seed, max_words}: write a random
                                            # treebank at ``path`` if it does not exist (tests)
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from neurocrf.conventions import SPLITS
from neurocrf.parsing.alpino import read_alpino
from neurocrf.parsing.bracket import read_discbracket, read_penn, write_discbracket
from neurocrf.parsing.export import read_export, write_export
from neurocrf.parsing.tree import TreebankFormatError, TreebankSentence, natural_key, random_tree

__all__ = ["FORMATS", "SPLITS", "TREEBANK_DEFAULTS", "TreebankFormatError", "check_split", "data_root",
           "load_split", "load_treebank", "read_treebank", "select_split", "split_by_file",
           "split_treebank", "treebank_options", "write_sample_treebank", "write_treebank"]

log = logging.getLogger(__name__)

FORMATS = ("alpino", "export", "discbracket", "bracket")
"""Treebank formats :func:`read_treebank` reads."""

TREEBANK_DEFAULTS: dict[str, Any] = {
    "name": None,
    "path": None,
    "format": None,
    "reader": {},
    "limit": None,
    "move_punctuation": True,
    "dev": 0.1,
    "test": 0.1,
    "split_files": None,
    "h": 0,
    "v": 1,
    "generate": None,
}
"""Options of a treebank config and their defaults."""


def data_root() -> Path:
    """Folder of the shared corpora: ``$NEUROCRF_DATA``, else ``../shared/data`` next to the
    project root."""
    env = os.environ.get("NEUROCRF_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _guess_format(path: Path) -> str:
    if path.is_dir():
        return "alpino"
    suffix = path.suffix.lower()
    if suffix == ".export":
        return "export"
    if suffix in (".discbracket", ".dbr"):
        return "discbracket"
    if suffix in (".mrg", ".bracket", ".mrg.txt", ".ptb"):
        return "bracket"
    raise ValueError(f"cannot tell the treebank format of {path}; pass fmt= one of {FORMATS}")


def read_treebank(path: str | os.PathLike, fmt: str | None = None, **options) -> list[TreebankSentence]:
    """Read a treebank. ``fmt`` is one of :data:`FORMATS` (guessed from the path if None: a folder
    is Alpino, ``.export``, ``.discbracket``/``.dbr``, ``.mrg``). ``options`` go to the reader
    (e.g. ``fmt_version=4`` -> export ``fmt``, ``root_label=...``, ``limit=`` for Alpino,
    ``traces="resolve"`` for Penn brackets: :func:`~neurocrf.parsing.bracket.read_penn`)."""
    path = Path(path)
    fmt = fmt or _guess_format(path)
    if fmt == "alpino":
        return read_alpino(path, **options)
    if fmt == "export":
        version = options.pop("fmt_version", None)
        return read_export(path, version, **options)
    if fmt == "discbracket":
        return read_discbracket(path, **options)
    if fmt == "bracket":
        if path.is_dir():
            out: list[TreebankSentence] = []
            for f in sorted(path.glob("*.mrg"), key=lambda f: natural_key(f.name)):
                out.extend(read_penn(f, **options))
            return out
        return read_penn(path, **options)
    raise ValueError(f"unknown treebank format {fmt!r}; expected one of {FORMATS}")


def write_treebank(target: str | os.PathLike | TextIO, sentences: Iterable[TreebankSentence],
                   fmt: str = "discbracket", **options) -> None:
    """Write ``discbracket`` (options: ``write_ids``) or ``export`` (options: ``fmt_version`` 3/4,
    ``root_label``)."""
    if fmt == "discbracket":
        write_discbracket(target, sentences, **options)
    elif fmt == "export":
        version = options.pop("fmt_version", 3)
        write_export(target, sentences, version, **options)
    else:
        raise ValueError(f"cannot write treebank format {fmt!r}; expected 'discbracket' or 'export'")


def split_treebank(sentences: Sequence[TreebankSentence], dev: float = 0.1,
                   test: float = 0.1) -> dict[str, list[TreebankSentence]]:
    """Deterministic split by id (numbers compared as numbers): last ``test`` fraction -> test, the
    ``dev`` fraction before it -> dev, the rest -> train (fractions of the total, rounded down)."""
    if not (0 <= dev < 1 and 0 <= test < 1 and dev + test < 1):
        raise ValueError(f"bad split fractions dev={dev}, test={test}")
    ordered = sorted(sentences, key=lambda s: natural_key(s.id))
    n = len(ordered)
    n_test, n_dev = int(n * test + 1e-9), int(n * dev + 1e-9)
    n_train = n - n_test - n_dev
    return {"train": ordered[:n_train], "dev": ordered[n_train:n_train + n_dev],
            "test": ordered[n_train + n_dev:]}


def split_by_file(sentences: Sequence[TreebankSentence],
                  ranges: Mapping[str, Sequence[str]]) -> dict[str, list[TreebankSentence]]:
    """Split by the file a sentence comes from: its id up to the last ``:`` (``wsj_0160:3`` ->
    ``wsj_0160``; the whole id if it has none). ``ranges`` maps ``dev`` and ``test`` to
    ``[first, last]`` file names (inclusive, numbers compared as numbers); the other files are
    train. Each split keeps id order.

    >>> from neurocrf.parsing.tree import Tree
    >>> s = [TreebankSentence(f"wsj_{f:04d}:{i}", ["a"], Tree("S", [0])) for f in (1, 2, 3) for i in (1, 2)]
    >>> parts = split_by_file(s, {"dev": ["wsj_0002", "wsj_0002"], "test": ["wsj_0003", "wsj_0003"]})
    >>> {name: [x.id for x in part] for name, part in parts.items()}["dev"]
    ['wsj_0002:1', 'wsj_0002:2']
    """
    unknown = sorted(set(ranges) - {"dev", "test"})
    if unknown or not ranges:
        raise ValueError(f"split_files maps 'dev' and/or 'test' to [first, last] file names, got {dict(ranges)}")
    bounds = {}
    for name, pair in ranges.items():
        if len(pair) != 2 or natural_key(str(pair[0])) > natural_key(str(pair[1])):
            raise ValueError(f"split_files.{name} must be [first, last] with first <= last, got {list(pair)}")
        bounds[name] = (natural_key(str(pair[0])), natural_key(str(pair[1])))
    out: dict[str, list[TreebankSentence]] = {"train": [], "dev": [], "test": []}
    for sentence in sorted(sentences, key=lambda s: natural_key(s.id)):
        key = natural_key(sentence.id.rpartition(":")[0] or sentence.id)
        hits = [name for name, (lo, hi) in bounds.items() if lo <= key <= hi]
        if len(hits) > 1:
            raise ValueError(f"split_files ranges overlap at {sentence.id}: {hits}")
        out[hits[0] if hits else "train"].append(sentence)
    return out


def select_split(splits: Mapping[str, Sequence[TreebankSentence]], split: str) -> list[TreebankSentence]:
    """``splits[split]`` for a name of :data:`SPLITS`, or all of them in order for ``"all"``."""
    check_split(split)
    if split == "all":
        return [s for name in SPLITS for s in splits[name]]
    return list(splits[split])


def check_split(split: str) -> None:
    """Raise ValueError unless ``split`` is a name of :data:`SPLITS` or ``"all"``."""
    if split not in (*SPLITS, "all"):
        raise ValueError(f"split must be one of {(*SPLITS, 'all')}, got {split!r}")


def treebank_options(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``config`` completed with :data:`TREEBANK_DEFAULTS`; unknown keys raise ValueError."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(TREEBANK_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown treebank option(s) {unknown}; expected {sorted(TREEBANK_DEFAULTS)}")
    options = {**TREEBANK_DEFAULTS, **config}
    if not options["path"]:
        raise ValueError("treebank config needs a 'path'")
    return options


def write_sample_treebank(path: str | Path, sentences: int = 80, seed: int = 7,
                          max_words: int = 8, fmt: str = "discbracket") -> Path:
    """Write a random discontinuous treebank (ids 0..N-1) for tests and demos, in ``fmt``
    (``discbracket`` or ``export``).

    Words are drawn per POS tag from small lists (``n3``, ``v1`` ...), so a tagger can learn
    something, and every tree has root ``ROOT`` with at least two children (no unary root). The
    export file also carries a per-token edge label (the ``function`` annotation): the label of
    the word's parent phrase in lower case, a target an auxiliary head can learn."""
    rng = random.Random(seed)
    out: list[TreebankSentence] = []
    for i in range(sentences):
        n = rng.randint(2, max(2, max_words))
        while True:
            tree = random_tree(rng, n, p_disc=0.3, p_unary=0.1, max_children=3)
            if len(tree.children) > 1:
                break
        words = [""] * n
        for index, pos in tree.pos():
            words[index] = f"{pos.lower()}{rng.randint(0, 9)}"
        function = [""] * n
        for node in tree.subtrees():
            for child in node.children:
                if not isinstance(child, int) and child.is_preterminal:
                    function[child.children[0]] = node.label.lower()  # type: ignore[index]
        out.append(TreebankSentence(str(i), words, tree, {"function": function}))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "export":
        write_treebank(path, out, "export", root_label="ROOT")
    elif fmt == "discbracket":
        write_treebank(path, out, "discbracket", write_ids=True)
    else:
        raise ValueError(f"sample treebank format must be discbracket or export, got {fmt!r}")
    return path


def load_treebank(config: Mapping[str, Any]) -> dict[str, list[TreebankSentence]]:
    """Read and split the treebank described by ``config`` (see the module docstring).

    Returns ``{"train", "dev", "test"}`` -> sentences as read (punctuation not moved)."""
    options = treebank_options(config)
    path = Path(options["path"])
    if not path.exists():
        if options["generate"]:
            write_sample_treebank(path, **dict(options["generate"]))
            log.info("generated a random treebank at %s", path)
        else:
            raise FileNotFoundError(f"treebank not found: {path} (set treebank.path or NEUROCRF_DATA)")
    reader = dict(options["reader"] or {})
    if options["limit"] is not None and (options["format"] or "") == "alpino":
        reader.setdefault("limit", int(options["limit"]))
    sentences = read_treebank(path, options["format"], **reader)
    if options["limit"] is not None:
        sentences = sentences[: int(options["limit"])]
    if not sentences:
        raise ValueError(f"treebank {path} holds no sentences")
    if options["split_files"]:
        return split_by_file(sentences, dict(options["split_files"]))
    return split_treebank(sentences, dev=float(options["dev"]), test=float(options["test"]))


def load_split(config: Mapping[str, Any], split: str) -> list[TreebankSentence]:
    """The sentences of ``split`` (a name of :data:`SPLITS`, or ``"all"``) of the treebank that
    ``config`` describes (:func:`load_treebank`)."""
    check_split(split)
    return select_split(load_treebank(config), split)

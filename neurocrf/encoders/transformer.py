"""Transformer encoder: a Hugging Face model, one vector per word.

Words are split into subwords by the model's fast tokenizer (``is_split_into_words=True``,
``word_ids()``); a word vector is its first subword's vector, its last one's, or the mean of its
subwords (``pooling``). A word that tokenizes to no subword at all (control characters, zero-width space)
is given the tokenizer's unknown token, so every word has at least one subword.

Long sentences are never truncated. When a sentence has more subwords than fit in the model
(``limit`` = max length minus the special tokens), it is cut into overlapping windows of at most
``limit`` subwords, started every ``stride`` subwords (or ``limit - 2 * context``), each one
moved to a word start where possible and ended before a word it would cut. Each word then takes
its vector from the window that holds all of its subwords and gives it the most context on its
poorer side; a word that no window holds whole (a very long word) takes each subword from the
window where that subword has the most context. Every window is encoded as a sentence of its
own (special tokens, positions from 0), so a word of a window is encoded exactly as in a direct
pass over that window's words.

``model_path`` is a Hub id, a local folder or ``pkg:<module>`` (see :mod:`neurocrf.encoders.hf_model`).
The model's config and tokenizer files travel as plain values in ``files`` (the encoder's
vocabularies, kept in checkpoints); with ``restore=True`` the encoder is built from them alone and
``model_path`` is not read (the weights then come from the checkpoint's state dict).

A fine-tuned model (``fine_tune: true``) follows the module's train/eval mode (dropout on in
training steps, off in evaluation); a frozen one stays in eval mode.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

import torch
from torch import Tensor, nn

from neurocrf.encoders.base import Encoder, sentence_mask, with_defaults
from neurocrf.encoders.hf_model import load_config, load_tokenizer, model_files, model_source

DEFAULTS: dict[str, Any] = {
    "model_path": None,  # Hub id, local folder with config, tokenizer (and weights), or pkg:<module>
    "pooling": "first",  # first | last | mean
    "fine_tune": True,  # False: frozen weights, no gradients, always in eval mode
    "max_length": None,  # subwords per window incl. special tokens (default: the model's limit)
    "stride": None,  # subwords between window starts (default: half the window)
    "context": None,  # alternative to stride: stride = window - 2 * context
    "layers": -1,  # hidden layer(s) to use; a list is averaged
    "dropout": 0.0,
    "window_batch_size": 64,  # windows per model call
    "tokenizer_kwargs": {},  # e.g. {add_prefix_space: true} for byte-level BPE tokenizers
}
POOLINGS = ("first", "last", "mean")
FILES_KEY = "transformer_files"  # the vocabularies entry holding the model's config and tokenizer files
_INF = float("inf")


def plan_windows(starts: list[int], num_pieces: int, limit: int, stride: int) -> list[tuple[int, int]]:
    """Overlapping subword windows ``(start, end)`` (end exclusive) covering ``num_pieces`` subwords.

    Args:
        starts: sorted subword index at which each word begins (``starts[0] == 0``).
        limit: most subwords per window; stride: most subwords between two window starts.
    """
    if num_pieces <= limit:
        return [(0, num_pieces)]
    windows = []
    start = 0
    while True:
        end = min(num_pieces, start + limit)
        if end < num_pieces:
            cut = starts[bisect_right(starts, end) - 1]  # start of the word holding subword `end`
            if start < cut < end:
                end = cut  # do not cut the last word unless it alone fills the window
        windows.append((start, end))
        if end >= num_pieces:
            return windows
        furthest = min(start + stride, end)
        word_start = starts[bisect_right(starts, furthest) - 1]
        start = word_start if word_start > start else furthest


def assign_pieces(starts: list[int], num_pieces: int, windows: list[tuple[int, int]]) -> list[int]:
    """For each subword, the index of the window its vector is taken from (see the module doc)."""
    ends = [*starts[1:], num_pieces]
    window_starts = [s for s, _ in windows]
    window_ends = [e for _, e in windows]  # non-decreasing by construction

    def best(first: int, last: int) -> int | None:
        # windows holding subwords [first, last): start <= first and end >= last
        chosen, chosen_score = None, (-_INF, -_INF)
        for k in range(bisect_left(window_ends, last), bisect_right(window_starts, first)):
            start, end = windows[k]
            left = first - start if start > 0 else _INF
            right = end - last if end < num_pieces else _INF
            score = (min(left, right), left + right)
            if score > chosen_score:
                chosen, chosen_score = k, score
        return chosen

    owner = [0] * num_pieces
    for first, last in zip(starts, ends):
        whole = best(first, last)
        for piece in range(first, last):
            owner[piece] = whole if whole is not None else best(piece, piece + 1)  # type: ignore[assignment]
    return owner


class TransformerPreparer:
    """Tokens -> subword windows + the map from window subwords back to words (CPU tensors).

    Output keys: ``input_ids``/``attention_mask`` ``[num_windows, window_len]``; ``piece_index``,
    ``piece_word``, ``piece_weight`` ``[num_pieces_used]`` (flat window position, flat word
    position ``b * seq_len + t``, pooling weight); ``mask`` ``[batch, seq_len]``.
    """

    def __init__(self, tokenizer: Any, limit: int, stride: int, pooling: str) -> None:
        self.tokenizer = tokenizer
        self.limit, self.stride, self.pooling = limit, stride, pooling
        self.prefix, self.suffix = special_tokens(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.unk_id = fallback_piece(tokenizer)

    def pieces(self, sentences: list[list[str]]) -> list[list[list[int]]]:
        """Subword ids per word; a word with none gets the unknown token."""
        encoded = self.tokenizer(
            sentences, is_split_into_words=True, add_special_tokens=False, verbose=False
        )
        out = []
        for k, sentence in enumerate(sentences):
            per_word: list[list[int]] = [[] for _ in sentence]
            for piece, word in zip(encoded["input_ids"][k], encoded.word_ids(k)):
                if word is not None:
                    per_word[word].append(piece)
            out.append([ids or [self.unk_id] for ids in per_word])
        return out

    def plan(self, word_pieces: list[list[int]]) -> tuple[list[int], list[int], list[tuple[int, int]], list[int]]:
        """``(flat subword ids, word starts, windows, window of each subword)`` for one sentence."""
        flat = [piece for ids in word_pieces for piece in ids]
        starts, position = [], 0
        for ids in word_pieces:
            starts.append(position)
            position += len(ids)
        windows = plan_windows(starts, len(flat), self.limit, self.stride)
        return flat, starts, windows, assign_pieces(starts, len(flat), windows)

    def _pooled(self, start: int, count: int) -> range:
        """The subwords (flat positions) a word of ``count`` subwords from ``start`` is pooled from."""
        if self.pooling == "first":
            return range(start, start + 1)
        if self.pooling == "last":
            return range(start + count - 1, start + count)
        return range(start, start + count)

    def __call__(self, tokens: list[list[str]]) -> dict[str, Tensor]:
        mask = sentence_mask(tokens)
        width = mask.shape[1]
        rows = [b for b, sentence in enumerate(tokens) if sentence]
        contents: list[list[int]] = []
        window_of: list[int] = []  # (global window, position inside the window) per used piece
        position_of: list[int] = []
        piece_word: list[int] = []
        piece_weight: list[float] = []
        offset = len(self.prefix)
        all_pieces = self.pieces([tokens[b] for b in rows]) if rows else []
        for b, word_pieces in zip(rows, all_pieces):
            flat, starts, windows, owner = self.plan(word_pieces)
            base = len(contents)
            contents.extend(flat[s:e] for s, e in windows)
            for w, ids in enumerate(word_pieces):
                used = self._pooled(starts[w], len(ids))
                for piece in used:
                    window_of.append(base + owner[piece])
                    position_of.append(offset + piece - windows[owner[piece]][0])
                    piece_word.append(b * width + w)
                    piece_weight.append(1.0 / len(used))
        length = offset + max((len(c) for c in contents), default=0) + len(self.suffix)
        input_ids = torch.full((len(contents), length), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(contents), length), dtype=torch.long)
        for i, content in enumerate(contents):
            ids = self.prefix + content + self.suffix
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention[i, : len(ids)] = 1
        index = torch.tensor(window_of, dtype=torch.long) * length + torch.tensor(position_of, dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "piece_index": index,
            "piece_word": torch.tensor(piece_word, dtype=torch.long),
            "piece_weight": torch.tensor(piece_weight, dtype=torch.float),
            "mask": mask,
        }


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after a single sentence."""
    encoded = tokenizer([["a"]], is_split_into_words=True, add_special_tokens=True)
    ids, words = encoded["input_ids"][0], encoded.word_ids(0)
    inside = [i for i, w in enumerate(words) if w is not None]
    if not inside:
        raise ValueError("the tokenizer produced no subword for the probe word 'a'")
    return list(ids[: inside[0]]), list(ids[inside[-1] + 1 :])


def fallback_piece(tokenizer: Any) -> int:
    if tokenizer.unk_token_id is not None:
        return int(tokenizer.unk_token_id)
    probe = tokenizer([["_"]], is_split_into_words=True, add_special_tokens=False)["input_ids"][0]
    if not probe:
        raise ValueError("tokenizer has no unknown token and cannot encode '_'")
    return int(probe[0])


class TransformerEncoder(Encoder):
    """Subword windows -> ``[B, T, hidden_size]`` word vectors (0 at padding)."""

    def __init__(self, options: dict[str, Any], files: dict[str, Any] | None = None, restore: bool = False) -> None:
        super().__init__()
        from transformers import AutoModel

        if options["pooling"] not in POOLINGS:
            raise ValueError(f"transformer option pooling must be one of {POOLINGS}, got {options['pooling']!r}")
        if files is None:
            if restore:
                raise ValueError(
                    "this checkpoint holds no transformer config and tokenizer files (vocabularies"
                    f"[{FILES_KEY!r}]); it was written by an older neurocrf: retrain, or rebuild it from"
                    " the original model with neurocrf.encoders.build_vocabularies"
                )
            files = transformer_files(options)
        config = load_config(files)
        tokenizer = load_tokenizer(files, config)
        if restore:
            self.model = AutoModel.from_config(config)
        else:
            source, source_options = model_source(options["model_path"])
            self.model = AutoModel.from_pretrained(source, config=config, trust_remote_code=False, **source_options)

        max_length = self._max_length(tokenizer, options["max_length"])
        probe = TransformerPreparer(tokenizer, 1, 1, options["pooling"])
        limit = max_length - len(probe.prefix) - len(probe.suffix)
        if limit < 1:
            raise ValueError(f"max_length={max_length} leaves no room for words after the special tokens")
        stride = self._stride(options, limit)
        self.preparer = TransformerPreparer(tokenizer, limit, stride, options["pooling"])

        layers = options["layers"]
        self.layers = [layers] if isinstance(layers, int) else list(layers)
        self.fine_tune = bool(options["fine_tune"])
        self.window_batch_size = int(options["window_batch_size"])
        self.dropout = nn.Dropout(options["dropout"])
        self.output_dim = int(self.model.config.hidden_size)
        self.emits_scores = False
        if not self.fine_tune:
            self.model.requires_grad_(False)
        # from_pretrained returns eval mode and Lightning keeps the modes it finds: follow our own
        self.train(self.training)

    def _max_length(self, tokenizer: Any, configured: int | None) -> int:
        limits = [getattr(self.model.config, "max_position_embeddings", None)]
        if tokenizer.model_max_length and tokenizer.model_max_length < 1_000_000:
            limits.append(tokenizer.model_max_length)
        if configured is not None:
            limits.append(int(configured))
        limits = [x for x in limits if x is not None]
        if not limits:
            raise ValueError("cannot tell the model's max length; set `max_length`")
        return min(limits)

    @staticmethod
    def _stride(options: dict[str, Any], limit: int) -> int:
        if options["stride"] is not None and options["context"] is not None:
            raise ValueError("set either `stride` or `context` for the transformer windows, not both")
        if options["context"] is not None:
            stride = limit - 2 * int(options["context"])
        elif options["stride"] is not None:
            stride = int(options["stride"])
        else:
            stride = max(1, limit // 2)
        if not 1 <= stride <= limit:
            raise ValueError(f"window stride must be in [1, {limit}] (window of {limit} subwords), got {stride}")
        return stride

    def train(self, mode: bool = True) -> TransformerEncoder:
        super().train(mode)
        if not self.fine_tune:
            self.model.eval()  # a frozen model keeps dropout off
        return self

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        inputs = self._to_device(inputs)
        mask = inputs["mask"]
        batch, width = mask.shape
        param = next(self.model.parameters())
        out = param.new_zeros(batch * width, self.output_dim)
        if inputs["input_ids"].shape[0]:
            with torch.set_grad_enabled(self.fine_tune and torch.is_grad_enabled()):
                hidden = self._encode_windows(inputs["input_ids"], inputs["attention_mask"])
            pieces = hidden.reshape(-1, self.output_dim)[inputs["piece_index"]]
            pieces = pieces * inputs["piece_weight"].to(pieces.dtype).unsqueeze(-1)
            out = out.to(pieces.dtype).index_add(0, inputs["piece_word"], pieces)
        return self.dropout(out.view(batch, width, self.output_dim))

    def _encode_windows(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """``[num_windows, window_len]`` -> ``[num_windows, window_len, hidden_size]``."""
        chunks = []
        hidden_states = self.layers != [-1]
        for first in range(0, input_ids.shape[0], self.window_batch_size):
            part = slice(first, first + self.window_batch_size)
            output = self.model(
                input_ids=input_ids[part], attention_mask=attention_mask[part], output_hidden_states=hidden_states
            )
            if hidden_states:
                chunks.append(torch.stack([output.hidden_states[i] for i in self.layers]).mean(dim=0))
            else:
                chunks.append(output.last_hidden_state)
        return torch.cat(chunks)


def transformer_files(options: dict[str, Any]) -> dict[str, Any]:
    """The model's config and tokenizer files (plain values) for the encoder options."""
    if options.get("model_path") is None:
        raise ValueError("transformer encoder needs `model_path` (a Hub id, a local model folder or pkg:<module>)")
    return model_files(options["model_path"], options.get("tokenizer_kwargs"))


def build_vocabularies(config: dict[str, Any]) -> dict[str, Any]:
    """``{FILES_KEY: config and tokenizer files}``: what a checkpoint needs besides the weights."""
    return {FILES_KEY: transformer_files(with_defaults(config, DEFAULTS, "transformer"))}


def build_transformer(config: dict[str, Any], vocabularies: dict[str, Any] | None = None,
                      restore: bool = False) -> TransformerEncoder:
    files = (vocabularies or {}).get(FILES_KEY)
    return TransformerEncoder(with_defaults(config, DEFAULTS, "transformer"), files, restore=restore)

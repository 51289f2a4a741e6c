"""Tiny random Hugging Face models saved like a downloaded model folder or a Hub cache entry, for
offline tests."""

from __future__ import annotations

import shutil
import string
from pathlib import Path

import torch

CHARS = string.ascii_letters + string.digits + string.punctuation
# A small BiLSTM encoder config (words only, no dropout) for the supertagger tests.
TINY_ENCODER = {"name": "bilstm", "word_dim": 16, "char": None, "hidden_size": 32, "dropout": 0.0}


def save_tiny_bert(folder: Path, words: tuple[str, ...] = (), hidden_size: int = 16, layers: int = 1,
                   max_positions: int = 128, dropout: float = 0.0, seed: int = 0) -> Path:
    """A random BERT with a character-level WordPiece vocabulary (every ASCII word tokenizes to
    known pieces; ``words`` are whole-word entries too), its fast tokenizer and config written to
    ``folder``; returns ``folder``. ``dropout`` is the model's own (hidden and attention): 0 by
    default, so that short fits learn alike in train and eval mode."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *CHARS, *(f"##{c}" for c in CHARS)]
    vocab = list(dict.fromkeys(vocab))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    try:  # transformers >= 5 takes `vocab=`, 4.x `vocab_file=`
        tokenizer = transformers.BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=False)
    except (TypeError, ValueError):
        tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=False)
    tokenizer.save_pretrained(str(folder))
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * hidden_size, max_position_embeddings=max_positions,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(seed)
    transformers.BertModel(config).save_pretrained(str(folder))
    return folder


def install_in_hub_cache(folder: Path, hf_home: Path, repo_id: str) -> None:
    """Lay ``folder``'s files out as the Hub cache of ``repo_id`` under ``hf_home``
    (``hub/models--owner--name/{refs/main, snapshots/<commit>/...}``), as a download would."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for path in folder.iterdir():
        shutil.copy(path, snapshot / path.name)

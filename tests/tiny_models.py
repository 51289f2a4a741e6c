"""Tiny random Hugging Face models saved like a downloaded model folder, for offline tests."""

from __future__ import annotations

import string
from pathlib import Path


def save_tiny_bert(folder: Path, hidden_size: int = 16, layers: int = 1, dropout: float = 0.0,
                   seed: int = 0) -> Path:
    """A random BERT with a character-level WordPiece vocabulary (every ASCII word tokenizes to
    known pieces), its fast tokenizer and config written to ``folder``; returns ``folder``.
    ``dropout`` is the model's own (hidden and attention), 0 so that short fits learn alike in
    train and eval mode."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = string.ascii_letters + string.digits + string.punctuation
    vocab += list(chars) + [f"##{c}" for c in chars]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    try:  # transformers >= 5 takes `vocab=`, 4.x `vocab_file=`
        tokenizer = transformers.BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=False)
    except (TypeError, ValueError):
        tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=False)
    tokenizer.save_pretrained(str(folder))
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * hidden_size, max_position_embeddings=128,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(seed)
    transformers.BertModel(config).save_pretrained(str(folder))
    return folder

"""Encoders: tokens in, ``[batch, seq_len, output_dim]`` out.

Two calls build an encoder from a plain config dict (``config["name"]`` in ``bilstm``,
``transformer``, ``features``; the other keys are the encoder's options, see
``configs/encoder/*.yaml``)::

    vocabularies = build_vocabularies(config, train_tokens)   # reads training data + vector files
    encoder = build_encoder(config, vocabularies, num_tags)
    out = encoder(encoder.prepare(batch_tokens))              # [B, T, encoder.output_dim]

``vocabularies`` holds plain python values only, so it can be saved with the config in a
checkpoint. Rebuilding from a checkpoint is ``build_encoder(config, vocabularies, num_tags,
restore=True)`` then ``load_state_dict``: it never reads pretrained vector files, and a transformer
is built from its folder's config and tokenizer without loading its weights. (Without
``restore=True`` it works too: the vector file is still not read, the transformer's weights are.)
"""

from __future__ import annotations

from typing import Any

from neurocrf.encoders.base import Encoder
from neurocrf.encoders.templates import extract_features
from neurocrf.values import to_plain

ENCODERS = ("bilstm", "transformer", "features")
"""Encoder names ``config["name"]`` takes (``configs/encoder/<name>.yaml``)."""


def _checked(config: Any) -> tuple[dict[str, Any], str]:
    """The config as plain values (a dict) and the encoder's name, checked."""
    config = to_plain(config, "encoder")
    if not isinstance(config, dict):
        raise TypeError(f"encoder config must be a mapping, got {type(config).__name__}")
    name = config.get("name")
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder name {name!r}; expected one of {ENCODERS}")
    return config, name


def build_vocabularies(config: Any, sentences: list[list[str]]) -> dict[str, Any]:
    """Vocabularies the encoder needs, from the training sentences; plain values only."""
    config, name = _checked(config)
    if name == "bilstm":
        from neurocrf.encoders.bilstm import build_vocabularies as build

        return build(config, sentences)
    if name == "features":
        from neurocrf.encoders.features import build_vocabularies as build

        return build(config, sentences)
    from neurocrf.encoders.transformer import build_vocabularies as build

    return build(config)


def build_encoder(config: Any, vocabularies: dict[str, Any], num_tags: int, *, restore: bool = False) -> Encoder:
    """Construct the encoder module from the config and the saved vocabularies.

    Args:
        restore: True when the weights will come from a state dict (checkpoint loading): skips
            reading pretrained weights (transformer) and pretrained vector rows (BiLSTM).
    """
    config, name = _checked(config)
    if name == "bilstm":
        from neurocrf.encoders.bilstm import build_bilstm

        return build_bilstm(config, vocabularies, restore=restore)
    if name == "features":
        from neurocrf.encoders.features import build_features

        return build_features(config, vocabularies, num_tags, restore=restore)
    from neurocrf.encoders.transformer import build_transformer

    return build_transformer(config, vocabularies, restore=restore)


__all__ = ["ENCODERS", "Encoder", "build_encoder", "build_vocabularies", "extract_features"]

"""BiLSTM encoder: vocabularies, shapes, masks, char features, word dropout, rebuild."""

from __future__ import annotations

import json

import pytest
import torch

from neurocrf.encoders import build_encoder, build_vocabularies
from neurocrf.encoders.bilstm import BiLSTMEncoder

TRAIN = [["EU", "rejects", "German", "call"], ["Peter", "Blackburn", "in", "Paris"], ["the", "call", "in", "Paris"]]
SMALL = {"name": "bilstm", "word_dim": 8, "hidden_size": 6, "char_dim": 5, "char_hidden": 4, "dropout": 0.0}


def _build(**options) -> tuple[dict, BiLSTMEncoder]:
    config = {**SMALL, **options}
    vocabularies = build_vocabularies(config, TRAIN)
    return vocabularies, build_encoder(config, vocabularies, num_tags=5).eval()


def test_vocabularies_are_plain_and_ordered() -> None:
    vocabularies, _ = _build(min_count=2)
    json.dumps(vocabularies)  # plain python values only
    assert vocabularies["words"] == ["<pad>", "<unk>", "Paris", "call", "in"]  # count 2, ties alphabetical
    assert vocabularies["chars"][:2] == ["<pad>", "<unk>"] and "P" in vocabularies["chars"]
    assert vocabularies["pretrained"] is None


def test_word_ids_unk_and_lowercase_fallback() -> None:
    vocabularies, encoder = _build()
    words = vocabularies["words"]
    ids = encoder.prepare([["Paris", "THE", "Unseen"]])["words"][0].tolist()
    assert ids == [words.index("Paris"), words.index("the"), 1]
    _, lowered = _build(lowercase=True)
    assert lowered.prepare([["PARIS"]])["words"].tolist() == lowered.prepare([["paris"]])["words"].tolist()


@pytest.mark.parametrize("char", ["cnn", "lstm", None])
def test_shapes_and_padding(char: str | None) -> None:
    _, encoder = _build(char=char, num_layers=2)
    batch = [["EU", "rejects"], [], ["Peter", "Blackburn", "in", "Paris", "today"]]
    inputs = encoder.prepare(batch)
    assert inputs["mask"].tolist() == [[True, True] + [False] * 3, [False] * 5, [True] * 5]
    assert ("chars" in inputs) == (char is not None)
    out = encoder(inputs)
    assert out.shape == (3, 5, 12) and encoder.output_dim == 12 and not encoder.emits_scores
    assert out[0, 2:].abs().sum() == 0 and out[1].abs().sum() == 0
    assert out[0, :2].abs().sum() > 0
    # a sentence's states do not depend on the other sentences of the batch
    torch.testing.assert_close(encoder(encoder.prepare([batch[0]]))[0], out[0, :2])


def test_empty_batch() -> None:
    _, encoder = _build()
    assert encoder(encoder.prepare([[], []])).shape == (2, 0, 12)


@pytest.mark.parametrize("char", ["cnn", "lstm"])
def test_char_features_see_case(char: str) -> None:
    _, encoder = _build(char=char, lowercase=True)
    inputs = encoder.prepare([["Paris"], ["paris"]])
    assert inputs["words"][0].tolist() == inputs["words"][1].tolist()  # same word id
    assert inputs["chars"][0].tolist() != inputs["chars"][1].tolist()
    features = encoder._char_features(inputs["chars"], inputs["mask"])
    assert (features[0] - features[1]).abs().max() > 1e-4
    out = encoder(inputs)
    assert (out[0] - out[1]).abs().max() > 1e-4


def test_char_cnn_ignores_padding_characters() -> None:
    _, encoder = _build(char="cnn")
    alone = encoder.prepare([["in"]])
    padded = encoder.prepare([["in", "Blackburn"]])  # "in" padded to 9 characters
    a = encoder._char_features(alone["chars"], alone["mask"])[0, 0]
    b = encoder._char_features(padded["chars"], padded["mask"])[0, 0]
    torch.testing.assert_close(a, b)


def test_word_dropout_only_while_training() -> None:
    _, encoder = _build(word_dropout=1.0, char=None)
    inputs = encoder.prepare([["Paris", "call"]])
    unk = encoder.prepare([["zzz", "yyy"]])
    torch.testing.assert_close(encoder.train()(inputs), encoder.train()(unk))
    assert (encoder.eval()(inputs) - encoder.eval()(unk)).abs().max() > 1e-4


def test_frozen_embeddings() -> None:
    _, encoder = _build(freeze_embeddings=True)
    encoder(encoder.prepare(TRAIN)).sum().backward()
    assert encoder.embedding.weight.grad is None
    assert encoder.lstm.weight_ih_l0.grad is not None


def test_rebuild_from_config_vocabularies_and_state_dict() -> None:
    config = {**SMALL, "char": "lstm", "num_layers": 2}
    vocabularies = build_vocabularies(config, TRAIN)
    encoder = build_encoder(config, vocabularies, num_tags=5).eval()
    saved = json.loads(json.dumps(vocabularies))
    rebuilt = build_encoder(config, saved, num_tags=5, restore=True).eval()
    rebuilt.load_state_dict(encoder.state_dict())
    batch = [["EU", "rejects", "Unseen"], ["Paris"]]
    torch.testing.assert_close(rebuilt(rebuilt.prepare(batch)), encoder(encoder.prepare(batch)), rtol=0, atol=0)


def test_bad_config_raises() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        build_vocabularies({"name": "bilstm", "hiden_size": 3}, TRAIN)
    with pytest.raises(ValueError, match="char"):
        build_vocabularies({"name": "bilstm", "char": "gru"}, TRAIN)
    with pytest.raises(ValueError, match="unknown encoder"):
        build_vocabularies({"name": "cnn"}, TRAIN)


def test_preparer_pickles() -> None:
    import pickle

    _, encoder = _build(char="cnn")
    copy = pickle.loads(pickle.dumps(encoder.preparer))
    for key, value in encoder.prepare(TRAIN).items():
        assert torch.equal(copy(TRAIN)[key], value)


@pytest.mark.gpu
@pytest.mark.parametrize("char", ["cnn", "lstm"])
def test_runs_on_cuda(char: str) -> None:
    _, encoder = _build(char=char)
    encoder = encoder.cuda()
    inputs = encoder.prepare(TRAIN)
    expected = encoder.cpu()(inputs)
    # cuDNN runs float32 LSTMs in TF32 by default (about 1e-4 apart from the CPU): compare in float32
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out = encoder.cuda()(inputs)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-4)

"""Sparse feature encoder: exact feature strings, feature vocabulary, emissions = sum of weights."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from neurocrf.encoders import build_encoder, build_vocabularies, extract_features
from neurocrf.encoders.templates import FEATURE_SETS, normalise, short_shape, word_shape

SENTENCE = ["EU", "rejects", "Sept-12"]


def test_set1_features_of_a_known_sentence() -> None:
    assert extract_features(SENTENCE, "set1") == [
        ["bias", "w[0]=EU", "w[-1]=__BOS__", "w[+1]=rejects", "n[0]=eu"],
        ["bias", "w[0]=rejects", "w[-1]=EU", "w[+1]=Sept-12", "n[0]=rejects"],
        ["bias", "w[0]=Sept-12", "w[-1]=rejects", "w[+1]=__EOS__", "n[0]=sept-00"],
    ]


def test_set2_adds_affixes_and_full_adds_shape_and_flags() -> None:
    set1, set2, full = (extract_features(SENTENCE, name) for name in ("set1", "set2", "full"))
    assert set2[1] == set1[1] + ["p2=re", "p3=rej", "p4=reje", "s2=ts", "s3=cts", "s4=ects"]
    assert set2[0] == set1[0] + ["p2=EU", "s2=EU"]  # affixes only as long as the word
    assert full[2] == set2[2] + ["shape[0]=Xxxx-dd", "sshape[0]=Xx-d", "cap=init", "digit=has", "hyphen"]
    assert full[0][-3:] == ["shape[0]=XX", "sshape[0]=X", "cap=all"]
    assert full[1][-1] == "cap=lower"


def test_helpers_and_custom_templates() -> None:
    assert normalise("A1b22") == "a0b00"
    assert word_shape("U.S.") == "X.X." and short_shape("1999") == "d"
    features = extract_features(["a", "b", "c"], ["n[-2,2]", "window:5", "suffix:1-1"])
    assert features[0] == ["bias", "n[-2]=__BOS__", "n[+2]=c", "w[-2]=__BOS__", "w[-1]=__BOS__", "w[+1]=b",
                           "w[+2]=c", "s1=a"]
    with pytest.raises(ValueError, match="unknown feature template"):
        extract_features(["a"], ["tokne"])
    with pytest.raises(ValueError, match="unknown feature set"):
        extract_features(["a"], "set3")


def test_column_templates_read_pre_joined_tokens() -> None:
    tokens = ["EU\tNNP", "rejects\tVBZ"]
    features = extract_features(tokens, ["token", "col1[-1,0]"])
    assert features[1] == ["bias", "w[0]=rejects", "col1[-1]=NNP", "col1[0]=VBZ"]
    with pytest.raises(ValueError, match=r"token 1 \('rejects'\) has only 1 column"):
        extract_features(["EU\tNNP", "rejects"], ["col1[0]"])
    config = {"name": "features", "templates": ["col2[0]"]}
    with pytest.raises(ValueError, match="column 2"):
        build_vocabularies(config, [tokens])


def _train() -> list[list[str]]:
    return [["EU", "rejects", "call"], ["the", "call"], ["EU", "call"]]


def test_min_count_and_bias_first() -> None:
    vocab = build_vocabularies({"name": "features", "templates": "set1", "min_count": 2}, _train())["features"]
    json.dumps(vocab)
    assert vocab[0] == "bias"
    assert set(vocab) == {"bias", "w[0]=EU", "n[0]=eu", "w[-1]=__BOS__", "w[0]=call", "n[0]=call",
                          "w[+1]=__EOS__", "w[+1]=call", "w[-1]=EU"}


def test_unseen_features_are_dropped_and_emissions_are_sums() -> None:
    config = {"name": "features", "templates": "full"}
    vocabularies = build_vocabularies(config, _train())
    encoder = build_encoder(config, vocabularies, num_tags=4)
    assert encoder.emits_scores and encoder.output_dim == 4
    assert encoder.weights.weight.abs().sum() == 0  # zero-initialised
    with torch.no_grad():
        encoder.weights.weight.normal_()
    batch = [["EU", "Zorglub"], []]
    inputs = encoder.prepare(batch)
    out = encoder(inputs)
    assert out.shape == (2, 2, 4) and inputs["mask"].tolist() == [[True, True], [False, False]]
    index = {f: i for i, f in enumerate(vocabularies["features"])}
    for t, token_features in enumerate(extract_features(batch[0], "full")):
        known = [index[f] for f in token_features if f in index]
        torch.testing.assert_close(out[0, t], encoder.weights.weight[known].sum(dim=0))
    # "Zorglub" fires only bias and features seen in training (w[-1]=EU, w[+1]=__EOS__, cap=init...)
    assert "w[0]=Zorglub" not in index
    assert out[1].abs().sum() == 0


def test_gradients_reach_only_fired_features() -> None:
    config = {"name": "features", "templates": "set1"}
    vocabularies = build_vocabularies(config, _train())
    encoder = build_encoder(config, vocabularies, num_tags=3)
    encoder(encoder.prepare([["the"]]))[0, 0, 1].backward()
    grad = encoder.weights.weight.grad
    fired = {vocabularies["features"].index(f) for f in extract_features(["the"], "set1")[0]}
    assert {int(i) for i in grad[:, 1].nonzero().flatten()} == fired
    assert grad[:, [0, 2]].abs().sum() == 0


def test_rebuild_gives_identical_emissions() -> None:
    config = {"name": "features", "templates": "set2"}
    vocabularies = json.loads(json.dumps(build_vocabularies(config, _train())))
    encoder = build_encoder(config, vocabularies, num_tags=3)
    with torch.no_grad():
        encoder.weights.weight.normal_()
    rebuilt = build_encoder(config, vocabularies, num_tags=3, restore=True)
    rebuilt.load_state_dict(encoder.state_dict())
    batch = [["EU", "call", "x"], ["the"]]
    torch.testing.assert_close(rebuilt(rebuilt.prepare(batch)), encoder(encoder.prepare(batch)), rtol=0, atol=0)


def test_named_sets_are_nested() -> None:
    assert set(FEATURE_SETS["set1"]) < set(FEATURE_SETS["set2"]) < set(FEATURE_SETS["full"])


def test_features_feed_python_crfsuite(tmp_path) -> None:
    pycrfsuite = pytest.importorskip("pycrfsuite")
    trainer = pycrfsuite.Trainer(verbose=False)
    train = [(["EU", "rejects", "call"], ["B-ORG", "O", "O"]), (["UN", "calls", "EU"], ["B-ORG", "O", "B-ORG"])]
    for tokens, tags in train:
        trainer.append(pycrfsuite.ItemSequence(extract_features(tokens, "full")), tags)
    trainer.set_params({"max_iterations": 50})
    trainer.train(str(tmp_path / "model.crfsuite"))
    tagger = pycrfsuite.Tagger()
    tagger.open(str(tmp_path / "model.crfsuite"))
    assert tagger.tag(pycrfsuite.ItemSequence(extract_features(["EU", "rejects"], "full"))) == ["B-ORG", "O"]
    assert "w[0]=EU" in {name for (name, _label) in tagger.info().state_features}


def test_preparer_pickles() -> None:
    import pickle

    config = {"name": "features", "templates": ["token", "col1[0]"]}
    tokens = [["EU\tNNP", "call\tNN"]]
    encoder = build_encoder(config, build_vocabularies(config, tokens), num_tags=2)
    copy = pickle.loads(pickle.dumps(encoder.preparer))
    for key, value in encoder.prepare(tokens).items():
        assert torch.equal(copy(tokens)[key], value)


@pytest.mark.gpu
def test_runs_on_cuda() -> None:
    config = {"name": "features", "templates": "full"}
    encoder = build_encoder(config, build_vocabularies(config, _train()), num_tags=3).cuda()
    out = encoder(encoder.prepare(_train()))  # CPU inputs are moved to the module's device
    assert out.is_cuda and out.shape == (3, 3, 3)


def test_label_pair_features_give_pair_emissions() -> None:
    """With pair templates the encoder returns [B, T, L + 1, L]: rows a < L add the weights of the
    position's pair features for (a, c) to the tag scores, row L is the tag scores alone."""
    config = {"name": "features", "templates": "set1", "pair_templates": ["w[-1,0]"], "pair_min_count": 1}
    vocabularies = build_vocabularies(config, _train())
    assert "bias" not in vocabularies["pair_features"]  # the CRF's transition matrix is that feature
    assert set(vocabularies["pair_features"]) == {f for s in _train() for t in extract_features(s, ["w[-1,0]"])
                                                  for f in t if f != "bias"}
    encoder = build_encoder(config, vocabularies, num_tags=3)
    assert encoder.emits_scores and encoder.emits_pairs and encoder.pair_weights.weight.shape[1] == 9
    with torch.no_grad():
        encoder.weights.weight.normal_()
        encoder.pair_weights.weight.normal_()
    batch = [["EU", "call", "Zorglub"], ["the"]]
    out = encoder(encoder.prepare(batch))
    assert out.shape == (2, 3, 4, 3)
    plain = build_encoder({"name": "features", "templates": "set1"}, vocabularies, num_tags=3)
    plain.load_state_dict({"weights.weight": encoder.weights.weight})
    scores = plain(plain.prepare(batch))
    torch.testing.assert_close(out[:, :, 3], scores)
    index = {f: i for i, f in enumerate(vocabularies["pair_features"])}
    for t, token_features in enumerate(extract_features(batch[0], ["w[-1,0]"])):
        known = [index[f] for f in token_features[1:] if f in index]
        pair = encoder.pair_weights.weight[known].sum(0).view(3, 3)
        torch.testing.assert_close(out[0, t, :3], scores[0, t].unsqueeze(0) + pair)
    assert out[1, 1:].abs().sum() == 0  # padding
    out[0, 1, 2, 0].backward()  # previous tag 2, tag 0 at "call": only w[-1]=EU and w[0]=call
    fired = {index["w[-1]=EU"], index["w[0]=call"]}
    grad = encoder.pair_weights.weight.grad
    assert {int(i) for i in grad[:, 2 * 3 + 0].nonzero().flatten()} == fired
    assert grad.abs().sum() == len(fired)
    copy = pickle.loads(pickle.dumps(encoder.preparer))
    for key, value in encoder.prepare(batch).items():
        assert torch.equal(copy(batch)[key], value)
    with pytest.raises(ValueError, match="pair_features"):
        build_encoder(config, {"features": vocabularies["features"]}, num_tags=3)

"""What the BiLSTM's word lookup sees: casing classes, digits folded to 0, several vector sources
concatenated, words added from another source; and a tagger using all of them trains, saves a
checkpoint that loads with ``weights_only=True`` and predicts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from neurocrf.encoders import build_encoder, build_vocabularies
from neurocrf.encoders.word_shape import CASING_CLASSES, casing_class
from tests.helpers.spacy_pipeline import write_spacy_pipeline

CASES = {
    "the": "all_lower",
    "a": "all_lower",
    "EU": "all_upper",
    "U.S.": "all_upper",
    "A": "all_upper",
    "Peter": "initial_upper",
    "McDonald": "initial_upper",
    "1996": "numeric",
    "3": "numeric",
    "12.5%": "mostly_numeric",
    "1,000": "mostly_numeric",
    "F-16": "contains_digit",
    "4x4x": "contains_digit",
    "iPod": "other",
    ".": "other",
    "--": "other",
}


def test_casing_classes() -> None:
    assert CASING_CLASSES[0] == "padding"
    assert {word: CASING_CLASSES[casing_class(word)] for word in CASES} == CASES


def test_casing_ids_follow_the_words_and_pad_with_zero() -> None:
    config = {"name": "bilstm", "char": None, "hidden_size": 4, "word_dim": 5, "lowercase": True, "casing_dim": 3}
    encoder = build_encoder(config, build_vocabularies(config, [["Peter", "saw", "EU"]]), num_tags=3)
    inputs = encoder.prepare([["Peter", "saw", "EU", "1996"], ["the"]])
    names = [[CASING_CLASSES[i] for i in row] for row in inputs["casing"].tolist()]
    assert names == [
        ["initial_upper", "all_lower", "all_upper", "numeric"],
        ["all_lower", "padding", "padding", "padding"],
    ]
    assert encoder.preparer.words.items[int(inputs["words"][0, 0])] == "peter"
    assert encoder.lstm.input_size == 5 + 3
    out = encoder(inputs)
    assert out.shape == (2, 4, 8)
    # the casing class reaches the output: the same lower-cased word in two casings differs
    encoder.eval()
    upper, lower = encoder(encoder.prepare([["SAW"], ["saw"]]))
    assert not torch.allclose(upper, lower)
    # the prediction path (cached input projections per word) sees the casing too
    batch = [["Peter", "SAW", "saw", "1996"], ["EU"]]
    with torch.no_grad():
        torch.testing.assert_close(encoder.encode(batch), encoder(encoder.prepare(batch)))


def test_zero_digits_folds_the_lookup_not_the_characters() -> None:
    config = {"name": "bilstm", "hidden_size": 4, "word_dim": 5, "zero_digits": True}
    vocabularies = build_vocabularies(config, [["In", "1996", "and", "2003", "F-16"]])
    assert vocabularies["words"] == ["<pad>", "<unk>", "0000", "F-00", "In", "and"]
    assert "1" in vocabularies["chars"] and "9" in vocabularies["chars"]
    encoder = build_encoder(config, vocabularies, num_tags=3)
    inputs = encoder.prepare([["1996", "2003", "1821", "F-15", "1.5"]])
    words = [vocabularies["words"][i] for i in inputs["words"][0].tolist()]
    assert words == ["0000", "0000", "0000", "F-00", "<unk>"]
    assert not torch.equal(inputs["chars"][0, 0], inputs["chars"][0, 1])  # chars keep the digits


def test_zero_digits_off_keeps_numbers_apart() -> None:
    config = {"name": "bilstm", "hidden_size": 4, "word_dim": 5}
    words = build_vocabularies(config, [["1996", "2003"]])["words"]
    assert words == ["<pad>", "<unk>", "1996", "2003"]


def _glove(path: Path, vectors: dict[str, list[float]]) -> str:
    path.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in vectors.items()), encoding="utf-8")
    return str(path)


def test_zero_digits_pretrained_rows_take_the_first_folded_word(tmp_path: Path) -> None:
    source = _glove(tmp_path / "v.txt", {"the": [1.0, 1.0], "1996": [2.0, 2.0], "2003": [3.0, 3.0]})
    config = {"name": "bilstm", "char": None, "hidden_size": 4, "vectors": source, "zero_digits": True}
    vocabularies = build_vocabularies(config, [["the", "1821"]])
    encoder = build_encoder(config, vocabularies, num_tags=3)
    row = encoder.embedding.weight[vocabularies["words"].index("0000")]
    assert row.tolist() == [2.0, 2.0]  # "1996" comes first in the file


def test_two_sources_are_concatenated(tmp_path: Path) -> None:
    first = _glove(tmp_path / "a.txt", {"paris": [1.0, 2.0], "is": [3.0, 4.0], "rome": [5.0, 6.0]})
    second = _glove(tmp_path / "b.txt", {"Paris": [10.0, 20.0, 30.0], "nice": [40.0, 50.0, 60.0]})
    config = {"name": "bilstm", "char": None, "hidden_size": 4, "vectors": [first, second],
              "add_pretrained_words": True}
    vocabularies = build_vocabularies(config, [["Paris", "is", "nice", "today"]])
    assert vocabularies["pretrained"]["dim"] == 5
    words = vocabularies["words"]
    assert "rome" in words  # added from the first source
    weight = build_encoder(config, vocabularies, num_tags=3).embedding.weight.detach()
    assert weight[words.index("Paris")].tolist() == [1.0, 2.0, 10.0, 20.0, 30.0]
    is_row, nice_row = weight[words.index("is")].tolist(), weight[words.index("nice")].tolist()
    assert is_row[:2] == [3.0, 4.0] and is_row[2:] not in ([0.0] * 3, [40.0, 50.0, 60.0])  # random block
    assert nice_row[2:] == [40.0, 50.0, 60.0] and nice_row[:2] != [0.0, 0.0]
    with pytest.raises(ValueError, match="word_dim=2 but the vectors in .*a.txt, .*b.txt have 5"):
        build_vocabularies({**config, "word_dim": 2}, [["Paris"]])


def test_add_words_from_another_source(tmp_path: Path) -> None:
    order = _glove(tmp_path / "order.txt", {"the": [0.0], "berlin": [0.0], "oslo": [0.0], "lima": [0.0]})
    vectors = _glove(tmp_path / "v.txt", {"oslo": [1.0, 1.5], "berlin": [2.0, 2.5], "lima": [3.0, 3.5]})
    config = {"name": "bilstm", "char": None, "hidden_size": 4, "vectors": vectors, "add_pretrained_words": True,
              "add_words_from": order, "max_pretrained_words": 3}
    vocabularies = build_vocabularies(config, [["Berlin", "is", "big"]])
    words = vocabularies["words"]
    assert words[-3:] == ["the", "berlin", "oslo"] and "lima" not in words  # the first 3 of `order`
    weight = build_encoder(config, vocabularies, num_tags=3).embedding.weight.detach()
    assert weight[words.index("oslo")].tolist() == [1.0, 1.5]
    assert weight[words.index("Berlin")].tolist() == [2.0, 2.5]  # lower-cased fallback


def test_lowercase_lookup_reads_cased_sources(tmp_path: Path) -> None:
    source = _glove(tmp_path / "v.txt", {"Oslo": [1.0, 1.5], "OSLO": [9.0, 9.0], "the": [2.0, 2.5]})
    config = {"name": "bilstm", "char": None, "hidden_size": 4, "vectors": source, "lowercase": True}
    vocabularies = build_vocabularies(config, [["OSLO", "The"]])
    assert vocabularies["words"] == ["<pad>", "<unk>", "oslo", "the"]
    weight = build_encoder(config, vocabularies, num_tags=3).embedding.weight.detach()
    assert weight[2].tolist() == [1.0, 1.5]  # the first cased form in the file


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O
in IN B-PP O
1996 CD B-NP O
. . O O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
saw VBD B-VP O
GERMANY NNP B-NP I-LOC
"""


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_tagger_with_every_word_feature_checkpoints_and_predicts(tmp_path: Path) -> None:
    from neurocrf.cli.train import train
    from neurocrf.cli.utils import compose_task_config
    from neurocrf.models.tagger import Tagger

    corpus = tmp_path / "data" / "conll2003"
    corpus.mkdir(parents=True)
    for name in ("eng.train", "eng.testa", "eng.testb"):
        (corpus / name).write_text(CONLL, encoding="utf-8")
    pipeline = write_spacy_pipeline(tmp_path / "pipeline")
    glove = _glove(tmp_path / "glove.txt", {"germany": [0.5, 0.5], "the": [0.1, 0.2], "0000": [0.3, 0.3]})
    overrides = [
        "data=conll2003", f"paths.shared_data={tmp_path / 'data'}", "data.batch_size=2",
        f"encoder.vectors=[{glove},{pipeline}]", "encoder.add_pretrained_words=true", "encoder.lowercase=true",
        "encoder.zero_digits=true", "encoder.casing_dim=3", "encoder.char=lstm", "encoder.char_dim=4",
        "encoder.char_hidden=3", "encoder.hidden_size=5", "encoder.freeze_unseen_words=true",
        "~logger", "test=false", "trainer.max_epochs=1", "~callbacks.progress_bar",
        "+trainer.enable_progress_bar=false",
    ]
    out = tmp_path / "run"
    train(compose_task_config("train", out, overrides))
    checkpoint_path = out / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    encoder_config = checkpoint["hyper_parameters"]["encoder"]
    assert encoder_config["casing_dim"] == 3 and encoder_config["zero_digits"] is True

    tagger = Tagger.load(checkpoint_path)
    words = tagger.encoder.preparer.words.items
    assert "0000" in words and "1996" not in words and "germany" in words
    state = checkpoint["state_dict"]
    saved = torch.cat([state["encoder.embedding.trained.weight"], state["encoder.embedding.frozen"]])
    torch.testing.assert_close(tagger.encoder.embedding.weight, saved, rtol=0, atol=0)
    assert words.index("the") >= state["encoder.embedding.trained.weight"].shape[0]  # "the" is not in training
    predictions = tagger.predict([["Peter", "saw", "Germany", "in", "2001"], ["EU"]])
    assert [len(p.tags) for p in predictions] == [5, 1]
    assert tagger.encoder.casing_embedding.weight.shape == (len(CASING_CLASSES), 3)


@pytest.mark.parametrize("char", ["cnn", "lstm"])
def test_char_dropout_drops_character_embeddings_in_training_only(char: str) -> None:
    config = {"name": "bilstm", "hidden_size": 4, "word_dim": 5, "char": char, "char_dim": 6, "char_hidden": 3}
    vocabularies = build_vocabularies(config, [["Paris", "is", "nice"]])
    plain = build_encoder(config, vocabularies, num_tags=3)
    dropped = build_encoder({**config, "char_dropout": 1.0}, vocabularies, num_tags=3)
    assert set(dropped.state_dict()) == set(plain.state_dict())  # old checkpoints load
    dropped.load_state_dict(plain.state_dict())
    ids = plain.prepare([["Paris", "Tokyo"]])["chars"][0]  # as many characters
    # p = 1: every character embedding is 0 while training, so every word gets the same features
    features = dropped.char_encoder.train()(ids)
    torch.testing.assert_close(features[0], features[1])
    assert not torch.allclose(plain.char_encoder.train()(ids)[0], plain.char_encoder(ids)[1])
    torch.testing.assert_close(dropped.char_encoder.eval()(ids), plain.char_encoder.eval()(ids))


@pytest.mark.parametrize("option", [{"casing_dim": 3, "lowercase": True}, {"zero_digits": True}])
def test_export_refuses_word_features_its_inputs_lack(option: dict) -> None:
    from types import SimpleNamespace

    from neurocrf.models.export import ExportableTagger

    config = {"name": "bilstm", "char": None, "hidden_size": 4, "word_dim": 5, **option}
    encoder = build_encoder(config, build_vocabularies(config, [["In", "1996"]]), num_tags=3)
    with pytest.raises(ValueError, match="cannot be exported"):
        ExportableTagger(SimpleNamespace(encoder=encoder, head=None))


def _train_steps(encoder, batches: list[list[list[str]]]) -> None:
    """SGD with momentum and clipping (the CoNLL-2003 recipe's optimizer) over ``batches``."""
    optimizer = torch.optim.SGD([p for p in encoder.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    encoder.train()
    for batch in batches:
        optimizer.zero_grad()
        encoder(encoder.prepare(batch)).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 5.0)
        optimizer.step()


def test_freeze_unseen_words_trains_as_the_whole_table(tmp_path: Path) -> None:
    """The added pretrained words that training never sees get no gradient: keeping their rows
    fixed trains the same model (same start, same steps), with a parameter of the training rows only."""
    source = _glove(tmp_path / "v.txt", {w: [float(i), -float(i), 0.5] for i, w in enumerate(
        ["the", "paris", "rome", "oslo", "lima", "berlin"], start=1)})
    train = [["Paris", "is", "nice"], ["the", "cat", "sat"], ["Paris", "the", "cat"]]
    config = {"name": "bilstm", "hidden_size": 4, "char_dim": 4, "char_hidden": 3, "vectors": source,
              "add_pretrained_words": True, "dropout": 0.0}
    vocabularies = build_vocabularies(config, train)
    assert vocabularies["pretrained"]["trained_words"] == 8  # <pad> <unk> Paris the cat is nice sat
    words = vocabularies["words"]
    assert words[8:] == ["paris", "rome", "oslo", "lima", "berlin"]
    encoders = []
    for freeze in (False, True):
        torch.manual_seed(0)
        encoders.append(build_encoder({**config, "freeze_unseen_words": freeze}, vocabularies, num_tags=3))
    whole, split = encoders
    torch.testing.assert_close(split.embedding.weight, whole.embedding.weight.detach(), rtol=0, atol=0)
    assert split.embedding.trained.weight.shape == (8, 3) and not any(
        p.shape[0] == len(words) for p in split.parameters())
    _train_steps(whole, [train[:2], train[1:], train])
    _train_steps(split, [train[:2], train[1:], train])
    torch.testing.assert_close(split.embedding.weight, whole.embedding.weight.detach())
    whole.eval(), split.eval()
    batch = [["Rome", "and", "Paris"], ["berlin"]]
    rebuilt = build_encoder({**config, "freeze_unseen_words": True}, vocabularies, num_tags=3, restore=True)
    rebuilt.load_state_dict(split.state_dict())  # a checkpoint's state dict restores it
    with torch.no_grad():
        torch.testing.assert_close(split.encode(batch), whole.encode(batch))
        torch.testing.assert_close(split(split.prepare(batch)), whole(whole.prepare(batch)))
        torch.testing.assert_close(rebuilt.eval().encode(batch), split.encode(batch), rtol=0, atol=0)

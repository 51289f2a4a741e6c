"""Very long sentences through a whole Tagger: a 5,000-token sentence keeps every token (transformer
windows of a 64-subword model, BiLSTM), also after a checkpoint round trip; and the CPU BiLSTM path
(one fused LSTM call per direction over padded rows) equals the packed-sequence reference on such a
batch, outputs and gradients."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from neurocrf.data.conll import Sentence
from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.data.schemes import get_spans
from neurocrf.encoders import build_vocabularies
from neurocrf.encoders.chars import CharLSTM, dropout, run_lstm
from neurocrf.models.tagger import Tagger

transformers = pytest.importorskip("transformers")

LONG = 5000
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far"]
ENTITIES = {"cat": "ANIMAL", "dog": "ANIMAL", "mat": "THING"}
PIECES = [f"##{c}" for c in string.ascii_lowercase + string.digits]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *string.ascii_letters, *string.digits, ".", ",", *PIECES]
BILSTM = {"name": "bilstm", "word_dim": 8, "char": "cnn", "char_dim": 4, "char_hidden": 4, "hidden_size": 8}


def _sentence(length: int, seed: int) -> list[str]:
    """Known words, unknown multi-piece words ("xkcd7" -> x ##k ##c ##d ##7), punctuation and
    zero-width spaces (no subword at all)."""
    rng = random.Random(seed)
    words = []
    for _ in range(length):
        roll = rng.random()
        if roll < 0.7:
            words.append(rng.choice(WORDS))
        elif roll < 0.9:
            words.append("".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(2, 9))))
        elif roll < 0.98:
            words.append(rng.choice(".,"))
        else:
            words.append("\u200b")
    return words


def _tagged(words: list[str]) -> Sentence:
    return Sentence(tokens=words, tags=[f"B-{ENTITIES[w]}" if w in ENTITIES else "O" for w in words])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT (limit 64 positions) and its WordPiece tokenizer, saved to a folder."""
    folder = tmp_path_factory.mktemp("tiny_bert_64")
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(dict.fromkeys(VOCAB)) + "\n", encoding="utf-8")
    try:  # transformers >= 5 takes `vocab=`, 4.x `vocab_file=`
        tokenizer = transformers.BertTokenizerFast(vocab=str(vocab_file), do_lower_case=False)
        assert len(tokenizer) == len(dict.fromkeys(VOCAB))
    except (TypeError, ValueError, AssertionError):
        tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=False)
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(3)
    config = transformers.BertConfig(
        vocab_size=len(dict.fromkeys(VOCAB)), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=64,
    )
    transformers.BertModel(config).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def datamodule() -> SequenceDataModule:
    train = [_tagged(_sentence(random.Random(i).randint(3, 12), 100 + i)) for i in range(24)]
    return SequenceDataModule.from_sentences(train, file_scheme="IOB2", scheme="IOB2", batch_size=8)


def _tagger(encoder: dict, dm: SequenceDataModule) -> Tagger:
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    torch.manual_seed(0)
    return Tagger(encoder, {"kind": "first_order"}, dm.tags, dm.scheme, vocabularies, {"name": "sgd", "lr": 0.01})


def _sparse_entities(model: Tagger, words: list[str]) -> None:
    """Make about 1% of the tokens of ``words`` prefer a B- tag over O: a random model tags most
    tokens as entities, and each span costs a partition function over the whole sentence."""
    model.eval()
    with torch.no_grad():
        # emissions decide the path (not the random transitions): zero the CRF, spread the scores
        for parameter in model.head.parameters():
            parameter.zero_()
        model.projection.weight.mul_(20.0)
        emissions = model(model.encoder.prepare([words]))[0]  # [T, L]
        outside = model.tags.index("O")
        begins = [i for i, tag in enumerate(model.tags) if tag.startswith("B-")]
        gap = emissions[:, begins].max(dim=-1).values - emissions[:, outside]
        model.projection.bias[outside] += torch.quantile(gap, 0.99)


def _fit_calibrate_reload(model: Tagger, dm: SequenceDataModule, words: list[str], tmp_path: Path) -> Tagger:
    """One real training step, then :func:`_sparse_entities`, then a checkpoint round trip."""
    dm.set_input_builder(model.encoder.preparer)
    trainer = pl.Trainer(
        max_steps=1, limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    before = model.projection.weight.detach().clone()
    trainer.fit(model, datamodule=dm)
    assert not torch.equal(before, model.projection.weight)  # it trained
    _sparse_entities(model, words)
    path = tmp_path / "one_step.ckpt"
    trainer.save_checkpoint(path)
    return Tagger.load(path)


def _check(predictions, inputs: list[list[str]], tags: list[str]) -> None:
    assert len(predictions) == len(inputs)
    for prediction, words in zip(predictions, inputs):
        n = len(words)
        assert prediction.tokens == words
        assert len(prediction.tags) == len(prediction.confidences) == n
        assert set(prediction.tags) <= set(tags)
        assert all(0.0 <= c <= 1.0 + 1e-6 for c in prediction.confidences)
        expected = [(s.type, s.start, s.end) for s in get_spans(prediction.tags, prediction.scheme)]
        assert [(s.type, s.start, s.end) for s in prediction.spans] == expected
        for span in prediction.spans:
            assert 0 <= span.start < span.end <= n and span.type in {"ANIMAL", "THING"}
            assert 0.0 <= span.confidence <= 1.0 + 1e-6


def _round_trip(model: Tagger, dm: SequenceDataModule, tmp_path: Path) -> None:
    long_sentence = _sentence(LONG, seed=7)
    inputs = [_sentence(5, 1), long_sentence, [], _sentence(1, 2), _sentence(40, 3)]
    loaded = _fit_calibrate_reload(model, dm, long_sentence, tmp_path)
    batched = model.predict(inputs)
    _check(batched, inputs, dm.tags)
    assert 0 < len(batched[1].spans) < LONG // 10  # a real tagging, neither all O nor all entities
    alone = model.predict([long_sentence])[0]
    assert alone.tags == batched[1].tags
    assert alone.confidences == pytest.approx(batched[1].confidences, abs=1e-4)
    restored = loaded.predict(inputs)
    _check(restored, inputs, dm.tags)
    for ours, theirs in zip(batched, restored):
        assert ours.tags == theirs.tags
        assert ours.confidences == pytest.approx(theirs.confidences, abs=1e-5)


def test_transformer_tagger_keeps_every_token_of_a_5000_token_sentence(
    model_dir: Path, datamodule: SequenceDataModule, tmp_path: Path
) -> None:
    encoder = {"name": "transformer", "model_path": str(model_dir), "window_batch_size": 128}
    model = _tagger(encoder, datamodule)
    pieces = model.encoder.preparer.pieces([_sentence(LONG, seed=7)])[0]
    assert sum(len(p) for p in pieces) > LONG  # with the multi-piece words
    prepared = model.encoder.prepare([_sentence(LONG, seed=7)])
    assert prepared["input_ids"].shape[1] <= 64 and prepared["input_ids"].shape[0] > 100  # many windows
    _round_trip(model, datamodule, tmp_path)


def test_bilstm_tagger_keeps_every_token_of_a_5000_token_sentence(
    datamodule: SequenceDataModule, tmp_path: Path
) -> None:
    _round_trip(_tagger(BILSTM, datamodule), datamodule, tmp_path)


@pytest.mark.parametrize(("layers", "width"), [(1, LONG), (2, 400)])  # the packed reference is slow
def test_cpu_bilstm_path_equals_packed_reference_on_a_long_batch(layers: int, width: int) -> None:
    lstm = torch.nn.LSTM(6, 5, num_layers=layers, batch_first=True, bidirectional=True)
    lengths = torch.tensor([3, width, 0, 1, 17])
    x = torch.randn(len(lengths), width, 6, requires_grad=True)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(-1)
    weights = torch.randn(len(lengths), width, 10)

    out = run_lstm(lstm, x, lengths) * mask
    grads = torch.autograd.grad((out * weights).sum(), [x, *lstm.parameters()])
    packed = pack_padded_sequence(x, lengths.clamp(min=1), batch_first=True, enforce_sorted=False)
    reference = pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=width)[0] * mask
    expected = torch.autograd.grad((reference * weights).sum(), [x, *lstm.parameters()])

    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-4)
    for ours, theirs in zip(grads, expected):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_char_lstm_features_are_the_final_states_of_each_direction() -> None:
    encoder = CharLSTM(num_chars=12, char_dim=4, hidden=3)
    ids = torch.tensor([[3, 4, 5, 0, 0], [7, 0, 0, 0, 0], [1, 2, 3, 4, 11]])
    lengths = ids.ne(0).sum(dim=1)
    packed = pack_padded_sequence(encoder.embedding(ids), lengths, batch_first=True, enforce_sorted=False)
    _, (last, _) = encoder.lstm(packed)  # [2, N, hidden]
    torch.testing.assert_close(encoder(ids), torch.cat([last[0], last[1]], dim=-1))


def test_fast_cpu_dropout_keeps_the_dropout_distribution() -> None:
    values = torch.ones(200_000, requires_grad=True)
    out = dropout(values, 0.3, True)
    kept = out > 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.7))
    out.sum().backward()
    torch.testing.assert_close(values.grad, out.detach())  # gradient = the same scaled mask
    assert torch.equal(dropout(values, 0.3, False), values)
    assert dropout(values, 1.0, True).abs().sum() == 0

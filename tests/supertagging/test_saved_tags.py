"""Saved supertagger output (neurocrf.supertagging.saved_tags): the distributions a model computes,
written and read back, give the model's own k-best lists; several files mix like an ensemble of
the models; truncation, lookup and file errors."""

from __future__ import annotations

import doctest
import gzip
import json
import math
from pathlib import Path

import pytest
import torch

from neurocrf.encoders import build_vocabularies
from neurocrf.parsing.treebank import write_sample_treebank
from neurocrf.supertagging import source as source_module
from neurocrf.supertagging.data import SupertagDataModule
from neurocrf.supertagging.ensemble import SupertaggerEnsemble
from neurocrf.supertagging.saved_tags import (
    SavedSupertags,
    TagDistribution,
    read_tag_file,
    tag_distributions,
    tag_file_header,
    write_tag_file,
)
from neurocrf.supertagging.source import KBestTags, SupertagScorer, SupertagSource
from neurocrf.supertagging.supertagger import Supertagger
from tests.helpers.tiny_models import TINY_ENCODER


@pytest.fixture(scope="module")
def datamodule(tmp_path_factory: pytest.TempPathFactory) -> SupertagDataModule:
    path = write_sample_treebank(tmp_path_factory.mktemp("tb") / "tiny.discbracket", sentences=40, seed=3)
    dm = SupertagDataModule({"path": str(path), "format": "discbracket"}, batch_size=8)
    dm.setup()
    return dm


def make_model(dm: SupertagDataModule, seed: int) -> Supertagger:
    torch.manual_seed(seed)
    vocabularies = build_vocabularies(TINY_ENCODER, [s.words for s in dm.corpora["train"]])
    model = Supertagger(TINY_ENCODER, vocabularies, dm.supertags, dm.preterminals, dm.roots)
    model.eval()
    return model


def saved(model, sentences: list[list[str]], n: int, path: Path | None = None) -> SavedSupertags:
    ids = [str(i) for i in range(len(sentences))]
    distributions = tag_distributions(model, ids, sentences, n=n, batch_size=3)
    header = tag_file_header(model, distributions, ["model.ckpt"])
    if path is None:
        return SavedSupertags([header], [distributions], ["memory"])
    write_tag_file(path, header, distributions)
    return SavedSupertags.read(path)


def assert_same_kbest(got: list[KBestTags], expected: list[KBestTags]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.tokens == b.tokens and a.preterminals == b.preterminals
        assert [[t for t, _ in c] for c in a.candidates] == [[t for t, _ in c] for c in b.candidates]
        assert [w for c in a.candidates for _, w in c] == pytest.approx([w for c in b.candidates for _, w in c],
                                                                        abs=1e-5)
        assert a.supertag_probs == pytest.approx(b.supertag_probs, rel=1e-5)


@pytest.mark.parametrize("name", ["tags.jsonl", "tags.jsonl.gz"])
def test_saved_output_gives_the_models_kbest(tmp_path: Path, datamodule: SupertagDataModule, name: str) -> None:
    model = make_model(datamodule, 0)
    sentences = [s.words for s in datamodule.corpora["dev"]]
    tags = saved(model, sentences + [[]], n=6, path=tmp_path / name)
    for k in (1, 4, 6):
        assert_same_kbest(tags.predict_kbest(sentences, k=k), model.predict_kbest(sentences, k=k))
    # looked up by words: any order, any subset, strings too; an empty sentence has no tags
    some = [sentences[3], sentences[0]]
    assert_same_kbest(tags.predict_kbest([" ".join(w) for w in some] + [[]], k=4)[:2],
                      model.predict_kbest(some, k=4))
    assert tags.predict_kbest([[]], k=4)[0].candidates == []
    assert tags.supertags == model.supertags and tags.roots == model.roots and tags.transform == model.transform
    if name.endswith(".gz"):
        with gzip.open(tmp_path / name, "rt") as handle:
            assert json.loads(handle.readline())["sources"] == ["model.ckpt"]
    with pytest.raises(ValueError, match="holds only the 6 best supertags"):
        tags.predict_kbest(sentences, k=7)
    with pytest.raises(ValueError, match="holds no tags for the sentence 'not there'"):
        tags.predict_kbest([["not", "there"]], k=2)


def test_round_trip_keeps_every_value(tmp_path: Path, datamodule: SupertagDataModule) -> None:
    model = make_model(datamodule, 0)
    sentences = [s.words for s in datamodule.corpora["test"]]
    ids = [f"s{i}" for i in range(len(sentences))]
    distributions = tag_distributions(model, ids, sentences, n=len(model.supertags) + 5)
    assert all(len(row) == len(model.supertags) for d in distributions for row in d.supertags)
    header = tag_file_header(model, distributions)
    write_tag_file(tmp_path / "t.jsonl", header, distributions)
    header_again, again = read_tag_file(tmp_path / "t.jsonl")
    assert header_again == header and header["n"] == len(model.supertags)
    assert [(d.id, d.words) for d in again] == [(d.id, d.words) for d in distributions]
    for a, b in zip(again, distributions):
        assert torch.equal(a.supertags, b.supertags) and torch.equal(a.preterminals, b.preterminals)
        # log-probabilities are written to 6 decimals
        assert torch.allclose(a.supertag_log_probs, b.supertag_log_probs, atol=6e-7, rtol=0)
        assert torch.allclose(a.preterminal_log_probs, b.preterminal_log_probs, atol=6e-7, rtol=0)
    # each row is the model's sorted distribution
    log_probs, pt_log_probs = (t[0] for t in model.batch_log_probs([sentences[0]]))
    assert distributions[0].supertag_log_probs[0].tolist() == pytest.approx(
        sorted(log_probs[0].tolist(), reverse=True), abs=1e-6)
    assert distributions[0].preterminal_log_probs[1].tolist() == pytest.approx(
        sorted(pt_log_probs[1].tolist(), reverse=True), abs=1e-6)


def test_several_files_mix_like_an_ensemble(tmp_path: Path, datamodule: SupertagDataModule) -> None:
    first, second = make_model(datamodule, 0), make_model(datamodule, 1)
    sentences = [s.words for s in datamodule.corpora["dev"]]
    full = len(first.supertags)
    for i, model in enumerate((first, second)):
        saved(model, sentences, n=full, path=tmp_path / f"m{i}.jsonl")
    mixed = SavedSupertags.read([tmp_path / "m0.jsonl", tmp_path / "m1.jsonl"])
    ensemble = SupertaggerEnsemble([first, second])
    assert_same_kbest(mixed.predict_kbest(sentences, k=5), ensemble.predict_kbest(sentences, k=5))
    # a file with itself is the file alone
    twice = SavedSupertags.read([tmp_path / "m0.jsonl", tmp_path / "m0.jsonl"])
    assert_same_kbest(twice.predict_kbest(sentences, k=5), first.predict_kbest(sentences, k=5))


def test_model_ensemble_and_saved_tags_are_supertag_sources(datamodule: SupertagDataModule) -> None:
    model = make_model(datamodule, 0)
    ensemble = SupertaggerEnsemble([model, make_model(datamodule, 1)])
    tags = saved(model, [s.words for s in datamodule.corpora["dev"]], n=4)
    for source in (model, ensemble, tags):
        assert isinstance(source, SupertagSource)
    assert isinstance(model, SupertagScorer) and isinstance(ensemble, SupertagScorer)
    assert not isinstance(tags, SupertagScorer)  # k-best lists, not whole distributions
    assert not isinstance(object(), SupertagSource)
    result = doctest.testmod(source_module)
    assert result.attempted > 0 and result.failed == 0


def _file(supertags: list[str], rows: list[list[tuple[int, float]]],
          transform: dict | None = None) -> tuple[dict, list]:
    header = {"format": "neurocrf-supertag-distributions", "version": 1, "supertags": supertags,
              "preterminals": ["P", "Q"], "roots": ["S"], "transform": transform or {"h": 0, "v": 1},
              "n": max(len(r) for r in rows), "sources": []}
    entry = TagDistribution("1", [f"w{i}" for i in range(len(rows))],
                            torch.tensor([[i for i, _ in r] for r in rows]),
                            torch.tensor([[math.log(p) for _, p in r] for r in rows]),
                            torch.tensor([[0, 1]] * len(rows)),
                            torch.tensor([[math.log(0.6), math.log(0.4)]] * len(rows)))
    return header, [entry]


def test_truncated_members_count_unsaved_tags_as_zero() -> None:
    # member 1 saved A, B of one token; member 2 saved C, A with the labels in another order
    one = _file(["A", "B", "C"], [[(0, 0.5), (1, 0.3)]])
    two = _file(["C", "B", "A"], [[(0, 0.6), (2, 0.2)]])
    mixed = SavedSupertags([one[0], two[0]], [one[1], two[1]], ["one", "two"])
    kbest = mixed.predict_kbest([["w0"]], k=2)[0]
    # means: A (0.5 + 0.2) / 2 = 0.35, C 0.3, B 0.15; the two best renormalised over 0.65
    assert [t for t, _ in kbest.candidates[0]] == ["A", "C"]
    assert [w for _, w in kbest.candidates[0]] == pytest.approx([-math.log(0.35 / 0.65), -math.log(0.3 / 0.65)],
                                                                rel=1e-6)
    assert kbest.supertag_probs == pytest.approx([0.35]) and kbest.preterminals == ["P"]
    assert mixed.supertags == ["A", "B", "C"]
    with pytest.raises(ValueError, match="k = 3 but one holds only the 2 best"):
        mixed.predict_kbest([["w0"]], k=3)
    with pytest.raises(ValueError, match="two was tagged for trees prepared with"):
        SavedSupertags([one[0], _file(["A"], [[(0, 1.0)]], {"h": 1, "v": 1})[0]], [one[1], one[1]], ["one", "two"])


def test_bad_files_name_file_and_line(tmp_path: Path) -> None:
    header, entries = _file(["A", "B"], [[(0, 0.5), (1, 0.5)]])
    good = json.dumps({"id": "1", "words": ["w0"], "supertags": [[0, 1]], "supertag_log_probs": [[-0.7, -0.7]],
                       "preterminals": [[0]], "preterminal_log_probs": [[0.0]]})
    cases = {
        "header": ('{"format": "other"}\n', r"h.jsonl:1: not a supertag distribution file"),
        "version": (json.dumps({**header, "version": 9}) + "\n", r"version.jsonl:1: version 9"),
        "json": (json.dumps(header) + "\n" + good + "\n{oops\n", r"json.jsonl:3: not a JSON line"),
        "keys": (json.dumps(header) + '\n{"id": "1"}\n', r"keys.jsonl:2: a sentence line needs the keys"),
        "range": (json.dumps(header) + "\n" + good.replace("[[0, 1]]", "[[0, 7]]") + "\n",
                  r"range.jsonl:2: a supertags id outside the header's 2 labels"),
        "rows": (json.dumps(header) + "\n" + good.replace('["w0"]', '["w0", "w1"]') + "\n",
                 r"rows.jsonl:2: 2 words but 1 rows of supertags"),
        "ragged": (json.dumps(header) + "\n"
                   + good.replace('"supertags": [[0, 1]], "supertag_log_probs": [[-0.7, -0.7]]',
                                  '"supertags": [[0, 1], [0]], "supertag_log_probs": [[-0.7, -0.7], [0.0]]')
                   .replace('["w0"]', '["w0", "w1"]')
                   .replace('[[0]], "preterminal_log_probs": [[0.0]]',
                            '[[0], [0]], "preterminal_log_probs": [[0.0], [0.0]]') + "\n",
                   r"ragged.jsonl:2: token 1: 1 supertags ids and 1 log-probabilities \(token 0 has 2\)"),
        "empty": ("", r"empty.jsonl: empty file"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / ("h.jsonl" if name == "header" else f"{name}.jsonl")
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_tag_file(path)
    with pytest.raises(FileNotFoundError, match="nothere.jsonl"):
        read_tag_file(tmp_path / "nothere.jsonl")
    with pytest.raises(ValueError, match="n must be >= 1"):
        tag_distributions(None, [], [], n=0)

"""The Penn Treebank as an LCFRS treebank: ids in numeric order, the split by file, labels with
reserved characters, and a tiny Penn-format treebank through ``neurocrf-extract`` (tree ->
supertags -> tree). Tests on the real WSJ sample are ``slow`` and skip without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from neurocrf.cli.extract import extract
from neurocrf.cli.utils import compose_task_config
from neurocrf.parsing.supertags import supertags_to_tree
from neurocrf.parsing.tree import Tree, TreebankSentence, natural_key
from neurocrf.parsing.treebank import data_root, load_treebank, read_treebank, split_by_file, split_treebank
from neurocrf.supertagging.data import prepare_for_extraction, read_supertag_corpus

ROOT = Path(__file__).resolve().parents[2]


def sentence(sent_id: str) -> TreebankSentence:
    return TreebankSentence(sent_id, ["a"], Tree("S", [0]))


def test_ids_sort_with_numbers_compared_as_numbers() -> None:
    ids = ["wsj_0001:10", "wsj_0002:1", "wsj_0001:2", "wsj_0001:1", "wsj_0001:9"]
    parts = split_treebank([sentence(i) for i in ids], dev=0.2, test=0.2)
    assert [s.id for s in parts["train"]] == ["wsj_0001:1", "wsj_0001:2", "wsj_0001:9"]
    assert [s.id for s in parts["dev"]] == ["wsj_0001:10"] and [s.id for s in parts["test"]] == ["wsj_0002:1"]
    assert sorted(["10.xml", "2.xml", "1.xml", "b.xml", "a10.xml", "a9.xml"], key=natural_key) == [
        "1.xml", "2.xml", "10.xml", "a9.xml", "a10.xml", "b.xml"]
    alpino_ids = [s.id for part in split_treebank([sentence(i) for i in ("10", "2", "100", "7153")]).values()
                  for s in part]
    assert alpino_ids == ["2", "10", "100", "7153"]


def test_folder_of_penn_files_is_read_in_numeric_file_order(tmp_path: Path) -> None:
    for name in ("f10", "f2", "f1"):
        (tmp_path / f"{name}.mrg").write_text("( (S (NN x)) )\n( (S (NN y)) )\n", encoding="utf-8")
    assert [s.id for s in read_treebank(tmp_path, "bracket")] == [
        "f1:1", "f1:2", "f2:1", "f2:2", "f10:1", "f10:2"]


def test_split_by_file_ranges_and_errors() -> None:
    sentences = [sentence(f"wsj_{f:04d}:{i}") for f in (1, 2, 9, 10, 11) for i in (2, 10)]
    parts = split_by_file(sentences, {"dev": ["wsj_0002", "wsj_0009"], "test": ["wsj_0010", "wsj_0011"]})
    assert [s.id for s in parts["train"]] == ["wsj_0001:2", "wsj_0001:10"]
    assert [s.id for s in parts["dev"]] == ["wsj_0002:2", "wsj_0002:10", "wsj_0009:2", "wsj_0009:10"]
    assert [s.id for s in parts["test"]][-1] == "wsj_0011:10"
    with pytest.raises(ValueError, match="first <= last"):
        split_by_file(sentences, {"dev": ["wsj_0009", "wsj_0002"]})
    with pytest.raises(ValueError, match="'dev' and/or 'test'"):
        split_by_file(sentences, {"valid": ["wsj_0002", "wsj_0002"]})
    with pytest.raises(ValueError, match="overlap at wsj_0002:2"):
        split_by_file(sentences, {"dev": ["wsj_0001", "wsj_0002"], "test": ["wsj_0002", "wsj_0003"]})


# Three files: a wh-question (*T*), an extraposed relative clause (*ICH*) with a label holding
# the reserved '|' (ADVP|PRT, read as ADVP), and right node raising (*RNR*).
PENN_FILES = {
    "wsj_0001": """( (SBARQ (WHNP-1 (WP What)) (SQ (VBD did) (NP-SBJ (PRP you)) (VP (VB see) (NP (-NONE- *T*-1))))
   (. ?)) )
( (S (NP-SBJ (NP (DT A) (NN man)) (SBAR (-NONE- *ICH*-1))) (VP (VBD came) (ADVP|PRT (RB in))
   (SBAR-1 (WHNP-2 (WP who)) (S (NP-SBJ (-NONE- *T*-2)) (VP (VBD knew))))) (. .)) )
""",
    "wsj_0002": """( (S (NP-SBJ (PRP They)) (VP (VP (VBD bought) (NP (-NONE- *RNR*-1))) (CC and)
   (VP (VBD sold) (NP (-NONE- *RNR*-1))) (, ,) (ADVP (RB today)) (, ,) (NP-1 (NNS shares))) (. .)) )
""",
    "wsj_0010": """( (S (NP-SBJ (PRP It)) (VP (VBD rained)) (. .)) )
""",
}


@pytest.fixture()
def penn_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ptb"
    folder.mkdir()
    for name, text in PENN_FILES.items():
        (folder / f"{name}.mrg").write_text(text, encoding="utf-8")
    return folder


def ptb_config(out: Path, folder: Path, *overrides: str):
    return compose_task_config("extract", out, [
        "treebank=ptb", f"treebank.path={folder}", "treebank.split_files.dev=[wsj_0002,wsj_0002]",
        "treebank.split_files.test=[wsj_0010,wsj_0099]", *overrides])


def test_extract_on_a_penn_treebank_round_trips_the_resolved_trees(tmp_path: Path, penn_folder: Path) -> None:
    cfg = ptb_config(tmp_path / "out", penn_folder)
    assert cfg.treebank.reader.traces == "resolve"
    stats = extract(cfg)
    assert [stats[s]["sentences"] for s in ("train", "dev", "test")] == [2, 1, 1]
    assert stats["total"]["max_fanout"] == 2
    splits = load_treebank(cfg.treebank)
    assert splits["train"][1].tree == Tree.parse(
        "(ROOT (S (NP (NP (DT 0) (NN 1)) (SBAR (S (WHNP (WP 4)) (VP (VBD 5))))) (VP (VBD 2) (ADVP (RB 3)))"
        " (. 6)))")
    for split in ("train", "dev", "test"):
        corpus = read_supertag_corpus(tmp_path / "out" / f"{split}.supertags")
        for gold, tagged in zip(splits[split], corpus, strict=True):
            moved = prepare_for_extraction(gold, True)
            assert supertags_to_tree(tagged.supertags, tagged.preterminals, tagged.words) == moved.tree


def test_reserved_label_is_refused_naming_file_and_tree(tmp_path: Path) -> None:
    path = tmp_path / "t.discbracket"
    path.write_text("(ROOT (S (A 0=a) (B 1=b)))\tid=first\n(ROOT (S|X (A 0=a) (B 1=b)))\tid=second\n", encoding="utf-8")
    cfg = compose_task_config("extract", tmp_path / "out", [
        f"treebank.path={path}", "treebank.generate=null", "treebank.dev=0", "treebank.test=0"])
    with pytest.raises(ValueError, match=rf"treebank {path}: sentence second: label 'S\|X' contains reserved"):
        extract(cfg)


@pytest.mark.slow
def test_wsj_sample_split_traces_and_round_trip(tmp_path: Path) -> None:
    """Real data: the configured split, the trace statistics of docs/results.md and the
    tree -> supertags -> tree identity on the training trees."""
    if not (data_root() / "ptb_sample").is_dir():
        pytest.skip("Penn Treebank sample not available (set NEUROCRF_DATA)")
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from ptb_trace_report import trace_report

    report = trace_report(data_root() / "ptb_sample")
    assert report["sentences_with_coindexed_traces"] == 1411
    assert report["remove"]["as_read"]["discontinuous_sentences"] == 0
    assert report["resolve"]["as_read"]["discontinuous_sentences"] == 731
    assert report["resolve"]["as_read"]["fanout"] == {"1": 76517, "2": 1032, "3": 1}
    cfg = compose_task_config("extract", tmp_path, ["treebank=ptb"])
    splits = load_treebank(cfg.treebank)
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [3253, 316, 345]
    assert splits["dev"][0].id == "wsj_0150:1" and splits["test"][-1].id == "wsj_0199:3"
    extract(cfg)
    corpus = read_supertag_corpus(tmp_path / "train.supertags")
    differ = [gold.id for gold, tagged in zip(splits["train"], corpus, strict=True)
              if supertags_to_tree(tagged.supertags, tagged.preterminals, tagged.words)
              != prepare_for_extraction(gold, True).tree]
    # one tree whose supertags also derive another tree: three VP_2 nodes in one chain (see
    # docs/results.md); every other training tree comes back exactly
    assert differ == ["wsj_0039:9"]

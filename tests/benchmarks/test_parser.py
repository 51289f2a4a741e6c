"""scripts/bench_parser.py: the parser from gold supertags plus distractors recovers every gold
tree when gold is the best candidate, and the table covers every setting."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from neurocrf.parsing.tree import TreebankSentence, random_tree
from neurocrf.parsing.treebank import write_sample_treebank

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_parser import benchmark_parser, main  # noqa: E402


def test_benchmark_recovers_gold_trees_when_gold_is_best() -> None:
    rng = random.Random(9)
    sentences = []
    for i in range(30):
        n = rng.randint(1, 14)
        sentences.append(TreebankSentence(str(i), [f"w{j}" for j in range(n)], random_tree(rng, n, p_disc=0.4)))
    stats = benchmark_parser(sentences, k=5, gold_best=True)
    assert stats["sentences"] == 30 and stats["fallbacks"] == 0 and stats["exact"] == 30
    assert stats["sentences_per_second"] > 0
    stats = benchmark_parser(sentences, k=5, gold_best=False, noise="same_pos")
    assert stats["sentences"] == 30 and stats["exact"] <= 30
    with pytest.raises(ValueError, match="noise must be one of"):
        benchmark_parser(sentences, noise="uniform")


def test_main_prints_one_row_per_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sample_treebank(tmp_path / "tiny.discbracket", sentences=20, seed=4)
    rows = main(["--treebank", str(path), "--split", "all", "--k", "3"])
    assert [(r["noise"], r["gold_best"]) for r in rows] == [
        ("frequency", True), ("frequency", False), ("same_pos", True), ("same_pos", False)]
    assert all(r["sentences"] == 20 for r in rows) and rows[0]["exact"] == 20
    out = capsys.readouterr().out
    assert "all split: 20 sentences" in out and out.count("| 2 by ") == 4

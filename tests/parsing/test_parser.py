"""The k-best supertag parser: gold reproduction, optimality, ambiguity, fallbacks, limits."""

from __future__ import annotations

import doctest
import itertools
import math
import random
import time

import pytest
import torch

from neurocrf.parsing import deduction
from neurocrf.parsing import parser as parser_module
from neurocrf.parsing.deduction import deduce
from neurocrf.parsing.grammar import Supertag
from neurocrf.parsing.parser import NOPARSE, Parser, noparse_tree
from neurocrf.parsing.supertags import extract_from_prepared, extract_supertags
from neurocrf.parsing.transforms import prepare_tree
from neurocrf.parsing.tree import Tree, TreebankSentence, random_tree


def _sentences(seed: int, count: int, max_words: int = 14, p_disc: float = 0.4
               ) -> list[TreebankSentence]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = rng.randint(1, max_words)
        tree = random_tree(rng, n, p_disc=p_disc)
        out.append(TreebankSentence(str(i), [f"w{j}" for j in range(n)], tree))
    return out


def _roots(sentences: list[TreebankSentence]) -> set[str]:
    return {prepare_tree(s.tree).label for s in sentences}


def test_gold_k1_reproduces_gold_tree() -> None:
    sentences = _sentences(seed=3, count=200)
    parser = Parser(_roots(sentences), k=1)
    for sent in sentences:
        gold = extract_supertags(sent)
        result = parser.parse(sent.words, [[(t, 0.0)] for t in gold.tags], gold.preterminals)
        assert not result.fallback and result.status == "ok"
        assert result.tree == sent.tree
        assert result.skipped == 0 and result.items >= len(sent.words)


def test_gold_with_distractors_found_when_gold_is_best() -> None:
    sentences = _sentences(seed=5, count=120)
    gold = [extract_supertags(s) for s in sentences]
    pool = sorted({t for tags in gold for t in tags.tags})
    rng = random.Random(0)
    k = 8
    parser = Parser(_roots(sentences), k=k)
    total_items_k1 = total_items_k = 0
    for sent, tags in zip(sentences, gold):
        cands = []
        for tag in tags.tags:
            noise = rng.sample([t for t in pool if t != tag], k - 1)
            weights = sorted(rng.uniform(0.0, 3.0) for _ in range(k))
            cands.append(list(zip([tag, *noise], weights)))
            rng.shuffle(cands[-1])  # order of the list must not matter
        result = parser.parse(sent.words, cands, tags.preterminals)
        assert result.tree == sent.tree
        best = sum(min(w for _, w in c) for c in cands)
        assert result.weight == pytest.approx(best)
        total_items_k += result.items
        total_items_k1 += len(sent.words)
    assert total_items_k > total_items_k1  # distractors were really combined


def test_best_derivation_matches_brute_force() -> None:
    """The first goal popped has the minimum total weight over all tag choices (k^n)."""
    rng = random.Random(17)
    checked = parsed = 0
    while checked < 40:
        n = rng.randint(2, 5)
        trees = [random_tree(rng, n, labels=("S", "X"), p_disc=0.5) for _ in range(3)]
        prepared = [prepare_tree(t) for t in trees]
        per_tree = [extract_from_prepared(p) for p in prepared]
        roots = {p.label for p in prepared}
        cands = []
        for pos in range(n):
            tags = list(dict.fromkeys(tags[pos] for tags in per_tree))
            cands.append([(tag, rng.uniform(0.0, 2.0)) for tag in tags])
        best = math.inf
        for choice in itertools.product(*cands):
            result = deduce([[c] for c in choice], roots)
            if result.derivation is not None:
                best = min(best, sum(w for _, w in choice))
        result = deduce(cands, roots)
        if math.isinf(best):
            assert result.derivation is None and result.status == "noparse"
        else:
            parsed += 1
            assert result.status == "ok"
            assert result.weight == pytest.approx(best)
        checked += 1
    assert parsed >= 30


def _ambiguous_candidates(w1a: float, w1b: float, w2a: float, w2b: float) -> list:
    # reading A: (S (X (a 0) (b 1)) (c 2)); reading B: (S (a 0) (Y (b 1) (c 2)))
    return [
        [("@pt 1 t - -", 0.0)],
        [("X 1 x0t @pt -", w1a), ("S 2 x0ty0 @pt Y", w1b)],
        [("S 2 x0t X -", w2a), ("Y 2 t - -", w2b)],
    ]


@pytest.mark.parametrize("weights, expected, total", [
    ((0.1, 0.5, 1.0, 0.2), "(S (a 0) (Y (b 1) (c 2)))", 0.7),   # B although A is best at token 1
    ((0.1, 0.5, 0.5, 0.2), "(S (X (a 0) (b 1)) (c 2))", 0.6),   # A although B is best at token 2
    ((2.0, 0.1, 0.3, 0.4), "(S (a 0) (Y (b 1) (c 2)))", 0.5),
])
def test_ambiguous_candidates_pick_lower_total_weight(weights, expected, total) -> None:
    parser = Parser({"S"}, k=2)
    result = parser.parse(["w0", "w1", "w2"], _ambiguous_candidates(*weights), ["a", "b", "c"])
    assert str(result.tree) == expected
    assert result.weight == pytest.approx(total)


def test_fallback_when_tags_cannot_combine() -> None:
    parser = Parser({"S"}, k=3)
    cands = [[("@pt 1 t - -", 0.1)], [("X 2 t - -", 0.2), ("S 2 tx0 @pt -", 0.3)]]
    result = parser.parse(["a", "b"], cands, ["TOP+N", "V"])
    assert result.fallback and result.status == "noparse"
    assert result.tree == Tree.parse("(NOPARSE (TOP (N 0)) (V 1))")
    assert result.tree.label == NOPARSE and math.isinf(result.weight)
    # goal label not among the roots -> fallback too
    cands = [[("@pt 1 t - -", 0.1)], [("S 2 x0t @pt -", 0.2)]]
    assert not parser.parse(["a", "b"], cands, ["N", "V"]).fallback
    assert Parser({"TOP"}).parse(["a", "b"], cands, ["N", "V"]).fallback


def test_unparseable_supertags_are_skipped_and_counted() -> None:
    parser = Parser({"S"}, k=5)
    cands = [[("@pt 1 t - -", 0.1), ("garbage", 0.0), ("<unk>", 0.0)],
             [("S 2 x0x1t NP -", 0.0), ("S 2 x0t @pt -", 0.2), ("S 2 x0t @pt", 0.0),
              ("X 2 t - -", math.inf)]]
    result = parser.parse(["a", "b"], cands, ["D", "N"])
    assert result.skipped == 5
    assert not result.fallback and str(result.tree) == "(S (D 0) (N 1))"
    # a token without any valid candidate: fallback
    result = parser.parse(["a", "b"], [[("@pt 1 t - -", 0.1)], [("junk", 0.0)]], ["D", "N"])
    assert result.fallback and result.skipped == 1


def test_only_k_best_candidates_are_used() -> None:
    cands = [[("@pt 1 t - -", 0.0)], [("X 2 t - -", 0.1), ("S 2 x0t @pt -", 0.9)]]
    assert Parser({"S"}, k=1).parse(["a", "b"], cands, ["D", "N"]).fallback
    assert not Parser({"S"}, k=2).parse(["a", "b"], cands, ["D", "N"]).fallback


def test_tensor_weights_accepted() -> None:
    cands = [[("@pt 1 t - -", torch.tensor(0.25))],
             [("S 2 x0t @pt -", torch.tensor(0.5)), ("S 2 t - -", torch.tensor(0.1))]]
    result = Parser({"S"}).parse(["a", "b"], cands, ["D", "N"])
    assert str(result.tree) == "(S (D 0) (N 1))" and result.weight == pytest.approx(0.75)


def test_input_length_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="2 words but 1 candidate"):
        Parser({"S"}).parse(["a", "b"], [[("@pt 1 t - -", 0.0)]], ["D", "N"])
    with pytest.raises(ValueError, match="k must be"):
        Parser({"S"}, k=0)


def _explosive_candidates(n: int) -> list[list[tuple[str, float]]]:
    """Tags that combine in exponentially many ways but never reach the goal label."""
    tags = ["X 2 t - -", "X 1 t - -", "X 2 ty0 - X", "X 1 x0t X -", "X 2 x0t X -", "X 1 x0,t X -",
            "X 2 tx0 X -", "X 1 x0ty0 X X", "X 2 x0,ty0 X X", "X 1 x0t,y0 X X"]
    return [[("@pt 1 t - -", 0.0)]] + [[(t, 0.1 * i) for i, t in enumerate(tags)]
                                       for _ in range(n - 1)]


def test_time_limit_respected() -> None:
    words = [f"w{i}" for i in range(40)]
    parser = Parser({"GOAL"}, k=10, time_limit=0.3, max_items=None)
    start = time.perf_counter()
    result = parser.parse(words, _explosive_candidates(40), ["N"] * 40)
    elapsed = time.perf_counter() - start
    assert result.status == "timeout" and result.fallback
    assert 0.3 <= elapsed < 3.0
    assert [str(c) for c in result.tree.children] == [f"(N {i})" for i in range(40)]


def test_item_limit_respected() -> None:
    words = [f"w{i}" for i in range(40)]
    result = Parser({"GOAL"}, k=10, time_limit=None, max_items=500).parse(
        words, _explosive_candidates(40), ["N"] * 40)
    assert result.status == "item_limit" and result.fallback
    assert 500 < result.items < 5000


def test_noparse_tree_restores_preterminals() -> None:
    assert noparse_tree(["A+B", "C"]) == Tree.parse("(NOPARSE (A (B 0)) (C 1))")


def test_doctests() -> None:
    for module in (deduction, parser_module):
        assert doctest.testmod(module).failed == 0


def test_derivation_to_tree_rejects_unfilled_hole() -> None:
    from neurocrf.parsing.deduction import Derivation, derivation_to_tree

    tag = Supertag.parse("X 2 t - -")
    with pytest.raises(ValueError, match="hole"):
        derivation_to_tree(Derivation(tag, 1, None, None), ["A", "B"])


@pytest.mark.slow
def test_alpino_gold_k1_parses_reproduce_test_split() -> None:
    from neurocrf.parsing.punctuation import move_punctuation_sentence
    from neurocrf.parsing.treebank import data_root, read_treebank, split_treebank

    path = data_root() / "alpino" / "cdb"
    if not path.is_dir():
        pytest.skip(f"Alpino treebank not found at {path}")
    split = split_treebank([move_punctuation_sentence(s) for s in read_treebank(path)])
    roots = _roots(split["train"])
    parser = Parser(roots, k=1, time_limit=10.0)
    failures = []
    for sent in split["test"]:
        gold = extract_supertags(sent)
        result = parser.parse(sent.words, [[(t, 0.0)] for t in gold.tags], gold.preterminals)
        if result.fallback or result.tree != sent.tree:
            failures.append(sent.id)
    assert len(split["test"]) == 713
    assert failures == []


def test_candidates_from_topk_renormalises() -> None:
    tags = ["@pt 1 t - -", "S 2 x0t @pt -", "X 2 t - -"]
    log_probs = torch.log(torch.tensor([[0.6, 0.2], [0.3, 0.1]]))
    cands = parser_module.candidates_from_topk(torch.tensor([[0, 2], [1, 7]]), log_probs, tags)
    assert [t for t, _ in cands[0]] == [tags[0], tags[2]]
    assert [t for t, _ in cands[1]] == [tags[1]]  # id 7 is outside the vocabulary
    assert cands[0][0][1] == pytest.approx(-math.log(0.75))
    assert cands[0][1][1] == pytest.approx(-math.log(0.25))
    assert cands[1][0][1] == pytest.approx(-math.log(0.75))
    raw = parser_module.candidates_from_topk([[0]], [[math.log(0.5)]], tags, renormalize=False)
    assert raw[0][0][1] == pytest.approx(math.log(2))
    result = Parser({"S"}).parse(["a", "b"], cands, ["D", "N"])
    assert str(result.tree) == "(S (D 0) (N 1))"

"""Supertag extraction: string form, hand examples, round trip tree -> supertags -> tree."""

from __future__ import annotations

import doctest
import random
from pathlib import Path

import pytest

from neurocrf.parsing import grammar, supertags
from neurocrf.parsing.grammar import PT, Supertag, escape_label, unescape_label
from neurocrf.parsing.supertags import extract_from_prepared, extract_supertags, supertags_to_tree
from neurocrf.parsing.transforms import prepare_tree, restore_tree
from neurocrf.parsing.tree import Tree, TreebankSentence, random_tree


def _random_trees(seed: int, count: int, max_words: int = 16, **options) -> list[Tree]:
    rng = random.Random(seed)
    return [random_tree(rng, rng.randint(1, max_words), **options) for _ in range(count)]


def _max_fanout(tree: Tree) -> int:
    return max(node.fanout() for node in tree.subtrees())


# ------------------------------------------------------------------------- string form
@pytest.mark.parametrize("text", [
    "@pt 1 t - -",
    "VP_2 2 x0t,y0 NP V",
    "S 2 x0ty0x1 @pt S|<>_2",
    "X|<> 1 tx0,x1y0,y1 X_2 Y_2",
    "A%20B 2 t - -",          # label with a space
    "%2D 2 t - -",            # label that is exactly "-"
    "%40pt%25 2 t - -",       # label "@pt%"
])
def test_supertag_string_round_trip(text: str) -> None:
    tag = Supertag.parse(text)
    assert str(tag) == text
    assert Supertag.parse(str(tag)) == tag
    assert hash(Supertag.parse(text)) == hash(tag)


@pytest.mark.parametrize("label", ["A B", "-", "@pt", "%41", "a\tb", "NP|<>_2", "x,y"])
def test_escape_label_round_trip(label: str) -> None:
    token = escape_label(label)
    assert " " not in token and "\t" not in token and token != "-" and not token.startswith("@")
    assert unescape_label(token) == label


@pytest.mark.parametrize("text, problem", [
    ("VP 2 x0t NP", "5 space-separated"),
    ("VP 3 x0t NP -", "attachment"),
    ("VP 2 x0 NP -", "exactly one"),
    ("VP 2 t,t - -", "exactly one"),
    ("VP 2 x1t NP -", "x0, x1"),
    ("VP 2 x0x1t NP -", "neighbouring"),
    ("VP 2 y0t - NP", "precedes"),
    ("VP 2 x0t - -", "does not match"),
    ("VP 2 t NP -", "does not match"),
    ("VP 2 x0tz0 NP -", "bad composition"),
    ("@pt 2 t - -", "@pt"),
    ("VP 2 x0t @foo -", "bad label"),
    ("VP 2 x0ty0 NP @pt", "bad labels"),
    ("%41 2 t - -", "canonical"),
])
def test_supertag_parse_rejects(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Supertag.parse(text)


def test_supertag_properties() -> None:
    tag = Supertag.parse("VP_2 1 x0ty0,x1y1 NP_2 V_2")
    assert (tag.fanout, tag.fanout_first, tag.fanout_second, tag.rank) == (2, 2, 2, 2)
    assert tag.is_discontinuous
    assert tag.runs() == (("x", True), ("t", False), ("y", False), ("x", True), ("y", False))
    assert not Supertag.parse("S 2 x0ty0 @pt S").is_discontinuous
    assert Supertag.parse("S 2 t - -").rank == 0


# ------------------------------------------------------------------------- hand examples
def test_extract_continuous_hand_example() -> None:
    # (S (NP (D 0) (N 1)) (VP (V 2) (N 3))): S takes 2 (smallest of VP), VP takes 3, NP takes 1
    tree = Tree.parse("(S (NP (D 0) (N 1)) (VP (V 2) (N 3)))")
    tags = [str(t) for t in extract_from_prepared(tree)]
    assert tags == ["@pt 1 t - -", "NP 1 x0t @pt -", "S 2 x0ty0 NP VP", "VP 2 t - -"]
    assert supertags_to_tree(tags, ["D", "N", "V", "N"], restore=False) == tree


def test_extract_discontinuous_hand_example() -> None:
    # VP_2 covers {1, 3}: it takes 3 (both children vanish) and keeps a hole for token 1
    tree = Tree.parse("(S (A 0) (X (VP_2 (V 1) (N 3)) (B 2)))")
    tags = [str(t) for t in extract_from_prepared(tree)]
    assert tags == ["@pt 1 t - -", "S 2 x0ty0 @pt X", "X 2 tx0 VP_2 -", "VP_2 1 t - -"]
    assert supertags_to_tree(tags, ["A", "V", "B", "N"], restore=False) == tree


def test_extract_gap_in_lhs() -> None:
    # X_2 over {0, 2}: its rule (token 2) has two components; S fills the gap with token 1
    tree = Tree.parse("(S (X_2 (A 0) (B 2)) (C 1))")
    tags = [str(t) for t in extract_from_prepared(tree)]
    assert tags == ["@pt 1 t - -", "S 2 x0tx1 X_2 -", "X_2 1 x0,t @pt -"]
    assert supertags_to_tree(tags, ["A", "C", "B"], restore=False) == tree


def test_single_token_sentence() -> None:
    sent = TreebankSentence("1", ["Ja"], Tree.parse("(TOP (S (N 0)))"))
    extracted = extract_supertags(sent)
    assert (extracted.tags, extracted.preterminals, extracted.root) == (["@pt 1 t - -"], ["TOP+S+N"], "TOP+S+N")
    tree = supertags_to_tree(extracted.tags, extracted.preterminals, sent.words)
    assert tree == sent.tree


def test_extract_rejects_unprepared_tree() -> None:
    with pytest.raises(ValueError, match="neither a preterminal nor binary"):
        extract_from_prepared(Tree.parse("(S (A 0) (B 1) (C 2))"))
    with pytest.raises(ValueError, match="yield"):
        extract_from_prepared(Tree.parse("(S (A 0) (B 2))"))


def test_supertags_to_tree_errors() -> None:
    with pytest.raises(ValueError, match="preterminals"):
        supertags_to_tree(["@pt 1 t - -"], ["A", "B"])
    with pytest.raises(ValueError, match="do not combine"):
        supertags_to_tree(["@pt 1 t - -", "S 2 tx0 @pt -"], ["A", "B"])


# ------------------------------------------------------------------------- round trip
def test_round_trip_random_discontinuous_trees() -> None:
    """tree -> prepare -> supertags -> strings -> tags -> tree -> restore is the identity."""
    trees = _random_trees(seed=7, count=600, p_disc=0.4)
    trees = [t for t in trees if _max_fanout(prepare_tree(t)) <= 3]
    assert len(trees) > 300
    assert sum(_max_fanout(t) > 1 for t in trees) > 100  # really discontinuous
    for tree in trees:
        sent = TreebankSentence("s", [f"w{i}" for i in range(len(tree.leaves()))], tree)
        extracted = extract_supertags(sent)
        tags, pts = extracted.tags, extracted.preterminals
        assert [str(Supertag.parse(t)) for t in tags] == tags
        prepared = prepare_tree(tree)
        assert extracted.root == prepared.label
        assert supertags_to_tree(tags, pts, sent.words, restore=False,
                                 roots={prepared.label}) == prepared
        assert supertags_to_tree(tags, pts, sent.words) == tree


def test_round_trip_high_fanout() -> None:
    trees = _random_trees(seed=11, count=150, max_words=22, p_disc=0.8)
    assert max(_max_fanout(prepare_tree(t)) for t in trees) >= 4
    for tree in trees:
        prepared = prepare_tree(tree)
        tags = extract_from_prepared(prepared)
        pts = [p for _, p in prepared.pos()]
        assert restore_tree(supertags_to_tree(tags, pts, restore=False)) == tree


def test_ambiguity_with_one_label_is_genuine() -> None:
    """With a single phrase label, a few trees share their supertags with another tree (two
    orders of attaching same-label constituents); the reconstruction then re-extracts to the same
    supertags, and most trees still come back exactly."""
    rng = random.Random(1)
    exact = 0
    total = 600
    for _ in range(total):
        n = rng.randint(2, 16)
        tree = random_tree(rng, n, labels=("X",), pos_tags=("A", "B"), p_disc=0.5, p_unary=0.1)
        prepared = prepare_tree(tree)
        tags = extract_from_prepared(prepared)
        rebuilt = supertags_to_tree(tags, [p for _, p in prepared.pos()], restore=False)
        exact += rebuilt == prepared
        assert extract_from_prepared(rebuilt) == tags
    assert exact >= 0.97 * total


def test_attachment_mark_disambiguates_rotation() -> None:
    # X(h, X(X(..), D)) vs X(X(h, X(..)), D): same rules except for the attachment marks
    t1 = Tree.parse("(S (A 0) (X (B 1) (X (X (C 2) (D 3)) (E 4))))")
    t2 = Tree.parse("(S (A 0) (X (X (B 1) (X (C 2) (D 3))) (E 4)))")
    tags1, tags2 = extract_from_prepared(t1), extract_from_prepared(t2)
    assert tags1 != tags2
    strip = [[(t.lhs, t.composition, t.first, t.second) for t in tags] for tags in (tags1, tags2)]
    assert strip[0] == strip[1]
    pts = ["A", "B", "C", "D", "E"]
    assert supertags_to_tree(tags1, pts, restore=False) == t1
    assert supertags_to_tree(tags2, pts, restore=False) == t2


# ------------------------------------------------------------------------- extraction of sentences
def test_extract_supertags_reads_tags_preterminals_and_the_root() -> None:
    sents = [
        TreebankSentence("a", ["x", "y", "z"], Tree.parse("(S (VP (V 0) (N 2)) (A 1))")),
        TreebankSentence("b", ["x", "y"], Tree.parse("(S (V 0) (N 1))")),
        TreebankSentence("c", ["x"], Tree.parse("(S (N 0))")),
    ]
    extracted = [extract_supertags(s) for s in sents]
    # sentence a: VP_2 takes 2 with a gap; S takes 1 into the gap
    assert [e.tags for e in extracted] == [["@pt 1 t - -", "S 2 x0tx1 VP_2 -", "VP_2 1 x0,t @pt -"],
                                           ["@pt 1 t - -", "S 2 x0t @pt -"], ["@pt 1 t - -"]]
    assert [e.preterminals for e in extracted] == [["V", "A", "N"], ["V", "N"], ["S+N"]]
    assert [e.root for e in extracted] == ["S", "S", "S+N"]
    tags = [t for e in extracted for t in e.supertags]
    assert [t.rank for t in tags] == [0, 1, 1, 0, 1, 0]
    assert [t.is_discontinuous for t in tags] == [False, True, True, False, False, False]
    with pytest.raises(ValueError, match="sentence 7: label 'X|Y'"):
        extract_supertags(TreebankSentence("7", ["a", "b"], Tree.parse("(X|Y (N 0) (V 1))")))


def test_doctests() -> None:
    for module in (grammar, supertags):
        assert doctest.testmod(module).failed == 0


def test_pt_label_reserved() -> None:
    with pytest.raises(ValueError, match="reserved"):
        extract_from_prepared(Tree.parse(f"(S ({PT} 0) (B 1))"))


# ------------------------------------------------------------------------- Alpino (slow)
def _alpino_dir() -> Path:
    from neurocrf.parsing.treebank import data_root

    path = data_root() / "alpino" / "cdb"
    if not path.is_dir():
        pytest.skip(f"Alpino treebank not found at {path}")
    return path


@pytest.mark.slow
def test_alpino_round_trip_all_trees() -> None:
    from neurocrf.parsing.punctuation import move_punctuation_sentence
    from neurocrf.parsing.treebank import read_treebank

    sentences = read_treebank(_alpino_dir())
    assert len(sentences) == 7136
    failures = []
    tokens = max_fanout = 0
    for raw in sentences:
        sent = move_punctuation_sentence(raw)
        extracted = extract_supertags(sent)
        tree = supertags_to_tree(extracted.tags, extracted.preterminals, sent.words)
        if tree != sent.tree:
            failures.append(sent.id)
        tokens += len(extracted.tags)
        max_fanout = max(max_fanout, *(max(t.fanout, t.fanout_first, t.fanout_second) for t in extracted.supertags))
    assert failures == []
    assert tokens == 140778
    assert max_fanout <= 4

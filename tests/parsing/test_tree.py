"""Tree API: yields, blocks, fanout, traversal, copying, structural equality, text forms."""

import random

import pytest

from neurocrf.parsing.tree import Tree, TreebankSentence, escape_word, parse_bracketed, random_tree, unescape_word

DISC = "(S (VP (VB 0) (NN 2)) (X 1))"


def test_leaves_blocks_fanout():
    t = Tree.parse("(S (VP (V 0) (N 2) (A 5)) (X 1) (Y 3) (Z 4))")
    vp = t.children[0]
    assert vp.leaves() == [0, 2, 5]
    assert vp.blocks() == [(0, 1), (2, 3), (5, 6)]
    assert vp.fanout() == 3
    assert t.leaves() == [0, 1, 2, 3, 4, 5]
    assert t.blocks() == [(0, 6)] and t.fanout() == 1
    assert Tree("X", [4, 3, 7]).blocks() == [(3, 5), (7, 8)]


def test_preterminal_and_pos():
    t = Tree.parse(DISC)
    assert not t.is_preterminal
    assert t.children[1].is_preterminal
    assert t.pos() == [(0, "VB"), (1, "X"), (2, "NN")]
    assert [p.label for p in t.preterminals()] == ["VB", "X", "NN"]
    assert t.height() == 3


def test_subtrees_preorder_and_postorder():
    t = Tree.parse("(S (A (a 0) (b 1)) (B (c 2)))")
    assert [n.label for n in t.subtrees()] == ["S", "A", "a", "b", "B", "c"]
    assert [n.label for n in t.postorder()] == ["a", "b", "A", "c", "B", "S"]


def test_copy_is_deep():
    t = Tree.parse(DISC)
    c = t.copy()
    assert c == t and c is not t
    c.children[0].label = "NP"
    c.children[0].children[0].children[0] = 7
    assert t.children[0].label == "VP" and t.leaves() == [0, 1, 2]


def test_equality_ignores_child_order_but_not_structure():
    a = Tree.parse(DISC)
    b = Tree("S", [Tree("X", [1]), Tree("VP", [Tree("NN", [2]), Tree("VB", [0])])])
    assert a == b
    assert a != Tree.parse("(S (VP (VB 0) (NN 1)) (X 2))")  # different yields
    assert a != Tree.parse("(S (NP (VB 0) (NN 2)) (X 1))")  # different label
    assert a != Tree.parse("(S (VB 0) (NN 2) (X 1))")  # different structure
    assert (a == "x") is False


def test_sort_orders_children_by_first_leaf():
    t = Tree("S", [Tree("X", [1]), Tree("VP", [Tree("NN", [2]), Tree("VB", [0])])]).sort()
    assert [c.label for c in t.children] == ["VP", "X"]
    assert [c.label for c in t.children[0].children] == ["VB", "NN"]


def test_str_and_parse_round_trip_with_words():
    t = Tree.parse(DISC)
    assert str(t) == DISC
    words = ["is", "(y)", "x"]
    text = t.discbracket(words)
    assert text == "(S (VP (VB 0=is) (NN 2=x)) (X 1=#LRB#y#RRB#))"
    tree, parsed_words = parse_bracketed(text)
    assert tree == t and parsed_words == {0: "is", 1: "(y)", 2: "x"}
    assert unescape_word(escape_word("a(b)c")) == "a(b)c"
    # '=' inside a word: only the first '=' separates index and word
    assert parse_bracketed("(S (X 0==))")[1] == {0: "="}


def test_pretty_lists_every_terminal():
    t = Tree.parse(DISC)
    text = t.pretty(["is", "y", "x"])
    assert text.splitlines() == ["(S", "  (VP", "    (VB 0=is)", "    (NN 2=x))", "  (X 1=y))"]


@pytest.mark.parametrize("bad", ["(S (X 0)", "(S (X 0)))", "(S (X a))", "(S ())", "", "(S (X 0)) (T 1)",
                                 "0 (S (X 1))", "(S (X 0=a) (Y 0=b))"])
def test_parse_errors(bad):
    with pytest.raises(ValueError):
        Tree.parse(bad)


def test_validate():
    Tree.parse(DISC).validate(3)
    with pytest.raises(ValueError, match="more than once"):
        Tree("S", [Tree("A", [0]), Tree("B", [0])]).validate()
    with pytest.raises(ValueError, match="not 0..3"):
        Tree.parse(DISC).validate(4)
    with pytest.raises(ValueError, match="empty"):
        Tree("S", [Tree("A", [0]), Tree("B")]).validate()
    with pytest.raises(ValueError, match="neither"):
        Tree("S", ["0"]).validate()  # type: ignore[list-item]


def test_treebank_sentence_pos_tags():
    s = TreebankSentence("7", ["is", "y", "x"], Tree.parse(DISC))
    assert s.pos_tags == ["VB", "X", "NN"]


def test_random_tree_is_valid_seeded_and_discontinuous():
    trees = [random_tree(random.Random(seed), 1 + seed % 12) for seed in range(300)]
    for seed, t in enumerate(trees):
        t.validate(1 + seed % 12)
        assert all(p.is_preterminal for p in t.preterminals())
        # every terminal sits under a preterminal
        assert sorted(i for i, _ in t.pos()) == t.leaves()
    again = [random_tree(random.Random(seed), 1 + seed % 12) for seed in range(300)]
    assert trees == again
    disc = sum(any(n.fanout() > 1 for n in t.subtrees()) for t in trees)
    unary = sum(any(len(n.children) == 1 and isinstance(n.children[0], Tree) for n in t.subtrees())
                for t in trees)
    assert disc > 50 and unary > 50

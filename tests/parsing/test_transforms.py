"""Tree transforms (unary collapsing, binarization, fanout markers) and punctuation placement."""

import random
from collections import Counter

import pytest

from neurocrf.parsing.punctuation import PUNCT_TAGS, move_punctuation, move_punctuation_sentence, punctuation_indices
from neurocrf.parsing.transforms import (
    add_fanout_markers,
    base_label,
    binarize,
    check_labels,
    collapse_unaries,
    debinarize,
    expand_unaries,
    prepare_tree,
    remove_fanout_markers,
    restore_tree,
)
from neurocrf.parsing.tree import Tree, TreebankSentence, leaf_blocks, random_tree

T = Tree.parse
FLAT = "(S (A 0) (B 1) (C 2) (D 3))"


def _random_trees(count: int, seed: int, max_words: int = 14) -> list[Tree]:
    rng = random.Random(seed)
    return [random_tree(rng, rng.randint(1, max_words)) for _ in range(count)]


# ---------------------------------------------------------------------------- unary chains
def test_collapse_unaries_including_preterminal_chains():
    t = T("(ROOT (S (VP (V 0) (NP (N 1)) (PP (P 2) (NP (AP (A 3)))))))")
    c = collapse_unaries(t)
    assert str(c) == "(ROOT+S+VP (V 0) (NP+N 1) (PP (P 2) (NP+AP+A 3)))"
    assert expand_unaries(c) == t
    assert str(t) == "(ROOT (S (VP (V 0) (NP (N 1)) (PP (P 2) (NP (AP (A 3)))))))"  # not mutated
    # a one-word sentence collapses into a single preterminal
    assert str(collapse_unaries(T("(ROOT (S (N 0)))"))) == "(ROOT+S+N 0)"


# ---------------------------------------------------------------------------- binarization
@pytest.mark.parametrize("h, expected", [
    (0, "(S (A 0) (S|<> (B 1) (S|<> (C 2) (D 3))))"),
    (1, "(S (A 0) (S|<B> (B 1) (S|<C> (C 2) (D 3))))"),
    (2, "(S (A 0) (S|<B,C> (B 1) (S|<C,D> (C 2) (D 3))))"),
])
def test_right_factored_binarization_horizontal(h, expected):
    b = binarize(T(FLAT), h=h)
    assert str(b) == expected
    assert debinarize(b) == T(FLAT)


def test_vertical_markovization_annotates_phrases_with_ancestors():
    t = T("(ROOT (S (NP (D 0) (N 1)) (V 2) (X 3)))")
    assert str(binarize(t, v=2)) == ("(ROOT (S^<ROOT> (NP^<S> (D 0) (N 1)) "
                                     "(S|<>^<ROOT> (V 2) (X 3))))")
    assert str(binarize(t, v=3)) == ("(ROOT (S^<ROOT> (NP^<S,ROOT> (D 0) (N 1)) "
                                     "(S|<>^<ROOT> (V 2) (X 3))))")
    assert debinarize(binarize(t, h=1, v=3)) == t
    with pytest.raises(ValueError):
        binarize(t, v=0)


def test_discontinuous_binarization_orders_children_by_first_leaf_and_marks_fanout():
    # children stored out of order on purpose; S's children by first leaf: VP(0) X(1) Y(3)
    t = Tree("S", [Tree("Y", [3]), Tree("X", [1]),
                   Tree("VP", [Tree("A", [4]), Tree("V", [0]), Tree("N", [2])])])
    b = binarize(t)
    assert [c.label if isinstance(c, Tree) else c for c in b.children] == ["VP", "S|<>"]
    assert b.children[1].leaves() == [1, 3] and b.children[1].fanout() == 2
    assert str(add_fanout_markers(b)) == "(S (VP_3 (V 0) (VP|<>_2 (N 2) (A 4))) (S|<>_2 (X 1) (Y 3)))"
    assert str(prepare_tree(t)) == str(add_fanout_markers(b))
    assert remove_fanout_markers(add_fanout_markers(b)) == b
    assert restore_tree(prepare_tree(t)) == t


def test_base_label():
    assert base_label("VP|<NP,PP>^<S>_2") == "VP"
    assert base_label("S+VP_3") == "S+VP"
    assert base_label("NP") == "NP"


@pytest.mark.parametrize("h, v", [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (3, 3), (50, 1)])
def test_prepare_restore_identity_on_random_trees(h, v):
    trees = _random_trees(250, seed=h * 10 + v)
    for t in trees:
        original = t.copy()
        p = prepare_tree(t, h=h, v=v)
        assert t == original and str(t) == str(original)  # input untouched
        assert restore_tree(p) == t, (str(t), str(p))
        for node in p.subtrees():
            # binary, unary-free except preterminals, markers agree with the real fanout
            assert len(node.children) == 2 or node.is_preterminal, str(p)
            k = node.fanout()
            assert node.label.endswith(f"_{k}") == (k > 1), str(p)
        assert p.leaves() == t.leaves()
        assert [i for i, _ in p.pos()] == [i for i, _ in t.pos()]


def test_random_trees_exercise_discontinuity_and_unaries():
    trees = _random_trees(250, seed=1)
    prepared = [prepare_tree(t) for t in trees]
    assert sum(any("_" in n.label for n in p.subtrees()) for p in prepared) > 60
    assert sum(any("+" in n.label for n in p.subtrees()) for p in prepared) > 60
    assert sum(any("|<>" in n.label for n in p.subtrees()) for p in prepared) > 60


@pytest.mark.parametrize("label", ["A+B", "VP|x", "S^2", "X<", "NP_2", "NP_12"])
def test_labels_that_clash_with_markers_are_rejected(label):
    t = Tree("S", [Tree(label, [Tree("A", [0]), Tree("B", [1])])])
    with pytest.raises(ValueError, match=label.replace("+", r"\+").replace("|", r"\|")
                       .replace("^", r"\^")):
        prepare_tree(t)
    check_labels(T("(S (NP_x 0) ($, 1) (-LRB- 2))"))  # allowed


def test_restore_tolerates_intermediate_root():
    assert restore_tree(T("(VP|<>_2 (A 0) (B 2))")) == T("(VP (A 0) (B 2))")


# ---------------------------------------------------------------------------- punctuation
def test_punctuation_moves_to_lowest_common_ancestor_or_root():
    # treebank placement: all punctuation under the root, which makes SMAIN discontinuous
    t = T("(TOP (SMAIN (noun 0) (verb 1) (CONJ (X 2) (Y 4))) (punct 3) (punct 5) (punct 6))")
    assert t.children[0].fanout() == 2
    m = move_punctuation(t)
    assert m == T("(TOP (SMAIN (noun 0) (verb 1) (CONJ (X 2) (punct 3) (Y 4))) (punct 5) (punct 6))")
    assert all(n.fanout() == 1 for n in m.subtrees())
    # sentence-initial punctuation goes to the root as well
    m = move_punctuation(T("(TOP (punct 0) (NP (N 1) (N 2)))"))
    assert m == T("(TOP (punct 0) (NP (N 1) (N 2)))")


def test_punctuation_inside_a_discontinuous_gap():
    # VP = {0, 3} with gap {1 (NP), 2 (punct)}; the comma lies between NP(1) and VP(3):
    # LCA(1, 3) = S, so VP keeps fanout 2 (gap made by NP) and gains nothing
    t = T("(S (VP (V 0) (V 3)) (NP (N 1)) ($, 2))")
    m = move_punctuation(t)
    assert m == t
    # a gap made only by punctuation is closed
    t = T("(ROOT (S (VP (V 0) (V 2)) (NP (N 3))) ($, 1))")
    assert move_punctuation(t) == T("(ROOT (S (VP (V 0) ($, 1) (V 2)) (NP (N 3))))")


def test_punctuation_phrase_left_empty_is_removed_and_all_punct_sentence():
    t = T("(TOP (SMAIN (N 0) (V 2)) (DU (punct 1)) (punct 3))")
    assert move_punctuation(t) == T("(TOP (SMAIN (N 0) (punct 1) (V 2)) (punct 3))")
    assert move_punctuation(T("(TOP (X (punct 0) (punct 1)))")) == T("(TOP (punct 0) (punct 1))")
    assert move_punctuation(T("(punct 0)")) == T("(punct 0)")
    t = T("(S (A 0) (B 1))")
    assert move_punctuation(t) == t


def test_punctuation_by_word_regex_and_custom_tags():
    t = T("(S (NP (N 0) (N 1)) (V 2))")
    words = ["a", "&", "b"]
    assert punctuation_indices(t, words) == set()
    assert punctuation_indices(t, words, word_regex=r"[^\w\s]+") == {1}
    assert punctuation_indices(t, tags={"V"}) == {2}
    with pytest.raises(ValueError):
        punctuation_indices(t, None, word_regex=".")
    assert {"punct", "$,", ","} <= PUNCT_TAGS


def _compressed_blocks(leaves: list[int], punct: set[int]) -> int:
    content = [i for i in range(max(leaves) + 1 + len(punct) + 1) if i not in punct]
    rank = {i: k for k, i in enumerate(content)}
    return len(leaf_blocks(sorted(rank[i] for i in leaves if i not in punct)))


def test_punctuation_never_creates_discontinuity_on_random_trees():
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(1, 14)
        t = random_tree(rng, n, pos_tags=("N", "V", "A", "punct"))
        punct = punctuation_indices(t)
        m = move_punctuation(t)
        m.validate(n)
        assert sorted(i for i, tag in m.pos() if tag == "punct") == sorted(punct)
        # without punctuation, the tree is the original one without punctuation
        strip = set(punct)
        for node in m.subtrees():
            content = [i for i in node.leaves() if i not in strip]
            if node is m or not content:
                continue
            # fanout equals the fanout of its non-punctuation yield on the sentence without punctuation
            assert node.fanout() == _compressed_blocks(node.leaves(), strip), (str(t), str(m))
        def phrases(tree: Tree) -> Counter:
            return Counter((x.label, frozenset(i for i in x.leaves() if i not in strip))
                           for x in tree.subtrees()
                           if not x.is_preterminal and any(i not in strip for i in x.leaves()))

        orig, new = phrases(t), phrases(m)
        assert orig == new


def test_lowercase_alpino_let_is_punctuation_in_extraction():
    """disco-dop's Alpino reader tags punctuation `let` and leaves it under the root: moved like
    `punct`, the supertags see continuous phrases (before, every comma opened a gap)."""
    from neurocrf.parsing.bracket import parse_discbracket
    from neurocrf.supertagging.data import corpus_statistics, prepare_for_extraction, supertag_corpus

    sentences = parse_discbracket(
        "(TOP (SMAIN (N 0=Jan) (WW 2=zag) (NP (N 4=Piet) (N 6=Marie))) (let 1=,) (let 3=,) (let 5=,) (let 7=.))\n"
        "(TOP (SMAIN (N 0=Het) (WW 2=regent)) (LET[] 1=,) (let 3=!))\n")
    assert max(n.fanout() for s in sentences for n in s.tree.subtrees()) == 4
    moved = [prepare_for_extraction(s, True) for s in sentences]
    assert moved[0].tree == T("(TOP (SMAIN (N 0) (let 1) (WW 2) (let 3) (NP (N 4) (let 5) (N 6))) (let 7))")
    corpus, _ = supertag_corpus(sentences)
    stats = corpus_statistics({"train": corpus}, {"train": moved})
    assert (stats["total"]["max_fanout"], stats["total"]["discontinuity_rate"]) == (1, 0.0)


def test_move_punctuation_sentence_keeps_id_and_words():
    s = TreebankSentence("9", ["a", ",", "b"], T("(ROOT (S (N 0) (N 2)) ($, 1))"), comment="checked")
    m = move_punctuation_sentence(s)
    assert (m.id, m.words, m.comment) == ("9", ["a", ",", "b"], "checked")
    assert m.tree == T("(ROOT (S (N 0) ($, 1) (N 2)))")
    assert s.tree == T("(ROOT (S (N 0) (N 2)) ($, 1))")


# ---------------------------------------------------------------------------- the real treebank
@pytest.mark.slow
@pytest.mark.parametrize("h, v", [(0, 1), (1, 2)])
def test_alpino_prepare_restore_identity_on_every_tree(h, v):
    from neurocrf.parsing.treebank import data_root, read_treebank

    folder = data_root() / "alpino" / "cdb"
    if not folder.is_dir():
        pytest.skip(f"no Alpino treebank at {folder} (set NEUROCRF_DATA)")
    sents = [move_punctuation_sentence(s) for s in read_treebank(folder)]
    assert len(sents) == 7136
    failures = []
    for s in sents:
        try:
            if restore_tree(prepare_tree(s.tree, h=h, v=v)) != s.tree:
                failures.append(f"{s.id}: {s.tree.discbracket(s.words)}")
        except ValueError as err:
            failures.append(f"{s.id}: {err}")
    assert not failures, f"{len(failures)} trees fail prepare -> restore:\n" + "\n".join(failures[:20])

"""Discontinuous bracket evaluation on hand-made examples with known scores."""

import random
import re
import warnings

import pytest

from neurocrf.parsing.evaluate import (
    DEFAULT_PARAMS_FILE,
    EvalParams,
    bracketings,
    evaluate,
    format_report,
    load_params,
    main,
)
from neurocrf.parsing.punctuation import PUNCT_TAGS
from neurocrf.parsing.tree import Tree, TreebankSentence, random_tree
from neurocrf.parsing.treebank import read_treebank

WORDS = ["a", "b", "c", ",", "d", "."]
# VP = {0, 2, 4}: discontinuous because of NP(1) (the comma at 3 is deleted before scoring)
GOLD = "(ROOT (S (VP (V 0) (ADVP (ADV 2)) (N 4)) (NP (N 1))) ($, 3) ($. 5))"
# same brackets once punctuation is deleted and PRT == ADVP; comma placed elsewhere
PRED_SAME = "(ROOT (S (VP (V 0) (PRT (ADV 2)) (N 4) ($, 3)) (NP (N 1))) ($. 5))"
# only S matches: VP {0,1}, NP {2,3} (renumbered)
PRED_WRONG = "(ROOT (S (VP (V 0) (N 1)) (NP (ADV 2) (N 4))) ($, 3) ($. 5))"


def sent(tree: str, words=WORDS, sid="1") -> TreebankSentence:
    return TreebankSentence(sid, list(words), Tree.parse(tree))


def _read_as_discodop(path):
    """How disco-dop's evaluator reads a parameter file (EVALB syntax): non-empty lines not
    starting with '#' split once into key and value; DELETE_* values are whole rests of lines,
    EQ_* values pairs, the other keys integers. Raises where disco-dop raises."""
    sets, pairs, ints = {}, {}, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.split(None, 1)  # ValueError on a line of spaces or a key alone
        if key in ("DELETE_LABEL", "DELETE_LABEL_FOR_LENGTH", "DELETE_WORD"):
            sets.setdefault(key, set()).add(value)
        elif key in ("EQ_LABEL", "EQ_WORD"):
            first, second = value.split()
            pairs.setdefault(key, []).append((first, second))
        elif key in ("DEBUG", "MAX_ERROR", "CUTOFF_LEN", "LABELED", "DISC_ONLY", "LA", "TED", "DEP",
                     "DELETE_ROOT_PRETERMS"):
            assert key not in ints, f"{key} twice"
            ints[key] = int(value)
        else:
            raise ValueError(f"unrecognized parameter key: {key}")
    return sets, pairs, ints


def test_default_params_file_reads_the_same_in_discodop():
    p = load_params()
    # what punctuation.py moves, also as disco-dop reads the tags with brackets; Penn empty elements
    assert p.delete_label == {"TOP", "ROOT", "VROOT", "NOPARSE", "$[", "let[]", "LET[]", "-NONE-"} | set(PUNCT_TAGS)
    assert p.eq_label == {"ADVP": "ADVP", "PRT": "ADVP"}
    assert p.eq_word == {"-LRB-": "-LRB-", "(": "-LRB-", "-RRB-": "-RRB-", ")": "-RRB-"}
    assert p.labeled and p.cutoff_len == 0 and not p.delete_word and not p.delete_label_for_length
    assert DEFAULT_PARAMS_FILE.name == "proper.prm"
    sets, pairs, ints = _read_as_discodop(DEFAULT_PARAMS_FILE)
    assert sets == {"DELETE_LABEL": p.delete_label}
    assert pairs == {"EQ_LABEL": [("ADVP", "PRT")], "EQ_WORD": [("-LRB-", "("), ("-RRB-", ")")]}
    assert ints == {"LABELED": 1, "CUTOFF_LEN": 0}


def test_punctuation_tags_are_those_of_discodops_proper_prm():
    """Every punctuation tag of the proper.prm that disco-dop ships (Negra/Tiger, Alpino in both
    cases, as its Alpino reader writes `let`, and Penn) is punctuation here and deleted by ours."""
    discodop = {"$,", "$(", "$[", "$.", "PUNCT", "punct", "LET[]", "LET()", "LET", "let[]", "let()", "let",
                ",", ":", "``", "''", "."}
    brackets_as_read = {"$[", "LET[]", "let[]"}
    assert discodop - brackets_as_read <= PUNCT_TAGS
    assert discodop | {"-NONE-"} <= load_params().delete_label


def test_equivalence_classes_are_the_transitive_closure_of_pairs(tmp_path):
    prm = tmp_path / "eq.prm"
    prm.write_text("EQ_LABEL ADVP PRT\nEQ_LABEL X Y\nEQ_LABEL PRT Z\nEQ_WORD -LRB- (\n", encoding="utf-8")
    p = load_params(prm)
    assert p.eq_label == {"ADVP": "ADVP", "PRT": "ADVP", "Z": "ADVP", "X": "X", "Y": "X"}
    assert p.eq_word == {"-LRB-": "-LRB-", "(": "-LRB-"}


def test_bracketings_delete_root_punctuation_and_renumber():
    params = load_params()
    keep = {0: 0, 1: 1, 2: 2, 4: 3}
    b = bracketings(Tree.parse(GOLD), keep, params)
    assert b == {("S", frozenset({0, 1, 2, 3})): 1, ("VP", frozenset({0, 2, 3})): 1,
                 ("ADVP", frozenset({2})): 1, ("NP", frozenset({1})): 1}


def test_perfect_prediction_with_label_equivalence_and_moved_punctuation():
    r = evaluate([sent(GOLD)], [sent(PRED_SAME)])
    assert (r["gold_brackets"], r["pred_brackets"], r["matched_brackets"]) == (4, 4, 4)
    assert r["f1"] == 1.0 and r["exact_match"] == 1.0
    assert (r["gold_dis_brackets"], r["matched_dis_brackets"], r["dis_f1"]) == (1, 1, 1.0)
    assert (r["pos_correct"], r["pos_total"]) == (4, 4)  # punctuation not counted


def test_without_label_equivalence_prt_is_an_error():
    params = load_params()
    params.eq_label = {}
    r = evaluate([sent(GOLD)], [sent(PRED_SAME)], params)
    assert r["matched_brackets"] == 3 and r["exact_match"] == 0.0
    assert r["per_label"]["PRT"] == {"gold": 0, "pred": 1, "matched": 0, "precision": 0.0,
                                     "recall": 0.0, "f1": 0.0}


def test_known_scores_over_a_corpus():
    gold = [sent(GOLD, sid="1"), sent(GOLD, sid="2")]
    pred = [sent(PRED_SAME, sid="1"), sent(PRED_WRONG, sid="2")]
    r = evaluate(gold, pred)
    assert (r["gold_brackets"], r["pred_brackets"], r["matched_brackets"]) == (8, 7, 5)
    assert r["precision"] == pytest.approx(5 / 7) and r["recall"] == pytest.approx(5 / 8)
    assert r["f1"] == pytest.approx(2 * 5 / (7 + 8))
    assert (r["gold_dis_brackets"], r["pred_dis_brackets"], r["matched_dis_brackets"]) == (2, 1, 1)
    assert (r["dis_precision"], r["dis_recall"]) == (1.0, 0.5)
    assert r["dis_f1"] == pytest.approx(2 / 3)
    assert r["exact_match"] == 0.5 and r["exact_matches"] == 1 and r["sentences"] == 2
    single = evaluate([gold[1]], [pred[1]])
    assert single["f1"] == pytest.approx(2 / 7) and single["dis_f1"] == 0.0


def test_gap_made_only_by_punctuation_is_not_discontinuous():
    words = ["a", ",", "b", "c"]
    gold = sent("(ROOT (S (VP (V 0) (V 2)) (NP (N 3))) ($, 1))", words)
    pred = sent("(ROOT (S (VP (V 0) ($, 1) (V 2)) (NP (N 3))))", words)
    r = evaluate([gold], [pred])
    assert r["gold_dis_brackets"] == 0 and r["f1"] == 1.0
    # with no deletion gold S {0, 2, 3} and VP {0, 2} are discontinuous, the predicted ones not
    r = evaluate([gold], [pred], EvalParams(delete_label={"ROOT"}))
    assert r["gold_dis_brackets"] == 2 and r["pred_dis_brackets"] == 0
    assert r["matched_brackets"] == 1 and r["gold_brackets"] == 3  # only NP {3}


def test_punctuation_is_deleted_by_gold_pos_and_word():
    words = ["a", "-", "b"]
    gold = sent("(ROOT (S (N 0) (X (SYM 1)) (N 2)))", words)
    pred = sent("(ROOT (S (N 0) (SYM 1) (N 2)))", words)
    assert evaluate([gold], [pred])["matched_brackets"] == 1  # X {1} is not predicted
    r = evaluate([gold], [pred], EvalParams(delete_label={"ROOT"}, delete_word={"-"}))
    assert (r["gold_brackets"], r["matched_brackets"], r["pos_total"]) == (1, 1, 2)  # X gone


def test_noparse_fallback_counts_nothing_but_pos():
    pred = sent("(NOPARSE (V 0) (N 1) (ADV 2) ($, 3) (N 4) ($. 5))")
    r = evaluate([sent(GOLD)], [pred])
    assert (r["pred_brackets"], r["matched_brackets"], r["gold_brackets"]) == (0, 0, 4)
    assert r["precision"] == 0.0 and r["recall"] == 0.0 and r["f1"] == 0.0
    assert r["pos_accuracy"] == 1.0


def test_root_not_in_delete_label_is_counted_and_multisets():
    words = ["a", "b"]
    gold = sent("(S (NP (NP (N 0) (N 1))))", words)
    pred = sent("(S (NP (N 0) (N 1)))", words)
    r = evaluate([gold], [pred])
    # gold: S, NP, NP (same span twice); pred: S, NP
    assert (r["gold_brackets"], r["pred_brackets"], r["matched_brackets"]) == (3, 2, 2)
    assert r["exact_match"] == 0.0 and r["precision"] == 1.0


def test_unlabeled_and_cutoff(tmp_path):
    prm = tmp_path / "u.prm"
    prm.write_text("# unlabeled\nLABELED 0\nDELETE_LABEL ROOT\nCUTOFF_LEN 3\n", encoding="utf-8")
    p = load_params(prm)
    assert not p.labeled and p.cutoff_len == 3
    short = sent("(ROOT (S (A 0) (B 1)))", ["a", "b"], sid="s")
    short_pred = sent("(ROOT (X (A 0) (B 1)))", ["a", "b"], sid="s")
    r = evaluate([sent(GOLD), short], [sent(PRED_WRONG), short_pred], prm)
    assert r["sentences"] == 1 and r["f1"] == 1.0  # GOLD has 6 words > 3: skipped


def test_cutoff_counts_punctuation_as_evalb_does(tmp_path):
    """4 words, one of them punctuation: 4 > CUTOFF_LEN 3 although 3 words are scored; a tag
    listed in DELETE_LABEL_FOR_LENGTH does not count."""
    words = ["a", "b", "c", "."]
    gold = sent("(ROOT (S (A 0) (B 1) (C 2)) ($. 3))", words)
    prm = tmp_path / "cut.prm"
    prm.write_text("DELETE_LABEL ROOT\nDELETE_LABEL $.\nCUTOFF_LEN 3\n", encoding="utf-8")
    assert evaluate([gold], [gold], prm)["sentences"] == 0
    prm.write_text(prm.read_text(encoding="utf-8") + "DELETE_LABEL_FOR_LENGTH $.\n", encoding="utf-8")
    r = evaluate([gold], [gold], prm)
    assert r["sentences"] == 1 and r["pos_total"] == 3 and r["gold_brackets"] == 1


def test_disc_only_in_a_parameter_file_is_ignored_as_discodop_ignores_it(tmp_path):
    """discodop eval overrides the file's DISC_ONLY with its --disconly option, so the same file
    gives the same scores in both tools: all brackets, Dis-F1 beside them."""
    gold = [sent(GOLD, sid="1"), sent(GOLD, sid="2")]
    pred = [sent(PRED_SAME, sid="1"), sent(PRED_WRONG, sid="2")]
    prm = tmp_path / "d.prm"
    prm.write_text(DEFAULT_PARAMS_FILE.read_text(encoding="utf-8") + "DISC_ONLY 1\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=rf"{prm}:\d+: DISC_ONLY 1 is ignored, as discodop eval ignores it"):
        r = evaluate(gold, pred, prm)
    assert r == evaluate(gold, pred)
    assert (r["gold_brackets"], r["pred_brackets"], r["matched_brackets"]) == (8, 7, 5)
    assert r["dis_f1"] == pytest.approx(2 / 3) and not r["disc_only"]
    prm.write_text("DELETE_LABEL ROOT\nDISC_ONLY 0\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_params(prm)  # DISC_ONLY 0 is what disco-dop does: no warning


def test_disc_only_option_counts_as_discodop_eval_disconly():
    """--disconly: brackets, sentences and exact matches of the sentences with a discontinuous
    bracket on either side; POS accuracy over all sentences."""
    words = ["a", "b", "c"]
    flat = sent("(ROOT (S (A 0) (B 1) (C 2)))", words, sid="3")
    gold = [sent(GOLD, sid="1"), sent(GOLD, sid="2"), flat]
    pred = [sent(PRED_SAME, sid="1"), sent(PRED_WRONG, sid="2"), flat]
    r = evaluate(gold, pred, disc_only=True)
    assert (r["gold_brackets"], r["pred_brackets"], r["matched_brackets"]) == (2, 1, 1)
    assert r["f1"] == r["dis_f1"] == pytest.approx(2 / 3)
    assert (r["sentences"], r["exact_matches"]) == (2, 1)  # the flat sentence has no disc. bracket
    assert (r["pos_correct"], r["pos_total"]) == (11, 11) and r["disc_only"]
    assert format_report(r).startswith("(discontinuous brackets only)")


def test_function_tags_are_stripped_before_scoring_as_discodop_does():
    words = ["a", "b", "c"]
    gold = sent("(ROOT (S-TPC (NP-SBJ=2 (N 0) (N 2)) (VP-HD (V-HD 1))))", words)
    pred = sent("(ROOT (S (NP (N 0) (N 2)) (VP (V 1))))", words)
    r = evaluate([gold], [pred])
    assert (r["matched_brackets"], r["gold_brackets"], r["pos_accuracy"]) == (3, 3, 1.0)
    assert sorted(r["per_label"]) == ["NP", "S", "VP"] and r["functions"] == "remove"
    kept = evaluate([gold], [pred], functions="leave")
    assert (kept["matched_brackets"], kept["pos_accuracy"]) == (0, pytest.approx(2 / 3))
    assert sorted(kept["per_label"]) == ["NP", "NP-SBJ=2", "S", "S-TPC", "VP", "VP-HD"]
    # labels starting with '-' are kept whole, so -NONE- is still deleted as an empty element
    trace = sent("(ROOT (S (NP (-NONE- 0)) (V 1) (N 2)))", ["*T*-1", "b", "c"])
    assert evaluate([trace], [trace])["pos_total"] == 2
    with pytest.raises(ValueError, match="functions must be one of"):
        evaluate([gold], [pred], functions="add")


def test_lowercase_alpino_punctuation_let_is_deleted():
    """disco-dop's Alpino reader tags punctuation `let` (the pt attribute): deleted like `punct`,
    so a gap made only of it is no gap."""
    words = ["a", ",", "b", "c"]
    gold = sent("(ROOT (S (VP (V 0) (V 2)) (NP (N 3))) (let 1))", words)
    pred = sent("(ROOT (S (VP (V 0) (let 1) (V 2)) (NP (N 3))))", words)
    r = evaluate([gold], [pred])
    assert (r["gold_dis_brackets"], r["matched_brackets"], r["pos_total"]) == (0, 3, 3)
    assert r["f1"] == 1.0


def test_root_preterminals(tmp_path):
    words = ["a", "b", "c", "d"]
    gold = sent("(ROOT (S (VP (V 0) (N 2)) (X 1)) (Y 3))", words)
    prm = tmp_path / "d.prm"
    prm.write_text("DELETE_LABEL ROOT\nDELETE_ROOT_PRETERMS 1\n", encoding="utf-8")
    r = evaluate([gold], [gold], prm)
    assert r["pos_total"] == 3 and r["gold_brackets"] == 2  # d (Y under ROOT) deleted: S, VP


def test_different_words_are_an_error_naming_the_sentence(tmp_path):
    other = ["a", "B", "c", ",", "d", "!"]
    gold = [sent(GOLD, sid="s1"), sent(GOLD, sid="s2")]
    pred = [sent(PRED_SAME, sid="s1"), sent(PRED_SAME, other, sid="s2")]
    with pytest.raises(ValueError, match=r"sentence 2 \(id s2\): gold and predicted words differ "
                                         r"\(word 1: gold 'b', predicted 'B', word 5: gold '\.', predicted '!'\)"):
        evaluate(gold, pred)
    prm = tmp_path / "eq.prm"
    prm.write_text("DELETE_LABEL ROOT\nEQ_WORD b B\nEQ_WORD . !\n", encoding="utf-8")
    assert evaluate(gold, pred, prm)["sentences"] == 2  # equal up to EQ_WORD


def test_pos_accuracy_and_wrong_tags():
    words = ["a", "b", "c"]
    r = evaluate([sent("(ROOT (S (A 0) (B 1) (C 2)))", words)],
                 [sent("(ROOT (S (A 0) (C 1) (B 2)))", words)])
    assert r["pos_accuracy"] == pytest.approx(1 / 3) and r["f1"] == 1.0


@pytest.mark.parametrize("text, line, message", [
    ("FOO 1\n", 1, "unknown parameter 'FOO'"),
    ("DELETE_LABEL ROOT\nDELETE_POS $,\n", 2, "unknown parameter 'DELETE_POS' .*as DELETE_LABEL lines"),
    ("# c\nLABELED\n", 2, "needs a value"),
    ("LABELED 1\nLABELED 0\n", 2, "given twice"),
    ("CUTOFF_LEN x\n", 1, "non-negative integer"),
    ("LABELED 0  # unlabeled\n", 1, "non-negative integer"),  # no comments after a value
    ("DELETE_LABEL TOP ROOT VROOT\n", 1, "one value per DELETE_LABEL line.*'TOP ROOT VROOT' as a single label"),
    ("DELETE_LABEL TOP \n", 1, "trailing whitespace"),
    ("DELETE_WORD a # comment\n", 1, "one value per DELETE_WORD line"),
    ("EQ_LABEL ADVP PRT X\n", 1, "takes two values"),
    ("LABELED 1\n  \n", 2, "a line of spaces"),
    ("TED 1\n", 1, "tree-edit distance scores, which neurocrf does not compute"),
])
def test_bad_parameter_files(tmp_path, text, line, message):
    prm = tmp_path / "bad.prm"
    prm.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        load_params(prm)
    assert str(err.value).startswith(f"{prm}:{line}:")


def test_mismatched_inputs_are_rejected():
    with pytest.raises(ValueError, match=r"1 gold sentences \(gold\) but 0 predicted ones \(predictions\)"):
        evaluate([sent(GOLD)], [])
    with pytest.raises(ValueError, match="predictions: sentence 1 has id '2', but gold sentence 1 .* has id '1'; "
                                         "to pair .* by position instead, pass check_ids=false"):
        evaluate([sent(GOLD, sid="1")], [sent(GOLD, sid="2")])
    assert evaluate([sent(GOLD, sid="1")], [sent(GOLD, sid="2")], check_ids=False)["f1"] == 1.0
    with pytest.raises(ValueError, match=r"sentence 1 \(id 1\): gold has 6 words, prediction 5 \(first "
                                         r"difference at word 5: gold '\.', predicted none\)"):
        evaluate([sent(GOLD)], [sent("(ROOT (A 0) (A 1) (A 2) (A 3) (A 4))", WORDS[:5])])
    with pytest.raises(ValueError, match="not distinct"):
        evaluate([sent(GOLD)], [sent("(ROOT (S (A 0) (A 0)) (B 1) (B 2) (B 3) (B 4) (B 5))")])


def test_random_trees_score_perfectly_against_themselves_and_symmetrically():
    rng = random.Random(2)
    gold, pred = [], []
    for k in range(100):
        n = rng.randint(1, 12)
        words = [f"w{i}" for i in range(n)]
        gold.append(TreebankSentence(str(k), words, random_tree(rng, n)))
        pred.append(TreebankSentence(str(k), words, random_tree(rng, n)))
    same = evaluate(gold, gold)
    assert same["f1"] == same["dis_f1"] == same["exact_match"] == same["pos_accuracy"] == 1.0
    assert same["gold_dis_brackets"] > 20
    ab, ba = evaluate(gold, pred), evaluate(pred, gold)
    assert ab["matched_brackets"] == ba["matched_brackets"]
    assert ab["precision"] == pytest.approx(ba["recall"]) and ab["f1"] == pytest.approx(ba["f1"])
    assert 0 < ab["f1"] < 1


def test_report_and_command_line(tmp_path, capsys):
    r = evaluate([sent(GOLD)], [sent(PRED_SAME)])
    text = format_report(r)
    assert "labeled F1          100.00" in text and "Dis-F1" in text and "ADVP" in text
    gold_path, pred_path = tmp_path / "g.discbracket", tmp_path / "p.discbracket"
    gold_path.write_text(Tree.parse(GOLD).discbracket(WORDS) + "\n", encoding="utf-8")
    pred_path.write_text(Tree.parse(PRED_WRONG).discbracket(WORDS) + "\n", encoding="utf-8")
    assert main([str(gold_path), str(pred_path)]) == 0
    out = capsys.readouterr().out
    assert "labeled precision    33.33" in out and "labeled recall       25.00" in out


def test_predictions_without_ids_name_the_file_and_the_fix(tmp_path):
    """Gold with ids (Alpino file names), predictions without (numbered by line, as disco-dop
    writes them): the error names the predictions file, says it holds no ids and gives the fix."""
    gold = [sent(GOLD, sid="6441"), sent(GOLD, sid="6442")]
    pred_path = tmp_path / "parse.discbracket"
    pred_path.write_text("".join(Tree.parse(PRED_SAME).discbracket(WORDS) + "\n" for _ in gold), encoding="utf-8")
    pred = read_treebank(pred_path)
    with pytest.raises(ValueError) as err:
        evaluate(gold, pred, sources=("treebank alpino (test)", str(pred_path)))
    assert str(err.value).startswith(f"{pred_path}: sentence 1 has id '1', but gold sentence 1 (treebank alpino "
                                     f"(test)) has id '6441' ({pred_path} holds no sentence ids: its sentences are "
                                     f"numbered 1, 2, ... by line")
    assert "pass check_ids=false" in str(err.value)
    assert evaluate(gold, pred, check_ids=False)["f1"] == 1.0
    with pytest.raises(ValueError, match=r"the same ids in another order"):
        evaluate(gold, gold[::-1])


def test_same_scores_as_discodop_eval(tmp_path, capsys):
    """Figures printed by ``discodop eval gold pred proper.prm --fmt=discbracket`` (disco-dop
    built from source, git dd181a6) on these files, with its default options, --disconly and
    --functions=leave: function tags, `let` punctuation, a comment that is not an id."""
    gold_path, pred_path = tmp_path / "gold.discbracket", tmp_path / "pred.discbracket"
    gold_path.write_text(DISCODOP_GOLD, encoding="utf-8")
    pred_path.write_text(DISCODOP_PRED, encoding="utf-8")
    gold, pred = read_treebank(gold_path), read_treebank(pred_path)
    assert [s.id for s in gold] == ["s1", "2", "3"] and gold[1].comment == "prob=0.5"
    for options, (brackets, recall, precision, f1, exact) in {
            (): ((7, 7), 85.71, 85.71, 85.71, 66.67),
            ("--disconly",): ((2, 1), 50.00, 100.00, 66.67, 50.00),
            ("--functions", "leave"): ((7, 7), 14.29, 14.29, 14.29, 0.00)}.items():
        assert main([str(gold_path), str(pred_path), "--no-check-ids", *options]) == 0
        out = capsys.readouterr().out
        assert f"gold {brackets[0]}  predicted {brackets[1]}" in out, out
        assert f"labeled recall      {recall:6.2f}" in out and f"labeled precision   {precision:6.2f}" in out
        assert f"labeled F1          {f1:6.2f}" in out and f"exact match         {exact:6.2f}" in out
        assert "POS accuracy        100.00" in out
    r = evaluate(gold, pred, check_ids=False)
    assert r["dis_f1"] == evaluate(gold, pred, check_ids=False, disc_only=True)["f1"]


# hand-made; scored by disco-dop as test_same_scores_as_discodop_eval says
DISCODOP_GOLD = """\
(ROOT (S-SBJ (VP=2 (V 0=a) (ADVP-MNR (ADV 2=c)) (N 4=e)) (NP-SBJ (N 1=b))) (let 3=,) (let 5=.))\tid=s1
(ROOT (SMAIN (NP (N 0=x) (N 3=w)) (V 1=y) (let 2=,)) (let 4=.))\tprob=0.5
(ROOT (S (A 0=p) (B 1=q)))
"""
DISCODOP_PRED = """\
(ROOT (S (VP (V 0=a) (PRT (ADV 2=c)) (N 4=e) (let 3=,)) (NP (N 1=b))) (let 5=.))
(ROOT (SMAIN (NP (N 0=x)) (V 1=y) (N 3=w) (let 2=,)) (let 4=.))
(ROOT (S-X (A 0=p) (B 1=q)))
"""


@pytest.mark.slow
def test_alpino_against_itself_and_against_flat_fallback():
    from neurocrf.parsing.punctuation import move_punctuation_sentence
    from neurocrf.parsing.treebank import data_root, read_treebank

    folder = data_root() / "alpino" / "cdb"
    if not folder.is_dir():
        pytest.skip(f"no Alpino treebank at {folder} (set NEUROCRF_DATA)")
    gold = [move_punctuation_sentence(s) for s in read_treebank(folder)]
    r = evaluate(gold, gold)
    assert r["f1"] == r["dis_f1"] == r["exact_match"] == r["pos_accuracy"] == 1.0
    assert 0.07 < r["gold_dis_brackets"] / r["gold_brackets"] < 0.1
    flat = [TreebankSentence(s.id, s.words, Tree("NOPARSE", [Tree(t, [i]) for i, t in s.tree.pos()]))
            for s in gold]
    r = evaluate(gold, flat)
    assert r["pred_brackets"] == 0 and r["f1"] == 0.0 and r["pos_accuracy"] == 1.0


def test_doctests():
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module("neurocrf.parsing.evaluate")).failed == 0


@pytest.mark.slow
def test_every_figure_agrees_with_an_installed_discodop(tmp_path):
    """With disco-dop installed (``discodop`` on PATH, or the command in $DISCODOP):
    scripts/discodop_agreement.py finds the same figures on the hand-made files above and on
    random trees with punctuation, function tags and `let` tags, under each option set."""
    import os
    import shlex
    import shutil
    import sys
    from pathlib import Path

    command = os.environ.get("DISCODOP") or shutil.which("discodop")
    if not command or not shutil.which(shlex.split(command)[0]):
        pytest.skip("disco-dop is not installed (pip install disco-dop, or DISCODOP=<command>)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from discodop_agreement import compare

    from neurocrf.parsing.treebank import write_treebank

    rng = random.Random(8)
    labels, tags = ("S", "VP", "NP-SBJ", "NP", "PP=2"), ("N", "V", "let", "$,")
    gold, pred = [], []
    for k in range(200):
        n = rng.randint(2, 12)
        words = [f"w{i}" for i in range(n)]
        gold.append(TreebankSentence(str(k), words, random_tree(rng, n, pos_tags=tags, labels=labels)))
        tree = random_tree(rng, n, pos_tags=tags, labels=labels)
        if rng.random() < 0.6:  # the gold tree with one phrase relabelled: most brackets match
            tree = gold[-1].tree.copy()
            rng.choice(list(tree.subtrees())).label = rng.choice(labels)
        pred.append(TreebankSentence(str(k), words, tree))
    files = {}
    for name, sentences in (("gold", gold), ("pred", pred)):
        files[name] = tmp_path / f"{name}.discbracket"
        write_treebank(files[name], sentences, "discbracket", write_ids=True)
    (tmp_path / "g.discbracket").write_text(DISCODOP_GOLD, encoding="utf-8")
    (tmp_path / "p.discbracket").write_text(DISCODOP_PRED, encoding="utf-8")
    pairs = ((files["gold"], files["pred"]), (tmp_path / "g.discbracket", tmp_path / "p.discbracket"))
    for gold_path, pred_path in pairs:
        rows = compare(str(gold_path), str(pred_path), params=str(DEFAULT_PARAMS_FILE), discodop=command,
                       fmt="discbracket")
        assert [r["options"] for r in rows] == ["defaults", "--disconly", "--functions=leave"]
        assert all(r["agree"] for r in rows), rows


def test_discodop_commands_in_the_docs_name_the_format():
    """``discodop eval`` reads the export format unless told otherwise: every command that hands
    it files (README, docs, docstrings, proper.prm) says --fmt."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "neurocrf").rglob("*.py")),
             DEFAULT_PARAMS_FILE, *sorted((root / "configs").rglob("*.yaml"))]
    commands = [(path.name, line) for path in files for line in path.read_text(encoding="utf-8").splitlines()
                if re.search(r"discodop eval \S+ \S+ \S*\.prm", line)]
    assert len(commands) >= 4
    assert [c for c in commands if "--fmt=" not in c[1]] == []

"""The parsing entry points on the real Hydra configs and a tiny generated treebank:
extract -> supertag training -> weights-only checkpoint -> parse -> evaluate, the gold-supertag
oracle through the parse code path, text input, errors, and ``python -m`` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from neurocrf.cli.extract import extract
from neurocrf.cli.parse import parse
from neurocrf.cli.parse_evaluate import evaluate_predictions
from neurocrf.cli.supertag_train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.parsing import read_treebank
from neurocrf.parsing.treebank import load_treebank
from neurocrf.supertagging.data import read_supertag_corpus
from neurocrf.supertagging.heads import FactoredSupertagHead
from neurocrf.supertagging.saved_tags import read_tag_file
from neurocrf.supertagging.supertagger import Supertagger

TINY = ["encoder.word_dim=32", "encoder.char=null", "encoder.hidden_size=64", "encoder.dropout=0.0",
        "heads.dropout=0.0", "optimizer.lr=0.01", "data.batch_size=8"]
QUIET = ["~logger", "~callbacks.progress_bar", "+trainer.enable_progress_bar=false"]


def compose_config(name: str, out: Path, data_dir: Path, overrides: list[str]) -> DictConfig:
    return compose_task_config(name, out, overrides, data_dir)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``paths.data_dir``: the tiny treebank is generated there on first use."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict:
    """A tiny supertagger trained to memorise the tiny treebank's training split."""
    out = tmp_path_factory.mktemp("supertag")
    cfg = compose_config("supertag", out, data_dir, [
        *TINY, *QUIET, "trainer.max_epochs=30", "callbacks.model_checkpoint.monitor=null",
        "~callbacks.early_stopping", "final_parse.splits=[train,test]", "parsing.k=4"])
    metrics, objects = train(cfg)
    return {"metrics": metrics, "ckpt": objects["ckpt_path"], "out": out}


def test_configs_compose(tmp_path: Path, data_dir: Path) -> None:
    cfg = compose_config("supertag", tmp_path, data_dir, [])
    assert cfg.treebank.name == "tiny" and cfg.callbacks.model_checkpoint.monitor == "val/supertag_acc"
    assert cfg.parsing.k == 10 and cfg.encoder.name == "bilstm"
    alpino = compose_config("supertag", tmp_path, data_dir, ["treebank=alpino"]).treebank
    assert alpino.path.endswith("alpino/cdb") and alpino.format == "alpino"
    assert compose_config("parse", tmp_path, data_dir, ["treebank=alpino"]).k == 10
    assert compose_config("parse", tmp_path, data_dir, []).fallback_k == 50
    measured = compose_config("supertag", tmp_path, data_dir, ["experiment=alpino_supertagger_bilstm"])
    assert measured.treebank.name == "alpino" and measured.encoder.num_layers == 2
    assert (measured.encoder.word_dropout, measured.heads.dropout, measured.trainer.max_epochs) == (0.2, 0.3, 60)
    assert measured.heads.factors == ["lhs", "label", "attach", "composition", "first", "second"]
    assert measured.heads.auxiliary == {"function": 0.5, "projection": 0.5}
    assert measured.callbacks.ema.decay == 0.999 and "model_checkpoint" in measured.callbacks
    assert compose_config("parse", tmp_path, data_dir, []).get("treebank") is None
    assert compose_config("extract", tmp_path, data_dir, []).treebank.name == "tiny"
    assert compose_config("parse_evaluate", tmp_path, data_dir, ["predictions=x"]).split == "test"


def test_extract_writes_corpus_roots_and_statistics(tmp_path: Path, data_dir: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    stats = extract(compose_config("extract", tmp_path, data_dir, ["treebank=tiny"]))
    splits = load_treebank(compose_config("extract", tmp_path, data_dir, []).treebank)
    for split in ("train", "dev", "test"):
        corpus = read_supertag_corpus(tmp_path / f"{split}.supertags")
        assert [s.words for s in corpus] == [s.words for s in splits[split]]
        assert stats[split]["sentences"] == len(corpus)
        assert stats[split]["tokens"] == sum(len(s.words) for s in corpus)
        assert stats[split]["supertags"] == len({t for s in corpus for t in s.supertags})
    train_tags = {t for s in read_supertag_corpus(tmp_path / "train.supertags") for t in s.supertags}
    dev_test = {t for split in ("dev", "test")
                for s in read_supertag_corpus(tmp_path / f"{split}.supertags") for t in s.supertags}
    assert stats["total"]["supertags_only_in_dev_test"] == len(dev_test - train_tags)
    assert stats["total"]["sentences"] == 80 and stats["total"]["max_fanout"] >= 2
    assert (tmp_path / "roots.txt").read_text().split() == stats["roots"] == ["ROOT"]
    assert json.loads((tmp_path / "stats.json").read_text())["total"] == stats["total"]
    printed = capsys.readouterr().out
    assert "discontinuous constituent" in printed and "train" in printed


def test_oracle_gold_supertags_k1_reproduce_gold_trees(tmp_path: Path, data_dir: Path) -> None:
    report = parse(compose_config("parse", tmp_path, data_dir,
                                  ["treebank=tiny", "oracle=true", "k=1", "split=all"]))
    assert report["sentences"] == 80 and report["coverage"] == 1.0 and report["k"] == 1
    assert report["f1"] == 1.0 and report["dis_f1"] == 1.0 and report["exact_match"] == 1.0
    assert report["evaluation"]["gold_dis_brackets"] > 0
    gold = [s for split in load_treebank(compose_config("parse", tmp_path, data_dir, ["treebank=tiny"]).treebank
                                         ).values() for s in split]
    predicted = read_treebank(tmp_path / "parse.discbracket")
    assert [p.id for p in predicted] == [g.id for g in gold]
    lines = (tmp_path / "parse.discbracket").read_text(encoding="utf-8").splitlines()
    expected = [[g.tree.discbracket(g.words), f"id={g.id}"] for g in gold]
    assert [line.split("\t") for line in lines] == expected  # disco-dop's form: the id in the comment
    assert all(p.tree == g.tree and p.words == g.words for p, g in zip(predicted, gold))


def test_training_reports_metrics_and_parses_memorised_sentences(trained: dict) -> None:
    metrics = trained["metrics"]
    for key in ("train/loss", "val/supertag_acc", "val/pos_acc", "test/supertag_acc", "test/pos_acc",
                "parse_test/f1", "parse_test/coverage"):
        assert key in metrics, key
    assert metrics["parse_train/supertag_accuracy"] > 0.95
    assert metrics["parse_train/f1"] > 0.9 and metrics["parse_train/coverage"] > 0.9
    out = trained["out"]
    report = json.loads((out / "parse_train_report.json").read_text())
    assert report["sentences"] == 64 and report["noparse"] == report["sentences"] - report["parsed"]
    assert "f1" in (out / "parse_test_report.txt").read_text().lower()
    checkpoint = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["parsing"]["k"] == 4


def test_training_with_a_factored_head_and_a_weight_average(tmp_path: Path, data_dir: Path) -> None:
    cfg = compose_config("supertag", tmp_path, data_dir, [
        *TINY, *QUIET, "callbacks=[default,ema]", "callbacks.ema.decay=0.9",
        "heads.factors=[lhs,label,composition,first,second]", "trainer.max_epochs=30",
        "callbacks.model_checkpoint.monitor=null",
        "~callbacks.early_stopping", "final_parse.splits=[train]", "parsing.k=4"])
    metrics, objects = train(cfg)
    assert metrics["parse_train/supertag_accuracy"] > 0.95 and metrics["parse_train/f1"] > 0.9
    checkpoint = torch.load(objects["ckpt_path"], map_location="cpu", weights_only=True)
    averaged, current = checkpoint["state_dict"], checkpoint["ema_current"]
    assert set(current) <= set(averaged)
    assert any(not torch.equal(averaged[name], value) for name, value in current.items())
    model = Supertagger.load(objects["ckpt_path"])
    assert isinstance(model.supertag_head, FactoredSupertagHead)
    assert torch.equal(model.supertag_head.own.weight, averaged["supertag_head.own.weight"])


def test_distillation_trains_a_student_from_saved_teacher_tags(tmp_path: Path, data_dir: Path,
                                                                trained: dict) -> None:
    teacher = tmp_path / "teacher.train.jsonl.gz"
    parse(compose_config("parse", tmp_path / "tag", data_dir, [
        "treebank=tiny", "split=train", f"ckpt_path={trained['ckpt']}", f"save_tags={teacher}", "save_tags_n=8"]))
    # weight 1: the student sees no gold supertag, only the teacher's distributions
    cfg = compose_config("supertag", tmp_path / "student", data_dir, [
        *TINY, *QUIET, f"data.teacher={teacher}", "heads.distill=1.0", "trainer.max_epochs=30",
        "callbacks.model_checkpoint.monitor=null", "~callbacks.early_stopping", "final_parse.splits=[train]",
        "parsing.k=4"])
    metrics, objects = train(cfg)
    assert metrics["parse_train/supertag_accuracy"] > 0.9 and metrics["parse_train/f1"] > 0.8
    model = Supertagger.load(objects["ckpt_path"])
    assert model.distill == 1.0 and model.hparams["config"]["data"]["teacher"] == str(teacher)
    for options in ([f"data.teacher={teacher}"], ["heads.distill=0.5"]):
        with pytest.raises(ValueError, match="needs both heads.distill"):
            train(compose_config("supertag", tmp_path / "bad", data_dir, [*TINY, *QUIET, *options]))


def test_init_from_starts_a_new_run_from_a_trained_model(tmp_path: Path, data_dir: Path, trained: dict) -> None:
    source = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    cfg = compose_config("supertag", tmp_path, data_dir, [
        *TINY, *QUIET, f"init_from={trained['ckpt']}", "optimizer.lr=0.0", "trainer.max_epochs=1",
        "callbacks.model_checkpoint.monitor=null", "~callbacks.early_stopping", "final_parse.splits=[train]"])
    metrics, objects = train(cfg)
    checkpoint = torch.load(objects["ckpt_path"], map_location="cpu", weights_only=True)
    assert checkpoint["epoch"] == 0 and checkpoint["epoch"] < source["epoch"]
    assert checkpoint["hyper_parameters"]["optimizer"]["lr"] == 0.0
    assert checkpoint["hyper_parameters"]["config"]["init_from"] == trained["ckpt"]
    for name, value in source["state_dict"].items():  # lr 0: the loaded weights, unchanged
        assert torch.equal(checkpoint["state_dict"][name], value), name
    assert metrics["parse_train/f1"] == pytest.approx(trained["metrics"]["parse_train/f1"])

    with pytest.raises(ValueError, match="not both"):
        train(compose_config("supertag", tmp_path / "both", data_dir,
                             [*TINY, f"init_from={trained['ckpt']}", f"ckpt_path={trained['ckpt']}"]))
    source["hyper_parameters"]["supertags"] = source["hyper_parameters"]["supertags"][1:]
    other = tmp_path / "other.ckpt"
    torch.save(source, other)
    with pytest.raises(ValueError, match="other.ckpt: the checkpoint's supertags differ"):
        train(compose_config("supertag", tmp_path / "other", data_dir, [*TINY, f"init_from={other}"]))


def test_parse_and_evaluate_entry_points_end_to_end(tmp_path: Path, data_dir: Path, trained: dict) -> None:
    report = parse(compose_config("parse", tmp_path / "p", data_dir,
                                  ["treebank=tiny", "split=train", f"ckpt_path={trained['ckpt']}", "k=4"]))
    assert report["f1"] > 0.9 and report["coverage"] > 0.9 and report["supertag_accuracy"] > 0.95
    assert report["tagging_sentences_per_second"] > 0 and report["parsing_sentences_per_second"] > 0
    assert report["skipped_supertags"] == 0
    assert report["noparse"] == report["statuses"].get("noparse", 0) + report["statuses"].get("timeout", 0) \
        + report["statuses"].get("item_limit", 0)
    predictions = tmp_path / "p" / "parse.discbracket"
    text = (tmp_path / "p" / "parse_report.txt").read_text()
    assert "coverage" in text and "sentences/s" in text and "Dis-F1" in text
    scores = evaluate_predictions(compose_config("parse_evaluate", tmp_path / "e", data_dir, [
        "treebank=tiny", "split=train", f"predictions={predictions}"]))
    assert scores["f1"] == pytest.approx(report["f1"]) and scores["dis_f1"] == pytest.approx(report["dis_f1"])
    assert json.loads((tmp_path / "e" / "parse_evaluation.json").read_text())["f1"] == scores["f1"]
    # the same sentences as plain text: same trees, ids are line numbers
    gold = load_treebank(compose_config("parse", tmp_path, data_dir, ["treebank=tiny"]).treebank)["train"]
    text_input = tmp_path / "sentences.txt"
    text_input.write_text("".join(" ".join(s.words) + "\n" for s in gold[:10]) + "\n")
    out = tmp_path / "text" / "trees.discbracket"
    plain = parse(compose_config("parse", tmp_path / "t", data_dir, [
        f"input={text_input}", f"ckpt_path={trained['ckpt']}", "k=4", f"output={out}"]))
    assert plain["sentences"] == 10 and "f1" not in plain
    from_text = read_treebank(out)
    from_treebank = read_treebank(predictions)[:10]
    assert [s.id for s in from_text] == [str(i) for i in range(1, 11)]
    assert [s.tree for s in from_text] == [s.tree for s in from_treebank]
    # the model of the checkpoint is the one that parsed
    model = Supertagger.load(trained["ckpt"])
    assert model.roots == ["ROOT"]
    # a list of checkpoints is an ensemble; a model with itself parses as the model alone
    out = tmp_path / "ensemble" / "trees.discbracket"
    pair = parse(compose_config("parse", tmp_path / "en", data_dir, [
        f"input={text_input}", f"ckpt_path=[{trained['ckpt']},{trained['ckpt']}]", "k=4", f"output={out}"]))
    assert pair["sentences"] == 10
    assert [s.tree for s in read_treebank(out)] == [s.tree for s in from_text]


def test_saved_tags_parse_like_the_model(tmp_path: Path, data_dir: Path, trained: dict) -> None:
    base = ["treebank=tiny", "split=train", "k=4"]
    direct = parse(compose_config("parse", tmp_path / "d", data_dir, [*base, f"ckpt_path={trained['ckpt']}"]))
    tags = tmp_path / "train.jsonl.gz"
    saving = parse(compose_config("parse", tmp_path / "s", data_dir, [
        *base, f"ckpt_path={trained['ckpt']}", f"save_tags={tags}", "save_tags_n=6"]))
    assert saving["saved_tags"] == str(tags) and tags.is_file()
    again = parse(compose_config("parse", tmp_path / "t", data_dir, [*base, f"tags={tags}"]))
    pair = parse(compose_config("parse", tmp_path / "p", data_dir, [*base, f"tags=[{tags},{tags}]"]))
    for report in (saving, again, pair):
        for key in ("f1", "dis_f1", "coverage", "supertag_accuracy", "supertag_kbest_accuracy",
                    "preterminal_accuracy"):
            assert report[key] == pytest.approx(direct[key])
    trees = [read_treebank(tmp_path / name / "parse.discbracket") for name in ("d", "s", "t", "p")]
    assert all(t == trees[0] for t in trees[1:]) and again["tags"] == str(tags)
    # the file holds max(save_tags_n, k, fallback_k) = 50 supertags (or all, when fewer)
    assert read_tag_file(tags)[0]["n"] == min(50, len(Supertagger.load(trained["ckpt"]).supertags))
    with pytest.raises(ValueError, match="not ckpt_path and tags"):
        parse(compose_config("parse", tmp_path, data_dir, [*base, f"tags={tags}", f"ckpt_path={trained['ckpt']}"]))
    with pytest.raises(ValueError, match="save_tags writes a model's output"):
        parse(compose_config("parse", tmp_path, data_dir, [*base, f"tags={tags}", f"save_tags={tmp_path}/x.jsonl"]))
    with pytest.raises(ValueError, match="holds no tags for the sentence"):
        parse(compose_config("parse", tmp_path, data_dir, ["treebank=tiny", "split=test", f"tags={tags}"]))


def test_select_ensemble_script_chooses_on_dev_and_scores_test(tmp_path: Path, data_dir: Path,
                                                                trained: dict) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from select_ensemble import main as select_ensemble

    files = {}
    for split in ("dev", "test"):
        files[split] = tmp_path / f"{split}.jsonl"
        parse(compose_config("parse", tmp_path / split, data_dir, [
            "treebank=tiny", f"split={split}", f"ckpt_path={trained['ckpt']}", f"save_tags={files[split]}"]))
    direct = {k: parse(compose_config("parse", tmp_path / f"direct{k}", data_dir, [
        "treebank=tiny", "split=test", f"ckpt_path={trained['ckpt']}", f"k={k}", "fallback_k=null"]))
        for k in (2, 3)}
    out = tmp_path / "table.md"
    assert select_ensemble(["--treebank", "tiny", "--data-dir", str(data_dir), "--k", "2", "3", "--out", str(out),
                            "--member", "a", str(files["dev"]), str(files["test"]),
                            "--member", "b", str(files["dev"]), str(files["test"])]) == 0
    rows = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["| a", "| b", "| all 2", "| all 2", "| **chosen on dev: a**"]
    # a model with itself adds nothing: the greedy choice stops at one member; test scores are the
    # model's (the tiny model parses few held-out sentences: coverage and tag accuracy tell more than F1)
    for column, key in ((3, "f1"), (5, "coverage"), (6, "supertag_accuracy")):
        assert rows[0][column] == rows[1][column] == f"{100 * direct[2][key]:.2f}"
    assert 0 < direct[2]["coverage"] < 1 and 0 < direct[2]["supertag_accuracy"] < 1
    # all members: dev at both k, test only at the k with the best dev F1
    all_rows = rows[2:4]
    scored = [r for r in all_rows if r[3] != "-"]
    assert len(scored) == 1 and float(scored[0][2]) == max(float(r[2]) for r in all_rows)
    k = int(scored[0][1])
    for column, key in ((3, "f1"), (5, "coverage"), (6, "supertag_accuracy")):
        assert scored[0][column] == f"{100 * direct[k][key]:.2f}"


def test_select_ensemble_best_k_takes_the_best_dev_f1_and_the_first_on_a_tie() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from select_ensemble import best_k

    class Dev:
        def __init__(self, f1: dict[int, float]) -> None:
            self.f1 = f1

        def score(self, files, members, k, time_limit):
            return {"f1": self.f1[k]}

    assert best_k(Dev({10: 0.5, 20: 0.6}), {}, ("a",), [10, 20], 1.0) == (0.6, 20, ("a",))
    assert best_k(Dev({10: 0.7, 20: 0.6}), {}, ("a",), [10, 20], 1.0)[1] == 10
    assert best_k(Dev({10: 0.6, 20: 0.6}), {}, ("a",), [20, 10], 1.0)[1] == 20


def test_fallback_k_reparses_only_noparse_sentences() -> None:
    from neurocrf.supertagging.pipeline import summarize, tag_and_parse
    from neurocrf.supertagging.source import KBestTags

    class Stub:
        """Token 1's best supertag has a root label the parser does not accept."""

        roots = ["S"]

        def predict_kbest(self, sentences, k, batch_size=64):
            second = [("T 2 x0t @pt -", 0.1), ("S 2 x0t @pt -", 2.0)][:k]
            return [KBestTags(list(w), [[("@pt 1 t - -", 0.0)], second], ["D", "N"]) for w in sentences]

    words = [["a", "b"], ["c", "d"]]
    plain = tag_and_parse(Stub(), ["1", "2"], words, k=1)
    assert [r.status for r in plain.results] == ["noparse", "noparse"] and plain.extra == {}
    assert str(plain.predictions[0].tree) == "(NOPARSE (D 0) (N 1))"
    wider = tag_and_parse(Stub(), ["1", "2"], words, k=1, fallback_k=2)
    assert wider.extra == {"fallback_k": 2, "retried": 2, "rescued": 2}
    assert [str(p.tree) for p in wider.predictions] == ["(S (D 0) (N 1))"] * 2
    report = summarize(wider, gold_supertags=[["@pt 1 t - -", "S 2 x0t @pt -"]] * 2)
    assert report["coverage"] == 1.0 and report["rescued"] == 2
    # gold-in-k counts the first k candidates only, not the fallback ones
    assert report["supertag_kbest_accuracy"] == 0.5 and report["supertag_accuracy"] == 0.5


def test_parse_errors(tmp_path: Path, data_dir: Path) -> None:
    with pytest.raises(ValueError, match="ckpt_path is required"):
        parse(compose_config("parse", tmp_path, data_dir, ["treebank=tiny"]))
    with pytest.raises(ValueError, match="input=<text file> or treebank"):
        parse(compose_config("parse", tmp_path, data_dir, ["ckpt_path=x.ckpt"]))
    text_input = tmp_path / "s.txt"
    text_input.write_text("a b\n")
    with pytest.raises(ValueError, match="oracle=true needs gold trees"):
        parse(compose_config("parse", tmp_path, data_dir, ["oracle=true", f"input={text_input}"]))
    with pytest.raises(FileNotFoundError, match="nothere.txt"):
        parse(compose_config("parse", tmp_path, data_dir, ["ckpt_path=x", f"input={tmp_path}/nothere.txt"]))
    with pytest.raises(ValueError, match="split must be"):
        parse(compose_config("parse", tmp_path, data_dir, ["treebank=tiny", "oracle=true", "split=val"]))


def test_evaluate_entry_point_with_a_gold_file(tmp_path: Path, data_dir: Path) -> None:
    """Hand-written files in disco-dop's forms: discbracket ``tree<TAB>comment`` lines (an
    ``id=`` comment gives the sentence id, another comment is a comment; the last line has
    none, so its id is its line number 3) and an EVALB parameter file."""
    gold = tmp_path / "gold.discbracket"
    pred = tmp_path / "pred.discbracket"
    gold.write_text("(ROOT (VP (V 0=a) (N 2=c)) (X 1=b))\tid=1\n(ROOT (S (N 0=x) (V 1=y)))\tid=2 checked\n"
                    "(ROOT (S (N 0=p) (V 1=q) (N 2=r)) ($. 3=.))\n", encoding="utf-8")
    pred.write_text("(ROOT (VP (V 0=a) (N 1=b)) (X 2=c))\tid=1\n(ROOT (S (N 0=x) (V 1=y)))\tprob=0.5\n"
                    "(ROOT (S (N 0=p) (V 1=q) (N 2=r) ($. 3=.)))\n", encoding="utf-8")
    scores = evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
        f"gold={gold}", f"predictions={pred}", f"report_dir={tmp_path / 'eval'}"]))
    assert scores["sentences"] == 3 and scores["gold_dis_brackets"] == 1 and scores["matched_brackets"] == 2
    assert scores["f1"] == pytest.approx(2 / 3) and scores["dis_f1"] == 0.0
    assert scores["exact_match"] == pytest.approx(2 / 3)
    assert "Dis-F1" in (tmp_path / "eval" / "parse_evaluation.txt").read_text()
    # the gold trees as scored, for discodop eval
    assert read_treebank(tmp_path / "eval" / "gold.discbracket") == read_treebank(gold)
    # CUTOFF_LEN counts the full stop (4 words > 3): the third sentence is left out
    prm = tmp_path / "cut.prm"
    prm.write_text("# EVALB syntax\nLABELED 1\nCUTOFF_LEN 3\nDELETE_LABEL ROOT\nDELETE_LABEL $.\n", encoding="utf-8")
    cut = evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
        f"gold={gold}", f"predictions={pred}", f"params={prm}", f"report_dir={tmp_path / 'cut'}"]))
    assert cut["sentences"] == 2 and cut["f1"] == pytest.approx(0.5)
    # disco-dop's option defaults: function tags stripped; --disconly restricts every score
    pred.write_text(pred.read_text(encoding="utf-8").replace("(VP ", "(VP-HD ").replace("(S ", "(S-SBJ "),
                    encoding="utf-8")
    assert evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
        f"gold={gold}", f"predictions={pred}", f"report_dir={tmp_path / 'eval'}"])) == scores
    assert evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
        f"gold={gold}", f"predictions={pred}", f"report_dir={tmp_path / 'eval'}", "functions=leave"]))["f1"] == 0.0
    disc = evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
        f"gold={gold}", f"predictions={pred}", f"report_dir={tmp_path / 'eval'}", "disc_only=true"]))
    assert (disc["sentences"], disc["gold_brackets"], disc["pred_brackets"], disc["f1"]) == (1, 1, 0, 0.0)
    pred.write_text("(ROOT (VP (V 0=a) (N 1=b)) (X 2=c))\tid=7\n(ROOT (S (N 0=x) (V 1=y)))\tid=2\n"
                    "(ROOT (S (N 0=p) (V 1=q) (N 2=r) ($. 3=.)))\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{pred}: sentence 1 has id '7', but gold sentence 1 \({gold}\) has id "
                                         rf"'1'; to pair .* pass check_ids=false"):
        evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
            f"gold={gold}", f"predictions={pred}"]))
    assert evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
        f"gold={gold}", f"predictions={pred}", f"report_dir={tmp_path / 'eval'}", "check_ids=false"])) == scores
    pred.write_text("(ROOT (VP (V 0=a) (N 1=b)) (X 2=c))\tid=1\n(ROOT (S (N 0=x) (V 1=z)))\n"
                    "(ROOT (S (N 0=p) (V 1=q) (N 2=r) ($. 3=.)))\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"sentence 2 \(id 2\): gold and predicted words differ \(word 1: gold 'y', "
                                         r"predicted 'z'\)"):
        evaluate_predictions(compose_config("parse_evaluate", tmp_path, data_dir, [
            f"gold={gold}", f"predictions={pred}"]))


def test_python_m_entry_point(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run([sys.executable, "-m", "neurocrf.cli.extract", "treebank=tiny",
                          f"output_dir={tmp_path / 'corpus'}", f"paths.root_dir={tmp_path}",
                          f"paths.data_dir={tmp_path / 'data'}"],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "supertag corpus written to" in run.stdout
    stats = json.loads((tmp_path / "corpus" / "stats.json").read_text())
    assert stats["total"]["sentences"] == 80 and (tmp_path / "data" / "tiny_treebank").is_dir()


@pytest.mark.slow
def test_alpino_oracle_and_statistics(tmp_path: Path, data_dir: Path) -> None:
    """Real corpus: the gold supertags of the Alpino test split parse back to the gold trees."""
    from neurocrf.parsing import data_root

    if not (data_root() / "alpino" / "cdb").is_dir():
        pytest.skip("Alpino treebank not available (set NEUROCRF_DATA)")
    stats = extract(compose_config("extract", tmp_path / "x", data_dir, ["treebank=alpino"]))
    assert [stats[s]["sentences"] for s in ("train", "dev", "test")] == [5710, 713, 713]
    assert stats["total"]["max_fanout"] == 4
    report = parse(compose_config("parse", tmp_path / "o", data_dir,
                                  ["treebank=alpino", "oracle=true", "k=1", "split=test"]))
    assert report["coverage"] == 1.0 and report["f1"] == 1.0 and report["dis_f1"] == 1.0


def test_transformer_supertagger_trains_and_parses_through_the_clis(tmp_path: Path, data_dir: Path) -> None:
    """``neurocrf-supertag encoder=transformer`` with the fine-tuning recipe (AdamW, head_lr,
    linear warmup), then ``neurocrf-parse`` with its checkpoint: the same tags as the trained model."""
    pytest.importorskip("transformers")
    from tests.helpers.tiny_models import save_tiny_bert

    model_dir = save_tiny_bert(tmp_path / "tiny_bert", hidden_size=32)
    metrics, objects = train(compose_config("supertag", tmp_path / "train", data_dir, [
        "encoder=transformer", f"encoder.model_path={model_dir}", "data.batch_size=8", "heads.dropout=0.0",
        "optimizer.name=adamw", "optimizer.lr=1e-3", "+optimizer.head_lr=1e-2", "optimizer.weight_decay=0.01",
        "scheduler={name:linear,warmup_ratio:0.1}", "trainer.max_epochs=30", "trainer.gradient_clip_val=1.0",
        "callbacks.model_checkpoint.monitor=null", "~callbacks.early_stopping", *QUIET,
        "final_parse.splits=[]", "parsing.k=4"]))
    trained = objects["model"].eval()
    assert trained.hparams["encoder"]["name"] == "transformer"
    rates = {g["name"]: g["initial_lr"] for g in objects["trainer"].optimizers[0].param_groups}
    assert rates == {"base": 1e-3, "base_no_decay": 1e-3, "head": 1e-2, "head_no_decay": 1e-2}

    report = parse(compose_config("parse", tmp_path / "parse", data_dir, [
        "treebank=tiny", "split=train", f"ckpt_path={objects['ckpt_path']}", "k=4"]))
    corpus = objects["datamodule"].corpora["train"]
    best = [tags.best for tags in trained.predict_kbest([s.words for s in corpus], k=4)]
    gold = [s.supertags for s in corpus]
    accuracy = sum(p == g for ps, gs in zip(best, gold) for p, g in zip(ps, gs)) / sum(map(len, gold))
    assert accuracy > 0.4  # learned: the most frequent supertag is 23% of the tokens
    assert report["supertag_accuracy"] == pytest.approx(accuracy)
    assert report["sentences"] == len(corpus) and report["coverage"] > 0.9 and report["f1"] > 0.5
    assert {"val/supertag_acc", "test/supertag_acc"} <= set(metrics)

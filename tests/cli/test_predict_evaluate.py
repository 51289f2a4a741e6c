"""The evaluate and predict entry points on a checkpoint trained through the train entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from neurocrf.cli.evaluate import evaluate
from neurocrf.cli.predict import predict
from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.data.conll import read_conll
from neurocrf.data.inputs import detect_input_format
from neurocrf.data.sample import ensure_sample_corpus
from neurocrf.data.schemes import convert_tags, validate_tags
from neurocrf.models.metrics import span_scores
from neurocrf.models.tagger import Tagger

REPO = Path(__file__).resolve().parents[2]


def compose_config(name: str, out: Path, overrides: list[str]) -> DictConfig:
    return compose_task_config(name, out, overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    data_dir = tmp_path_factory.mktemp("data")
    ensure_sample_corpus(data_dir / "sample", seed=13, train_size=300, dev_size=40, test_size=40)
    out = tmp_path_factory.mktemp("train")
    cfg = compose_config("train", out, [
        f"paths.data_dir={data_dir}", "~logger", "test=false", "trainer.max_epochs=3", "data.batch_size=16",
        "optimizer.lr=0.02", "encoder.word_dim=16", "encoder.char_dim=8", "encoder.char_hidden=8",
        "encoder.hidden_size=32",
    ])
    train(cfg)
    return {"ckpt": out / "checkpoints" / "last.ckpt", "data_dir": data_dir, "test": data_dir / "sample" / "test.conll"}


def test_evaluate_matches_predictions(trained: dict[str, Path], tmp_path: Path) -> None:
    cfg = compose_config("evaluate", tmp_path,
                         [f"ckpt_path={trained['ckpt']}", f"paths.data_dir={trained['data_dir']}"])
    metrics, _ = evaluate(cfg)
    gold_iob2 = read_conll(trained["test"], tag_column=1)
    tagger = Tagger.load(trained["ckpt"])
    predictions = tagger.predict([s.tokens for s in gold_iob2])
    # scored in the checkpoint's scheme (BIOES) against the file's IOB2 gold, converted
    gold = [convert_tags(s.tags, "IOB2", tagger.scheme) for s in gold_iob2]
    expected = span_scores(gold, [p.tags for p in predictions], tagger.scheme)
    assert expected.f1 > 0.2  # a trained model, so that the comparison means something
    assert metrics["test/f1"] == pytest.approx(expected.f1, abs=1e-6)
    assert metrics["test/precision"] == pytest.approx(expected.precision, abs=1e-6)
    report = (tmp_path / "test_report.txt").read_text()
    assert report.splitlines()[0].split() == ["type", "precision", "recall", "f1", "support"]
    assert {"PER", "ORG", "LOC", "MISC"} <= {line.split()[0] for line in report.splitlines()[2:] if line.strip()}
    assert json.loads((tmp_path / "test_metrics.json").read_text())["support"] == expected.support

    dev = compose_config("evaluate", tmp_path / "dev",
                         [f"ckpt_path={trained['ckpt']}", f"paths.data_dir={trained['data_dir']}", "split=dev"])
    evaluate(dev)
    assert (tmp_path / "dev" / "dev_report.txt").is_file()


def test_predict_conll_keeps_columns_and_token_counts(trained: dict[str, Path], tmp_path: Path) -> None:
    output = tmp_path / "pred.conll"
    cfg = compose_config("predict", tmp_path, [
        f"ckpt_path={trained['ckpt']}", f"input={trained['test']}", f"output={output}",
        "scheme=IOB2", "confidence=true", "nbest=2",
    ])
    summary = predict(cfg)
    assert summary["input_format"] == "conll"
    source = read_conll(trained["test"], tag_column=None)
    written = read_conll(output, tag_column=None)
    assert [len(s.tokens) for s in written] == [len(s.tokens) for s in source]
    for before, after in zip(source, written):
        assert after.tokens == before.tokens
        columns = list(zip(*after.columns))  # token, gold, pred, confidence, nbest_1, nbest_2
        assert len(columns) == 6 and list(columns[1]) == [row[1] for row in before.columns]
        validate_tags(list(columns[2]), "IOB2")  # predictions converted to the requested scheme
        assert list(columns[2]) == list(columns[4])  # the best of the n-best is the prediction
        assert all(0.0 <= float(c) <= 1.0 for c in columns[3])


def test_predict_text_jsonl_any_length(trained: dict[str, Path], tmp_path: Path) -> None:
    long_line = " ".join(["Mr.", "Smith", "flew", "to", "Paris", "."] * 80)  # 480 tokens
    text = tmp_path / "input.txt"
    text.write_text(f"Mr. Smith works in Paris .\n\n{long_line}\nhello\n", encoding="utf-8")
    assert detect_input_format(text) == "text"
    output = tmp_path / "pred.jsonl"
    cfg = compose_config("predict", tmp_path, [
        f"ckpt_path={trained['ckpt']}", f"input={text}", f"output={output}", "format=jsonl", "nbest=3",
    ])
    predict(cfg)
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    lines = text.read_text(encoding="utf-8").splitlines()
    assert len(records) == len(lines)  # one record per input line, the empty one included
    for record, line in zip(records, lines):
        assert record["tokens"] == line.split()
        assert len(record["tags"]) == len(record["confidences"]) == len(line.split())
        for span in record["spans"]:
            assert 0 <= span["start"] < span["end"] <= len(record["tokens"]) and 0 < span["confidence"] <= 1
    assert len(records[0]["nbest"]) == 3 and records[0]["nbest"][0]["tags"] == records[0]["tags"]
    probabilities = [p["probability"] for p in records[0]["nbest"]]
    assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1 + 1e-5
    assert records[1]["tokens"] == [] and len(records[2]["tokens"]) == 480


def test_predict_nbest_on_a_10000_token_sentence(trained: dict[str, Path], tmp_path: Path) -> None:
    """n-best on a very long sentence: the predicted tags first, five distinct paths, float64
    log-probabilities in order (their probabilities underflow to 0)."""
    text = tmp_path / "long.txt"
    text.write_text(" ".join(["Mr.", "Smith", "flew", "to", "Paris", "."] * 1667) + "\n", encoding="utf-8")
    output = tmp_path / "long.jsonl"
    predict(compose_config("predict", tmp_path, [
        f"ckpt_path={trained['ckpt']}", f"input={text}", f"output={output}", "format=jsonl", "nbest=5",
        "input_format=text",
    ]))
    (record,) = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(record["tokens"]) == 10002
    nbest = record["nbest"]
    assert len(nbest) == 5 and nbest[0]["tags"] == record["tags"]
    assert len({tuple(p["tags"]) for p in nbest}) == 5
    log_probs = [p["log_probability"] for p in nbest]
    assert log_probs == sorted(log_probs, reverse=True) and log_probs[0] < 0


def test_predict_module_entry_point(trained: dict[str, Path], tmp_path: Path) -> None:
    """`python -m neurocrf.cli.predict` finds the configs from any working directory."""
    text = tmp_path / "in.txt"
    text.write_text("Mr. Smith works in Paris .\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    env.pop("NEUROCRF_CONFIGS", None)
    result = subprocess.run(
        [sys.executable, "-m", "neurocrf.cli.predict", f"ckpt_path={trained['ckpt']}", f"input={text}",
         "format=jsonl", "output=-", f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(result.stdout.strip())
    assert record["tokens"] == ["Mr.", "Smith", "works", "in", "Paris", "."]
    assert (tmp_path / "logs" / "predict" / "runs").is_dir()  # the run dir came from configs/hydra


def test_keep_types_model_is_evaluated_on_its_own_types(tmp_path: Path) -> None:
    """A model trained on NP chunks only (data.keep_types) is evaluated on NP chunks only by
    neurocrf-evaluate with the plain data config: the checkpoint supplies keep_types. The model
    also has label-pair features, so training with validation, the checkpoint and evaluation run
    on pair emissions."""
    train_file, test_file = tmp_path / "train.txt", tmp_path / "test.txt"
    _chunk_corpus(train_file, 40, seed=3)
    _chunk_corpus(test_file, 15, seed=4)
    data = [f"data.train_path={train_file}", f"data.test_path={test_file}", "data.dev_fraction=0.2",
            "data.token_columns=[0,1]"]
    cfg = compose_config("train", tmp_path / "train", [
        "data=conll2000", *data, "data.scheme=IOB2", "data.keep_types=[NP]", "encoder=features",
        "encoder.templates=['col1[-1,0]']", "encoder.pair_templates=['col1[-1]|col1[0]']",
        "crf=first_order", "~logger", "test=false", "trainer.max_epochs=3", "optimizer.lr=0.1", "data.batch_size=8",
    ])
    train(cfg)
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    model = Tagger.load(ckpt)
    assert model.keep_types == ["NP"] and model.tags == ["O", "B-NP", "I-NP"] and model.encoder.emits_pairs
    gold = read_conll(test_file, tag_column=2)
    predicted = model.predict([[f"{c[0]}\t{c[1]}" for c in s.columns] for s in gold])
    only_np = [[t if t.endswith("-NP") else "O" for t in s.tags] for s in gold]
    expected = span_scores(only_np, [p.tags for p in predicted], "IOB2").f1
    metrics, _ = evaluate(compose_config("evaluate", tmp_path / "evaluate",
                                         [f"ckpt_path={ckpt}", "data=conll2000", *data]))
    assert metrics["test/f1"] == pytest.approx(expected, abs=1e-6)


def _chunk_corpus(path: Path, sentences: int, seed: int) -> None:
    """``word POS chunk`` lines whose chunks follow the POS column only: every word is new, so a
    model can tag the test file only through its POS column."""
    import random

    rng = random.Random(seed)
    patterns = [[("DT", "B-NP"), ("NN", "I-NP")], [("VBZ", "B-VP")], [("IN", "B-PP")], [("NNP", "B-NP")]]
    lines = []
    for s in range(sentences):
        for _ in range(rng.randint(2, 6)):
            for pos, chunk in rng.choice(patterns):
                lines.append(f"w{seed}x{s}x{rng.randrange(10**6)} {pos} {chunk}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_token_columns_model_reads_the_same_columns_in_predict_and_evaluate(tmp_path: Path) -> None:
    """A features CRF trained on word + POS (data.token_columns) is given word + POS again by
    neurocrf-predict and neurocrf-evaluate, from the checkpoint alone."""
    train_file, test_file = tmp_path / "train.txt", tmp_path / "test.txt"
    _chunk_corpus(train_file, 60, seed=1)
    _chunk_corpus(test_file, 20, seed=2)
    data = [f"data.train_path={train_file}", f"data.test_path={test_file}", "data.dev_fraction=0.2"]
    cfg = compose_config("train", tmp_path / "train", [
        "data=conll2000", *data, "data.token_columns=[0,1]", "encoder=features",
        "encoder.templates=[token,'col1[-1,0]']", "crf=first_order", "~logger", "test=false",
        "trainer.max_epochs=4", "optimizer.lr=0.1", "data.batch_size=8",
    ])
    train(cfg)
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    assert Tagger.load(ckpt).token_columns == [0, 1]

    output = tmp_path / "pred.conll"
    predict(compose_config("predict", tmp_path / "predict",
                           [f"ckpt_path={ckpt}", f"input={test_file}", f"output={output}", "scheme=IOB2"]))
    gold = read_conll(test_file, tag_column=2)
    written = read_conll(output, tag_column=3)
    assert [s.tokens for s in written] == [s.tokens for s in gold]
    predicted_f1 = span_scores([s.tags for s in gold], [s.tags for s in written], "IOB2").f1
    assert predicted_f1 > 0.95  # unseen words: only the POS column can tag them

    # evaluate with the plain data config (no token_columns): the checkpoint supplies them
    metrics, _ = evaluate(compose_config("evaluate", tmp_path / "evaluate",
                                         [f"ckpt_path={ckpt}", "data=conll2000", *data]))
    assert metrics["test/f1"] == pytest.approx(predicted_f1, abs=1e-6)

    text = tmp_path / "in.txt"
    text.write_text("the dog barks\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"in.txt:1: token columns \[0, 1\] need a column file"):
        predict(compose_config("predict", tmp_path / "text",
                               [f"ckpt_path={ckpt}", f"input={text}", "input_format=text"]))


def test_cluster_and_vector_features_through_the_entry_points(tmp_path: Path) -> None:
    """Hydra options encoder.clusters and encoder.vectors: a model trained through neurocrf-train
    with a clusters file and a vectors file is used by neurocrf-predict and neurocrf-evaluate after
    both files are gone (the checkpoint carries them), with the predictions of the loaded model.
    The test words are new, but their clusters and vectors are the ones of their chunk type."""
    import random

    train_file, test_file = tmp_path / "train.txt", tmp_path / "test.txt"
    _chunk_corpus(train_file, 40, seed=5)
    _chunk_corpus(test_file, 15, seed=6)
    rng = random.Random(0)
    paths, vectors = [], []
    for sentence in read_conll(train_file, tag_column=2) + read_conll(test_file, tag_column=2):
        for (word, _pos, _), tag in zip(sentence.columns, sentence.tags):
            group = ["B-NP", "I-NP", "B-VP", "B-PP"].index(tag)
            paths.append(f"{group:02b}{rng.randrange(2)}\t{word}")
            vectors.append(word + " " + " ".join("1.0" if d == group else f"{rng.gauss(0, 0.1):.3f}" for d in range(4)))
    clusters_file, vectors_file = tmp_path / "clusters.paths", tmp_path / "vectors.txt"
    clusters_file.write_text("\n".join(paths) + "\n", encoding="utf-8")
    vectors_file.write_text("\n".join(vectors) + "\n", encoding="utf-8")
    data = [f"data.train_path={train_file}", f"data.test_path={test_file}", "data.dev_fraction=0.2"]
    train(compose_config("train", tmp_path / "train", [
        "data=conll2000", *data, "data.scheme=IOB2", "encoder=features", "encoder.templates=[token,'cluster2[0]']",
        f"encoder.clusters={clusters_file}", f"encoder.vectors={vectors_file}", "encoder.vector_offsets=[0]",
        "crf=first_order", "~logger", "test=false", "trainer.max_epochs=4", "optimizer.lr=0.1", "data.batch_size=8",
    ]))
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    clusters_file.unlink(), vectors_file.unlink()
    model = Tagger.load(ckpt)
    gold = read_conll(test_file, tag_column=2)
    expected = model.predict([s.tokens for s in gold])

    output = tmp_path / "pred.conll"
    predict(compose_config("predict", tmp_path / "predict", [f"ckpt_path={ckpt}", f"input={test_file}",
                                                             f"output={output}", "scheme=IOB2"]))
    written = read_conll(output, tag_column=3)
    assert [s.tokens for s in written] == [s.tokens for s in gold]
    assert [s.tags for s in written] == [p.tags for p in expected]
    f1 = span_scores([s.tags for s in gold], [s.tags for s in written], "IOB2").f1
    assert f1 > 0.95  # every test word is unseen: only its cluster and vector can tag it
    metrics, _ = evaluate(compose_config("evaluate", tmp_path / "evaluate", [f"ckpt_path={ckpt}", "data=conll2000",
                                                                              *data]))
    assert metrics["test/f1"] == pytest.approx(f1, abs=1e-6)

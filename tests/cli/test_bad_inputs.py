"""Bad input through the entry points (train, evaluate, predict, export, parse, supertag): each
either gets a clear error naming the file (and line) and the problem, or is read exactly, with the
tokens counted on the way in and out.

Input files whose format cannot be told, long first sentences, gold tags without a final blank
line, byte order marks, bytes that are not UTF-8, whitespace around tags, broken checkpoints and
checkpoints of the other model kind, outputs that cannot be written, failures while writing, and
empty sentences in n-best and CoNLL output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import DictConfig

from neurocrf.cli.evaluate import evaluate
from neurocrf.cli.export import export
from neurocrf.cli.parse import parse
from neurocrf.cli.predict import predict
from neurocrf.cli.supertag_train import train as train_supertagger
from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.data.conll import ConllFormatError
from neurocrf.inference.writers import JsonlWriter
from neurocrf.models.checkpoints import CheckpointError
from tests.helpers.sample_data import sample_data_dir

EVAL_QUIET = ["~callbacks.progress_bar", "+trainer.enable_progress_bar=false"]
QUIET = ["~logger", *EVAL_QUIET]
TINY_TAGGER = ["encoder.word_dim=8", "encoder.char_dim=4", "encoder.char_hidden=4", "encoder.hidden_size=8"]
TINY_SUPERTAGGER = ["encoder.word_dim=8", "encoder.char=null", "encoder.hidden_size=8"]
ISSUE_TEXT = "Peter works in Berlin\nMary lives in Paris\n\nJohn flew to Rome\n"


def config(name: str, out: Path, overrides: list[str], data_dir: Path | None = None) -> DictConfig:
    return compose_task_config(name, out, overrides, data_dir)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=13, train_size=60, dev_size=10, test_size=10)


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("tagger")
    train(config("train", out, [*QUIET, *TINY_TAGGER, "test=false", "trainer.max_epochs=1"], data_dir))
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def supertagger(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("supertagger")
    _, objects = train_supertagger(config("supertag", out, [
        *QUIET, *TINY_SUPERTAGGER, "trainer.max_epochs=1", "callbacks.model_checkpoint.monitor=null",
        "~callbacks.early_stopping", "final_parse.splits=[]"], data_dir))
    return Path(objects["ckpt_path"])


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory, tagger: Path) -> dict[str, Path]:
    """Checkpoint files that are not checkpoints: empty, truncated, garbage."""
    folder = tmp_path_factory.mktemp("broken")
    contents = {"empty.ckpt": b"", "truncated.ckpt": tagger.read_bytes()[:4096],
                "garbage.ckpt": b"\x80\x02}q\x00." * 64}
    for name, content in contents.items():
        (folder / name).write_bytes(content)
    return {name.split(".")[0]: folder / name for name in contents}


def run_predict(tmp_path: Path, ckpt: Path, source: Path, *options: str, output: str = "out.jsonl") -> list:
    """Predict ``source`` to ``tmp_path / output``; the JSON records (jsonl) or the output text."""
    target = tmp_path / output
    kind = "jsonl" if output.endswith(".jsonl") else "conll"
    predict(config("predict", tmp_path, [f"ckpt_path={ckpt}", f"input={source}", f"output={target}",
                                         f"format={kind}", *options]))
    text = target.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()] if kind == "jsonl" else text.split("\n")


def write(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


# ---------------------------------------------------------------- the input format


def test_text_with_equal_word_counts_is_refused_then_read_exactly(tmp_path: Path, tagger: Path) -> None:
    source = write(tmp_path, "input.txt", ISSUE_TEXT)
    with pytest.raises(ConllFormatError, match=r"input\.txt:1: cannot tell whether .* as text 4 sentence\(s\) of 12"):
        run_predict(tmp_path, tagger, source)
    assert not (tmp_path / "out.jsonl").exists()
    records = run_predict(tmp_path, tagger, source, "input_format=text")
    assert [r["tokens"] for r in records] == [line.split() for line in ISSUE_TEXT.splitlines()]
    assert sum(len(r["tags"]) for r in records) == 12


def test_a_first_sentence_of_1200_lines_is_one_sentence(tmp_path: Path, tagger: Path) -> None:
    words = [f"w{i}" for i in range(1200)]
    source = write(tmp_path, "long.txt", "".join(f"{w}\tO\n" for w in words) + "\nlast\tB-PER\n")
    records = run_predict(tmp_path, tagger, source)
    assert [r["tokens"] for r in records] == [words, ["last"]]
    assert [len(r["tags"]) for r in records] == [1200, 1]


def test_gold_tags_without_a_final_blank_line_stay_a_column(tmp_path: Path, tagger: Path) -> None:
    source = write(tmp_path, "gold", "EU\tB-ORG\nrejects\tO\nGerman\tB-MISC\ncall\tO")
    records = run_predict(tmp_path, tagger, source, "+reader.tag_column=-1")
    assert [r["tokens"] for r in records] == [["EU", "rejects", "German", "call"]]
    assert records[0]["gold"] == ["B-ORG", "O", "B-MISC", "O"] and len(records[0]["tags"]) == 4
    lines = run_predict(tmp_path, tagger, source, output="out.conll")
    assert [line.split("\t")[:2] for line in lines[:4]] == [["EU", "B-ORG"], ["rejects", "O"], ["German", "B-MISC"],
                                                            ["call", "O"]]
    assert lines[4:] == ["", ""]


# ---------------------------------------------------------------- encodings and tags


def test_text_input_drops_the_bom(tmp_path: Path, tagger: Path, supertagger: Path) -> None:
    source = write(tmp_path, "bom.txt", "\ufeffPeter lives in Berlin\nMary too\n")
    records = run_predict(tmp_path, tagger, source)
    assert [r["tokens"] for r in records] == [["Peter", "lives", "in", "Berlin"], ["Mary", "too"]]
    report = parse(config("parse", tmp_path / "parse", [f"ckpt_path={supertagger}", f"input={source}", "k=2"]))
    first = Path(report["output"][0]).read_text(encoding="utf-8").splitlines()[0]
    assert "Peter" in first and "\ufeff" not in first


def test_bytes_that_are_not_utf8_are_named_with_file_and_line(tmp_path: Path, tagger: Path, supertagger: Path) -> None:
    source = write(tmp_path, "latin.txt", "Peter lives here\nin K\xf6ln\n".encode("latin-1"))
    problem = r"latin\.txt:2: bytes b'\\xf6' are not valid utf-8"
    for options in ([], ["input_format=text"], ["input_format=conll"]):
        with pytest.raises(ConllFormatError, match=problem):
            run_predict(tmp_path, tagger, source, *options)
    with pytest.raises(ConllFormatError, match=problem):
        parse(config("parse", tmp_path, [f"ckpt_path={supertagger}", f"input={source}"]))
    records = run_predict(tmp_path, tagger, source, "+reader.encoding=latin-1")
    assert records[1]["tokens"] == ["in", "Köln"]


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_whitespace_around_a_tag_names_file_and_line(tmp_path: Path, data_dir: Path, tagger: Path, split: str) -> None:
    files = {name: data_dir / "sample" / f"{name}.conll" for name in ("train", "dev", "test")}
    lines = files[split].read_text(encoding="utf-8").splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.endswith("\tB-PER"))
    lines[number - 1] += " "
    files[split] = write(tmp_path, f"{split}.conll", "\n".join(lines) + "\n")
    data = [f"data.{name}_path={path}" for name, path in files.items()] + ["data.sample_dir=null"]
    problem = rf"{split}\.conll:{number}: tag 'B-PER ' is empty or has whitespace around it"
    if split != "dev":
        with pytest.raises(ConllFormatError, match=problem):
            evaluate(config("evaluate", tmp_path / "eval", [f"ckpt_path={tagger}", *EVAL_QUIET, *data], data_dir))
    with pytest.raises(ConllFormatError, match=problem):
        train(config("train", tmp_path / "train", [*QUIET, *TINY_TAGGER, "trainer.max_epochs=1", *data], data_dir))


# ---------------------------------------------------------------- checkpoints


def test_broken_checkpoints_are_named_by_every_entry_point(tmp_path: Path, data_dir: Path,
                                                           broken: dict[str, Path]) -> None:
    source = write(tmp_path, "in.txt", "Peter lives in Berlin\nMary too\n")
    problems = {"empty": "empty file (0 bytes)", "truncated": "truncated or damaged checkpoint",
                "garbage": "not a checkpoint"}
    for name, path in broken.items():
        runs = {
            "predict": lambda: run_predict(tmp_path, path, source),
            "evaluate": lambda: evaluate(config("evaluate", tmp_path, [f"ckpt_path={path}", *EVAL_QUIET], data_dir)),
            "export": lambda: export(config("export", tmp_path, [f"ckpt_path={path}"])),
            "train init_from": lambda: train(config("train", tmp_path, [*QUIET, f"init_from={path}"], data_dir)),
            "train ckpt_path": lambda: train(config("train", tmp_path, [*QUIET, f"ckpt_path={path}"], data_dir)),
            "parse": lambda: parse(config("parse", tmp_path, [f"ckpt_path={path}", f"input={source}"])),
            "supertag": lambda: train_supertagger(config("supertag", tmp_path, [*QUIET, f"init_from={path}"],
                                                         data_dir)),
        }
        for entry, run in runs.items():
            with pytest.raises(CheckpointError) as caught:
                run()
            message = str(caught.value)
            assert message.startswith(f"{path}: ") and problems[name] in message, (entry, message)
            assert "weights_only" not in message, (entry, message)


def test_a_checkpoint_of_the_other_kind_is_named(tmp_path: Path, data_dir: Path, tagger: Path,
                                                 supertagger: Path) -> None:
    source = write(tmp_path, "in.txt", "Peter lives in Berlin\nMary too\n")
    needs_tagger = {
        "predict": lambda: run_predict(tmp_path, supertagger, source),
        "evaluate": lambda: evaluate(config("evaluate", tmp_path, [f"ckpt_path={supertagger}", *EVAL_QUIET], data_dir)),
        "export": lambda: export(config("export", tmp_path, [f"ckpt_path={supertagger}"])),
        "train": lambda: train(config("train", tmp_path, [*QUIET, f"init_from={supertagger}"], data_dir)),
    }
    for entry, run in needs_tagger.items():
        with pytest.raises(CheckpointError, match=rf"{supertagger.name}: a supertagger checkpoint \(written by"
                                                  r" neurocrf-supertag\), but a tagger checkpoint"):
            run()
    needs_supertagger = {
        "parse": lambda: parse(config("parse", tmp_path, [f"ckpt_path={tagger}", f"input={source}"])),
        "ensemble": lambda: parse(config("parse", tmp_path,
                                         [f"ckpt_path=[{supertagger},{tagger}]", f"input={source}"])),
        "supertag": lambda: train_supertagger(config("supertag", tmp_path, [*QUIET, f"init_from={tagger}"], data_dir)),
    }
    for entry, run in needs_supertagger.items():
        with pytest.raises(CheckpointError, match=rf"{tagger.name}: a tagger checkpoint \(written by neurocrf-train\),"
                                                  r" but a supertagger checkpoint"):
            run()


# ---------------------------------------------------------------- outputs


def test_output_problems_are_found_before_the_model_is_loaded(tmp_path: Path) -> None:
    missing = tmp_path / "no_such.ckpt"  # reached only after the output checks
    empty_token = write(tmp_path, "in.tsv", "EU\tB-ORG\n\tO\n")
    with pytest.raises(ConllFormatError, match=r"in\.tsv:2: value '' is empty .* format=jsonl can hold it"):
        run_predict(tmp_path, missing, empty_token, "+reader.delimiter='\t'", output="pred.conll")
    assert not (tmp_path / "pred.conll").exists()
    source = write(tmp_path, "in.txt", "Peter lives in Berlin\nMary too\n")
    write(tmp_path, "a_file", "")  # a file where the output wants a folder
    with pytest.raises(OSError, match=r"output=.*a_file/sub/pred\.jsonl: cannot write there"):
        run_predict(tmp_path, missing, source, output="a_file/sub/pred.jsonl")
    with pytest.raises(IsADirectoryError, match="is a folder; name a file"):
        predict(config("predict", tmp_path, [f"ckpt_path={missing}", f"input={source}", f"output={tmp_path}"]))
    with pytest.raises(ValueError, match="unknown tag scheme 'IOB3'"):
        run_predict(tmp_path, missing, source, "scheme=IOB3")
    with pytest.raises(FileNotFoundError, match="no_such.ckpt"):
        run_predict(tmp_path, missing, source)


def test_a_failure_while_writing_leaves_no_partial_file(tmp_path: Path, tagger: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    source = write(tmp_path, "in.txt", "Peter lives in Berlin\nMary too\n")
    previous = write(tmp_path, "out.jsonl", "the previous predictions\n")

    def fail_halfway(self, sentence, prediction) -> None:  # noqa: ANN001 - JsonlWriter.write's signature
        self.handle.write('{"tokens": ["Peter"')
        raise OSError("disk full")

    monkeypatch.setattr(JsonlWriter, "write", fail_halfway)
    with pytest.raises(OSError, match="disk full"):
        run_predict(tmp_path, tagger, source)
    assert previous.read_text() == "the previous predictions\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.jsonl"]  # no temporary file left


def test_empty_sentences_have_their_nbest_and_their_line(tmp_path: Path, tagger: Path) -> None:
    text = "Peter lives in Berlin\n\n\nMary Smith too\n\n"
    source = write(tmp_path, "in.txt", text)
    records = run_predict(tmp_path, tagger, source, "nbest=3", "input_format=text")
    assert [r["tokens"] for r in records] == [line.split() for line in text.splitlines()]
    assert all("nbest" in r for r in records)
    assert records[1]["nbest"] == [{"tags": [], "probability": 1.0, "log_probability": 0.0}]
    assert len(records[0]["nbest"]) == 3 and records[0]["nbest"][0]["tags"] == records[0]["tags"]

    lines = run_predict(tmp_path, tagger, source, "input_format=text", "confidence=true", output="out.conll")
    assert lines[-1] == ""  # the file ends with a line break
    per_input_line: list[list[str]] = [[]]
    for line in lines[:-1]:  # the n-th blank line ends the n-th input line
        if line:
            per_input_line[-1].append(line.split("\t")[0])
        else:
            per_input_line.append([])
    assert per_input_line[:-1] == [line.split() for line in text.splitlines()] and per_input_line[-1] == []


def test_parse_outputs_are_whole_or_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """neurocrf-parse's trees and report: a failure while writing leaves the earlier file as it was."""
    import types

    import neurocrf.parsing as parsing
    from neurocrf.supertagging.pipeline import write_run

    previous = write(tmp_path, "parsed.discbracket", "(ROOT (N a))\t1\n")

    def fail_halfway(target, sentences, fmt="discbracket", **options) -> None:  # noqa: ANN001
        target.write("(ROOT (N")
        raise OSError("disk full")

    monkeypatch.setattr(parsing, "write_treebank", fail_halfway)
    with pytest.raises(OSError, match="disk full"):
        write_run(types.SimpleNamespace(predictions=[]), {}, previous)
    assert previous.read_text() == "(ROOT (N a))\t1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parsed.discbracket"]


@pytest.mark.parametrize("content, problem", [
    ("\ufeff(S (N 0=a) (V 1=b))\t1\n2\t(S (N 0=c))\n", ":2: expected a tree"),  # the old id<TAB>tree form
    ("(S (N 0=a) (V 1=b))\t1\n(S (N 0=c)\t2\n", ":2: "),  # an unbalanced bracket
    (b"(S (N 0=a) (V 1=b))\t1\n(S (N 0=\xf6))\t2\n", ":2: bytes b'\\xf6' are not valid utf-8"),
])
def test_extract_names_file_and_line_of_a_bad_treebank(content: str | bytes, problem: str, tmp_path: Path) -> None:
    from neurocrf.cli.extract import extract

    bank = tmp_path / "bank.discbracket"
    if isinstance(content, bytes):
        bank.write_bytes(content)
    else:
        bank.write_text(content, encoding="utf-8")
    with pytest.raises(Exception) as error:
        extract(config("extract", tmp_path / "out", ["treebank=tiny", f"treebank.path={bank}",
                                                     "treebank.generate=null"]))
    assert "bank.discbracket" in str(error.value) and problem in str(error.value), str(error.value)
    assert not (tmp_path / "out" / "stats.json").exists()

"""A user's mistake, run as the user runs the tools (``python -m neurocrf.cli.<tool>``): a bad
input, a missing file and a bad checkpoint for predict, evaluate, train and parse each end in one
line ``neurocrf-<tool>: error: <file>[:<line>]: <problem>``, exit status 2 and no traceback;
``HYDRA_FULL_ERROR=1`` adds the traceback; an internal error keeps its traceback (status 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from neurocrf.cli.tool import JobFailed, tool_main
from tests.helpers.cli import run_tool
from tests.helpers.sample_data import sample_data_dir, tiny_tagger_checkpoint

BAD_CONLL = "Peter\tB-PER\nworks\tO\tX\n\n"  # a line with 3 columns among lines of 2: line 2


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    data_dir = sample_data_dir(tmp_path_factory, seed=3, train_size=40, dev_size=8, test_size=8)
    folder = tmp_path_factory.mktemp("bad")
    (folder / "bad.conll").write_text(BAD_CONLL, encoding="utf-8")
    (folder / "bad.txt").write_bytes(b"Peter works\nin \xff Berlin\n")  # not UTF-8 on line 2
    (folder / "garbage.ckpt").write_bytes(b"\x80\x02}q\x00." * 64)
    return {"data": data_dir, "ckpt": tiny_tagger_checkpoint(tmp_path_factory, data_dir), "folder": folder}


def cases(files: dict[str, Path]) -> dict[str, tuple[str, list[str], str]]:
    """case -> (tool, arguments, the start of the problem the error line names)."""
    folder, ckpt, data = files["folder"], files["ckpt"], files["data"]
    bad, missing, garbage = folder / "bad.conll", folder / "missing.conll", folder / "garbage.ckpt"
    text, not_found = folder / "bad.txt", f"input file not found: {missing}"
    tiny = ["encoder.word_dim=8", "encoder.char_dim=4", "encoder.char_hidden=4", "encoder.hidden_size=8",
            "trainer.max_epochs=1", "~logger", f"paths.data_dir={data}"]
    return {
        "predict-bad-input": ("predict", [f"ckpt_path={ckpt}", f"input={bad}", "input_format=conll"], f"{bad}:2:"),
        "predict-missing-file": ("predict", [f"ckpt_path={ckpt}", f"input={missing}"], not_found),
        "predict-bad-checkpoint": ("predict", [f"ckpt_path={garbage}", f"input={folder / 'good.txt'}"], f"{garbage}"),
        "evaluate-bad-input": ("evaluate", [f"ckpt_path={ckpt}", f"data.test_path={bad}", f"paths.data_dir={data}"],
                               f"{bad}:2:"),
        "evaluate-missing-file": ("evaluate", [f"ckpt_path={ckpt}", f"data.test_path={missing}",
                                               f"paths.data_dir={data}"], not_found),
        "evaluate-bad-checkpoint": ("evaluate", [f"ckpt_path={garbage}", f"paths.data_dir={data}"], f"{garbage}"),
        "train-bad-input": ("train", [*tiny, f"data.train_path={bad}"], f"{bad}:2:"),
        "train-missing-file": ("train", [*tiny, f"data.train_path={missing}"], not_found),
        "train-bad-checkpoint": ("train", [*tiny, f"init_from={garbage}"], f"{garbage}"),
        "parse-bad-input": ("parse", [f"ckpt_path={garbage}", f"input={text}"], f"{text}:2:"),
        "parse-missing-file": ("parse", [f"ckpt_path={garbage}", f"input={missing}"], not_found),
        "parse-bad-checkpoint": ("parse", [f"ckpt_path={garbage}", "input=" + str(folder / "good.txt")], f"{garbage}"),
    }


FAST = ("predict-bad-input", "parse-bad-checkpoint")  # each subprocess takes seconds: the others are slow
CASES = [case if case in FAST else pytest.param(case, marks=pytest.mark.slow)
         for case in (f"{tool}-{kind}" for tool in ("predict", "evaluate", "train", "parse")
                      for kind in ("bad-input", "missing-file", "bad-checkpoint"))]


@pytest.mark.parametrize("case", CASES)
def test_a_user_error_is_one_line_and_exit_status_2(case: str, files: dict[str, Path], tmp_path: Path) -> None:
    (files["folder"] / "good.txt").write_text("Peter works in Berlin\n", encoding="utf-8")
    tool, arguments, problem = cases(files)[case]
    done = run_tool(tool, *arguments, f"paths.log_dir={tmp_path / 'logs'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Error executing job" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    prog = "neurocrf-" + tool.replace("_", "-")
    assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: {problem}"), done.stderr[-3000:]
    assert done.stderr.rstrip().endswith(errors[0])  # the last thing the user sees


def test_hydra_full_error_adds_the_traceback(files: dict[str, Path], tmp_path: Path) -> None:
    missing = files["folder"] / "missing.conll"
    done = run_tool("predict", f"ckpt_path={files['ckpt']}", f"input={missing}", cwd=tmp_path, HYDRA_FULL_ERROR="1")
    assert done.returncode == 2 and "Traceback (most recent call last)" in done.stderr
    assert done.stderr.rstrip().endswith(f"neurocrf-predict: error: input file not found: {missing}")


def test_an_internal_error_keeps_its_traceback_and_exit_status_1(capsys: pytest.CaptureFixture, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(cfg: object) -> None:
        raise KeyError("a bug")

    main = tool_main(broken, "extract", "neurocrf-extract")
    monkeypatch.setattr("sys.argv", ["neurocrf-extract", f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null",
                                     "hydra/job_logging=none", "hydra/hydra_logging=none"])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "Traceback (most recent call last)" in err and "KeyError: 'a bug'" in err
    assert err.rstrip().endswith("neurocrf-extract: internal error: 'a bug'")
    assert JobFailed.__mro__[1] is BaseException  # Hydra lets it through to the report

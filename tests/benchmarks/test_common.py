"""benchmarks/common.py, the one library the benchmarks share: interleaved timing, and a side in
a subprocess speaking JSON lines that finds ``benchmarks`` from any working folder."""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

import pytest

import benchmarks.common
from benchmarks.common import ROOT, JsonWorker, module_command, module_env, time_interleaved

ECHO_WORKER = """
from benchmarks.common import serve

def fail(request):
    raise ValueError("no such thing")

serve({"setup": lambda request: {"ready": request["name"]}, "double": lambda request: 2 * request["x"], "fail": fail})
"""


def test_doctests() -> None:
    assert doctest.testmod(benchmarks.common).failed == 0


def test_rounds_rotate_and_medians_are_of_each_contender() -> None:
    calls: list[str] = []
    clock = iter(range(1000)).__next__  # every reading one unit later: each call takes 1 unit
    result = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"),
                               "c": lambda: calls.append("c")}, repeats=3, warmup=1, clock=clock)
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]  # warm-up, then rotated rounds
    assert result == {"a": 1000.0, "b": 1000.0, "c": 1000.0}  # 1 unit = 1000 ms


def test_a_worker_in_another_folder_imports_benchmarks_and_answers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the worker starts in a temporary folder too: PYTHONPATH finds the repository
    worker = JsonWorker("echo", [sys.executable, "-c", ECHO_WORKER], {"name": "echo"})
    try:
        assert worker.info == {"ready": "echo"}
        assert worker.call({"op": "double", "x": 21}) == 42
        with pytest.raises(RuntimeError, match="echo worker: ValueError: no such thing"):
            worker.call({"op": "fail"})
        assert worker.call({"op": "double", "x": 1}) == 2  # a failed request leaves the worker serving
    finally:
        worker.close()
    assert worker.process.returncode == 0


def test_module_env_puts_a_baseline_before_the_repository(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = module_env(["/baseline"], OMP_NUM_THREADS="1")
    assert env["PYTHONPATH"].split(":") == ["/baseline", str(ROOT), "/elsewhere"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert module_command("benchmarks.train", "--worker", "flair", python="py") == [
        "py", "-m", "benchmarks.train", "--worker", "flair"]

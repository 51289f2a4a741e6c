"""What the benchmarks share: where things are, timing, the machine, and peers in subprocesses.

- :func:`time_interleaved`: contenders timed in rotating order over rounds, medians in ms.
- :func:`machine`: the CPU, cores, load and OS a table was measured on.
- :func:`module_command` and :func:`module_env`: re-run a benchmark module in a subprocess (one
  configuration per process, or a peer in its own interpreter), found from the repository root.
- :class:`JsonWorker` and :func:`serve`: a benchmark side in a persistent subprocess speaking JSON
  lines over stdin / stdout. Peers that need their own interpreter (flair pins ``transformers<5``)
  run this way, in the same rounds as neurocrf.

Every benchmark runs as a module from the repository root: ``python -m benchmarks.crf --help``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from neurocrf.parsing.treebank import data_root

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the folder that holds ``benchmarks/`` (and ``neurocrf/``)."""
DEFAULT_DATA = data_root()
"""The corpora folder: ``$NEUROCRF_DATA``, else ``../shared/data`` beside the repository."""
DEFAULT_FLAIR_PYTHON = os.environ.get("FLAIR_PYTHON", "")
"""An interpreter with flair installed (``$FLAIR_PYTHON``), for the benchmarks that time flair."""


# ---------------------------------------------------------------------------------- timing


def synchronize(device: Any) -> None:
    """Wait for the device's queued work (CUDA), so that a clock around a call times the call."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    contenders: dict[str, Callable[[], Any]],
    repeats: int,
    device: Any = "cpu",
    warmup: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median milliseconds per call of each contender: ``warmup`` untimed calls each, then
    ``repeats`` rounds in which every contender runs once, the first one rotating from round to
    round (load that drifts during the run falls on all of them alike).

    >>> sorted(time_interleaved({"a": lambda: None, "b": lambda: None}, repeats=3))
    ['a', 'b']
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            synchronize(device)
            start = clock()
            contenders[name]()
            synchronize(device)
            times[name].append(clock() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def iob2_tags(num_tags: int) -> list[str]:
    """An IOB2 tag list of ``num_tags`` tags (odd): ``O`` and B/I of ``(num_tags - 1) // 2`` types.

    >>> iob2_tags(5)
    ['O', 'B-T0', 'I-T0', 'B-T1', 'I-T1']
    """
    types = (num_tags - 1) // 2
    return ["O"] + [f"{prefix}-T{i}" for i in range(types) for prefix in "BI"]


def machine() -> dict[str, str]:
    """The CPU model, core count, load averages and OS of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {"cpu": cpu, "cores": str(os.cpu_count()), "load": load, "os": platform.platform()}


# ---------------------------------------------------------------------------------- subprocesses


def module_command(module: str, *arguments: str, python: str = sys.executable) -> list[str]:
    """The command that runs ``python -m module arguments...`` (with :func:`module_env`).

    >>> module_command("benchmarks.crf", "--help", python="python")
    ['python', '-m', 'benchmarks.crf', '--help']
    """
    return [python, "-m", module, *arguments]


def module_env(first: Sequence[str | os.PathLike[str]] = (), **variables: str) -> dict[str, str]:
    """This process's environment for a :func:`module_command` child, whatever its working folder:
    ``PYTHONPATH`` holds ``first`` (e.g. another neurocrf checkout to time), then the repository
    root (so ``benchmarks`` and this checkout's ``neurocrf`` import), then the caller's entries;
    ``variables`` are set too (e.g. ``OMP_NUM_THREADS="1"``)."""
    entries = [os.fspath(p) for p in first] + [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(entries), **variables}


class JsonWorker:
    """The parent's end of a side in a subprocess: ``command`` (a :func:`module_command` whose
    module calls :func:`serve`) is started in a temporary folder with ``env`` (default
    :func:`module_env`), sent ``setup``; :meth:`call` sends one request and returns the result."""

    def __init__(self, name: str, command: list[str], setup: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env or module_env(),
            cwd=tempfile.gettempdir(),  # so that PYTHONPATH, not the current folder, picks neurocrf
        )
        self.info = self.call({"op": "setup", **setup})

    def call(self, message: dict[str, Any]) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker died (exit code {self.process.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.name} worker: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        try:
            self.call({"op": "quit"})
        finally:
            self.process.wait(timeout=60)


def serve(handlers: dict[str, Callable[[dict[str, Any]], Any]]) -> None:
    """The child's end: answer requests on stdin with ``handlers[op](request)`` until ``quit``.

    Replies go to the original stdout; anything the handlers print goes to stderr.
    """
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            protocol.write(json.dumps({"result": None}) + "\n")
            protocol.flush()
            return
        try:
            reply = {"result": handlers[request["op"]](request)}
        except Exception as error:  # noqa: BLE001 - reported to the parent, which raises
            traceback.print_exc()
            reply = {"error": f"{type(error).__name__}: {error}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()

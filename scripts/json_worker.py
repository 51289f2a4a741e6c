"""A benchmark side in a persistent subprocess, speaking JSON lines over stdin / stdout.

The parent starts ``command`` (a script re-run with a worker flag), sends ``{"op": ...}`` requests
and reads one reply per request; the child answers them with :func:`serve`. Peers that need their
own interpreter (flair pins ``transformers<5``) run this way, in the same rounds as neurocrf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any


class JsonWorker:
    """The parent's end: ``call`` sends one request and returns the child's result."""

    def __init__(self, name: str, command: list[str], setup: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
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

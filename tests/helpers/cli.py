"""The console scripts as a user runs them: ``python -m neurocrf.cli.<tool>`` in a subprocess,
with this checkout first on the path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOOL_ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def tool_command(tool: str, *args: str) -> list[str]:
    """The command line of ``neurocrf-<tool>`` (``tool``: the module name, e.g. ``parse_evaluate``)."""
    return [sys.executable, "-m", f"neurocrf.cli.{tool}", *args]


def run_tool(tool: str, *args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """Run ``neurocrf-<tool> args`` in ``cwd`` to its end; its exit status, stdout and stderr."""
    environment = {**TOOL_ENV, **env}
    for name in ("HYDRA_FULL_ERROR", "NEUROCRF_SHORT_ERRORS"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(tool_command(tool, *args), cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=timeout, check=False)


def start_tool(tool: str, *args: str, cwd: Path, **options: Any) -> subprocess.Popen:
    """Start ``neurocrf-<tool> args`` in ``cwd`` (stderr piped, as text)."""
    return subprocess.Popen(tool_command(tool, *args), cwd=cwd, env=TOOL_ENV, stderr=subprocess.PIPE, text=True,
                            **options)

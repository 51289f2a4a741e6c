"""reproductions/conll2003_variants.sh: the queue runs in order with its overrides, at most JOBS at a
time; finished runs and runs another copy is training are skipped; --status reads the logs."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "reproductions" / "conll2003_variants.sh"

# stands in for python: `-m neurocrf.cli.train ...` records its arguments and its start and end,
# everything else (the --status reader) runs the real interpreter
FAKE_PYTHON = f"""#!/usr/bin/env bash
if [[ $1 == -m ]]; then
  echo "start $*" >> "$CALLS"
  echo "console output"  # Hydra's own log of a train run is train.log: the console must not share it
  sleep 2.5  # longer than the pause after a start: a second run would start meanwhile
  echo "end" >> "$CALLS"
  exit 0
fi
exec {sys.executable} "$@"
"""


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    runs = tmp_path / "runs"
    runs.mkdir()
    return {**os.environ, "PYTHON": str(python), "RUNS": str(runs), "CALLS": str(tmp_path / "calls"), "JOBS": "2",
            "POLL": "1"}


def test_queue_runs_in_order_one_at_a_time_and_skips(tmp_path: Path, fake: dict[str, str]) -> None:
    runs = Path(fake["RUNS"])
    (runs / "done_seed1").mkdir()
    (runs / "done_seed1" / "summary.json").write_text("{}")
    (runs / "busy_seed1").mkdir()
    queue = tmp_path / "queue.txt"
    queue.write_text("# comment\nfirst 1 encoder.char=lstm  # why\n\nsecond 2 data.scheme=IOB2 a=b\ndone 1\nbusy 1\n")
    with open(runs / "busy_seed1" / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another copy trains it: it takes one of the two slots
        done = subprocess.run(["bash", str(SCRIPT), str(queue)], env=fake, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = Path(fake["CALLS"]).read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["start", "end", "start", "end"]  # one slot left
    first, second = lines[0].split(), lines[2].split()
    assert first[:3] == ["start", "-m", "neurocrf.cli.train"]
    assert f"hydra.run.dir={runs / 'first_seed1'}" in first and "seed=1" in first and "resume=true" in first
    assert "test=false" in first and first[-1] == "encoder.char=lstm"
    assert "experiment=conll2003_bilstm_crf_cased" in first  # the recipe the search started from
    assert f"hydra.run.dir={runs / 'second_seed2'}" in second and second[-2:] == ["data.scheme=IOB2", "a=b"]
    assert (runs / "first_seed1" / "console.log").read_text() == "console output\n"
    assert not (runs / "first_seed1" / "train.log").exists()
    assert "done seed 1: finished" in done.stdout and "busy seed 1: running elsewhere, skipped" in done.stdout


def test_status_table_from_the_logs(fake: dict[str, str]) -> None:
    run = Path(fake["RUNS"]) / "spacy300_seed2"
    (run / ".hydra").mkdir(parents=True)
    overrides = ["experiment=conll2003_bilstm_crf", "seed=2", "encoder.word_dim=300"]
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    timing = "(training 380.2 s: 36.9 sentences/s, 534.1 tokens/s)"
    log = "".join(f"[x][neurocrf.models.callbacks][INFO] - epoch {e}: {s} s {timing}, val/f1 {f}\n"
                  for e, s, f in [(1, 400.5, 0.8), (2, 410.0, 0.9), (3, 420.0, 0.85)])
    (run / "train.log").write_text(log)
    (run / "console.log").write_text(log)  # the console's copy is not read: each epoch counts once
    done = subprocess.run(["bash", str(SCRIPT), "--status"], env=fake, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[-1]
    assert row == "| spacy300_seed2 | `encoder.word_dim=300` | 3 | 90.00 (2) | 85.00 | 420 | no | no |"

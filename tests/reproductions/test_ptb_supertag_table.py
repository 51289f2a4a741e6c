"""scripts/ptb_supertag_table.py: finished runs, mean ± sd per encoder, unfinished runs named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from ptb_supertag_table import collect, format_table  # noqa: E402


def write_run(folder: Path, f1: float, dis_f1: float, speed: float) -> None:
    folder.mkdir(parents=True)
    for split in ("dev", "test"):
        report = {"f1": f1, "dis_f1": dis_f1, "coverage": 1.0, "supertag_accuracy": 0.9,
                  "sentences_per_second": speed, "parsing_sentences_per_second": 2 * speed}
        (folder / f"parse_{split}_report.json").write_text(json.dumps(report), encoding="utf-8")


def test_table_averages_finished_seeds_and_names_the_rest(tmp_path: Path) -> None:
    write_run(tmp_path / "bilstm_seed2", 0.80, 0.40, 10.0)
    write_run(tmp_path / "bilstm_seed10", 0.90, 0.60, 30.0)
    (tmp_path / "minilm_seed1" / "checkpoints").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    done, pending = collect(tmp_path)
    assert [seed for seed, _ in done["bilstm"]] == [2, 10] and pending == ["minilm_seed1"]
    table = format_table(done, pending)
    assert "| bilstm seed 2 | 80.00 | 80.00 | 40.00 | 100.00 | 90.00 | 10.0 | 20.0 |" in table
    # mean and sample sd of (80, 90): 85 ± 7.07; of (40, 60): 50 ± 14.14; of (10, 30): 20 ± 14.1
    assert "| **bilstm, mean ± sd (n = 2)** | 85.00 ± 7.07 | 85.00 ± 7.07 | 50.00 ± 14.14 |" in table
    assert "20.0 ± 14.1 | 40.0 ± 28.3 |" in table
    assert table.rstrip().endswith("not finished: minilm_seed1")
    write_run(tmp_path / "minilm_seed1" / "x", 0.7, 0.5, 5.0)  # a stray folder does not count
    write_run(tmp_path / "minilm_seed4", 0.7, 0.5, 5.0)
    done, pending = collect(tmp_path)
    assert "| **minilm, mean ± sd (n = 1)** | 70.00 ± - |" in format_table(done, pending)


def test_driver_skips_finished_runs_and_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    fake = tmp_path / "fake_python"
    fake.write_text('#!/usr/bin/env bash\necho "$@" >> "$CALLS"\n', encoding="utf-8")
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    write_run(runs / "bilstm_seed1", 0.8, 0.4, 10.0)
    (runs / "bilstm_seed2" / "checkpoints").mkdir(parents=True)
    (runs / "bilstm_seed2" / "checkpoints" / "last.ckpt").write_bytes(b"")
    env = {**os.environ, "RUNS_DIR": str(runs), "PYTHON": str(fake), "CALLS": str(tmp_path / "calls")}
    done = subprocess.run(["bash", str(root / "scripts" / "ptb_supertag_runs.sh"), "bilstm:1", "bilstm:2",
                           "minilm:3"], env=env, capture_output=True, text=True, check=True)
    assert "bilstm_seed1: done, skipped" in done.stdout
    calls = (tmp_path / "calls").read_text(encoding="utf-8").splitlines()
    assert calls == [
        f"-m neurocrf.cli.supertag_train experiment=ptb_supertagger_bilstm seed=2 hydra.run.dir={runs}/bilstm_seed2"
        f" ckpt_path={runs}/bilstm_seed2/checkpoints/last.ckpt",
        f"-m neurocrf.cli.supertag_train experiment=ptb_supertagger_minilm seed=3 hydra.run.dir={runs}/minilm_seed3"]
    bad = subprocess.run(["bash", str(root / "scripts" / "ptb_supertag_runs.sh"), "lstm:1"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "bad run lstm:1" in bad.stderr

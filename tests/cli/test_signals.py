"""A resumable prediction (one process, and two with ``trainer=ddp_sim``) stopped by SIGTERM or
SIGINT while in flight: it stops within seconds with exit status 143 / 130, names the signal and
the input line reached, leaves nothing at the output path, keeps its complete shards, and the next
run reuses them for an output that holds every sentence."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from neurocrf.cli.predict import predict
from neurocrf.cli.utils import compose_task_config
from neurocrf.inference.sharded import shard_dir
from tests.helpers.cli import start_tool
from tests.helpers.sample_data import sample_data_dir, tiny_tagger_checkpoint

WINDOW = 50
SENTENCES = 20_000  # 400 shards: the run is in flight when signalled after two


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = sample_data_dir(tmp_path_factory, seed=5, train_size=60, dev_size=10, test_size=50)
    return tiny_tagger_checkpoint(tmp_path_factory, data_dir)


@pytest.fixture(scope="module")
def source(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("input") / "big.txt"
    words = ["Peter", "works", "in", "Berlin", "with", "Mary", "of", "Acme", "Corp", "."]
    lines = [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 9)) for i in range(SENTENCES)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def stop_in_flight(process: subprocess.Popen, folder: Path, signum: int) -> tuple[int, str, float]:
    """Send ``signum`` once the run has completed two shards; its exit status, stderr and the
    seconds it took to stop."""
    deadline = time.time() + 300
    while len(list(folder.glob("*.done.json"))) < 2 and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, f"the run ended before the signal: {process.communicate()[1][-3000:]}"
    sent = time.time()
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    return process.returncode, err, time.time() - sent


@pytest.mark.parametrize("signum, processes", [
    (signal.SIGTERM, 1),
    pytest.param(signal.SIGINT, 1, marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, 2, marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, 2, marks=pytest.mark.slow),
])
def test_a_stopped_resumable_run_keeps_its_shards_for_the_next(tmp_path: Path, ckpt: Path, source: Path,
                                                               signum: int, processes: int) -> None:
    output = tmp_path / "out.conll"
    options = [f"ckpt_path={ckpt}", f"input={source}", f"output={output}", f"window={WINDOW}", "batch_size=25",
               "resumable=true", f"paths.log_dir={tmp_path / 'logs'}"]
    trainer = ["trainer=ddp_sim"] if processes == 2 else []
    process = start_tool("predict", *options, *trainer, cwd=tmp_path)
    status, err, seconds = stop_in_flight(process, shard_dir(str(output)), signum)
    name = signal.Signals(signum).name
    assert status == 128 + signum, err[-3000:]
    assert f"neurocrf-predict: stopped by {name}" in err and "Traceback" not in err, err[-3000:]
    assert f"prediction stopped by {name} after {source}:" in err, err[-3000:]
    assert seconds < 60
    assert not output.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.conll.")] == \
        [shard_dir(str(output)).name]  # no temporary output left, the shards kept
    kept = len(list(shard_dir(str(output)).glob("*.done.json")))
    assert kept >= 2

    summary = predict(compose_task_config("predict", tmp_path / "again", options))
    assert summary["reused"] >= kept >= 2
    assert summary["sentences"] == SENTENCES
    assert output.read_text(encoding="utf-8").count("\n\n") == SENTENCES

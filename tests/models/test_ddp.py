"""DDP correctness on CPU (``trainer=ddp_sim``: 2 processes, gloo): test metrics computed from the
predictions of both ranks equal a single-process evaluation of the same checkpoint.

The test split has an odd number of sentences, so the distributed sampler gives one rank a repeated
sentence: a rank-local F1, a sum over ranks or a missing dedup would all change the numbers.
(tests/cli/test_train.py checks the same for the dev F1 of an in-memory model.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from neurocrf.cli.evaluate import evaluate
from neurocrf.cli.train import train
from neurocrf.cli.utils import compose_task_config
from neurocrf.data.conll import read_conll
from neurocrf.data.schemes import get_spans
from neurocrf.models.metrics import span_scores
from neurocrf.models.tagger import Tagger
from tests.helpers.sample_data import sample_data_dir

TINY = [
    "encoder.word_dim=16", "encoder.char_dim=8", "encoder.char_hidden=8", "encoder.hidden_size=16",
    "data.batch_size=16", "optimizer.lr=0.05", "trainer.num_sanity_val_steps=0",
    "+trainer.enable_progress_bar=false", "~logger",
]
# keep the best and the last checkpoint; no early stopping, no progress bar
TRAIN_CALLBACKS = ["~callbacks.progress_bar", "~callbacks.early_stopping"]
EVAL = ["callbacks=none", "+trainer.enable_progress_bar=false"]
TEST_SIZE = 61


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=13, train_size=300, dev_size=40, test_size=TEST_SIZE)


def compose_config(name: str, output_dir: Path, data_dir: Path, overrides: list[str]) -> DictConfig:
    return compose_task_config(name, output_dir, overrides, data_dir)


def gold_spans(path: Path) -> int:
    return sum(len(get_spans(s.tags, "IOB2")) for s in read_conll(path, tag_column=1, delimiter="\t"))


def single_process_f1(checkpoint: Path, test_file: Path) -> float:
    """F1 of ``Tagger.load(checkpoint).predict`` on the test file: no Trainer, no DDP."""
    tagger = Tagger.load(checkpoint)
    sentences = read_conll(test_file, tag_column=1, delimiter="\t", scheme="IOB2")
    predictions = tagger.predict([s.tokens for s in sentences], batch_size=32)
    return span_scores([s.tags for s in sentences], [p.tags_in("IOB2") for p in predictions], "IOB2").f1


@pytest.fixture(scope="module")
def checkpoint(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tagger trained in this process for 2 epochs (its last checkpoint)."""
    output = tmp_path_factory.mktemp("single")
    cfg = compose_config("train", output, data_dir, ["trainer.max_epochs=2", "test=false", *TINY, *TRAIN_CALLBACKS])
    train(cfg)
    return output / "checkpoints" / "last.ckpt"


def test_ddp_sim_test_f1_of_a_checkpoint_equals_single_process(data_dir: Path, checkpoint: Path,
                                                               tmp_path: Path) -> None:
    test_file = data_dir / "sample" / "test.conll"
    expected = single_process_f1(checkpoint, test_file)
    assert expected > 0.0  # a learned model: wrong gathering would show

    single, _ = evaluate(compose_config("evaluate", tmp_path / "cpu", data_dir, [f"ckpt_path={checkpoint}", *EVAL]))
    cfg = compose_config("evaluate", tmp_path / "ddp", data_dir, [f"ckpt_path={checkpoint}", "trainer=ddp_sim", *EVAL])
    distributed, objects = evaluate(cfg)
    assert objects["trainer"].world_size == 2 and objects["trainer"].strategy.__class__.__name__ == "DDPStrategy"

    assert single["test/f1"] == pytest.approx(expected, abs=1e-6)
    assert distributed["test/f1"] == pytest.approx(expected, abs=1e-6)
    for key in ("test/precision", "test/recall"):
        assert distributed[key] == pytest.approx(single[key], abs=1e-6)
    # rank 0 scored every test sentence exactly once: the gold span count is the whole file's
    report = json.loads((tmp_path / "ddp" / "test_metrics.json").read_text())
    assert report["support"] == gold_spans(test_file)
    assert report["f1"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.slow
def test_ddp_sim_training_cli_end_to_end(data_dir: Path, tmp_path: Path) -> None:
    """``neurocrf-train trainer=ddp_sim``: fit and test in 2 processes; the reported test F1 is
    the single-process F1 of the checkpoint it names."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "neurocrf.cli.train", "trainer=ddp_sim", "trainer.max_epochs=3",
        f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}", *TINY, *TRAIN_CALLBACKS,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run(command, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "MEMBER: 2/2" in output  # two processes really ran
    assert "terminate called" not in done.stderr and "destroy_process_group" not in done.stderr  # a clean exit
    best = Path(next(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("checkpoint: ")))
    report = json.loads((run_dir / "test_metrics.json").read_text())
    test_file = data_dir / "sample" / "test.conll"
    assert report["support"] == gold_spans(test_file)
    assert report["f1"] == pytest.approx(single_process_f1(best, test_file), abs=1e-6)


# Run as `python -c EXIT_CHECK <evaluate overrides>`: registered before anything of neurocrf, this
# handler runs after every other exit handler (last in, first out) and reports whether the process
# group was still open when the interpreter began to finalise (where gloo's threads can abort it).
EXIT_CHECK = """
import atexit, sys
import torch.distributed as dist
atexit.register(lambda: print(f"process group open at exit: {dist.is_initialized()}", flush=True))
from neurocrf.cli.evaluate import main
main()
"""


def test_a_distributed_run_destroys_its_process_group_before_the_interpreter_exits(
        data_dir: Path, checkpoint: Path, tmp_path: Path) -> None:
    """``neurocrf-evaluate`` under the DDP strategy in one process (gloo, world size 1): the group
    Lightning opened is destroyed at exit, and the run exits 0 with nothing on stderr after its
    work. An open group makes a spawned worker abort now and then (neurocrf.models.distributed)."""
    command = [
        sys.executable, "-c", EXIT_CHECK, f"ckpt_path={checkpoint}", "trainer=ddp_sim", "trainer.strategy=ddp",
        "trainer.devices=1", f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'run'}", *EVAL,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run(command, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "MEMBER: 1/1" in done.stdout + done.stderr  # Lightning really initialised a process group
    assert "process group open at exit: False" in done.stdout, done.stdout[-2000:]
    assert "terminate called" not in done.stderr and "destroy_process_group" not in done.stderr

"""Prediction on several nodes, without a cluster: two ``neurocrf-predict`` processes on this
machine that Lightning sees as 2 nodes x 1 device (gloo), started as a cluster starts them, each
with its own Hydra run directory:

- by SLURM (``srun``): the variables ``srun`` sets, read by Lightning's ``SLURMEnvironment``
  (rank, node, task counts, the node list for the main address, the job id for the port);
- by hand: ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` on
  each process (Lightning's ``LightningEnvironment``);
- by ``torchrun --nnodes=2``, once per node (Lightning's ``TorchElasticEnvironment``).

The output is byte for byte that of one process; rank 0 of node 0 merges it, once; a re-run
after an interrupted run predicts only what is missing; both processes exit cleanly. An output
folder that the nodes do not share is refused with an error on every rank, and so is an output
that differs between ranks. A rank that fails in the middle (a token that its shard cannot write
as CoNLL) stops the others too, which keep their complete shards.

The ``submitit_slurm_ddp`` launcher preset asks SLURM for the layout Lightning expects (checked
on the sbatch script the submitit plugin writes, without a cluster).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from neurocrf.cli.predict import predict
from neurocrf.cli.utils import CONFIG_DIR, compose_task_config
from neurocrf.inference.sharded import merge_shards, prepare_shards, shard_dir
from tests.helpers.sample_data import sample_data_dir, sample_test_text, tiny_tagger_checkpoint

REPO = Path(__file__).resolve().parents[2]
WINDOW = 8  # 61 test sentences + 8 empty lines: 9 shards
TIMEOUT = 240
OPTIONS = [f"window={WINDOW}", "format=jsonl", "nbest=2", "batch_size=3"]
TWO_NODES = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.num_nodes=2"]
CLUSTER_VARIABLES = re.compile(r"SLURM_.*|MASTER_ADDR|MASTER_PORT|NODE_RANK|LOCAL_RANK|WORLD_SIZE|GROUP_RANK|"
                               r"TORCHELASTIC_.*|PL_.*")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=17, train_size=150, dev_size=20, test_size=61)


@pytest.fixture(scope="module")
def ckpt(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_tagger_checkpoint(tmp_path_factory, data_dir)


@pytest.fixture(scope="module")
def source(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_test_text(tmp_path_factory, data_dir, empty_after=16, empty=WINDOW)


@pytest.fixture(scope="module")
def single(ckpt: Path, source: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The output of one process, without shards."""
    folder = tmp_path_factory.mktemp("single")
    overrides = [f"ckpt_path={ckpt}", f"input={source}", f"output={folder / 'out.jsonl'}", *OPTIONS]
    predict(compose_task_config("predict", folder, overrides))
    return (folder / "out.jsonl").read_bytes()


def free_port(low: int = 15000, high: int = 24999) -> int:
    """A free port in ``[low, high]`` (SLURM's port is 15000 + the job id's last 4 digits)."""
    for port in random.sample(range(low, high + 1), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def slurm(rank: int, port: int) -> dict[str, str]:
    """What ``srun`` sets in task ``rank`` of a job on 2 nodes with 1 task each."""
    return {"SLURM_JOB_ID": f"7{port - 15000:04d}", "SLURM_JOB_NAME": "predict", "SLURM_NNODES": "2",
            "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_NODELIST": "localhost",
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank)}


def by_hand(rank: int, port: int) -> dict[str, str]:
    """What a user sets on node ``rank`` of 2 (1 process per node)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(rank), "LOCAL_RANK": "0",
            "WORLD_SIZE": "2"}


PREDICT = [sys.executable, "-m", "neurocrf.cli.predict"]


def torchrun(rank: int, port: int, log_dir: Path) -> list[str]:
    """``torchrun`` on node ``rank`` of 2, one process per node, running ``neurocrf-predict``; the
    worker's stderr goes to a ``stderr.log`` below ``log_dir`` (the launcher's own to its stderr)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={rank}",
            "--master-addr=127.0.0.1", f"--master-port={port}", f"--log-dir={log_dir}", "--redirects=2",
            "-m", "neurocrf.cli.predict"]


def launcher_exit_barrier_only(err: str) -> bool:
    """Whether every traceback in a torchrun launcher's stderr is its exit barrier's: the launcher
    that hosts the rendezvous store may leave before the other reads the barrier (a race of
    torch.distributed.elastic after the workers have finished; the exit status stays 0)."""
    return all("elastic/agent/server/api.py" in line for line in err.splitlines() if "Traceback" in line)


def launch(tmp_path: Path, variables: list[dict[str, str]], arguments: list[list[str]],
           cwds: list[Path] | None = None, commands: list[list[str]] | None = None,
           run_dirs: list[Path] | None = None) -> list[tuple[int, str, str]]:
    """Start one ``neurocrf-predict`` per node (own cluster variables; by ``commands`` if given;
    own run directory ``run<rank>`` unless ``run_dirs``) and wait for all; -> (exit status,
    stderr, the run's log file) per node."""
    procs, logs = [], []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for rank, (extra, args) in enumerate(zip(variables, arguments)):
        env = {k: v for k, v in os.environ.items() if not CLUSTER_VARIABLES.fullmatch(k)}
        env.update(extra, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        run_dir = run_dirs[rank] if run_dirs else tmp_path / f"run{rank}"
        logs.append((tmp_path / f"rank{rank}.err", run_dir / "predict.log"))
        with open(logs[-1][0], "w") as err:
            procs.append(subprocess.Popen(
                [*(commands[rank] if commands else PREDICT), *args, f"hydra.run.dir={run_dir}"], env=env,
                cwd=cwds[rank] if cwds else tmp_path, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))
    try:
        codes = [proc.wait(timeout=TIMEOUT) for proc in procs]
    finally:
        for proc in procs:  # (torchrun's worker too: each node's processes have a session of their own)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [(code, err.read_text(), log.read_text() if log.is_file() else "") for code, (err, log) in zip(codes, logs)]


def arguments(ckpt: Path, source: Path, output: Path | str, *extra: str) -> list[str]:
    return [f"ckpt_path={ckpt}", f"input={source}", f"output={output}", *OPTIONS, *TWO_NODES, *extra]


def written_shards(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"shard (\d+): \d+ sentences written", text)]


def expect_clean_exits(ranks: list[tuple[int, str, str]]) -> None:
    for code, err, _ in ranks:
        assert code == 0 and "terminate called" not in err and "Traceback" not in err, err


def test_two_slurm_nodes_write_the_bytes_of_one(tmp_path: Path, ckpt: Path, source: Path, single: bytes) -> None:
    output = tmp_path / "out" / "tags.jsonl"
    port = free_port()
    ranks = launch(tmp_path, [slurm(0, port), slurm(1, port)], [arguments(ckpt, source, output)] * 2)
    expect_clean_exits(ranks)
    (_, _, log0), (_, _, log1) = ranks
    assert output.read_bytes() == single
    # each shard by the rank its number names; merged once, by rank 0 of node 0
    assert written_shards(log0) == [0, 2, 4, 6, 8] and written_shards(log1) == [1, 3, 5, 7]
    assert len(re.findall(r"wrote 69 sentences to .*tags\.jsonl \(9 shards, 0 reused\)", log0)) == 1, log0
    assert "wrote" not in log1
    assert sorted(p.name for p in output.parent.iterdir()) == ["tags.jsonl"]


def test_an_output_folder_the_nodes_do_not_share_is_refused(tmp_path: Path, ckpt: Path, source: Path) -> None:
    """The same relative output from two working directories: the same path on each "node",
    two different folders, as with a node-local disk."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    for node in (node0, node1):
        node.mkdir()
    port = free_port()
    ranks = launch(tmp_path, [slurm(0, port), slurm(1, port)],
                   [arguments(ckpt, source, "out/tags.jsonl", "shared_wait_s=1")] * 2, cwds=[node0, node1])
    host = socket.gethostname()
    for code, err, _ in ranks:
        assert code == 1 and "terminate called" not in err, err
        assert (f"out/.tags.jsonl.shards: rank 1 on {host} does not see the shard folder that rank 0 on {host}"
                " prepared: the output must be on a file system that every node shares, at the same path (not a"
                " node-local disk such as /tmp), and show it within 1 s (shared_wait_s=...)") in err, err
    assert not written_shards(ranks[0][2] + ranks[1][2])
    assert not (node0 / "out" / "tags.jsonl").exists() and not (node1 / "out" / ".tags.jsonl.shards").exists()


def test_a_shard_another_node_wrote_but_rank_0_does_not_see_is_named(tmp_path: Path) -> None:
    """The merge, when a shard that rank 1 reported written is not in rank 0's view of the folder."""
    folder = shard_dir(str(tmp_path / "tags.conll"))
    reused, token = prepare_shards(folder, "key")
    assert reused == 0 and len(token) == 32
    with pytest.raises(RuntimeError, match=re.escape(
            f"shard(s) [0] written in this run (rank 1 on node2) are not complete in {folder} as"
            f" {socket.gethostname()} sees it: the output must be on a file system that every node shares")):
        merge_shards(folder, str(tmp_path / "tags.conll"), "key", {0: "rank 1 on node2"})
    assert not (tmp_path / "tags.conll").exists() and folder.is_dir()  # kept for a re-run


@pytest.mark.slow
def test_two_slurm_nodes_resume_a_preempted_run(tmp_path: Path, ckpt: Path, source: Path, single: bytes) -> None:
    output = tmp_path / "out" / "tags.jsonl"
    port = free_port()
    # a preempted run: each rank stops after 4 batches (8 sentences in batches of 3: 3 per shard)
    first = launch(tmp_path / "first", [slurm(0, port), slurm(1, port)],
                   [arguments(ckpt, source, output, "+trainer.limit_predict_batches=4")] * 2)
    (code0, err0, log0), (code1, err1, log1) = first
    assert code0 == 1 and "shard(s) [3] not complete" in err0 and "run the same command again" in err0, err0
    assert code1 == 0, err1
    # rank 0: shard 0 in 3 batches, then shard 2 (empty lines only) in one; rank 1: shard 1, cut in shard 3
    assert written_shards(log0) == [0, 2] and written_shards(log1) == [1]
    assert not output.exists() and shard_dir(str(output)).is_dir()

    port = free_port()
    ranks = launch(tmp_path / "again", [slurm(0, port), slurm(1, port)], [arguments(ckpt, source, output)] * 2)
    expect_clean_exits(ranks)
    (_, _, log0), (_, _, log1) = ranks
    assert output.read_bytes() == single
    assert written_shards(log0) == [4, 6, 8] and written_shards(log1) == [3, 5, 7]
    assert "3 complete shard(s) found" in log0
    assert len(re.findall(r"wrote 69 sentences to .*tags\.jsonl \(9 shards, 3 reused\)", log0)) == 1, log0
    assert sorted(p.name for p in output.parent.iterdir()) == ["tags.jsonl"]


@pytest.mark.slow
def test_a_rank_that_fails_stops_the_other(tmp_path: Path, ckpt: Path, source: Path) -> None:
    sentences = [line.split() for line in source.read_text(encoding="utf-8").splitlines()]
    sentences[WINDOW + 1][1] = "New\tYork"  # in shard 1, rank 1's: a tab cannot be a CoNLL column
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"tokens": tokens}) + "\n" for tokens in sentences), encoding="utf-8")
    output = tmp_path / "out" / "tags.conll"
    port = free_port()
    ranks = launch(tmp_path, [slurm(0, port), slurm(1, port)], [arguments(ckpt, bad, output, "format=conll")] * 2)
    (code0, err0, log0), (code1, err1, _) = ranks
    assert code1 == 2 and f"{bad}:{WINDOW + 2}: value 'New\\tYork' is empty or contains the delimiter" in err1, err1
    host = socket.gethostname()
    assert code0 == 1 and f"rank 1 on {host} (ConllFormatError: {bad}:{WINDOW + 2}: value" in err0, err0
    assert "stopped the run; the complete shards are kept in" in err0
    for err in (err0, err1):
        assert "terminate called" not in err
    assert not output.exists() and written_shards(log0) == [0, 2, 4, 6, 8]


@pytest.mark.slow
@pytest.mark.parametrize("started", ["by_hand", "torchrun"])
def test_two_nodes_started_without_slurm_write_the_bytes_of_one(tmp_path: Path, ckpt: Path, source: Path,
                                                                single: bytes, started: str) -> None:
    output = tmp_path / "tags.jsonl"
    port = free_port(30000, 32000)
    if started == "by_hand":
        ranks = launch(tmp_path, [by_hand(0, port), by_hand(1, port)], [arguments(ckpt, source, output)] * 2)
        expect_clean_exits(ranks)
    else:
        logs = [tmp_path / f"torchrun{rank}" for rank in range(2)]
        ranks = launch(tmp_path, [{}, {}], [arguments(ckpt, source, output)] * 2,
                       commands=[torchrun(0, port, logs[0]), torchrun(1, port, logs[1])])
        workers = [next(log.rglob("stderr.log")).read_text() for log in logs]
        expect_clean_exits([(code, worker, "") for (code, _, _), worker in zip(ranks, workers)])
        assert all("terminate called" not in err and launcher_exit_barrier_only(err) for _, err, _ in ranks)
    assert written_shards(ranks[0][2]) == [0, 2, 4, 6, 8] and written_shards(ranks[1][2]) == [1, 3, 5, 7]
    assert output.read_bytes() == single


@pytest.mark.slow
def test_one_run_directory_for_the_job_holds_the_default_output(tmp_path: Path, ckpt: Path, source: Path,
                                                                single: bytes) -> None:
    """``srun neurocrf-predict ... hydra.run.dir=logs/predict/slurm-$SLURM_JOB_ID`` (docs/guide/prediction.md)."""
    port = free_port()
    shared = tmp_path / "logs" / "predict" / f"slurm-{port}"
    ranks = launch(tmp_path, [slurm(0, port), slurm(1, port)], [arguments(ckpt, source, "null")] * 2,
                   run_dirs=[shared, shared])
    expect_clean_exits(ranks)
    assert (shared / "predictions.jsonl").read_bytes() == single


@pytest.mark.slow
def test_an_output_in_each_run_directory_is_refused(tmp_path: Path, ckpt: Path, source: Path) -> None:
    """``output=null`` under ``srun``: each process has a run directory of its own."""
    port = free_port()
    ranks = launch(tmp_path, [slurm(0, port), slurm(1, port)], [arguments(ckpt, source, "null")] * 2)
    host = socket.gethostname()
    for code, err, _ in ranks:
        assert code == 1 and "terminate called" not in err, err
        outputs = [tmp_path / f"run{rank}" / "predictions.jsonl" for rank in (0, 1)]
        assert (f"the ranks write to different outputs (rank 0 on {host}: {outputs[0]}; rank 1 on {host}:"
                f" {outputs[1]}): give every rank the same output=") in err
    assert not list(tmp_path.glob("run*/*predictions*"))  # nothing prepared


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
                    reason="needs the `sweeps` extra (pip install -e '.[sweeps]')")
@pytest.mark.parametrize("task", ["predict", "train"])
def test_the_slurm_ddp_launcher_asks_for_one_task_per_device_on_every_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task: str) -> None:
    import hydra
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    bin_dir = tmp_path / "bin"  # a stub srun passes submitit's check; the submission is intercepted
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=task, return_hydra_config=True, overrides=[
            "hydra/launcher=submitit_slurm_ddp", f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "hydra.launcher.partition=gpu", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=3",
            *(["ckpt_path=/shared/last.ckpt", "input=/shared/corpus.txt.gz"] if task == "predict" else [])])
    assert set(cfg.hydra.launcher) == {field.name for field in dataclasses.fields(SlurmQueueConf)}
    assert (cfg.hydra.launcher.nodes, cfg.hydra.launcher.tasks_per_node, cfg.hydra.launcher.gpus_per_node) == (3, 4, 4)
    launcher = hydra.utils.instantiate(cfg.hydra.launcher)
    launcher.config = cfg  # what Hydra's setup() stores
    submitted: dict[str, object] = {}

    def intercept(executor: submitit.AutoExecutor, function: object, *arguments: object) -> list:
        submitted["executor"] = executor
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", intercept)
    launcher.launch([[]], initial_job_idx=0)
    script = submitted["executor"]._executor._make_submission_file_text(f"python -m neurocrf.cli.{task}", "uid")
    for option in ("--nodes=3", "--ntasks-per-node=4", "--gpus-per-node=4", "--partition=gpu"):
        assert f"#SBATCH {option}\n" in script, option
    assert "srun" in script  # every task runs the job: Lightning's SLURMEnvironment reads srun's variables

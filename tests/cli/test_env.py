"""``neurocrf-env`` prints a Markdown report of the install: versions, the compiled kernel, the
devices and the backend ``"auto"`` takes on each, with the chooser's reasons (here: no GPU, so no
Triton)."""

from __future__ import annotations

import subprocess
import sys

import torch

from neurocrf.cli import env
from neurocrf.structs import engine


def test_the_report_says_what_auto_takes_and_why_triton_is_not_used(monkeypatch, capsys):
    monkeypatch.delenv(engine.ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env.main([])
    text = capsys.readouterr().out
    assert text.startswith("## neurocrf environment")
    for label in ("Python", "neurocrf", "torch", "triton", "Lightning", "transformers", "Hydra", "numpy",
                  "compiled CPU kernel", "threads"):
        assert f"| {label} |" in text
    assert "| Triton kernels | not used: " in text and "no CUDA device" in text
    expected, _ = engine.auto_choice("cpu")
    assert f"| CPU, first order | {expected} |" in text
    assert "| CPU, pair states | torch |" in text  # the compiled kernel takes first-order chains only


def test_the_chosen_backend_follows_the_environment(monkeypatch, capsys):
    monkeypatch.setenv(engine.ENV, "torch")
    env.main(["--no-self-check"])
    text = capsys.readouterr().out
    assert "| CPU, first order | torch | NEUROCRF_CRF_BACKEND=torch replaces 'auto' |" in text
    assert "`NEUROCRF_CRF_BACKEND=torch`" in text


def test_it_runs_as_a_module():
    run = subprocess.run([sys.executable, "-m", "neurocrf.cli.env", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "neurocrf-env" in run.stdout

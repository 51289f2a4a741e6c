"""``--help`` of every Hydra tool: its own options, each with the documentation of its config's
comments, only the config groups it uses, and example command lines; and a run without its
mandatory values names every one of them at once."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from neurocrf.cli.help import read_options, tool_help
from neurocrf.cli.utils import CONFIG_DIR
from tests.helpers.cli import run_tool

TOOLS = ["train", "evaluate", "predict", "export", "extract", "supertag", "parse", "parse_evaluate", "draw"]
MODEL_GROUPS = ("encoder=", "crf=", "experiment=", "hparams_search=")


def help_page(tool: str, overrides: list[str] | None = None) -> str:
    """The page Hydra prints for ``neurocrf-<tool> --help`` (its help template, resolved)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=tool, overrides=overrides or [], return_hydra_config=True)
    names = dict.fromkeys(("FLAGS_HELP", "HYDRA_CONFIG_GROUPS", "APP_CONFIG_GROUPS", "CONFIG"), "")
    return string.Template(str(cfg.hydra.help.template)).substitute(names)  # as Hydra does


@pytest.mark.parametrize("tool", TOOLS)
def test_help_shows_the_tools_own_options_documented_and_its_groups(tool: str) -> None:
    page = help_page(tool)
    options = read_options((Path(CONFIG_DIR) / f"{tool}.yaml").read_text(encoding="utf-8"))
    assert options and all(option.doc for option in options), [o.key for o in options if not o.doc]
    for option in options:
        assert f"\n  {option.key}=" in page, option.key
        assert option.doc.split()[0] in page
    examples = page.split("examples:\n")[1].split("\n\n")[0].splitlines()
    assert len(examples) >= 2 and all(line.strip().split()[0] in ("neurocrf-" + tool.replace("_", "-"), "srun")
                                      or "neurocrf-" in line for line in examples), examples
    groups = page.split("config groups")[1] if "config groups" in page else ""
    assert "hydra/" not in groups and "hydra=" not in groups
    if tool in ("train",):
        assert all(group in groups for group in ("encoder=", "crf=", "data="))
    elif tool != "supertag":
        assert not any(group in groups for group in MODEL_GROUPS), groups
    assert "exit status: 0 done; 2 a user error" in page.lower() and "NEUROCRF_HOME" in page
    assert "$$" not in page


def test_help_shows_the_values_the_command_line_gives() -> None:
    page = help_page("predict", ["batch_size=7", "trainer=ddp_sim"])
    assert "\n  batch_size=7\n" in page and "\n  trainer=ddp_sim  (one of: " in page
    assert "\n  ckpt_path=???\n      the trained checkpoint" in page


def test_the_help_of_the_installed_tool_and_every_missing_value_at_once(tmp_path: Path) -> None:
    done = run_tool("predict", "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("neurocrf-predict: Tag a file"), done.stderr[-2000:]
    assert "Powered by Hydra" not in done.stdout and "\n  input_format=auto\n" in done.stdout
    missing = run_tool("predict", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == (
        "neurocrf-predict: error: missing mandatory values: ckpt_path, input (give ckpt_path=... input=...;"
        " --help lists the options)")
    assert "Traceback" not in missing.stderr


def test_tool_help_without_a_composed_config_shows_the_values_as_written() -> None:
    page = tool_help("parse_evaluate")
    assert page.startswith("neurocrf-parse-evaluate: Score predicted trees") and "\n  predictions=???\n" in page

"""Defaults live in the configs alone: every key a tool reads off its config (``cfg.<key>``,
``cfg["key"]``, ``cfg.get("key")``, nested ``cfg.paths.output_dir``) is defined in the config
that tool composes (``cfg.get(group)`` may find an optional group absent), and no tool reads
``cfg.get(key, <default>)``."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

import neurocrf.cli
from neurocrf.cli.utils import CONFIG_DIR, compose_task_config

CLI = Path(neurocrf.cli.__file__).parent
TOOLS = {"train": "train", "evaluate": "evaluate", "predict": "predict", "export": "export", "extract": "extract",
         "supertag_train": "supertag", "parse": "parse", "parse_evaluate": "parse_evaluate", "draw": "draw"}


def defined(cfg: DictConfig, key: str) -> bool:
    """Whether the dotted ``key`` is in ``cfg`` (a mandatory ``???`` value counts)."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node.keys():
            return False
        node = node._get_node(part)
    return True


def _cfg_chain(node: ast.AST) -> list[str] | None:
    """``cfg.a["b"].c`` -> ``["a", "b", "c"]``; None for an expression not read off ``cfg``."""
    chain: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            chain.append(node.slice.value)
            node = node.value
        else:
            break
    return list(reversed(chain)) if isinstance(node, ast.Name) and node.id == "cfg" else None


def config_reads(source: str) -> tuple[set[str], list[str]]:
    """The dotted keys read off a variable named ``cfg`` in ``source``, and the ``cfg...get(key,
    default)`` calls (with their line)."""
    keys: set[str] = set()
    defaults: list[str] = []
    tree = ast.parse(source)
    gets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            chain = _cfg_chain(node.func.value)
            if chain is None:
                continue
            gets.add(id(node.func))
            if len(node.args) > 1 or node.keywords:
                defaults.append(f"line {node.lineno}: {ast.unparse(node)}")
            if node.args and isinstance(node.args[0], ast.Constant):
                chain = [*chain, str(node.args[0].value)]
            if chain:
                keys.add(".".join(chain))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and id(node) not in gets:
            chain = _cfg_chain(node)
            if chain and chain[-1] != "get":
                keys.add(".".join(chain))
    return keys, defaults


def test_config_reads_finds_attributes_items_and_defaults() -> None:
    keys, defaults = config_reads('x = cfg.paths.output_dir\ny = cfg["k"]\nz = cfg.get("batch_size", 32)\n')
    assert keys == {"paths", "paths.output_dir", "k", "batch_size"}
    assert defaults == ["line 3: cfg.get('batch_size', 32)"]


@pytest.mark.parametrize("module, config", sorted(TOOLS.items()))
def test_every_key_a_tool_reads_is_in_its_config(module: str, config: str, tmp_path: Path) -> None:
    keys, defaults = config_reads((CLI / f"{module}.py").read_text(encoding="utf-8"))
    assert defaults == [], f"neurocrf/cli/{module}.py repeats defaults of configs/{config}.yaml: {defaults}"
    cfg = compose_task_config(config, tmp_path)
    groups = {path.name for path in Path(CONFIG_DIR).iterdir() if path.is_dir()}
    absent = sorted(key for key in keys if not defined(cfg, key) and key.split(".")[0] not in groups)
    assert keys and absent == [], f"neurocrf/cli/{module}.py reads keys configs/{config}.yaml lacks: {absent}"


def test_no_tool_reads_a_literal_default_anywhere_in_the_cli() -> None:
    for path in sorted(CLI.glob("*.py")):
        assert config_reads(path.read_text(encoding="utf-8"))[1] == [], path.name

"""Who may import whom: ``parsing`` imports nothing above it, the library never imports an entry
point, and the scripts reach the supertag pipeline through the library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARSING_ENTRY_POINTS = ("extract", "parse", "parse_evaluate", "supertag_train")


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` of ``path`` names (at any depth)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        below = tuple(f + "." for f in forbidden)
        bad = sorted(m for m in imported_modules(path) if m in forbidden or m.startswith(below))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


@pytest.mark.parametrize(("package", "forbidden"), [
    ("parsing", ("neurocrf.models", "neurocrf.supertagging", "neurocrf.cli", "neurocrf.data", "neurocrf.encoders")),
    ("supertagging", ("neurocrf.cli",)),
    ("models", ("neurocrf.cli", "neurocrf.supertagging")),
])
def test_packages_import_only_downwards(package: str, forbidden: tuple[str, ...]) -> None:
    paths = sorted((ROOT / "neurocrf" / package).rglob("*.py"))
    assert paths
    assert offending(paths, forbidden) == {}


def test_scripts_reach_the_supertag_pipeline_through_the_library() -> None:
    forbidden = tuple(f"neurocrf.cli.{name}" for name in PARSING_ENTRY_POINTS)
    assert offending(sorted((ROOT / "scripts").glob("*.py")), forbidden) == {}
    assert offending(sorted((ROOT / "neurocrf" / "cli").glob("*.py")), ("neurocrf.cli.parse",)) == {}

"""The benchmarks, reproductions and tools reach the supertag pipeline through the library, not
through the parsing entry points (which floor of the package imports which:
``tests/docs/test_floors.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_scripts_reach_the_supertag_pipeline_through_the_library() -> None:
    forbidden = tuple(f"neurocrf.cli.{name}" for name in PARSING_ENTRY_POINTS)
    scripts = sorted(path for home in ("benchmarks", "reproductions", "tools") for path in (ROOT / home).glob("*.py"))
    assert len(scripts) > 20
    assert offending(scripts, forbidden) == {}
    assert offending(sorted((ROOT / "neurocrf" / "cli").glob("*.py")), ("neurocrf.cli.parse",)) == {}

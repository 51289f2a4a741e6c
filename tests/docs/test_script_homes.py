"""The homes of the scripts: ``benchmarks/``, ``reproductions/`` and ``tools/`` are packages whose
modules import as modules (run as ``python -m benchmarks.crf`` from the repository root), whose
README lists every command, and nothing in the repository patches ``sys.path`` or loads a
Python file by its path to reach them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOMES = ("benchmarks", "reproductions", "tools")
LIBRARIES = {"benchmarks/common.py", "benchmarks/train_flair.py", "reproductions/precursor_tables.py",
             "tools/triton_compiling.py"}


def scripts(home: str) -> list[Path]:
    return sorted(p for p in (ROOT / home).iterdir() if p.suffix in {".py", ".sh"} and p.name != "__init__.py")


@pytest.mark.parametrize("home", HOMES)
def test_every_script_imports_as_a_module_and_its_readme_names_it(home: str) -> None:
    assert (ROOT / home / "__init__.py").is_file()
    readme = (ROOT / home / "README.md").read_text(encoding="utf-8")
    for path in scripts(home):
        relative = path.relative_to(ROOT).as_posix()
        if path.suffix == ".py":
            importlib.import_module(f"{home}.{path.stem}")
            command = f"python -m {home}.{path.stem}"
            if relative not in LIBRARIES:
                assert re.search(rf"-m {home}\.{path.stem}\b", readme), f"{home}/README.md lacks `{command}`"
        else:
            assert relative in readme, f"{home}/README.md lacks {relative}"


def test_no_file_patches_sys_path_or_loads_a_file_by_path() -> None:
    patch = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=|spec_from_file_location")
    allowed = {"neurocrf/structs/engine/triton/runtime.py"}  # one kernel file loaded twice, interpreted and compiled
    found = []
    for folder in ("neurocrf", "tests", *HOMES):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative not in allowed and relative != "tests/docs/test_script_homes.py":
                found += [f"{relative}:{n}" for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                          if patch.search(line)]
    assert found == []
    assert not list(ROOT.glob("scripts/*"))  # every script has a home

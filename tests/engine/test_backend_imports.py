"""No module outside the engine imports a backend, and no backend imports another: what two
backends share sits at the engine root (:mod:`neurocrf.structs.engine`), and the chooser loads
backends by name. Read from the source files' import statements (``ast``), so an import inside a
function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import neurocrf

PACKAGE = Path(neurocrf.__file__).parent
ENGINE = "neurocrf.structs.engine"
BACKENDS = ("pytorch", "compiled", "triton")
SOURCES = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, package: str) -> set[str]:
    """Every module the imports of ``source`` (a module of ``package``) name; names imported from
    a module count as modules too (``from neurocrf.structs.engine import pytorch``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def backend_of(module: str) -> str | None:
    """The backend a module belongs to (``"pytorch"``, ``"compiled"``, ``"triton"``), or None."""
    for backend in BACKENDS:
        if module == f"{ENGINE}.{backend}" or module.startswith(f"{ENGINE}.{backend}."):
            return backend
    return None


def foreign_backends(source: str, module: str, is_package: bool = False) -> list[str]:
    """The backend modules ``source`` (module ``module``) imports that it does not belong to."""
    package = module if is_package else module.rpartition(".")[0]
    own = backend_of(module)
    return sorted(name for name in imported(source, package) if backend_of(name) not in (None, own))


@pytest.mark.parametrize("path", SOURCES, ids=module_name)
def test_no_module_imports_a_backend_it_does_not_belong_to(path):
    module = module_name(path)
    foreign = foreign_backends(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
    assert not foreign, f"{module} imports {', '.join(foreign)}: go through Chain or the engine root"


def test_the_rule_catches_backend_imports_in_every_form():
    source = ("from neurocrf.structs.engine.pytorch import log_scan\nfrom .engine import compiled\n"
              "import neurocrf.structs.engine.triton.runtime\nfrom neurocrf.structs.engine import reference\n"
              "def lazy():\n    from ..structs.engine.pytorch import first_order\n")
    assert foreign_backends(source, "neurocrf.structs.distribution") == [
        "neurocrf.structs.engine.compiled", "neurocrf.structs.engine.pytorch",
        "neurocrf.structs.engine.pytorch.first_order", "neurocrf.structs.engine.pytorch.log_scan",
        "neurocrf.structs.engine.triton.runtime"]
    backend_source = "from neurocrf.structs.engine.pytorch import first_order\nfrom . import kernel\n"
    assert foreign_backends(backend_source, "neurocrf.structs.engine.compiled.scan") == [
        "neurocrf.structs.engine.pytorch", "neurocrf.structs.engine.pytorch.first_order"]
    assert len(SOURCES) > 50 and any(module_name(path) == f"{ENGINE}.compiled" for path in SOURCES)

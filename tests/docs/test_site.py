"""The documentation site builds warning-free, its API pages cover every public name, and its
pages render in a browser.

Slow: building the site imports every module and takes minutes on 2 cores. ``.ci/run`` builds it
once (``sphinx-build -W --keep-going -n``) and points these tests at that build with
``NEUROCRF_DOCS_HTML``; without it they build into a temporary folder, once per session.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import shutil
from pathlib import Path

import pytest

import neurocrf

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@functools.cache
def public_modules() -> list[str]:
    """Every module of the package whose name has no leading underscore, the entry points aside."""
    names = ["neurocrf"]
    for info in pkgutil.walk_packages(neurocrf.__path__, "neurocrf."):
        if any(part.startswith("_") for part in info.name.split(".")) or info.name.startswith("neurocrf.cli"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional dependency (triton) is not installed
            continue
        names.append(info.name)
    return names


def exported_names() -> dict[str, str]:
    """``module.name`` -> where it is documented, for every name of every public ``__all__``."""
    found = {}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            if name.startswith("__"):  # __version__
                continue
            value = getattr(module, name)
            home = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
            if isinstance(value, type(neurocrf)):
                found[f"{module_name}.{name}"] = value.__name__
            elif all(home) and home[0].startswith("neurocrf"):
                found[f"{module_name}.{name}"] = f"{home[0]}.{home[1]}"
            else:  # a constant: documented in the module that assigns it
                found[f"{module_name}.{name}"] = f"{defining_module(module_name, name)}.{name}"
    return found


def defining_module(module_name: str, name: str) -> str:
    """The module whose source assigns the constant ``name`` that ``module_name`` exports (the
    nearest to it when several do)."""
    value = getattr(importlib.import_module(module_name), name)
    assigning = []
    for candidate in public_modules():
        other = importlib.import_module(candidate)
        source = Path(other.__file__).read_text(encoding="utf-8")
        if getattr(other, name, None) is value and (f"\n{name} =" in source or f"\n{name}:" in source):
            assigning.append(candidate)
    assert assigning, f"{module_name}.{name}: no module assigns it"
    return max(assigning, key=lambda candidate: len(os.path.commonprefix([candidate, module_name])))


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built HTML site: ``NEUROCRF_DOCS_HTML`` if set, else built here, warnings as errors."""
    given = os.environ.get("NEUROCRF_DOCS_HTML")
    if given:
        html = Path(given)
        assert (html / "objects.inv").is_file(), f"NEUROCRF_DOCS_HTML={given}: no built site there"
        return html
    build_main = pytest.importorskip("sphinx.cmd.build", reason="needs sphinx (the docs extra)").build_main
    html = tmp_path_factory.mktemp("site") / "html"
    status = build_main(["-W", "--keep-going", "-n", "-q", "-b", "html", str(ROOT / "docs"), str(html)])
    assert status == 0, "the site does not build warning-free (the warnings are above)"
    return html


def documented_objects(html: Path) -> set[str]:
    from sphinx.util.inventory import InventoryFile

    with open(html / "objects.inv", "rb") as stream:
        inventory = InventoryFile.load(stream, "", lambda base, uri: uri)
    data = getattr(inventory, "data", inventory)  # an Inventory object from Sphinx 9 on, a dict before
    return {name for kind, entries in data.items() if kind.startswith("py:") for name in entries}


def test_every_public_name_has_an_api_entry(site: Path) -> None:
    documented = documented_objects(site)
    missing = {exported: home for exported, home in exported_names().items() if home not in documented}
    assert not missing, f"names of an __all__ without an API entry (exported name -> expected entry): {missing}"


def test_every_public_module_has_a_page(site: Path) -> None:
    pages = {p.stem for p in (site / "api" / "generated").glob("*.html")}
    missing = set(public_modules()[1:]) - pages
    assert not missing, f"modules without an API page: {sorted(missing)}"


def test_pages_hold_rendered_text(site: Path) -> None:
    for page in ["index.html", "guide/crf_layers.html", "guide/prediction.html", "api/index.html"]:
        text = (site / page).read_text(encoding="utf-8")
        assert "```" not in text and "{toctree}" not in text and ".. auto" not in text, f"{page}: raw source"
    api = (site / "api/generated/neurocrf.structs.linear_chain.html").read_text(encoding="utf-8")
    assert "First-order linear-chain CRF" in api and 'id="neurocrf.structs.linear_chain.LinearChainCRF"' in api


def test_screenshots(site: Path, tmp_path: Path) -> None:
    from tools.docs_screenshots import CHROMIUM_NAMES, take_screenshots

    if not any(shutil.which(name) for name in CHROMIUM_NAMES):
        pytest.skip("needs Chromium (Debian: apt-get install chromium)")
    shots = take_screenshots(site, tmp_path)
    assert [p.name for p in shots] == ["index.png", "guide.png", "api.png"]
    for shot in shots:  # a blank page compresses to a few kB; a rendered page is larger
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 30_000, shot

"""The ``>>>`` examples of the documentation pages run, and give the output the page shows.

Every Markdown page under ``docs/`` with a ``>>>`` line is one doctest (the guide's CRF-library
page, the migration page, ...); a page's examples share one namespace and run from the top.
"""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md")
               if "_build" not in p.parts and ">>> " in p.read_text(encoding="utf-8"))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def test_the_crf_page_has_examples() -> None:
    assert ROOT / "docs" / "guide" / "crf_layers.md" in PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # files an example writes land in a temporary folder
    text = page.read_text(encoding="utf-8")
    test = doctest.DocTestParser().get_doctest(text, {}, page.name, str(page), 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=lambda report: print(report, end=""))
    assert runner.failures == 0, f"{page}: {runner.failures} of {runner.tries} examples failed (output above)"

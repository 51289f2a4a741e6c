"""The ``>>>`` examples of the documentation pages (docs/**/*.md) run and print what the pages say.

Each page's examples (the ``>>>`` lines of its ``pycon`` and ``python`` blocks) run as one doctest,
in page order, in one namespace, with the page's line numbers. The migration page also runs
pytorch-crf beside neurocrf on the same parameters, so its equivalence claims are checked here.
``checkpoint`` (the path of a small tagger's checkpoint) is in every page's namespace, as a trained
model's path is for a reader.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest
import torch

from neurocrf.encoders import build_vocabularies
from neurocrf.models.tagger import Tagger
from tests.helpers.checkpoints import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# pages that must hold examples (every other page runs its examples when it has any)
PAGES_WITH_EXAMPLES = ("guide/migration.md", "guide/faq.md")
FENCE = re.compile(r"^```(?:pycon|python)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

ENCODER = {"name": "bilstm", "word_dim": 8, "char": "cnn", "char_dim": 4, "char_hidden": 4, "hidden_size": 8}
TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"]
WORDS = [["Peter", "Blackburn", "works", "for", "the", "European", "Commission"], ["Thanks", "."]]


def example_source(text: str) -> str:
    """The page with everything outside its ``pycon`` and ``python`` blocks blanked, so that
    doctest's line numbers are the page's and a closing fence never reads as expected output."""
    lines = text.splitlines(keepends=True)
    kept = ["\n"] * len(lines)
    for match in FENCE.finditer(text):
        first = text.count("\n", 0, match.start(1))
        for offset, line in enumerate(match.group(1).splitlines(keepends=True)):
            kept[first + offset] = line
    return "".join(kept)


def run_examples(text: str, name: str, globs: dict) -> tuple[int, int, str]:
    """(examples, failures, report) of the ``>>>`` examples in the code blocks of ``text``."""
    test = doctest.DocTestParser().get_doctest(example_source(text), dict(globs), name, name, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=True)
    return len(test.examples), runner.failures, "".join(report)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small untrained BiLSTM-char tagger in the layout Lightning writes."""
    torch.manual_seed(0)
    tagger = Tagger(ENCODER, {"kind": "first_order"}, TAGS, "IOB2", build_vocabularies(ENCODER, WORDS))
    return save_checkpoint(tagger, tmp_path_factory.mktemp("tagger") / "last.ckpt")


def doc_pages() -> list[Path]:
    """Pages of the site with ``>>>`` lines, and the pages that must have them (not its build)."""
    pages = {p for p in DOCS.rglob("*.md")
             if "_build" not in p.relative_to(DOCS).parts and ">>>" in p.read_text(encoding="utf-8")}
    return sorted(pages | {DOCS / name for name in PAGES_WITH_EXAMPLES})


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_guide_examples_run(page: Path, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = page.read_text(encoding="utf-8")
    if "torchcrf" in text:
        pytest.importorskip("torchcrf")
    monkeypatch.chdir(tmp_path)  # files an example writes land here
    count, failures, report = run_examples(text, str(page.relative_to(ROOT)), {"checkpoint": str(checkpoint)})
    assert count > 0, f"{page.name}: no >>> examples in its code blocks"
    assert failures == 0, report


def test_a_wrong_output_and_an_error_fail() -> None:
    page = ("Text.\n\n```pycon\n>>> 1 + 1\n3\n```\n\n```python\n>>> undefined_name\n\n```\n\n"
            "```bash\n>>> 1\n5\n```\n>>> 2\n7\n")
    count, failures, report = run_examples(page, "page.md", {})
    assert (count, failures) == (2, 2), report  # >>> lines outside pycon and python blocks are no examples
    assert '"page.md", line 4' in report and "NameError" in report
    assert run_examples("```pycon\n>>> 2 + 2\n4\n```\nafter\n", "ok.md", {})[:2] == (1, 0)


def test_readme_crf_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
    crf_example = next(b for b in blocks if "LinearChainCRF" in b)
    exec(compile(crf_example, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "torch.Size([2, 7, 5]) torch.Size([2, 3, 7])" in printed and printed.startswith("tensor([[")

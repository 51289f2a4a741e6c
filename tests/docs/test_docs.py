"""The user-facing text of the project: no paths of one machine, no work history, no dead links.

Scans the docs, the README, the notebooks' markdown, the configs and the scripts. Generic
examples stay allowed (``${TMPDIR:-/tmp}``, ``/path/to/...``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# absolute paths that only exist on one machine
MACHINE_PATH = re.compile(r"(?<![\w$.{-])/(?:work|root|tmp|home)/")
GENERIC_PATHS = ("${TMPDIR:-/tmp}",)

# phrases of a lab notebook rather than of documentation
WORK_HISTORY = [re.compile(p, re.IGNORECASE) for p in (
    r"\b(?:this|that|the|last|next|previous|earlier|later) sessions?\b",
    r"\bsessions? \d+",
    r"\bteam machine\b",
    r"\blent\b",
    r"\bearlier runs?\b",
    r"\bthis issue\b",
    r"\bissues? \d+",
    r"\bthe lead\b",
)]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def text_files() -> list[Path]:
    """Docs, README, configs and scripts: every file a user reads as text."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "configs").rglob("*.yaml"))
    files += sorted(p for p in (ROOT / "scripts").iterdir() if p.suffix in {".py", ".sh"})
    return files


def notebook_markdown(path: Path) -> str:
    """The markdown cells of a notebook, joined."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def markdown_files() -> dict[Path, str]:
    """README, docs and notebook markdown: the places that link to each other."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    texts = {p: p.read_text(encoding="utf-8") for p in pages}
    texts.update({p: notebook_markdown(p) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))})
    return texts


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("Supertagging and LCFRS parsing: Alpino (Ruprecht & Mörbitz 2021)")
    'supertagging-and-lcfrs-parsing-alpino-ruprecht--mörbitz-2021'
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a markdown text (outside code blocks), with GitHub's -1, -2 suffixes."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        match = None if in_code else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            found.add(f"{base}-{counts[base]}" if base in counts else base)
            counts[base] = counts.get(base, 0) + 1
    return found


@pytest.mark.parametrize("path", text_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths_or_work_history(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        stripped = line
        for generic in GENERIC_PATHS:
            stripped = stripped.replace(generic, "")
        assert not MACHINE_PATH.search(stripped), f"{path}:{number}: machine path: {line.strip()}"
        for pattern in WORK_HISTORY:
            found = pattern.search(line)
            assert not found, f"{path}:{number}: work history ({found.group(0)!r}): {line.strip()}"


def test_checks_catch_what_they_are_for() -> None:
    assert MACHINE_PATH.search("see /home/ann/data") and MACHINE_PATH.search("--out /tmp/x.md")
    assert not MACHINE_PATH.search('mktemp -d "${TMPDIR:-/tmp}/x"'.replace(GENERIC_PATHS[0], ""))
    assert not MACHINE_PATH.search("pkg:/path/to/model or docs/home/x")
    assert any(p.search("an earlier run with crf.dropout") for p in WORK_HISTORY)
    assert any(p.search("measured in session 11") for p in WORK_HISTORY)
    assert not any(p.search("session = onnxruntime.InferenceSession(path)") for p in WORK_HISTORY)
    assert not any(p.search("the equivalent L2 weight, silent errors") for p in WORK_HISTORY)


def test_links_point_at_existing_files_and_headings() -> None:
    texts = markdown_files()
    for path, text in texts.items():
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            assert linked.exists(), f"{path}: link to a missing file: {target}"
            if anchor and linked.suffix == ".md":
                linked_text = texts.get(linked) or linked.read_text(encoding="utf-8")
                assert anchor in anchors(linked_text), f"{path}: link to a missing heading: {target}"


def test_results_keep_the_sections_that_configs_cite() -> None:
    headings = anchors((ROOT / "docs" / "results.md").read_text(encoding="utf-8"))
    assert "crf-variants-with-a-bilstm-encoder-precursor-induced-second-order" in headings
    for config in sorted((ROOT / "configs").rglob("*.yaml")):
        for title in re.findall(r'docs/results\.md, "([^"]+)"', config.read_text(encoding="utf-8")):
            assert any(h.startswith(slug(title)) for h in headings), f"{config}: no section {title!r}"

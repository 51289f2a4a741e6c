"""Screenshots of the built documentation site in headless Chromium, to look at.

Renders the landing page, one guide page and one API page of a build made by
``sphinx-build -W --keep-going -n -b html docs docs/_build/html`` and writes one PNG per page::

    python -m tools.docs_screenshots                                  # into docs/_build/screenshots
    python -m tools.docs_screenshots --html docs/_build/html --output shots

Needs Chromium (Debian: ``apt-get install chromium``; or name the binary with ``--chromium``).
Chromium runs with a fresh profile and without background network traffic; the pages are local
files.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    "index": "index.html",
    "guide": "guide/crf_layers.html",
    "api": "api/generated/neurocrf.structs.linear_chain.html",
}
"""Screenshot name -> page of the built site."""
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = "1280,1600"


def find_chromium(name: str | None = None) -> str:
    """The Chromium binary: ``name`` if given, else the first of :data:`CHROMIUM_NAMES` on PATH."""
    for candidate in [name] if name else CHROMIUM_NAMES:
        found = shutil.which(candidate)
        if found:
            return found
    raise FileNotFoundError(f"no Chromium found (tried {', '.join([name] if name else CHROMIUM_NAMES)}): "
                            "install it (Debian: apt-get install chromium) or pass --chromium")


def screenshot(chromium: str, page: Path, target: Path, timeout_s: float = 120.0) -> None:
    """Render the local file ``page`` into the PNG ``target`` at the window size :data:`WINDOW`."""
    if not page.is_file():
        raise FileNotFoundError(f"{page}: no such page (build the site first)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        command = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={profile}", f"--screenshot={target}", f"--window-size={WINDOW}",
            page.resolve().as_uri(),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0 or not target.is_file() or target.stat().st_size == 0:
        raise RuntimeError(f"{page}: Chromium exited with {done.returncode} and wrote no screenshot:\n{done.stderr}")


def take_screenshots(html: Path, output: Path, chromium: str | None = None) -> list[Path]:
    """One PNG per entry of :data:`PAGES` into ``output``; returns their paths."""
    binary = find_chromium(chromium)
    written = []
    for name, relative in PAGES.items():
        target = output / f"{name}.png"
        screenshot(binary, html / relative, target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_screenshots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "docs" / "_build" / "html", help="the built site")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "_build" / "screenshots")
    parser.add_argument("--chromium", default=None, help="the Chromium binary (default: found on PATH)")
    args = parser.parse_args(argv)
    try:
        for path in take_screenshots(args.html, args.output, args.chromium):
            print(path)
    except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"docs_screenshots: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The example notebooks: stored with their outputs, and every one runs from top to bottom.

Each notebook is executed with nbclient (kernel ``python3``, from ipykernel) on a copy in a tmp
folder, with this checkout first on ``PYTHONPATH``; any cell error fails the test. The notebooks
write their own outputs to temporary folders, never into the repository.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="needs nbformat (the dev extra)")
nbclient = pytest.importorskip("nbclient", reason="needs nbclient (the dev extra)")
pytest.importorskip("ipykernel", reason="needs ipykernel for the python3 kernel (the dev extra)")
pytest.importorskip("matplotlib", reason="the notebooks plot with matplotlib (the dev extra)")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = [
    "01_quickstart.ipynb", "02_crf_variants.ipynb", "03_supertag_parsing.ipynb", "04_sentence_uncertainty.ipynb",
    "05_crf_study.ipynb", "06_drawing_trees.ipynb",
]
# notebooks whose stored outputs must include plots or drawings
PLOTS = {"02_crf_variants.ipynb": 4, "03_supertag_parsing.ipynb": 3, "04_sentence_uncertainty.ipynb": 1,
         "05_crf_study.ipynb": 1}
MAX_BYTES = 600_000


def code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def errors(notebook) -> list[str]:
    return [
        f"{output.ename}: {output.evalue}"
        for cell in code_cells(notebook)
        for output in cell.outputs
        if output.output_type == "error"
    ]


def images(notebook) -> int:
    """Plots (PNG) and drawings (SVG) among the outputs."""
    return sum(bool({"image/png", "image/svg+xml"} & set(output.get("data", {})))
               for cell in code_cells(notebook) for output in cell.outputs)


def stderr_text(notebook) -> str:
    return "".join(
        output.text for cell in code_cells(notebook) for output in cell.outputs
        if output.output_type == "stream" and output.name == "stderr"
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_with_outputs(name: str) -> None:
    path = NOTEBOOK_DIR / name
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert path.stat().st_size < MAX_BYTES, f"{name} is {path.stat().st_size} bytes: keep outputs small"
    cells = code_cells(notebook)
    counts = [cell.execution_count for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{name}: not executed top to bottom in one go: {counts}"
    assert not errors(notebook)
    assert cells[-1].outputs and sum(bool(cell.outputs) for cell in cells) > len(cells) // 2  # results shown
    assert images(notebook) >= PLOTS.get(name, 0)
    assert "Epoch" not in stderr_text(notebook) and "it/s]" not in stderr_text(notebook)  # no progress bars
    assert notebook.metadata.kernelspec.name == "python3"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / name
    shutil.copy(NOTEBOOK_DIR / name, copy)
    notebook = nbformat.read(copy, as_version=4)
    for cell in code_cells(notebook):
        cell.outputs, cell.execution_count = [], None
    # the kernel is a subprocess: it imports neurocrf from this checkout, with one thread
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the cell on any error
    assert not errors(notebook)
    assert images(notebook) >= PLOTS.get(name, 0)
    nbformat.write(notebook, copy)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # wrote nothing beside itself

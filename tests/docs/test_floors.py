"""The package's floors (the layout the README draws): ``conventions``, ``values`` and ``interrupts``
(stop signals) below every floor; ``structs``, ``data``, ``encoders`` and ``parsing`` on the ground;
``models``, then ``supertagging`` above it; ``inference`` and ``study`` above those; ``cli`` on top.
A module imports only from its own room or from a room on a lower floor; a ground room reaches
another only through that room's package (``neurocrf.structs``, not
``neurocrf.structs.linear_chain``), and ``structs`` and ``parsing`` import no other room at all (the
supertag pipeline hands the parser plain values). Imports inside functions count too: a lazy import
is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import neurocrf

PACKAGE = Path(neurocrf.__file__).parent
FLOORS = {
    "conventions": 0, "values": 0, "interrupts": 0,
    "structs": 1, "data": 1, "encoders": 1, "parsing": 1,
    "models": 2,
    "supertagging": 3,
    "inference": 4, "study": 4,
    "cli": 5,
}
GROUND = 1
ALONE = ("structs", "parsing")


def neurocrf_imports(source: str) -> list[tuple[int, str]]:
    """Every ``neurocrf.*`` module that ``source`` imports (module level or inside a function)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.startswith("neurocrf.")]


def wrong_arrows(sources: dict[str, str]) -> list[str]:
    """One line per import that runs up a floor, sideways into another room of a floor above
    the ground, from ``structs`` or ``parsing`` into another room of the ground, or into another
    ground room's internals; ``sources``: the modules' text by path
    inside the package (``models/tagger.py``)."""
    wrong = []
    for path, source in sources.items():
        room = Path(path).with_suffix("").parts[0]
        if room == "__init__":
            continue
        for line, name in neurocrf_imports(source):
            parts = name.split(".")
            target = parts[1]
            if target == room:
                continue
            where = f"neurocrf/{path}:{line} imports {name}"
            if FLOORS[target] > FLOORS[room]:
                wrong.append(f"{where}: {target} is a floor above {room}")
            elif FLOORS[target] == FLOORS[room] and FLOORS[room] > GROUND:
                wrong.append(f"{where}: {target} and {room} share a floor")
            elif FLOORS[target] == FLOORS[room] == GROUND and room in ALONE:
                wrong.append(f"{where}: {room} imports no other room")
            elif FLOORS[target] == FLOORS[room] == GROUND and len(parts) > 2:
                wrong.append(f"{where}: a ground room reaches another only through its package")
    return wrong


def package_sources() -> dict[str, str]:
    return {path.relative_to(PACKAGE).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_room_has_a_floor() -> None:
    rooms = {Path(path).with_suffix("").parts[0] for path in package_sources()} - {"__init__"}
    assert rooms <= set(FLOORS), f"rooms without a floor: {sorted(rooms - set(FLOORS))}"


def test_no_import_runs_up_a_floor() -> None:
    assert wrong_arrows(package_sources()) == []


def test_the_check_finds_each_kind_of_wrong_arrow() -> None:
    """A model module importing the inference package, a lazy import of the study package, a
    prediction module importing a study module, a ground room reaching into another's
    internals and the parser importing the data package are each reported; imports from a lower
    floor and from the own room are not."""
    sources = {
        "models/upward.py": "from neurocrf.inference.run import FilePrediction\n"
                            "from neurocrf.models.heads import build_head\n"
                            "from neurocrf.structs import build_crf\n"
                            "def f():\n    import neurocrf.study.runs\n",
        "inference/sideways.py": "from neurocrf.study.runs import find_cells\n",
        "encoders/inside.py": "from neurocrf.structs.linear_chain import pair_emissions\n"
                              "from neurocrf.structs import build_crf\nfrom neurocrf.conventions import OUTSIDE\n",
        "parsing/reader.py": "from neurocrf.data.conll import read_conll\nfrom neurocrf.conventions import SPLITS\n",
    }
    assert [line.split(": ", 1)[1] for line in wrong_arrows(sources)] == [
        "inference is a floor above models",
        "study is a floor above models",
        "study and inference share a floor",
        "a ground room reaches another only through its package",
        "parsing imports no other room",
    ]

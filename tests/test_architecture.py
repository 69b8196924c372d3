"""docs/architecture.md agrees with the code.

The page names modules as paths in backquotes, relative to ``src/superserial/``
(```write/loop.py```, ```errors.py```). Checked here:

- every backquoted ``.py`` path on the page exists (under ``src/superserial/``, or
  from the repository's root for files such as ``tools/check_modules.py``);
- every module of ``src/superserial`` has a row of its own in a table of the page
  (first cell), and every such row is a module: the rooms' ``__init__.py`` files,
  which only describe their room, are the exception;
- the rooms' diagram (the ``text`` block of "The rooms, top to bottom") is the
  import-linter layers contract of the package in pyproject.toml, layer for layer,
  and each room's "Layers inside:" line is that room's layers contract; every room
  with a contract has such a line;
- no folder of ``src/superserial`` holds more than 12 modules directly (the check
  of ``tools/check_modules.py``, which ``make lint`` runs, run here too).
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "superserial"
DOC = ROOT / "docs" / "architecture.md"

_PATH = re.compile(r"`([A-Za-z0-9_./-]+\.py)`")
_ROW = re.compile(r"^\|\s*`([^`]+\.py)`\s*\|")
_LAYERS = re.compile(r"Layers inside: ((?:`[^`]+`(?: over )?)+)")
_HEADING = re.compile(r"^###\s+`([a-z_/]+)/`")


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _modules() -> set[str]:
    """Every module of the package as a path relative to src/superserial, rooms' __init__ aside."""
    out = set()
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC).as_posix()
        if f.name == "__init__.py" and f.parent != SRC:
            continue
        out.add(rel)
    return out


def _contracts() -> list[dict]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def _layers(line: str) -> list[set[str]]:
    """`a | b` over `c` -> [{a, b}, {c}]."""
    return [{name.strip() for name in group.split("|")} for group in re.findall(r"`([^`]+)`", line)]


def test_every_named_path_exists():
    missing = sorted(
        {p for p in _PATH.findall(_text()) if not (SRC / p).is_file() and not (ROOT / p).is_file()}
    )
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_module_has_a_row_and_every_row_is_a_module():
    rows = [m.group(1) for line in _text().splitlines() if (m := _ROW.match(line))]
    twice = sorted({r for r in rows if rows.count(r) > 1})
    assert not twice, f"modules with more than one row: {twice}"
    modules = _modules()
    missing = sorted(modules - set(rows))
    assert not missing, f"modules of src/superserial with no row in docs/architecture.md: {missing}"
    extra = sorted(set(rows) - modules)
    assert not extra, f"rows of docs/architecture.md that are no module: {extra}"


def test_rooms_diagram_is_the_first_contract():
    text = _text()
    section = text.split("## The rooms, top to bottom", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    drawn = []
    for line in block.splitlines():
        names = line.split("  ")[0]  # two spaces start a comment
        drawn.append(
            {n.strip().removesuffix("/").removesuffix(".py") for n in names.split("|")} - {""}
        )
    rooms = [
        c for c in _contracts() if c["type"] == "layers" and c["containers"] == ["superserial"]
    ]
    assert len(rooms) == 1, "expected one layers contract of the rooms in pyproject.toml"
    assert drawn == [{n.strip() for n in layer.split("|")} for layer in rooms[0]["layers"]]


def test_each_rooms_layers_line_is_its_contract():
    contracts = {
        container: [{n.strip() for n in layer.split("|")} for layer in c["layers"]]
        for c in _contracts()
        if c["type"] == "layers"
        for container in c["containers"]
        if container != "superserial"
    }
    assert contracts, "expected layers contracts inside rooms in pyproject.toml"
    found: dict[str, list[set[str]]] = {}
    room = None
    for line in _text().splitlines():
        if m := _HEADING.match(line):
            room = "superserial." + m.group(1).replace("/", ".")
        elif line.startswith("#"):
            room = None
        if m := _LAYERS.search(line):
            assert room is not None, f"a 'Layers inside:' line outside a room's section: {line}"
            assert room not in found, f"two 'Layers inside:' lines for {room}"
            found[room] = _layers(m.group(1))
    assert found == contracts


def test_no_folder_holds_more_than_twelve_modules():
    spec = importlib.util.spec_from_file_location(
        "check_modules", ROOT / "tools" / "check_modules.py"
    )
    assert spec and spec.loader
    check_modules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_modules)
    assert check_modules.MAX_MODULES == 12
    assert check_modules.crowded_folders() == []
    for folder in [SRC, *(d for d in SRC.rglob("*") if d.is_dir())]:
        count = sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
        assert count <= 12, f"{folder.relative_to(ROOT)} holds {count} modules"

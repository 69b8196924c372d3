"""Architecture checks that ruff, mypy and import-linter do not make.

- No module in ``src/superserial`` (any subpackage) is longer than 600 lines.
- No folder of ``src/superserial`` holds more than 12 modules directly (its
  ``__init__.py`` not counted): a room that grows past that is split.
- No code imports another module's ``_private`` names, in ``src/`` or
  ``tests/`` (``from superserial.x import _y``, or ``x._y`` on an imported
  superserial module). Shared internals get public names, or live in ``_x.py``
  modules, which any module may import.

Exits 1 and names each violation; prints one line of summary otherwise.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
MAX_MODULES = 12


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _problems(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    out = []
    lines = text.count("\n")
    if rel.parts[0] == "src" and lines > MAX_LINES:
        out.append(f"{rel}: {lines} lines, expected at most {MAX_LINES}")
    tree = ast.parse(text, str(rel))
    modules: dict[str, str] = {}  # local name -> superserial module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("superserial"):
            for alias in node.names:
                if _private(alias.name):
                    out.append(
                        f"{rel}:{node.lineno}: imports private {alias.name} from {node.module}"
                    )
                elif node.module == "superserial":
                    modules[alias.asname or alias.name] = f"superserial.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("superserial.") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
            and not modules[node.value.id].rsplit(".", 1)[-1].startswith("_")
        ):
            out.append(
                f"{rel}:{node.lineno}: uses private {node.value.id}.{node.attr} "
                f"of {modules[node.value.id]}"
            )
    return out


def crowded_folders() -> list[str]:
    """A problem for each folder of src/superserial holding more than MAX_MODULES modules."""
    src = ROOT / "src" / "superserial"
    out = []
    for folder in sorted([src, *(d for d in src.rglob("*") if d.is_dir())]):
        modules = [f for f in folder.glob("*.py") if f.name != "__init__.py"]
        if len(modules) > MAX_MODULES:
            out.append(
                f"{folder.relative_to(ROOT)}: {len(modules)} modules, "
                f"expected at most {MAX_MODULES} in one folder"
            )
    return out


def main() -> int:
    files = sorted((ROOT / "src" / "superserial").rglob("*.py")) + sorted(
        (ROOT / "tests").rglob("*.py")
    )
    problems = crowded_folders() + [p for f in files for p in _problems(f)]
    for p in problems:
        print(p)
    if problems:
        return 1
    print(
        f"check_modules: {len(files)} files, modules <= {MAX_LINES} lines, "
        f"folders <= {MAX_MODULES} modules, no private imports"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

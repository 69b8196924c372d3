"""Every ```python block of README.md and docs/*.md runs, in order, one namespace per file.

A block preceded by the line ``<!-- skip -->`` is not run: for the few that need
something the suite does not have (a Dataflow runner, a GPU, JAX). Each file runs
in its own temporary working directory, and ``/tmp/`` in a block is rewritten to
that directory, so examples may use natural paths such as ``/tmp/digits``
without touching the real /tmp or each other.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = "<!-- skip -->"
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a markdown file."""

    language: str
    line: int  # 1-based line of the first code line
    code: str
    skip: bool


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, with their skip markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        indent, language, start = m.group(1), m.group(2), i + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path}:{i + 1}: expected a closing ``` for this block")
        before = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
        code = textwrap.dedent(
            "\n".join(s[len(indent) :] if s.startswith(indent) else s for s in lines[start:end])
        )
        out.append(Block(language, start + 1, code, before == SKIP))
        i = end + 1
    return out


def _at_line(code: types.CodeType, offset: int) -> types.CodeType:
    """``code`` moved ``offset`` lines down, nested functions included.

    Line numbers are stored relative to ``co_firstlineno``, so moving that moves
    them all; tracebacks then show the block from its own first line.
    """
    consts = tuple(
        _at_line(c, offset) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_firstlineno=code.co_firstlineno + offset, co_consts=consts)


def test_doc_files_are_found_and_their_blocks_parse():
    names = {p.name for p in DOCS}
    assert {"README.md", "format.md", "guide.md"} <= names
    for path in DOCS:
        for block in blocks(path):
            if block.language == "python":
                compile(block.code, f"{path}:{block.line}", "exec")


def _forget_object_store_clients() -> None:
    """Drops fsspec's cached filesystem instances (they keep the endpoint they were made with)."""
    fsspec = sys.modules.get("fsspec")
    if fsspec is not None:
        for name in ("s3", "gs"):
            with contextlib.suppress(ImportError, ValueError):  # not installed here
                fsspec.get_filesystem_class(name).clear_instance_cache()


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # A real module, so that tools looking code up by module (AutoGraph) find it.
    module = types.ModuleType(f"superserial_docs_{path.stem.replace('-', '_').lower()}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    runnable = [b for b in blocks(path) if b.language == "python" and not b.skip]
    sources = [b.code.replace("/tmp/", f"{tmp_path}{os.sep}") for b in runnable]
    # The file as Python: the blocks at their markdown lines, blank lines elsewhere. Compiled
    # under the markdown's name and put in linecache, so tracebacks show the doc's own lines
    # and inspect.getsource (AutoGraph) finds code, not prose.
    lines = [""] * len(path.read_text(encoding="utf-8").splitlines())
    for block, source in zip(runnable, sources, strict=True):
        for k, text in enumerate(source.splitlines()):
            lines[block.line - 1 + k] = text
    text = "\n".join(lines) + "\n"
    linecache.cache[str(path)] = (len(text), None, text.splitlines(True), str(path))
    environ = dict(os.environ)
    try:
        for block, source in zip(runnable, sources, strict=True):
            exec(_at_line(compile(source, str(path), "exec"), block.line - 1), namespace)
    finally:
        # A doc may point the usual settings at a server of its own (storage.md: S3):
        # later tests get the environment, and fresh object-store clients, as before.
        os.environ.clear()
        os.environ.update(environ)
        _forget_object_store_clients()
    ran = len(runnable)
    if not ran:
        pytest.skip(f"{path.name} has no Python block to run")

"""How the command line shows things: shapes, structures, headers and values.

Text for people (rich trees and tables, numpy-style arrays) and JSON for
machines; error messages without TensorFlow's graph noise. Needs no
TensorFlow, so ``inspect``, ``head`` and ``verify`` work without it.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, NamedTupleNode, Node
from superserial.storage import fs
from superserial.write.indexes import IndexResult

__all__ = [
    "error_message",
    "first_elements",
    "fmt_shape",
    "header_summary",
    "index_json",
    "index_text",
    "infer_text",
    "leaf_json",
    "leaf_text",
    "leaves_table",
    "saved_json",
    "saved_text",
    "shards_table",
    "structure_tree",
]


def fmt_shape(shape: tuple[int | None, ...] | list[Any]) -> str:
    """A shape as ``[2, None, 3]``."""
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def structure_tree(node: Node, label: str) -> Any:
    """A rich ``Tree`` of an element structure, one line per node."""
    from rich.tree import Tree

    def add(parent: Any, n: Node, text: str) -> None:
        if isinstance(n, Leaf):
            extra = f" ragged_rank={n.ragged_rank}" if n.kind == "ragged" else ""
            parent.add(f"{text}: {n.kind} {n.dtype}{fmt_shape(n.shape)}{extra}")
            return
        if isinstance(n, DictNode):
            branch = parent.add(f"{text}: dict")
            for k in sorted(n.items):
                add(branch, n.items[k], repr(k))
        elif isinstance(n, NamedTupleNode):
            branch = parent.add(f"{text}: {n.name}({', '.join(n.fields)})")
            for f, v in zip(n.fields, n.items, strict=True):
                add(branch, v, f)
        else:
            branch = parent.add(f"{text}: tuple")
            for i, v in enumerate(n.items):
                add(branch, v, str(i))

    root = Tree(label)
    add(root, node, "element")
    return root


def _plain(x: Any) -> Any:
    """Nested Python lists of JSON-able values.

    Strings valid as UTF-8 become JSON strings, other bytes ``{"base64": ...}``;
    non-finite floats become "nan"/"inf"/"-inf"; complex numbers [re, im].
    """
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(x).decode("ascii")}
    if isinstance(x, complex):
        return [_plain(x.real), _plain(x.imag)]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _json_array(a: np.ndarray) -> Any:
    if a.dtype.kind not in "biufcOS":  # bfloat16 and friends
        a = a.astype(np.float32)
    return _plain(a.tolist())


def _rows_json(x: Any) -> Any:
    return [_rows_json(v) for v in x] if isinstance(x, list) else _json_array(x)


def _ragged_shape(x: Any) -> list[int | None]:
    return [len(x), *([None] * x.ragged_rank), *x.flat_values.shape[1:]]


def leaf_json(leaf: Leaf, x: Any) -> dict[str, Any]:
    """One decoded leaf value (numpy reader types) as a JSON-able dict, values in full."""
    from superserial.codec.numpy_decode import Ragged, Sparse

    if isinstance(x, Sparse):
        return {
            "kind": "sparse",
            "dtype": leaf.dtype,
            "dense_shape": np.asarray(x.dense_shape).tolist(),
            "indices": np.asarray(x.indices).tolist(),
            "values": _json_array(np.asarray(x.values)),
        }
    if isinstance(x, Ragged):
        return {
            "kind": "ragged",
            "dtype": leaf.dtype,
            "shape": _ragged_shape(x),
            "value": _rows_json(x.to_list()),
        }
    a = np.asarray(x)
    return {"kind": leaf.kind, "dtype": leaf.dtype, "shape": list(a.shape), "value": _json_array(a)}


def _array_text(a: np.ndarray) -> str:
    if a.ndim == 0:
        v = a.item()
        return repr(v) if isinstance(v, bytes) else np.array2string(a)
    return np.array2string(a, separator=", ")


def _rows_text(x: Any, edge: int) -> str:
    if not isinstance(x, list):
        return _array_text(x)
    n = len(x)
    rows = list(range(n)) if n <= 2 * edge else [*range(edge), -1, *range(n - edge, n)]
    parts = ["..." if i < 0 else _rows_text(x[i], edge) for i in rows]
    return "[" + ", ".join(parts) + "]"


def leaf_text(leaf: Leaf, x: Any, edge: int) -> str:
    """One decoded leaf value as text: its type, then values as numpy prints them.

    ``edge`` is how many rows of a ragged value show at each end.
    """
    from superserial.codec.numpy_decode import Ragged, Sparse

    if isinstance(x, Sparse):
        shape = np.asarray(x.dense_shape).tolist()
        return (
            f"sparse {leaf.dtype}{fmt_shape(shape)} nnz={len(x.values)}\n"
            f"      indices={_array_text(np.asarray(x.indices))}\n"
            f"      values={_array_text(np.asarray(x.values))}"
        )
    if isinstance(x, Ragged):
        shape = fmt_shape(_ragged_shape(x))
        return f"ragged {leaf.dtype}{shape} = {_rows_text(x.to_list(), edge)}"
    a = np.asarray(x)
    kind = "ragged " if leaf.kind == "ragged" else ""
    text = _array_text(a)
    sep = "\n      " if "\n" in text else " "
    return f"{kind}{leaf.dtype}{fmt_shape(list(a.shape))} ={sep}{text.replace(chr(10), chr(10) + '      ')}"


# ------------------------------------------------------------------ values


def first_elements(files: Sequence[str], header: Header, n: int) -> list[list[Any]]:
    """The flat leaves of the first ``n`` elements of ``files``, decoded without TensorFlow.

    For ``head``: ``files`` are the shard files of an opened dataset
    (:func:`superserial.read.opening.open_dataset`), in order.
    """
    from superserial.codec.numpy_decode import RecordDecoder
    from superserial.format.framing import read_records

    records: list[bytes] = []
    wheres: list[str] = []
    for file in files:
        if len(records) >= n:
            break
        with fs.open_file(file, "rb") as f:
            for i, record in enumerate(read_records(f, header.compression)):
                if len(records) >= n:
                    break
                records.append(record)
                wheres.append(f"{file} record {i}")
    if not records:
        return []
    columns = RecordDecoder(header).decode(records, wheres)
    return [[column[i] for column in columns] for i in range(len(records))]


# ------------------------------------------------------------------ errors


_TF_NOISE = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$")


def _clean(message: str) -> str:
    """The informative line(s) of a TensorFlow error message, without graph noise."""
    lines = []
    for line in message.splitlines():
        line = _TF_NOISE.sub("", line).strip()
        if not line or line.startswith(
            ("File ", "[[", "Graph execution error", "Detected at node")
        ):
            continue
        lines.append(line)
    text = " ".join(lines) if lines else message.strip()
    return text.replace("Name: <unknown>, ", "")


def error_message(e: BaseException) -> str:
    """An exception's message; TensorFlow's without its graph noise, after its type."""
    text = getattr(e, "message", None)
    if isinstance(text, str) and type(e).__module__.startswith("tensorflow"):
        return f"{type(e).__name__}: {_clean(text)}"
    return str(e)


# ------------------------------------------------------------------ headers


def _indexes(header: Header) -> str:
    """Which shards have a record index, and what to do about those without."""
    n, have = len(header.shards), sum(s.index is not None for s in header.shards)
    if header.compression:
        return "no record index (compressed shards: sequential reading only)"
    if have == n:
        return f"record index on all {n} shard(s) (random access)"
    return f"record index on {have} of {n} shard(s); `superserial index PATH` adds the rest"


def header_summary(path: str, header: Header) -> str:
    """The lines ``inspect`` starts with: version, writer, counts, compression, indexes."""
    return (
        f"superserial dataset {path}\n"
        f"  format_version {header.format_version}, written by {header.writer or '?'}\n"
        f"  {header.element_count:,} elements, {len(header.shards)} shard(s), "
        f"{header.total_bytes:,} bytes, compression {header.compression or 'none'}\n"
        f"  {_indexes(header)}"
    )


def saved_json(header: Header, output: str) -> dict[str, Any]:
    """What ``upgrade`` and ``convert`` print with ``--json``."""
    return {
        "path": output,
        "element_count": header.element_count,
        "compression": header.compression,
        "total_bytes": header.total_bytes,
        "shards": [s.to_obj() for s in header.shards],
    }


def saved_text(header: Header, output: str, what: str) -> str:
    """The line ``upgrade`` and ``convert`` print: ``what`` (e.g. "converted to") and counts."""
    return (
        f"{what} {output}: {header.element_count:,} elements, {len(header.shards)} shard(s), "
        f"{header.total_bytes:,} bytes, compression {header.compression or 'none'}"
    )


def infer_text(output: str, header: Header, report: Any) -> list[str]:
    """The lines ``infer`` prints: the dataset written, then one per feature.

    Args:
        output: The dataset written.
        header: Its header.
        report: The :class:`superserial.foreign.sources.infer.InferReport`.
    """
    lines = [
        f"wrote {output}: {header.element_count:,} elements from {len(report.files)} file(s) "
        f"(copied), compression {header.compression or 'none'}"
    ]
    for f in report.features:
        lo, hi = f.lengths
        length = str(lo) if lo == hi else f"{lo}..{hi}"
        why = f" ({f.ragged_because})" if f.ragged_because else ""
        lines.append(
            f"  {f.feature}: {f.kind} length {length} -> "
            f"{f.leaf_kind} {f.dtype}{fmt_shape(f.shape)}{why}"
        )
    return lines


def index_json(result: IndexResult) -> dict[str, Any]:
    """What ``superserial index --json`` prints."""
    return {
        "ok": True,
        "path": result.path,
        "changed": result.changed,
        "element_count": result.header.element_count,
        "indexed": list(result.written),
        "already_indexed": list(result.kept),
        "shards": [s.to_obj() for s in result.header.shards],
    }


def index_text(result: IndexResult) -> str:
    """What ``superserial index`` prints: one line per shard indexed, then a summary."""
    lines = [f"  indexed {name}" for name in result.written]
    n = len(result.header.shards)
    if result.changed:
        lines.append(
            f"indexed {result.path}: {len(result.written)} shard(s) indexed, "
            f"{len(result.kept)} already indexed; all {n} shard(s) have a record index"
        )
    else:
        lines.append(f"{result.path}: all {n} shard(s) already have a valid record index")
    return "\n".join(lines)


def leaves_table(header: Header) -> Any:
    """A rich ``Table`` of the header's leaves."""
    from rich.table import Table

    leaves = Table(title="leaves", title_justify="left")
    for col in ("name", "kind", "dtype", "shape", "ragged_rank", "encoding", "features"):
        leaves.add_column(col)
    for leaf in header.leaves:
        leaves.add_row(
            leaf.name,
            leaf.kind,
            leaf.dtype,
            fmt_shape(leaf.shape),
            "" if leaf.ragged_rank is None else str(leaf.ragged_rank),
            leaf.encoding,
            ", ".join(leaf.feature_names()),
        )
    return leaves


def shards_table(header: Header, limit: int | None) -> Any:
    """A rich ``Table`` of the header's first ``limit`` shards (None: all)."""
    from rich.table import Table

    shards = Table(title="shards", title_justify="left")
    for col, justify in (
        ("file", "left"),
        ("records", "right"),
        ("bytes", "right"),
        ("crc32c", "left"),
    ):
        # justify is one of rich's literal names; the loop variable widens it to str.
        shards.add_column(col, justify=justify)  # type: ignore[arg-type]
    for s in header.shards[:limit]:
        shards.add_row(s.file, f"{s.records:,}", f"{s.bytes:,}", s.crc32c)
    return shards

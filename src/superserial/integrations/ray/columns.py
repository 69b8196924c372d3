"""A Ray Data block's columns -> superserial leaves and the numpy encoder's columns.

What :mod:`superserial.integrations.ray.sink` writes a block as: one leaf per
column, named by the column (``a/b``: leaf ``b`` of dict ``a``), its kind, dtype
and shape taken from the values (see that module for the rules), and the
column in the form :func:`superserial.codec.numpy_encode.frame_batch` takes.
Nulls, and values superserial cannot store, are an
:class:`~superserial.errors.UnsupportedError` naming the column and row.

This module does not import TensorFlow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from superserial.codec import numpy_encode
from superserial.codec.numpy_decode import Ragged, Sparse
from superserial.codec.numpy_encode import Column, Shaped
from superserial.errors import UnsupportedError, require
from superserial.format import dtypes
from superserial.format.structure import DictNode, Leaf, Node, leaf_name

require("ray.data", extra="ray", needed_for="superserial.ray", package="Ray Data")

from ray.data.block import BlockAccessor  # noqa: E402
from ray.data.extensions import ArrowVariableShapedTensorType  # noqa: E402

__all__ = ["block_columns", "structure_of"]

# numpy dtype -> the dtype table's entry, for the dtypes a column may hold.
_BY_NUMPY = {d.numpy: d for d in dtypes.DTYPES if d.name != "string"}


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _path(column: str) -> tuple[str, ...]:
    """The structure path of a column: its name split at ``/`` (as leaf names are joined)."""
    return tuple(_unescape(p) for p in column.split("/"))


def _dtype(column: str, dtype: np.dtype) -> str:
    if dtype.kind in "OUS":
        return "string"
    entry = _BY_NUMPY.get(dtype)
    if entry is None:
        raise UnsupportedError(
            f"expected a column of a dtype superserial stores, got {dtype} in column {column!r}"
        )
    return entry.name


def _strings(column: str, values: np.ndarray, row0: int) -> np.ndarray:
    """``str`` / ``bytes`` values (any shape) as an ``object`` array of bytes."""
    out = np.empty(values.shape, dtype=object)
    flat, dst = values.reshape(-1), out.reshape(-1)
    per_row = max(1, int(np.prod(values.shape[1:])))
    for i, v in enumerate(flat):
        if isinstance(v, bytes):
            dst[i] = v
        elif isinstance(v, str):
            dst[i] = v.encode("utf-8")
        else:
            raise UnsupportedError(
                f"expected str or bytes in every row of column {column!r}, got "
                f"{'null' if v is None else type(v).__name__} at row {row0 + i // per_row}"
            )
    return out


def _typed(column: str, array: np.ndarray, row0: int) -> tuple[str, np.ndarray]:
    """An array of values as (its dtype name, the array: strings as bytes)."""
    name = _dtype(column, array.dtype)
    if name == "string":
        return name, _strings(column, array.astype(object), row0)
    return name, np.ascontiguousarray(array)


def _arrays(column: str, values: np.ndarray, row0: int) -> list[np.ndarray]:
    """An ``object`` column of ``np.ndarray`` values (or numpy scalars), checked: one dtype and rank."""
    arrays = [np.asarray(v) if isinstance(v, np.generic) else v for v in values]
    first = arrays[0]
    for i, v in enumerate(arrays):
        if not isinstance(v, np.ndarray) or v.dtype != first.dtype or v.ndim != first.ndim:
            got = (
                "null"
                if v is None
                else f"{v.dtype}{list(v.shape)}"
                if isinstance(v, np.ndarray)
                else type(v).__name__
            )
            raise UnsupportedError(
                f"expected arrays of one dtype and rank ({first.dtype}, rank {first.ndim}) in "
                f"column {column!r}, got {got} at row {row0 + i}"
            )
    return arrays


def _shaped(column: str, arrays: list[np.ndarray], row0: int) -> tuple[Leaf, Column]:
    """Arrays of varying shapes: a dense leaf with every dimension unknown."""
    dtype, flat = _typed(column, np.concatenate([a.reshape(-1) for a in arrays]), row0)
    shapes = np.array([a.shape for a in arrays], np.int64).reshape(len(arrays), arrays[0].ndim)
    leaf = Leaf(leaf_name(_path(column)), "dense", dtype, (None,) * arrays[0].ndim)
    return leaf, Shaped(flat, shapes)


def _ragged(column: str, values: np.ndarray, row0: int) -> tuple[Leaf, Column]:
    """:class:`~superserial.codec.numpy_decode.Ragged` values: a ragged leaf."""
    first = values[0]
    rank = len(first.nested_row_splits)
    for i, v in enumerate(values):
        same = (
            isinstance(v, Ragged)
            and len(v.nested_row_splits) == rank
            and v.flat_values.dtype == first.flat_values.dtype
            and v.flat_values.shape[1:] == first.flat_values.shape[1:]
            and v.nested_row_splits[0].dtype == first.nested_row_splits[0].dtype
        )
        if not same:
            raise UnsupportedError(
                f"expected ragged values of one dtype, ragged rank and inner shape in column "
                f"{column!r} (as row {row0}), got {type(v).__name__} unlike it at row {row0 + i}"
            )
    inner = first.flat_values.shape[1:]
    dtype, flat = _typed(
        column, np.concatenate([v.flat_values for v in values]).reshape(-1, *inner), row0
    )
    lengths = [np.array([len(v.nested_row_splits[0]) - 1 for v in values], np.int64)]
    for level in range(rank):
        lengths.append(np.concatenate([np.diff(v.nested_row_splits[level]) for v in values]))
    splits = first.nested_row_splits[0].dtype
    leaf = Leaf(
        leaf_name(_path(column)),
        "ragged",
        dtype,
        (None,) * (rank + 1) + tuple(inner),
        ragged_rank=rank,
        row_splits_dtype="int32" if splits == np.int32 else "int64",
    )
    return leaf, numpy_encode.Ragged(flat, tuple(lengths))


def _column(column: str, values: np.ndarray, variable: bool, row0: int) -> tuple[Leaf, Column]:
    """One column of a block as (its leaf, its values as the encoder takes them)."""
    name = leaf_name(_path(column))
    if values.dtype != object and not variable:
        dtype, array = _typed(column, values, row0)
        return Leaf(name, "dense", dtype, tuple(values.shape[1:])), array
    if values.dtype != object:  # a variable-shaped column whose block's shapes agree
        values = _objects(list(values))
    first = values[0]
    if first is None:
        raise UnsupportedError(f"expected a value in column {column!r}, got null at row {row0}")
    if isinstance(first, (str, bytes)):
        return Leaf(name, "dense", "string", ()), _strings(column, values, row0)
    if isinstance(first, Ragged):
        return _ragged(column, values, row0)
    if isinstance(first, Sparse):
        raise UnsupportedError(
            f"expected no sparse values in column {column!r}, got one at row {row0}: the Ray "
            "datasink has no TF-free encoder of sparse leaves"
        )
    if not isinstance(first, (np.ndarray, np.generic)):
        raise UnsupportedError(
            f"expected numbers, strings or arrays in column {column!r}, got "
            f"{type(first).__name__} at row {row0}"
        )
    arrays = _arrays(column, values, row0)
    if variable or any(a.shape != arrays[0].shape for a in arrays):
        return _shaped(column, arrays, row0)
    dtype, array = _typed(column, np.stack(arrays), row0)
    return Leaf(name, "dense", dtype, tuple(array.shape[1:])), array


def _objects(values: list[Any]) -> np.ndarray:
    # Filled one by one: numpy would make equal-shaped arrays one array.
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _nulls(block: Any, row0: int) -> None:
    """Raises on the first null of an Arrow block (Ray would make a null integer a float NaN)."""
    columns = getattr(block, "column_names", None)
    if columns is None:  # a pandas block: nulls are found as the values are converted
        return
    for name in columns:
        col = block.column(name)
        if col.null_count:
            row = next(i for i, v in enumerate(col.is_null().to_pylist()) if v)
            raise UnsupportedError(
                f"expected a value in every row of column {name!r}, got null at row {row0 + row}"
            )


def block_columns(block: Any, row0: int) -> dict[str, tuple[Leaf, Column]]:
    """A block's columns as {column name: (its leaf, its values for the encoder)}.

    Args:
        block: A Ray Data block (an Arrow table or a pandas DataFrame).
        row0: The row of the task's input the block starts at, for messages.

    Raises:
        UnsupportedError: A null, or a value superserial cannot store (named).
    """
    _nulls(block, row0)
    schema = getattr(block, "schema", None)
    variable = {
        f.name
        for f in (schema if schema is not None and hasattr(schema, "names") else [])
        if isinstance(f.type, ArrowVariableShapedTensorType)
    }
    return {
        name: _column(name, values, name in variable, row0)
        for name, values in BlockAccessor.for_block(block).to_numpy().items()
    }


def structure_of(leaves: dict[str, Leaf]) -> Node:
    """The dict structure of a block's leaves (column ``a/b``: leaf ``b`` of dict ``a``).

    Raises:
        UnsupportedError: A column is both a leaf and a dict (``a`` and ``a/b``).
    """
    root: dict[str, Any] = {}
    for column, leaf in sorted(leaves.items()):
        path = _path(column)
        node = root
        for i, key in enumerate(path[:-1]):
            child = node.setdefault(key, {})
            if isinstance(child, Leaf):
                raise UnsupportedError(
                    f"expected column {leaf_name(path[: i + 1])!r} to be a leaf or a dict of "
                    f"columns, not both: found it and {column!r}"
                )
            node = child
        if path[-1] in node:
            raise UnsupportedError(
                f"expected column {column!r} to be a leaf or a dict of columns, not both"
            )
        node[path[-1]] = leaf

    def build(d: dict[str, Any]) -> Node:
        return DictNode({k: v if isinstance(v, Leaf) else build(v) for k, v in d.items()})

    return build(root)

"""Apache Arrow in: a schema -> a header structure, record batches -> framed records.

Types are kept exactly or refused (the table is ``docs/convert.md``'s):

* ``int8`` .. ``uint64``, ``float16/32/64``, ``bool`` -> the same dtype (the
  dtype table's ``arrow`` names, :mod:`superserial.format.dtypes`);
* ``string``, ``binary`` and their large and view variants -> ``string`` (bytes);
* ``fixed_size_list`` (nested) -> a dense leaf of that shape;
* ``list`` / ``large_list`` -> a ragged leaf: each list level a ragged dimension
  (``ragged_rank`` = levels - 1), ``fixed_size_list`` inside them inner dimensions;
* ``struct`` -> a dict; a schema (a table) -> a dict of its columns.

Anything else (timestamps, decimals, dictionaries, maps, lists of structs, a
list inside a ``fixed_size_list``) is an :class:`~superserial.errors.UnsupportedError`
naming the column, raised from the schema before a row is read; a null anywhere
(a row, inside a list, a struct) a :class:`~superserial.errors.ConversionError`
naming the column and the row. :func:`write_arrow` streams batches through the
one write loop (:func:`superserial.foreign.writing.write_framed`) and keeps the
source schema in the header's metadata (``arrow_schema``), so the way out can
give back string vs binary, large lists and the schema's own metadata.

This module does not import TensorFlow.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from superserial.codec.numpy_encode import Column, Ragged, Strings, frame_batch
from superserial.errors import ConversionError, UnsupportedError, require
from superserial.foreign.writing import write_framed
from superserial.format import dtypes
from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, Node, iter_leaves, leaf_name

__all__ = ["arrow_structure", "frame_arrow_batch", "schema_metadata", "write_arrow"]

# Rows encoded at once: records of a few MiB together, as ``save`` batches them.
_BATCH_BYTES = 4 << 20
_MAX_ROWS = 8192


def _pa() -> Any:
    return require("pyarrow", extra="arrow", needed_for="Arrow and Parquet conversion")


def _dtype_of(t: Any) -> str | None:
    """The superserial dtype of a primitive Arrow type, or None."""
    pa = _pa()
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary_view(t)
    ):
        return "string"
    for d in dtypes.DTYPES:
        if d.arrow is not None and d.name != "string" and t == getattr(pa, d.arrow)():
            return d.name
    return None


def _is_list(t: Any) -> bool:
    pa = _pa()
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _leaf(t: Any, path: tuple[str, ...]) -> Leaf:
    """The leaf of a column of non-struct type ``t``."""
    pa = _pa()
    column = ".".join(path)
    levels, inner = 0, []
    while _is_list(t):
        levels, t = levels + 1, t.value_type
    while pa.types.is_fixed_size_list(t):
        inner.append(t.list_size)
        t = t.value_type
    if pa.types.is_dictionary(t):
        # Its values are kept (decoded); the dictionary encoding is the source schema's,
        # which the header keeps and the way out restores.
        t = t.value_type
    dtype = "string" if pa.types.is_fixed_size_binary(t) else _dtype_of(t)
    if dtype is None:
        if pa.types.is_struct(t) and not inner:
            raise UnsupportedError(
                f"expected list values of a primitive type, got a list of structs in column "
                f"{column!r}: superserial has no list of dicts; make it a struct of lists "
                "(one list per field: pyarrow.compute.struct_field on the list's values)"
            )
        if _is_list(t) or pa.types.is_struct(t):
            what = "a list" if _is_list(t) else "a struct"
            raise UnsupportedError(
                f"expected fixed_size_list values of primitive type, got {what} inside a "
                f"fixed_size_list in column {column!r}; make the inner lists fixed_size_list too"
            )
        raise UnsupportedError(
            f"expected an Arrow type superserial keeps exactly (integers, floats, bool, string, "
            f"binary, lists, fixed_size_list, struct, dictionaries of those), got {t} in column "
            f"{column!r}; cast it to one of the types of docs/convert.md first"
        )
    name = leaf_name(path)
    if not levels:
        return Leaf(name, "dense", dtype, tuple(inner))
    shape = (None,) * levels + tuple(inner)
    return Leaf(name, "ragged", dtype, shape, ragged_rank=levels - 1, row_splits_dtype="int64")


def _node(fields: Iterable[Any], path: tuple[str, ...]) -> DictNode:
    pa = _pa()
    items: dict[str, Node] = {}
    for field in fields:
        where = ".".join((*path, field.name))
        if field.name in items:
            raise UnsupportedError(f"expected distinct field names, got {where!r} twice")
        t = field.type
        if pa.types.is_struct(t):
            if t.num_fields == 0:
                raise UnsupportedError(f"expected a struct with fields, got none in {where!r}")
            items[field.name] = _node(t, (*path, field.name))
        else:
            items[field.name] = _leaf(t, (*path, field.name))
    return DictNode(items)


def arrow_structure(schema: Any) -> DictNode:
    """The header structure of an Arrow schema: a dict of its columns (see the module).

    Raises:
        UnsupportedError: A column's type cannot be kept exactly (named), or there is no column.
    """
    if len(schema) == 0:
        raise UnsupportedError("expected at least one column, got a schema of none")
    return _node(schema, ())


def schema_metadata(schema: Any) -> dict[str, Any]:
    """The header metadata that keeps ``schema``: ``{"arrow_schema": base64 of its IPC bytes}``."""
    return {"arrow_schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")}


def _leaf_arrays(
    columns: Sequence[Any], fields: Iterable[Any], path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, array) of each leaf in structure order: dict keys sorted, as ``iter_leaves`` walks."""
    pa = _pa()
    named = {f.name: (f, c) for f, c in zip(fields, columns, strict=True)}
    for key in sorted(named):
        field, array = named[key]
        if pa.types.is_struct(field.type):
            _no_nulls(array, (*path, key), [], 0)
            yield from _leaf_arrays(array.flatten(), field.type, (*path, key))
        else:
            yield (*path, key), array


def _row_of(ups: list[tuple[str, Any]], index: int) -> int:
    """The row of the column that holds value ``index`` of the innermost level walked."""
    for kind, how in reversed(ups):
        index = (
            int(np.searchsorted(how, index, side="right")) - 1 if kind == "list" else index // how
        )
    return index


def _no_nulls(array: Any, path: tuple[str, ...], ups: list[tuple[str, Any]], first: int) -> None:
    if array.null_count:
        index = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        row = first + _row_of(ups, index)
        inside = " (inside a list)" if ups else ""
        column = ".".join(path)
        raise ConversionError(
            f"expected no nulls, got one in column {column!r} at row {row}{inside}; "
            "superserial has no null: fill or drop them first",
            column=column,
            row=row,
        )


def _strings(array: Any) -> Strings:
    """The strings of a binary / string array (large or not), straight from its buffers."""
    pa = _pa()
    t = array.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        array = array.cast(pa.large_binary())
        t = array.type
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    _, offsets, data = array.buffers()
    n = len(array)
    if not n:
        return Strings(np.empty(0, np.uint8), np.empty(0, np.int64))
    offs = np.frombuffer(offsets, np.int64 if wide else np.int32)[
        array.offset : array.offset + n + 1
    ]
    raw = np.empty(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
    return Strings(raw[int(offs[0]) : int(offs[-1])], np.diff(offs).astype(np.int64))


def _numbers(array: Any, dtype: np.dtype) -> np.ndarray:
    """The values of a numeric or bool array (no nulls), as numpy, from its data buffer.

    Not ``to_numpy(zero_copy_only=False)``: that imports pandas (a second on first use).
    """
    buffer = array.buffers()[1]
    n, start = len(array), array.offset
    if dtype == np.bool_:  # bit-packed, least significant bit first
        if not n:
            return np.empty(0, np.bool_)
        bits = np.frombuffer(buffer, np.uint8)[start // 8 : (start + n + 7) // 8 + 1]
        unpacked = np.unpackbits(bits, bitorder="little")
        out: np.ndarray = unpacked[start % 8 : start % 8 + n].astype(np.bool_)
        return out
    if buffer is None:
        return np.empty(0, dtype)
    return np.frombuffer(buffer, dtype)[start : start + n]


def _column(leaf: Leaf, array: Any, path: tuple[str, ...], first: int) -> Column:
    """One leaf's batch as the numpy encoder takes it."""
    pa = _pa()
    ups: list[tuple[str, Any]] = []
    lengths: list[np.ndarray] = []
    while True:
        _no_nulls(array, path, ups, first)
        t = array.type
        if _is_list(t):
            offs = np.asarray(array.offsets, np.int64)
            lengths.append(np.diff(offs))
            array = array.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
            ups.append(("list", offs - offs[0]))
        elif pa.types.is_fixed_size_list(t):
            ups.append(("fixed", t.list_size))
            array = array.flatten()
        else:
            break
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
        _no_nulls(array, path, ups, first)  # a null among the values an index points at
    if pa.types.is_fixed_size_binary(array.type):
        array = array.cast(pa.binary())
    values = _strings(array) if leaf.encoding == "bytes" else _numbers(array, leaf.entry.numpy)
    if leaf.kind == "ragged":
        return Ragged(values, tuple(lengths))
    return values if isinstance(values, Strings) else values.reshape(-1, *leaf.shape)


def frame_arrow_batch(
    leaves: Sequence[Leaf], batch: Any, *, first_row: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The framed records of a ``pyarrow.RecordBatch``, one per row.

    Args:
        leaves: The leaves of :func:`arrow_structure` of the batch's schema.
        batch: The rows.
        first_row: The batch's first row in the whole source, for messages.

    Returns:
        (the framed records as one uint8 array, each record's data size).

    Raises:
        ConversionError: A null, naming the column and the row.
    """
    found = list(_leaf_arrays(batch.columns, batch.schema, ()))
    if [leaf_name(p) for p, _ in found] != [leaf.name for leaf in leaves]:
        raise UnsupportedError(
            f"expected a batch of the leaves {[leaf.name for leaf in leaves]}, "
            f"got {[leaf_name(p) for p, _ in found]}"
        )
    columns = [
        _column(leaf, array, path, first_row)
        for leaf, (path, array) in zip(leaves, found, strict=True)
    ]
    return frame_batch(leaves, columns, count=batch.num_rows)


def _pieces(batch: Any) -> Iterator[Any]:
    """A batch cut into slices of a few MiB: bounded memory, whatever the source's batches."""
    n = batch.num_rows
    per = max(1, min(_MAX_ROWS, (_BATCH_BYTES * n) // max(batch.nbytes, 1)))
    for start in range(0, n, per):
        yield batch.slice(start, per)


def _framed(
    batches: Iterable[Any], schema: Any, leaves: Sequence[Leaf]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    row = 0
    for batch in batches:
        if not batch.schema.equals(schema):
            raise UnsupportedError(
                f"expected every batch of the schema {schema}, got {batch.schema} at row {row}"
            )
        for piece in _pieces(batch):
            if piece.num_rows:
                yield frame_arrow_batch(leaves, piece, first_row=row)
                row += piece.num_rows


def write_arrow(
    batches: Iterable[Any],
    path: str,
    *,
    schema: Any,
    metadata: dict[str, Any] | None = None,
    num_rows: int | None = None,
    source: str = "Arrow batches",
    overwrite_hint: str = "overwrite=True",
    compression: str | None = None,
    num_shards: int | None = None,
    shard_size: int | None = None,
    overwrite: bool = False,
    progress: bool | Callable[[int, int], None] | None = None,
) -> Header:
    """Writes ``pyarrow.RecordBatch``es of ``schema`` as a superserial dataset at ``path``.

    The batches are streamed (memory bounded by a batch, not by the data), each
    row one element: a dict of the columns. The header's metadata keeps the
    schema (``arrow_schema``: base64 of ``schema.serialize()``) and the caller's
    ``metadata`` (``source``, ``hf_features``...).

    Args:
        batches: The record batches, in order; each of ``schema``.
        path: The dataset directory to create.
        schema: Their schema (the types are checked before a batch is read).
        metadata: More header metadata (JSON values).
        num_rows: The row count if known (a progress total; needed for ``num_shards``).
        source: What is converted, for the progress bar and the log.
        overwrite_hint: How the caller's user asks for ``overwrite``, for messages.
        compression, num_shards, shard_size, overwrite, progress: As for ``save``.

    Returns:
        The header written.

    Raises:
        UnsupportedError: A type cannot be kept exactly (before anything is written).
        ConversionError: A null (naming the column and the row); nothing is left at ``path``.
    """
    structure = arrow_structure(schema)
    leaves = tuple(iter_leaves(structure))
    meta = {**schema_metadata(schema), **(metadata or {})}
    return write_framed(
        _framed(batches, schema, leaves),
        path,
        structure,
        metadata=meta,
        num_rows=num_rows,
        source=source,
        compression=compression,
        num_shards=num_shards,
        shard_size=shard_size,
        overwrite=overwrite,
        progress=progress,
        overwrite_hint=overwrite_hint,
    )

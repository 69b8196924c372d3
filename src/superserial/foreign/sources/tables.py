"""The sources of ``superserial.convert`` that need no TensorFlow: Parquet, Arrow, pandas, numpy.

* Parquet: a file, a directory (its ``.parquet`` files, recursively, hidden and
  ``_`` names skipped, as pyarrow does) or a glob, local or on any filesystem of
  :mod:`superserial.storage.fs` (``s3://``, ``gs://``...); files in sorted order, each
  streamed a batch of a row group at a time (memory bounded by a row group),
  all of one schema;
* a ``pyarrow.Table`` or ``RecordBatch``;
* a pandas ``DataFrame``: column by column through pyarrow (the index is not
  kept); numbers keep their dtype (NaN stays a NaN), object columns of ``str``
  or ``bytes`` become strings; an object column of mixed types is a
  :class:`~superserial.errors.ConversionError` naming the column and the row;
* a dict of numpy arrays (nested dicts too): the first axis counts the
  elements, every other one is kept as a dense shape, dtypes exactly (bfloat16
  and complex included, which Arrow has not); strings from ``bytes``/``str``
  object arrays or numpy ``S``/``U`` arrays.

All go through :func:`superserial.foreign.sources.arrow.write_arrow` (numpy dicts
through :func:`superserial.foreign.writing.write_framed` directly), so nothing
is written before the types are checked, and a failure leaves nothing behind.

This module does not import TensorFlow.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from superserial.codec.numpy_encode import Strings, frame_batch
from superserial.errors import (
    ConversionError,
    DatasetNotFoundError,
    UnsupportedError,
    require,
)
from superserial.foreign.sources.arrow import write_arrow
from superserial.foreign.writing import check_options, write_framed
from superserial.format import dtypes
from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, Node, iter_leaves, leaf_name
from superserial.storage import fs

__all__ = [
    "convert_arrow",
    "convert_numpy",
    "convert_pandas",
    "convert_parquet",
    "is_numpy_dict",
    "parquet_files",
]

_GLOB_CHARS = frozenset("*?[")
_HIDDEN = ("_", ".")
# Rows Parquet hands over at once (at most, and about so many bytes): a row group
# is read a batch at a time.
_PARQUET_BATCH = 65536
_PARQUET_BATCH_BYTES = 8 << 20
# Elements of a numpy dict encoded at once (and fewer for big elements).
_NUMPY_BATCH_BYTES = 4 << 20


def _pa(what: str) -> Any:
    return require("pyarrow", extra="arrow", needed_for=what)


# ------------------------------------------------------------------ Parquet


def _walk_parquet(directory: str) -> list[str]:
    """The ``.parquet`` files under ``directory``, hidden and ``_`` names skipped (as pyarrow)."""
    files: list[str] = []
    for name in fs.listdir(directory):
        if name.startswith(_HIDDEN):
            continue
        full = fs.join(directory, name)
        if fs.isdir(full):
            files += _walk_parquet(full)
        elif name.endswith(".parquet"):
            files.append(full)
    return files


def parquet_files(source: str) -> list[str]:
    """The Parquet files of a file, a directory or a glob, sorted (local or a URL).

    Raises:
        DatasetNotFoundError: Nothing matches (naming ``source``).
    """
    if _GLOB_CHARS & set(source):
        local = fs.is_local(source)
        files = sorted(glob.glob(source, recursive=True) if local else fs.glob(source))
    elif fs.isdir(source):
        files = sorted(_walk_parquet(source))
    else:
        files = [source] if fs.exists(source) else []
    if not files:
        raise DatasetNotFoundError(f"expected Parquet files at {source}, found none")
    return files


def _parquet_file(file: str, **kwargs: Any) -> Any:
    """``pyarrow.parquet.ParquetFile`` of a local path or, through the filesystem layer, a URL."""
    pq = require("pyarrow.parquet", extra="arrow", needed_for="Parquet conversion")
    if fs.is_local(file):
        return pq.ParquetFile(file, **kwargs)
    # Requests of 8 MiB: a column chunk in a few reads, not one per page.
    return pq.ParquetFile(fs.open_file(file, "rb", _PARQUET_BATCH_BYTES), **kwargs)


def _batch_rows(f: Any) -> int:
    """Rows per batch read: about ``_PARQUET_BATCH_BYTES`` of them, by the row groups' sizes."""
    meta = f.metadata
    rows = max(meta.num_rows, 1)
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return int(min(_PARQUET_BATCH, max(64, _PARQUET_BATCH_BYTES * rows // max(size, 1))))


def _parquet_batches(files: list[str], schema: Any) -> Iterator[Any]:
    for file in files:
        # No pre-buffering: it holds a whole row group's column chunks at once (a
        # 2 GB file of 32 MiB row groups peaked at 3x the RSS without it).
        with _parquet_file(file, pre_buffer=False) as f:
            if not f.schema_arrow.equals(schema):
                raise UnsupportedError(
                    f"expected every Parquet file of the schema of {files[0]}, got another in "
                    f"{file}: {f.schema_arrow}"
                )
            yield from f.iter_batches(batch_size=_batch_rows(f), use_threads=True)


def convert_parquet(source: str, path: str, **options: Any) -> Header:
    """Converts Parquet files (a file, a directory or a glob) into a dataset at ``path``."""
    check_options(options, what="a Parquet source")
    files = parquet_files(os.fspath(source))
    with _parquet_file(files[0]) as first:
        schema = first.schema_arrow
    rows = 0
    for file in files:
        with _parquet_file(file) as f:
            rows += f.metadata.num_rows
    return write_arrow(
        _parquet_batches(files, schema),
        path,
        schema=schema,
        metadata={"source": {"format": "parquet", "files": len(files)}},
        num_rows=rows,
        source=os.fspath(source),
        **options,
    )


# ------------------------------------------------------------------ Arrow, pandas


def convert_arrow(source: Any, path: str, **options: Any) -> Header:
    """Converts a ``pyarrow.Table`` or ``RecordBatch`` into a dataset at ``path``."""
    check_options(options, what="an Arrow source")
    return write_arrow(
        source.to_batches() if hasattr(source, "to_batches") else [source],
        path,
        schema=source.schema,
        metadata={"source": {"format": "arrow"}},
        num_rows=source.num_rows,
        source=f"a pyarrow {type(source).__name__}",
        **options,
    )


def _mixed(name: str, series: Any) -> ConversionError:
    """The error of an object column whose values are not all of one kind."""
    first = None
    for row, value in enumerate(series.tolist()):
        kind = "bytes" if isinstance(value, bytes) else type(value).__name__
        missing = type(value).__name__ in ("NAType", "NaTType")  # pandas' missing values
        if value is None or missing or (isinstance(value, float) and value != value):
            return ConversionError(
                f"expected no missing values, got {value!r} in column {name!r} at row {row}; "
                "superserial has no null: fill or drop them first",
                column=name,
                row=row,
            )
        if first is None:
            first = (kind, row)
        elif kind != first[0]:
            return ConversionError(
                f"expected values of one type in column {name!r}, got {first[0]} at row "
                f"{first[1]} and {kind} at row {row}",
                column=name,
                row=row,
            )
    return ConversionError(f"expected values pyarrow converts in column {name!r}", column=name)


def _pandas_table(frame: Any) -> Any:
    pa = _pa("pandas conversion")
    arrays, names = [], []
    for name in frame.columns:
        if not isinstance(name, str):
            raise UnsupportedError(f"expected string column names, got {name!r}")
        series = frame[name]
        try:
            # from_pandas=False: a NaN of a float column is a value, kept bit for bit.
            array = pa.array(series, from_pandas=series.dtype == object)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise _mixed(name, series) from e
        if array.null_count:
            raise _mixed(name, series)
        arrays.append(array)
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def convert_pandas(source: Any, path: str, **options: Any) -> Header:
    """Converts a pandas ``DataFrame`` (its columns, not its index) into a dataset at ``path``."""
    check_options(options, what="a pandas source")
    table = _pandas_table(source)
    return write_arrow(
        table.to_batches(),
        path,
        schema=table.schema,
        metadata={"source": {"format": "pandas"}},
        num_rows=table.num_rows,
        source="a pandas DataFrame",
        **options,
    )


# ------------------------------------------------------------------ numpy


def is_numpy_dict(source: Any) -> bool:
    """True for a (nested) dict of numpy arrays."""
    if not isinstance(source, Mapping) or not source:
        return False
    return all(
        isinstance(v, np.ndarray) or (isinstance(v, Mapping) and is_numpy_dict(v))
        for v in source.values()
    )


def _numpy_node(source: Mapping[str, Any], path: tuple[str, ...]) -> DictNode:
    items: dict[str, Node] = {}
    for key, value in source.items():
        where = ".".join((*path, str(key)))
        if not isinstance(key, str):
            raise UnsupportedError(
                f"expected string keys, got {key!r} in {'.'.join(path) or 'the dict'}"
            )
        if isinstance(value, Mapping):
            items[key] = _numpy_node(value, (*path, key))
            continue
        if value.ndim == 0:
            raise UnsupportedError(
                f"expected arrays whose first axis counts the elements, got a scalar at {where!r}"
            )
        kind = value.dtype.kind
        if kind in "SUO":
            dtype = "string"
        else:
            entry = next((d for d in dtypes.DTYPES if d.numpy == value.dtype), None)
            if entry is None or entry.name == "string":
                raise UnsupportedError(
                    f"expected a dtype of docs/convert.md, got {value.dtype} at {where!r}"
                )
            dtype = entry.name
        items[key] = Leaf(leaf_name((*path, key)), "dense", dtype, tuple(value.shape[1:]))
    return DictNode(items)


def _numpy_strings(array: np.ndarray, name: str, first: int) -> Strings:
    if array.dtype.kind == "S":
        return Strings.of(array.reshape(-1).tolist())
    if array.dtype.kind == "U":
        return Strings.of([s.encode("utf-8") for s in array.reshape(-1).tolist()])
    flat = array.reshape(-1)
    bad = [i for i, v in enumerate(flat.tolist()) if not isinstance(v, bytes | str)]
    if bad:
        per = int(np.prod(array.shape[1:], dtype=np.int64)) or 1
        value = flat[bad[0]]
        raise ConversionError(
            f"expected bytes or str values in {name!r}, got {type(value).__name__} "
            f"{value!r:.40} at row {first + bad[0] // per}",
            column=name,
            row=first + bad[0] // per,
        )
    return Strings.of(flat)


def _numpy_batches(
    leaves: tuple[Leaf, ...], arrays: list[np.ndarray], count: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    per_element = sum(max(a[:1].nbytes, 8) for a in arrays) or 1
    step = max(1, min(8192, _NUMPY_BATCH_BYTES // per_element))
    for start in range(0, count, step):
        cols: list[Any] = []
        for leaf, array in zip(leaves, arrays, strict=True):
            part = array[start : start + step]
            cols.append(_numpy_strings(part, leaf.name, start) if leaf.dtype == "string" else part)
        yield frame_batch(leaves, cols, count=min(step, count - start))


def _leaf_arrays(node: DictNode, source: Mapping[str, Any]) -> list[np.ndarray]:
    """The arrays in ``iter_leaves`` order (dict keys sorted)."""
    out: list[np.ndarray] = []
    for key in sorted(node.items):
        child = node.items[key]
        if isinstance(child, DictNode):
            out += _leaf_arrays(child, source[key])
        else:
            out.append(np.asarray(source[key]))
    return out


def convert_numpy(source: Mapping[str, Any], path: str, **options: Any) -> Header:
    """Converts a dict of numpy arrays (first axis: the elements) into a dataset at ``path``."""
    check_options(options, what="a dict of numpy arrays")
    structure = _numpy_node(source, ())
    leaves = tuple(iter_leaves(structure))
    arrays = _leaf_arrays(structure, source)
    counts = {len(a) for a in arrays}
    if len(counts) != 1:
        lengths = {leaf.name: len(a) for leaf, a in zip(leaves, arrays, strict=True)}
        raise UnsupportedError(f"expected arrays of one length (the element count), got {lengths}")
    (count,) = counts
    return write_framed(
        _numpy_batches(leaves, arrays, count),
        path,
        structure,
        metadata={"source": {"format": "numpy"}},
        num_rows=count,
        source="a dict of numpy arrays",
        **options,
    )

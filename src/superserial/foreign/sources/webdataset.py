"""WebDataset in: tar shards of samples, one leaf per file extension.

A WebDataset shard is a tar whose members are grouped into samples by key, as
``webdataset`` groups them: the member's path up to the first dot of its file
name is the key, the rest (lowercased) the extension; consecutive members of one
key are one sample; members named ``__...__`` and members without a dot are not
sample files and are skipped, as ``webdataset`` skips them. Each extension
becomes a leaf, by its last part (``seg.png`` as ``png``), as ``webdataset``'s
decoders pick theirs:

* ``cls cls2 class count index inx id`` -> int64 (the decimal text);
* ``txt text transcript html htm`` -> string (UTF-8 checked);
* ``json jsn`` -> string: the JSON text as it is (UTF-8 checked), not parsed, so
  nothing about it is guessed;
* ``npy`` -> the array itself, its dtype and shape (the first sample's shape; a
  sample of another shape or dtype is an error);
* image and audio extensions, and every other one (``pyd``, ``pth``, ``msgpack``,
  unknown ones) -> the member's bytes (a string leaf); nothing is unpickled;
* the key -> the string leaf ``__key__``.

The first sample fixes the extensions; a sample with a member missing, or one
more, is a :class:`~superserial.errors.ConversionError` naming the tar and the
key, raised while writing, so nothing is committed. Samples become Arrow record batches written by
:func:`superserial.foreign.sources.arrow.write_arrow`. Shards are read as streams
through ``storage/fs.py`` (local paths and every remote scheme it serves), one
member at a time; a batch of about 32 MiB is the most held. This module is
TF-free and does not import ``webdataset``.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from superserial.errors import (
    ConversionError,
    CorruptDataError,
    DatasetNotFoundError,
    UnsupportedError,
    require,
)
from superserial.foreign.sources.arrow import write_arrow
from superserial.foreign.writing import check_options
from superserial.format import dtypes
from superserial.format.header import Header
from superserial.storage import fs

__all__ = ["convert_webdataset", "detect_webdataset", "expand_shards", "iter_samples"]

_INT_EXTS = frozenset(["cls", "cls2", "class", "count", "index", "inx", "id"])
_TEXT_EXTS = frozenset(["txt", "text", "transcript", "html", "htm", "json", "jsn"])
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_GLOB_CHARS = frozenset("*?[")
# A member name's key and extension, as webdataset.tariterators.base_plus_ext splits it.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_BATCH_BYTES = 32 << 20
_BATCH_ROWS = 4096
KEY = "__key__"
_NO_DTYPE = np.dtype(np.uint8)


def _names(source: Any) -> list[str] | None:
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if (
        isinstance(source, (list, tuple))
        and source
        and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        return [os.fspath(s) for s in source]
    return None


def _braces(pattern: str) -> list[str]:
    if "{" not in pattern:
        return [pattern]
    braceexpand = require("braceexpand", extra="webdataset", needed_for="WebDataset brace patterns")
    return list(braceexpand.braceexpand(pattern))


def _is_tar(name: str) -> bool:
    return name.lower().endswith(_TAR_SUFFIXES)


def detect_webdataset(source: Any) -> bool:
    """True for tar shard names (``.tar``, ``.tar.gz``, ``.tgz``), brace patterns of them,
    a list of them, or a local directory holding only tar files."""
    names = _names(source)
    if names is None:
        return False
    try:
        if len(names) == 1 and os.path.isdir(names[0]):
            files = [f for f in os.listdir(names[0]) if not f.startswith(".")]
            return bool(files) and all(_is_tar(f) for f in files)
        # A pattern ending in .tar needs no expanding (nor braceexpand installed) to tell.
        return all(_is_tar(p) or all(_is_tar(n) for n in _braces(p)) for p in names)
    except (OSError, UnsupportedError):  # unreadable, or braceexpand not installed
        return False


def expand_shards(source: Any) -> list[str]:
    """The shard files of ``source``, in order: brace patterns expanded, globs matched
    (sorted), a directory's tar files sorted by name.

    Raises:
        DatasetNotFoundError: A name or pattern matches no file.
        UnsupportedError: ``source`` is not a path, a pattern or a list of them.
    """
    names = _names(source)
    if names is None:
        raise UnsupportedError(
            f"expected WebDataset shards as a path, a brace pattern or a list of them, "
            f"found {type(source).__name__}"
        )
    shards: list[str] = []
    for pattern in names:
        if len(names) == 1 and fs.is_local(pattern) and os.path.isdir(pattern):
            shards += sorted(os.path.join(pattern, f) for f in os.listdir(pattern) if _is_tar(f))
            continue
        for name in _braces(pattern):
            if _GLOB_CHARS & set(name):
                found = fs.glob(name)
                if not found:
                    raise DatasetNotFoundError(
                        f"expected WebDataset shards matching {name}, found none"
                    )
                shards += found
            elif not fs.exists(name):
                raise DatasetNotFoundError(f"expected a WebDataset shard at {name}, found no file")
            else:
                shards.append(name)
    if not shards:
        raise DatasetNotFoundError(f"expected WebDataset tar shards in {names}, found none")
    return shards


def _members(shard: str) -> Iterator[tuple[str, bytes]]:
    with fs.open_file(shard, "rb") as f:
        try:
            with tarfile.open(fileobj=f, mode="r|*") as stream:
                for info in stream:
                    if not info.isreg() or _META.match(info.name):
                        continue
                    member = stream.extractfile(info)
                    if member is None:
                        continue
                    yield info.name, member.read()
                    # A stream keeps every TarInfo it read otherwise (webdataset does the same).
                    stream.members = []  # type: ignore[attr-defined]
        except tarfile.TarError as e:
            raise CorruptDataError(
                f"expected a tar file at {shard}, found an unreadable one: {e}"
            ) from e


def iter_samples(shards: Sequence[str]) -> Iterator[tuple[str, str, dict[str, bytes]]]:
    """Yields (shard, key, {extension: bytes}) for every sample, in order.

    Raises:
        CorruptDataError: A tar is unreadable, or holds one extension twice for a key.
    """
    for shard in shards:
        key: str | None = None
        sample: dict[str, bytes] = {}
        for name, data in _members(shard):
            match = _KEY_EXT.match(name)
            if match is None:
                continue
            prefix, ext = match.group(1), match.group(2).lower()
            if prefix != key:
                if key is not None:
                    yield shard, key, sample
                key, sample = prefix, {}
            if ext in sample:
                raise CorruptDataError(
                    f"expected one .{ext} member for key {key!r} in {shard}, found two"
                )
            sample[ext] = data
        if key is not None:
            yield shard, key, sample


@dataclass(frozen=True)
class _Column:
    """One extension's leaf: what it is read as, and for ``npy`` the array's dtype and shape."""

    ext: str
    kind: str  # "int", "text", "npy" or "bytes"
    dtype: np.dtype = _NO_DTYPE  # for "npy" only
    shape: tuple[int, ...] = ()

    def arrow_type(self, pa: Any) -> Any:
        if self.kind == "int":
            return pa.int64()
        if self.kind == "text":
            return pa.string()
        if self.kind == "bytes":
            return pa.binary()
        out = pa.from_numpy_dtype(self.dtype)
        for d in reversed(self.shape):
            out = pa.list_(out, d)
        return out


def _last(ext: str) -> str:
    return ext.rsplit(".", 1)[-1]


def _load_npy(data: bytes, where: str) -> np.ndarray:
    try:
        array: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise CorruptDataError(f"expected an .npy array in {where}, found: {e}") from e
    # A big-endian array's values are the same numbers in native order.
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _column(ext: str, data: bytes, where: str) -> _Column:
    last = _last(ext)
    if last in _INT_EXTS:
        return _Column(ext, "int")
    if last in _TEXT_EXTS:
        return _Column(ext, "text")
    if last != "npy":
        return _Column(ext, "bytes")
    array = _load_npy(data, where)
    name = array.dtype.name
    entry = next((d for d in dtypes.DTYPES if d.numpy == array.dtype and d.name != "string"), None)
    if entry is None or entry.arrow is None:
        raise UnsupportedError(
            f"expected an .npy dtype with an exact Arrow type (bool, ints, uints, float16/32/64) "
            f"in {where}, found {name}"
        )
    return _Column(ext, "npy", array.dtype, tuple(array.shape))


_Row = tuple[str, str, dict[str, bytes]]  # (shard, key, {extension: bytes})


def _fail(ext: str, row: int, shard: str, key: str, expected: str, found: str) -> ConversionError:
    return ConversionError(
        f"expected {expected}, found {found} for key {key!r} (sample {row}) in {shard}",
        column=ext,
        row=row,
    )


class _Batcher:
    """Samples -> Arrow record batches of the columns the first sample fixed."""

    def __init__(self, columns: list[_Column], first: str) -> None:
        self.pa = require("pyarrow", extra="arrow", needed_for="converting WebDataset shards")
        self.columns = columns
        self.exts = frozenset(c.ext for c in columns)
        self.first = first
        self.schema = self.pa.schema(
            [self.pa.field(KEY, self.pa.string())]
            + [self.pa.field(c.ext, c.arrow_type(self.pa)) for c in columns]
        )

    def check(self, row: int, shard: str, key: str, sample: dict[str, bytes]) -> None:
        """Refuses a sample whose members are not the first sample's."""
        if sample.keys() == self.exts:
            return
        missing = sorted(self.exts - sample.keys())
        extra = sorted(sample.keys() - self.exts)
        parts = [
            f"no .{', .'.join(missing)}" if missing else "",
            f"also .{', .'.join(extra)}" if extra else "",
        ]
        raise _fail(
            (missing or extra)[0],
            row,
            shard,
            key,
            f"the members .{', .'.join(sorted(self.exts))} of every sample (as {self.first} has)",
            " and ".join(p for p in parts if p),
        )

    def batch(self, first_row: int, rows: list[_Row]) -> Any:
        """The record batch of ``rows``, the first of which is sample ``first_row``."""
        pa = self.pa
        arrays = [pa.array([key for _, key, _ in rows], pa.string())]
        arrays += [self._array(col, first_row, rows) for col in self.columns]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _array(self, col: _Column, first_row: int, rows: list[_Row]) -> Any:
        pa = self.pa
        values = [sample[col.ext] for _, _, sample in rows]
        if col.kind == "bytes":
            return pa.array(values, pa.binary())
        if col.kind == "text":
            for i, v in enumerate(values):
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError as e:
                    shard, key, _ = rows[i]
                    raise _fail(
                        col.ext, first_row + i, shard, key, f"UTF-8 text in .{col.ext}", str(e)
                    ) from e
            return pa.array(values, pa.binary()).cast(pa.string())
        if col.kind == "int":
            out = np.empty(len(values), np.int64)
            for i, v in enumerate(values):
                try:
                    out[i] = int(v.strip())
                except (ValueError, OverflowError) as e:
                    shard, key, _ = rows[i]
                    raise _fail(
                        col.ext,
                        first_row + i,
                        shard,
                        key,
                        f"a decimal int64 in .{col.ext}",
                        repr(v[:40]),
                    ) from e
            return pa.array(out)
        stacked = np.empty((len(values), *col.shape), col.dtype)
        for i, v in enumerate(values):
            shard, key, _ = rows[i]
            array = _load_npy(v, f".{col.ext} of key {key!r} in {shard}")
            if array.dtype != col.dtype or array.shape != col.shape:
                raise _fail(
                    col.ext,
                    first_row + i,
                    shard,
                    key,
                    f".{col.ext} arrays of {col.dtype.name}{list(col.shape)} (as {self.first} has)",
                    f"{array.dtype.name}{list(array.shape)}",
                )
            stacked[i] = array
        out = pa.array(stacked.reshape(-1))
        for d in reversed(col.shape):
            out = pa.FixedSizeListArray.from_arrays(out, d)
        return out


def _batches(samples: Iterator[_Row], batcher: _Batcher) -> Iterator[Any]:
    rows: list[_Row] = []
    first_row = size = 0
    for row, sample in enumerate(samples):
        batcher.check(row, *sample)
        rows.append(sample)
        size += sum(len(v) for v in sample[2].values())
        if size >= _BATCH_BYTES or len(rows) >= _BATCH_ROWS:
            yield batcher.batch(first_row, rows)
            first_row, rows, size = row + 1, [], 0
    if rows:
        yield batcher.batch(first_row, rows)


def convert_webdataset(source: Any, path: Any, **save_options: Any) -> Header:
    """Converts WebDataset tar shards into a superserial dataset at ``path``.

    Args:
        source: A tar path or URL, a brace pattern (``shards-{000..009}.tar``), a
            glob, a list of them, or a local directory of tar files.
        path: Where the dataset is written.
        **save_options: As for ``superserial.save`` (``compression``,
            ``shard_size``, ``overwrite``, ``progress``...).

    Returns:
        The header written.

    Raises:
        DatasetNotFoundError: No shard, a shard that is not there, or no sample.
        CorruptDataError: A file that is not a tar, or a member twice for one key.
        ConversionError: A sample lacks a member the first one has (or has one
            more), or a value is not what its extension says (naming the extension
            as the column, the sample as the row, the tar and the key); nothing is
            written.
        UnsupportedError: An ``.npy`` dtype with no exact Arrow type.
    """
    check_options(save_options, what="WebDataset shards")
    shards = expand_shards(source)
    samples = iter_samples(shards)
    first = next(samples, None)
    if first is None:
        raise DatasetNotFoundError(
            f"expected samples in the WebDataset shards {shards}, found none"
        )
    shard, key, sample = first
    where = f"key {key!r} of {shard}"
    columns = [_column(ext, data, f".{ext} of {where}") for ext, data in sample.items()]
    batcher = _Batcher(columns, where)
    metadata = {
        "source": {
            "format": "webdataset",
            "shards": len(shards),
            "extensions": {c.ext: c.kind for c in columns},
        }
    }
    return write_arrow(
        _batches(itertools.chain([first], samples), batcher),
        fs.dataset_path(path),
        schema=batcher.schema,
        metadata=metadata,
        source=f"WebDataset ({len(shards)} shards)",
        **save_options,
    )

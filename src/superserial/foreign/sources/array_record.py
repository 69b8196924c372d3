"""ArrayRecord files of ``tf.train.Example`` records -> a superserial dataset.

The files are read in order with array-record's own reader and go through
:func:`superserial.foreign.sources.infer.infer_records`: the structure is inferred
from the Examples as ``superserial infer`` infers it from TFRecord files, and
the records are copied, one shard per input file, through the write loop.
Every record is parsed before anything is written, so a record that is no
Example fails naming its file and index with nothing written.

ArrayRecord's reader opens local files only (it reads through its own C++
file layer), so remote URLs are refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from superserial.errors import CorruptDataError, DatasetNotFoundError, UnsupportedError, require
from superserial.foreign.sources.infer import infer_records
from superserial.format.header import Header, normalize_compression
from superserial.storage import fs

__all__ = ["array_record_files", "convert_array_record", "is_array_record"]

_GLOB_CHARS = frozenset("*?[")
# A file of ArrayRecord by its name: "x.array_record", or a TFDS shard
# "name-split.array_record-00000-of-00004".
_NAME = re.compile(r"\.array_record(-\d+-of-\d+)?$")
# Records asked of the reader at once: a range read returns them as a list.
_CHUNK = 1024


def _sources(source: Any) -> list[str]:
    """``source`` as a list of path strings (one path, or a sequence of them)."""
    if isinstance(source, str | os.PathLike):
        return [os.fspath(source)]
    if (
        isinstance(source, Sequence)
        and source
        and all(isinstance(s, str | os.PathLike) for s in source)
    ):
        return [os.fspath(s) for s in source]
    raise UnsupportedError(
        f"expected ArrayRecord files as a path, a glob or a list of them, "
        f"got {type(source).__name__}"
    )


def is_array_record(source: Any) -> bool:
    """Whether ``source`` names ArrayRecord files (by their names: no file is opened).

    A path or glob ending in ``.array_record`` (or a TFDS shard name such as
    ``x-train.array_record-00000-of-00001``), a glob whose local matches all
    have such names, a directory holding such files, or a list of these. A TFDS directory of ArrayRecord shards is one too: the
    dispatcher asks the TFDS format first.
    """
    try:
        paths = _sources(source)
    except UnsupportedError:
        return False
    for p in paths:
        if _NAME.search(p.rstrip("/")):
            continue
        if not fs.is_local(p):
            return False
        if _GLOB_CHARS & set(p):
            # A glob such as "x-train.array_record-*": its (local) matches' names decide.
            matches = fs.glob(p)
            if not matches or not all(_NAME.search(m) for m in matches):
                return False
        elif not os.path.isdir(p) or not _in_dir(p):
            return False
    return True


def _in_dir(directory: str) -> list[str]:
    return sorted(
        os.path.join(directory, n)
        for n in os.listdir(directory)
        if _NAME.search(n) and os.path.isfile(os.path.join(directory, n))
    )


def array_record_files(source: Any) -> list[str]:
    """The ArrayRecord files ``source`` names, in the order they are written.

    Args:
        source: A file, a directory (its ArrayRecord files by name, sorted),
            a glob (its matches sorted), or a list of these (in its order).

    Raises:
        DatasetNotFoundError: A path, directory or glob names no file.
        UnsupportedError: A remote URL, or ``source`` is not paths.
    """
    files: list[str] = []
    for p in _sources(source):
        if not fs.is_local(p):
            raise UnsupportedError(
                f"expected a local ArrayRecord path (array-record reads local files only), got {p}"
            )
        if _GLOB_CHARS & set(p):
            matches = sorted(m for m in fs.glob(p) if not os.path.isdir(m))
            if not matches:
                raise DatasetNotFoundError(f"expected ArrayRecord files matching {p}, found none")
        elif os.path.isdir(p):
            matches = _in_dir(p)
            if not matches:
                raise DatasetNotFoundError(
                    f"expected *.array_record files in the directory {p}, found none"
                )
        elif os.path.isfile(p):
            matches = [p]
        else:
            raise DatasetNotFoundError(f"expected an ArrayRecord file at {p}, found none")
        files.extend(m for m in matches if m not in files)
    return files


def _reader(module: Any) -> Callable[[str], Iterator[bytes]]:
    """The records of one ArrayRecord file, in order, a range read at a time."""

    def read(file: str) -> Iterator[bytes]:
        reader = module.ArrayRecordReader(file)
        if not reader.ok():
            # The reader says why only when closed, and says it by raising.
            reason = "the reader is not ok"
            try:
                reader.close()
            except RuntimeError as e:
                reason = str(e)
            raise CorruptDataError(
                f"expected an ArrayRecord file, got one array-record cannot open at {file}: {reason}"
            )
        try:
            n = reader.num_records()
            for start in range(0, n, _CHUNK):
                try:
                    chunk = reader.read(start, min(start + _CHUNK, n))
                except (RuntimeError, ValueError, OSError) as e:
                    raise CorruptDataError(
                        f"expected readable ArrayRecord chunks, got a fault in {file} "
                        f"records {start}..{min(start + _CHUNK, n) - 1}: {e}"
                    ) from e
                yield from chunk
        finally:
            reader.close()

    return read


def convert_array_record(
    source: Any,
    path: str,
    *,
    compression: str | None = None,
    overwrite: bool = False,
    progress: bool | Callable[[int, int], None] | None = None,
    overwrite_hint: str = "overwrite=True",
    num_shards: int | None = None,
    shard_size: int | None = None,
) -> Header:
    """Makes a dataset at ``path`` of ArrayRecord files of ``tf.train.Example``.

    Args:
        source: ArrayRecord files, a directory of them, a glob, or a list of these.
        path: The dataset directory to create.
        compression: Of the dataset's shards: None, ``"GZIP"`` or ``"ZLIB"``.
        overwrite: Replace an existing dataset at ``path``.
        progress: As for ``save``: a bar, none, or a callable given (elements,
            bytes) per batch, once for the scan, once for the copy.
        overwrite_hint: How the caller's user asks for ``overwrite``, for messages.
        num_shards: Refused (with ``shard_size``): the records are copied one
            shard per input file, as ``infer`` copies them.
        shard_size: Refused, as ``num_shards``.

    Returns:
        The header written; its ``metadata["source"]`` says
        ``{"format": "array_record", "files": N}``.

    Raises:
        MissingDependencyError: array-record is not installed.
        DatasetNotFoundError: ``source`` names no file.
        CorruptDataError: A file is no ArrayRecord file, or a record is no
            ``tf.train.Example`` (named by file and index); nothing is written.
        HeaderError: The features cannot form a header (as for ``infer``).
        DatasetExistsError: ``path`` exists and ``overwrite`` is False.
        ValueError: ``num_shards`` or ``shard_size`` given.
    """
    if num_shards is not None or shard_size is not None:
        raise ValueError(
            "expected no num_shards or shard_size for ArrayRecord files (each file becomes "
            "one shard, its records copied), got one; convert the result again to re-shard it"
        )
    module = require(
        "array_record.python.array_record_module",
        extra="array-record",
        needed_for="converting ArrayRecord files",
        package="array-record",
    )
    files = array_record_files(source)
    header, _ = infer_records(
        files,
        _reader(module),
        path,
        compression=normalize_compression(compression),
        overwrite=overwrite,
        progress=progress,
        overwrite_hint=overwrite_hint,
        label="convert",
        metadata={"source": {"format": "array_record", "files": len(files)}},
    )
    return header

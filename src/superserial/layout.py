"""Where things are in a dataset directory, checked cheaply; no TensorFlow needed.

A dataset directory holds ``header.json`` and the shard files it lists
(``data-00000-of-00004.tfrecord``...). Nothing else in it is read.
"""

from __future__ import annotations

import os
import warnings

from superserial import fs
from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetNotFoundError,
    HeaderError,
    IdleReaderWarning,
)
from superserial.header import HEADER_FILE, LIMITS, Header

__all__ = ["check_target", "host_shards", "read_header", "shard_paths"]


def read_header(path: str) -> Header:
    """Reads and validates the header of the dataset at ``path``, reading no records.

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        HeaderError: The header is malformed or of an unknown version.
    """
    path = str(path)
    hpath = fs.join(path, HEADER_FILE)
    if not fs.exists(hpath):
        what = "no such directory" if not fs.exists(path) else f"no {HEADER_FILE}"
        raise DatasetNotFoundError(f"expected a superserial dataset at {path}, found {what}")
    if fs.is_local(path) and os.path.dirname(os.path.realpath(hpath)) != os.path.realpath(path):
        raise HeaderError(f"expected {hpath} inside {path}, found a link pointing out of it")
    with fs.open_file(hpath, "rb") as f:
        # Read one byte past the limit so an oversized header is caught unparsed.
        text = f.read(LIMITS.header_bytes + 1)
    return Header.from_json(text, source=hpath)


def shard_paths(path: str, header: Header, *, check_sizes: bool = True) -> list[str]:
    """The shard files of a dataset, checked cheaply against the header.

    Raises:
        CorruptDataError: A shard is missing, of the wrong size, an unlisted
            shard is present, or a shard is a link pointing out of the dataset.
    """
    path = str(path)
    files = [fs.join(path, s.file) for s in header.shards]
    listed = {s.file for s in header.shards}
    present = set(fs.listdir(path))
    extra = sorted(
        n for n in present if n.startswith("data-") and n.endswith(".tfrecord") and n not in listed
    )
    if extra:
        raise CorruptDataError(
            f"expected only the header's shards in {path}, found extra file {extra[0]}"
        )
    real_dir = os.path.realpath(path) if fs.is_local(path) else None
    for shard, file in zip(header.shards, files, strict=True):
        if shard.file not in present:
            raise CorruptDataError(
                f"expected shard {file} ({shard.records} records), found no file"
            )
        if real_dir is not None and os.path.dirname(os.path.realpath(file)) != real_dir:
            raise CorruptDataError(
                f"expected shard {file} inside {path}, found a link pointing out of it"
            )
        if check_sizes:
            got = fs.size(file)
            if got != shard.bytes:
                raise CorruptDataError(f"expected {shard.bytes} bytes in {file}, found {got}")
    return files


def host_shards(path: str, num_files: int, shard: tuple[int, int]) -> list[int]:
    """The shard indices host ``i`` of ``n`` reads for ``shard=(i, n)``: ``i, i+n, ...``.

    With fewer shard files than hosts, some hosts read nothing; every host
    then warns (an :class:`~superserial.errors.IdleReaderWarning`, so that
    the host whose log is watched tells about the idle ones too).

    Raises:
        ValueError: ``shard`` is not ``(i, n)`` with ``0 <= i < n``.
    """
    i, n = shard
    if not (isinstance(i, int) and isinstance(n, int) and 0 <= i < n):
        raise ValueError(f"expected shard=(i, n) with 0 <= i < n, got {shard!r}")
    if num_files < n:
        idle = f"host {i} reads nothing" if i >= num_files else f"host {i} reads shard {i}"
        others = f"hosts {num_files}..{n - 1}" if num_files < n - 1 else f"host {n - 1}"
        warnings.warn(
            f"shard={shard!r}: the dataset at {path} has {num_files} shard file(s) for {n} hosts, "
            f"so {others} of {n} read nothing ({idle}); save it with num_shards= a multiple "
            f"of the number of readers (hosts x DataLoader workers) to give every host a share",
            IdleReaderWarning,
            stacklevel=3,
        )
    return list(range(i, num_files, n))


def check_target(path: str, overwrite: bool, *, hint: str = "overwrite=True") -> None:
    """Checks that a dataset may be written at ``path``.

    Nothing may be there, unless ``overwrite`` and it is a superserial dataset
    (or an empty directory): anything else is never deleted.

    Args:
        path: Where the dataset goes.
        overwrite: Whether an existing dataset may be replaced.
        hint: How the caller's user asks for overwriting, for the message.

    Raises:
        DatasetExistsError: Something is at ``path`` that may not be replaced.
    """
    if not fs.exists(path):
        return
    if not overwrite:
        raise DatasetExistsError(
            f"expected no file or directory at {path}, found one; pass {hint} to replace a dataset"
        )
    if not fs.isdir(path):
        raise DatasetExistsError(
            f"expected a dataset directory at {path} to overwrite, found a file"
        )
    names = fs.listdir(path)
    if names and HEADER_FILE not in names:
        raise DatasetExistsError(
            f"expected a superserial dataset at {path} to overwrite, found a directory without "
            f"{HEADER_FILE}; refusing to delete it"
        )

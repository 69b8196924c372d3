"""Where things are in a dataset directory, checked cheaply; no TensorFlow needed.

A dataset directory holds ``header.json`` and the shard files it lists
(``data-00000-of-00004.tfrecord``...). Nothing else in it is read.
"""

from __future__ import annotations

import os

import google_crc32c

from superserial import fs
from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetNotFoundError,
    HeaderError,
)
from superserial.header import HEADER_FILE, LIMITS, Header

__all__ = ["check_target", "read_header", "shard_paths"]


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
        raise DatasetNotFoundError(
            f"expected a superserial dataset at {path}, found {what}{_raw_records_hint(path)}"
        )
    if fs.is_local(path) and os.path.dirname(os.path.realpath(hpath)) != os.path.realpath(path):
        raise HeaderError(f"expected {hpath} inside {path}, found a link pointing out of it")
    with fs.open_file(hpath, "rb") as f:
        # Read one byte past the limit so an oversized header is caught unparsed.
        text = f.read(LIMITS.header_bytes + 1)
    return Header.from_json(text, source=hpath)


_PROBE_FILES = 20


def _is_tfrecord_start(head: bytes) -> bool:
    """True if ``head`` (a file's first 12 bytes) is a TFRecord length with its masked CRC."""
    if len(head) < 12:
        return False
    crc = google_crc32c.value(head[:8])
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return masked == int.from_bytes(head[8:12], "little")


def _raw_records_hint(path: str) -> str:
    """A hint to run ``superserial infer`` when ``path`` is a directory of TFRecord files.

    Probes a few files only (by name, or by their first 12 bytes), so that a
    "not found" error stays cheap; an unreadable file is simply not counted.
    """
    if not fs.is_local(path):
        return ""
    try:
        if not fs.isdir(path):
            return ""
        names = sorted(fs.listdir(path))[:_PROBE_FILES]
        found = []
        for name in names:
            file = fs.join(path, name)
            if fs.isdir(file):
                continue
            if ".tfrec" in name.lower():
                found.append(name)
                continue
            with fs.open_file(file, "rb") as f:
                head = f.read(12)
            if head[:2] == b"\x1f\x8b" or _is_tfrecord_start(head):
                found.append(name)
    except OSError:
        return ""
    if not found:
        return ""
    pattern = fs.join(path, "*")
    return (
        f"; it holds TFRecord files ({found[0]}...) but no header: to make a dataset of "
        f"tf.train.Example records, run `superserial infer '{pattern}' -o NEW_DIR`"
    )


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
    if not fs.isdir(path):
        # Overwriting replaces only datasets: suggesting it here would not help.
        raise DatasetExistsError(
            f"expected no file or directory at {path}, found a file; overwriting replaces only "
            "a dataset directory, so move or delete the file, or choose another path"
        )
    if not overwrite:
        raise DatasetExistsError(
            f"expected no file or directory at {path}, found one; pass {hint} to replace a dataset"
        )
    names = fs.listdir(path)
    if names and HEADER_FILE not in names:
        raise DatasetExistsError(
            f"expected a superserial dataset at {path} to overwrite, found a directory without "
            f"{HEADER_FILE}; refusing to delete it"
        )

"""The record index of a shard: where each record starts, for random access.

Every uncompressed shard ``data-....tfrecord`` gets an index file beside it
(named by :func:`superserial.format.layout.index_name`) and listed in the header with
its size and CRC-32C. All integers little-endian::

    offset        bytes     field
    0             8         magic b"SSINDEX" followed by the version byte 0x01
    8             8         u64 N: the number of records in the shard
    16            4         u32 CRC-32C of the whole shard file (the header's crc32c)
    20            4         u32 0 (reserved)
    24            8*(N+1)   u64 offsets[0..N]: offsets[k] is the byte offset of record k's
                            length field; offsets[N] is the shard's size
    24+8*(N+1)    4         u32 CRC-32C (not masked) of every byte before it

Record ``k`` is the ``offsets[k+1] - offsets[k]`` bytes at ``offsets[k]``: its
12-byte length header, ``offsets[k+1] - offsets[k] - 16`` bytes of data and the
data CRC, checked on every read. An index is untrusted input:
:func:`decode` checks everything above before any offset is used.

This module does not import TensorFlow.
"""

from __future__ import annotations

import shlex
import struct
from collections.abc import Callable, Sequence

import google_crc32c
import numpy as np

from superserial.errors import CorruptDataError
from superserial.format.framing import record_offsets
from superserial.format.header import IndexFile, Shard
from superserial.storage import fs

__all__ = [
    "MAGIC",
    "crc32c",
    "decode",
    "encode",
    "offsets_from_sizes",
    "read_index",
    "rebuild_hint",
    "scan_offsets",
]

MAGIC = b"SSINDEX\x01"
_HEAD = struct.Struct("<8sQII")
_TAIL = struct.Struct("<I")
_FRAME = 16  # the bytes TFRecord framing adds to each record


def crc32c(data: bytes) -> int:
    """The CRC-32C of ``data`` (not masked)."""
    value: int = google_crc32c.value(data)
    return value


def offsets_from_sizes(sizes: Sequence[np.ndarray]) -> np.ndarray:
    """``offsets[0..N]`` of an uncompressed shard whose records have these data sizes.

    Args:
        sizes: The records' data lengths, in order, in any number of arrays.
    """
    n = sum(len(s) for s in sizes)
    offsets = np.zeros(n + 1, dtype=np.uint64)
    if n:
        lengths = np.concatenate([np.asarray(s, dtype=np.uint64) for s in sizes])
        np.cumsum(lengths + np.uint64(_FRAME), out=offsets[1:])
    return offsets


def encode(offsets: np.ndarray, shard_crc32c: str) -> bytes:
    """The index file of a shard with record ``offsets[0..N]`` and file CRC ``shard_crc32c``."""
    body = (
        _HEAD.pack(MAGIC, len(offsets) - 1, int(shard_crc32c, 16), 0)
        + np.asarray(offsets, dtype="<u8").tobytes()
    )
    return body + _TAIL.pack(crc32c(body))


def rebuild_hint(directory: str) -> str:
    """The command that rebuilds the indexes of the dataset at ``directory``, ready to paste."""
    return f"`superserial index {shlex.quote(directory)}` (superserial.build_index)"


def decode(data: bytes, shard: Shard, name: str, directory: str) -> np.ndarray:
    """Checks an index file against its shard; returns its ``offsets[0..N]``.

    Args:
        data: The index file's bytes.
        shard: The shard it indexes, as the header lists it.
        name: The index file's path, for messages.
        directory: The dataset's directory, for the command that rebuilds it.

    Raises:
        CorruptDataError: The index is damaged, truncated, or disagrees with
            the shard (record count, size, CRC-32C, offsets out of order).
    """

    def fail(text: str) -> CorruptDataError:
        return CorruptDataError(
            f"{text} in the index {name} of shard {shard.file}; rebuild it with "
            + rebuild_hint(directory),
            reason=text,
        )

    want = _HEAD.size + 8 * (shard.records + 1) + _TAIL.size
    if len(data) != want:
        raise fail(f"expected {want} bytes for {shard.records} records, got {len(data)}")
    magic, n, shard_crc, reserved = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise fail(f"expected the magic {MAGIC!r}, got {magic!r}")
    (crc,) = _TAIL.unpack_from(data, len(data) - _TAIL.size)
    got_crc = crc32c(data[: -_TAIL.size])
    if crc != got_crc:
        raise fail(f"expected the index CRC-32C {crc:08x}, got {got_crc:08x} (damaged index)")
    if n != shard.records or reserved:
        raise fail(f"expected {shard.records} records and reserved 0, got {n} and {reserved}")
    if f"{shard_crc:08x}" != shard.crc32c:
        raise fail(f"expected the shard CRC-32C {shard.crc32c}, got {shard_crc:08x}")
    offsets = np.frombuffer(data, dtype="<u8", count=n + 1, offset=_HEAD.size)
    if int(offsets[0]) != 0 or int(offsets[-1]) != shard.bytes:
        raise fail(
            f"expected offsets from 0 to the shard size {shard.bytes}, "
            f"got {int(offsets[0])} to {int(offsets[-1])}"
        )
    steps = np.diff(offsets.astype(np.int64))
    if len(steps) and int(steps.min()) < _FRAME:
        k = int(np.argmax(steps < _FRAME))
        raise fail(
            f"expected record {k} to span at least {_FRAME} bytes, got {int(steps[k])} "
            "(offsets out of order)"
        )
    return offsets.astype(np.int64)


def read_index(directory: str, shard: Shard) -> np.ndarray:
    """Reads and checks the index of ``shard`` in ``directory``; returns its offsets.

    Raises:
        ValueError: ``shard`` has no index (callers check ``shard.index`` first).
        CorruptDataError: The index file is missing, of the wrong size or
            CRC-32C, or does not check out (see :func:`decode`).
    """
    if shard.index is None:
        raise ValueError(f"expected a shard with an index, got {shard.file} without one")
    ref: IndexFile = shard.index
    path = fs.join(directory, ref.file)
    if not fs.exists(path):
        raise CorruptDataError(
            f"expected the index {path} of shard {shard.file}, found no file; rebuild it with "
            + rebuild_hint(directory),
            reason=f"expected the index of shard {shard.file}, found no file",
        )
    data = fs.read_bytes(path, limit=ref.bytes + 1)
    if len(data) != ref.bytes:
        raise CorruptDataError(
            f"expected {ref.bytes} bytes in the index {path}, got {len(data)}; rebuild it with "
            + rebuild_hint(directory),
            reason=f"expected {ref.bytes} bytes, got {len(data)} (truncated or replaced index)",
        )
    crc = f"{crc32c(data):08x}"
    if crc != ref.crc32c:
        raise CorruptDataError(
            f"expected the crc32c {ref.crc32c} of the index {path}, got {crc}; rebuild it with "
            + rebuild_hint(directory),
            reason=f"expected crc32c {ref.crc32c}, got {crc} (damaged index)",
        )
    return decode(data, shard, path, directory)


def scan_offsets(
    file: str, shard: Shard, on_chunk: Callable[[int], None] | None = None
) -> np.ndarray:
    """The record offsets of a shard file, found by reading it; checked against ``shard``.

    Reads the whole file for its CRC-32C and walks the record headers.

    Args:
        file: The shard file's path.
        shard: The shard as the header lists it.
        on_chunk: Called with the size of each chunk read for the CRC-32C
            (for progress bars).

    Raises:
        CorruptDataError: The file's size, CRC-32C or record count differs
            from ``shard``, or its framing is damaged.
    """
    size = fs.size(file)
    if size != shard.bytes:
        raise CorruptDataError(f"expected {shard.bytes} bytes in {file}, found {size}")
    crc = fs.file_crc32c(file, on_chunk)
    if crc != shard.crc32c:
        raise CorruptDataError(f"expected crc32c {shard.crc32c} of {file}, got {crc}")
    offsets = record_offsets(file, size)
    if len(offsets) - 1 != shard.records:
        raise CorruptDataError(
            f"expected {shard.records} records in {file} as the header says, got {len(offsets) - 1}"
        )
    return offsets

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

A GZIP or ZLIB shard's index (version byte 0x02) adds its restart points: the
stream is deflated as blocks, each with its own compressor and ending on a
byte boundary, so that a raw inflater (``wbits=-15``) can start at any block::

    offset        bytes     field
    0             8         magic b"SSINDEX" followed by the version byte 0x02
    8             8         u64 N: the number of records in the shard
    16            4         u32 CRC-32C of the whole shard file (the header's crc32c)
    20            4         u32 0 (reserved)
    24            8         u64 M >= 1: the number of restart blocks
    32            8*(N+1)   u64 offsets[0..N] in the UNCOMPRESSED stream; offsets[N] is
                            the stream's size U
    ..            8*(M+1)   u64 packed[0..M]: packed[j] is the file offset of block j's
                            raw deflate data; packed[M] the offset of the stream's
                            trailer (the file's size less 8 for GZIP, 4 for ZLIB)
    ..            8*(M+1)   u64 plain[0..M]: plain[j] is the offset in the stream of
                            block j's first byte; plain[0] = 0, plain[M] = U
    ..            8*M       u64 first[0..M-1]: the first record that starts at or
                            after plain[j] (N if none does)
    ..            4         u32 CRC-32C (not masked) of every byte before it

:func:`decode_restarts` checks it as :func:`decode` does, and also that
``packed`` rises strictly from past the stream's header to its trailer,
``plain`` never falls, no block claims more than deflate can expand its
bytes to (1032:1), and ``first`` is what ``offsets`` and ``plain`` give.

This module does not import TensorFlow.
"""

from __future__ import annotations

import shlex
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

import google_crc32c
import numpy as np

from superserial.errors import CorruptDataError
from superserial.format.framing import record_offsets
from superserial.format.header import IndexFile, Shard
from superserial.storage import fs

__all__ = [
    "MAGIC",
    "MAGIC_RESTARTS",
    "Restarts",
    "crc32c",
    "decode",
    "decode_restarts",
    "encode",
    "encode_restarts",
    "offsets_from_sizes",
    "read_index",
    "read_restarts",
    "rebuild_hint",
    "scan_offsets",
]

MAGIC = b"SSINDEX\x01"
MAGIC_RESTARTS = b"SSINDEX\x02"
_HEAD = struct.Struct("<8sQII")
_BLOCKS = struct.Struct("<Q")
# Bytes around the raw deflate data of a stream: its header (fewest), its trailer.
_STREAM_HEAD = {"GZIP": 10, "ZLIB": 2}
_STREAM_TAIL = {"GZIP": 8, "ZLIB": 4}
# Deflate expands at most 1032:1 (258 bytes from 2 bits), so a block claiming more is a lie.
_EXPANSION = 1032
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


def rebuild_hint(directory: str, compression: str | None = None) -> str:
    """The command that rebuilds the indexes of the dataset at ``directory``, ready to paste.

    A compressed dataset's restart points come with its stream: the command
    rewrites it, compressed alike, with new ones.
    """
    if compression:
        return (
            f"`superserial convert {shlex.quote(directory)} -o NEW_PATH "
            f"--compression {compression}` (a copy with new restart points)"
        )
    return f"`superserial index {shlex.quote(directory)}` (superserial.build_index)"


class Restarts(NamedTuple):
    """The checked index of a compressed shard.

    Attributes:
        offsets: ``offsets[0..N]``, the records' offsets in the uncompressed stream.
        packed: ``packed[0..M]``, the blocks' offsets in the file (then the trailer's).
        plain: ``plain[0..M]``, the blocks' offsets in the stream (then its size).
        first: ``first[0..M-1]``, the first record starting in or after each block.
    """

    offsets: np.ndarray
    packed: np.ndarray
    plain: np.ndarray
    first: np.ndarray

    def block_of(self, offset: np.ndarray | int) -> np.ndarray:
        """The block holding each uncompressed ``offset`` (in ``[0, U)``)."""
        found: np.ndarray = np.searchsorted(self.plain[:-1], offset, side="right") - 1
        return found


def _failing(
    shard: Shard, name: str, directory: str, compression: str | None = None
) -> Callable[[str], CorruptDataError]:
    def fail(text: str) -> CorruptDataError:
        return CorruptDataError(
            f"{text} in the index {name} of shard {shard.file}; rebuild it with "
            + rebuild_hint(directory, compression),
            reason=text,
        )

    return fail


def _check_offsets(
    offsets: np.ndarray, end: int, what: str, fail: Callable[[str], CorruptDataError]
) -> np.ndarray:
    """``offsets`` as int64, checked: from 0 to ``end``, each record at least 16 bytes."""
    if int(offsets[0]) != 0 or int(offsets[-1]) != end:
        raise fail(
            f"expected offsets from 0 to {what} {end}, got {int(offsets[0])} to {int(offsets[-1])}"
        )
    steps = np.diff(offsets.astype(np.int64))
    if len(steps) and int(steps.min()) < _FRAME:
        k = int(np.argmax(steps < _FRAME))
        raise fail(
            f"expected record {k} to span at least {_FRAME} bytes, got {int(steps[k])} "
            "(offsets out of order)"
        )
    return offsets.astype(np.int64)


def _check_magic(data: bytes, magic: bytes, fail: Callable[[str], CorruptDataError]) -> None:
    """Refuses the other version's index first: its size would say less."""
    got = data[: len(magic)]
    other = {MAGIC: "an uncompressed", MAGIC_RESTARTS: "a compressed"}.get(got)
    if other and got != magic:
        raise fail(f"expected the magic {magic!r}, got {got!r} (the index of {other} shard)")


def _check_head(
    data: bytes, shard: Shard, magic: bytes, want: int, fail: Callable[[str], CorruptDataError]
) -> int:
    """Checks an index's size, magic, CRC, record count and shard CRC; returns N."""
    if len(data) != want:
        raise fail(f"expected {want} bytes for {shard.records} records, got {len(data)}")
    got_magic, n, shard_crc, reserved = _HEAD.unpack_from(data, 0)
    if got_magic != magic:
        other = {MAGIC: "an uncompressed", MAGIC_RESTARTS: "a compressed"}.get(got_magic)
        also = f" (the index of {other} shard)" if other else ""
        raise fail(f"expected the magic {magic!r}, got {got_magic!r}{also}")
    (crc,) = _TAIL.unpack_from(data, len(data) - _TAIL.size)
    got_crc = crc32c(data[: -_TAIL.size])
    if crc != got_crc:
        raise fail(f"expected the index CRC-32C {crc:08x}, got {got_crc:08x} (damaged index)")
    if n != shard.records or reserved:
        raise fail(f"expected {shard.records} records and reserved 0, got {n} and {reserved}")
    if f"{shard_crc:08x}" != shard.crc32c:
        raise fail(f"expected the shard CRC-32C {shard.crc32c}, got {shard_crc:08x}")
    return int(n)


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
    fail = _failing(shard, name, directory)
    _check_magic(data, MAGIC, fail)
    want = _HEAD.size + 8 * (shard.records + 1) + _TAIL.size
    n = _check_head(data, shard, MAGIC, want, fail)
    offsets = np.frombuffer(data, dtype="<u8", count=n + 1, offset=_HEAD.size)
    return _check_offsets(offsets, shard.bytes, "the shard size", fail)


def encode_restarts(
    offsets: np.ndarray, packed: np.ndarray, plain: np.ndarray, shard_crc32c: str
) -> bytes:
    """The index file of a compressed shard (see the module's docstring).

    Args:
        offsets: ``offsets[0..N]`` of the records in the uncompressed stream.
        packed: ``packed[0..M]``, the blocks' file offsets, then the trailer's.
        plain: ``plain[0..M]``, the blocks' stream offsets, then the stream's size.
        shard_crc32c: The shard file's CRC-32C (8 hex digits).
    """
    offsets = np.asarray(offsets, dtype="<u8")
    first = np.searchsorted(offsets[:-1], np.asarray(plain[:-1], dtype=np.uint64), side="left")
    body = (
        _HEAD.pack(MAGIC_RESTARTS, len(offsets) - 1, int(shard_crc32c, 16), 0)
        + _BLOCKS.pack(len(packed) - 1)
        + offsets.tobytes()
        + np.asarray(packed, dtype="<u8").tobytes()
        + np.asarray(plain, dtype="<u8").tobytes()
        + first.astype("<u8").tobytes()
    )
    return body + _TAIL.pack(crc32c(body))


def decode_restarts(
    data: bytes, shard: Shard, compression: str, name: str, directory: str
) -> Restarts:
    """Checks a compressed shard's index file against the shard; returns its tables.

    Args:
        data: The index file's bytes.
        shard: The shard it indexes, as the header lists it.
        compression: ``"GZIP"`` or ``"ZLIB"``, the header's.
        name: The index file's path, for messages.
        directory: The dataset's directory, for the command that rebuilds it.

    Raises:
        CorruptDataError: The index is damaged, truncated, or disagrees with
            the shard or with itself (see the module's docstring).
    """
    fail = _failing(shard, name, directory, compression)
    _check_magic(data, MAGIC_RESTARTS, fail)
    n = shard.records
    fixed = _HEAD.size + _BLOCKS.size + 8 * (n + 1) + _TAIL.size
    if len(data) < fixed + 24:
        raise fail(f"expected at least {fixed + 24} bytes for {n} records, got {len(data)}")
    (m,) = _BLOCKS.unpack_from(data, _HEAD.size)
    if not 1 <= m <= max(shard.bytes, 1):
        raise fail(f"expected 1 to {max(shard.bytes, 1)} restart blocks, got {m}")
    _check_head(data, shard, MAGIC_RESTARTS, fixed + 8 * (3 * m + 2), fail)
    at = _HEAD.size + _BLOCKS.size
    tables = []
    for count in (n + 1, m + 1, m + 1, m):
        tables.append(np.frombuffer(data, dtype="<u8", count=count, offset=at).astype(np.int64))
        at += 8 * count
    raw_offsets, packed, plain, first = tables
    if int(raw_offsets[-1]) > _EXPANSION * shard.bytes:
        raise fail(f"expected a stream of at most {_EXPANSION}x the shard's bytes, got more")
    offsets = _check_offsets(raw_offsets, int(raw_offsets[-1]), "the stream size", fail)
    head, tail = _STREAM_HEAD[compression], shard.bytes - _STREAM_TAIL[compression]
    if int(packed[0]) < head or int(packed[-1]) != tail:
        raise fail(
            f"expected block offsets from at least {head} to the {compression} trailer at {tail}, "
            f"got {int(packed[0])} to {int(packed[-1])}"
        )
    packed_steps, plain_steps = np.diff(packed), np.diff(plain)
    if int(packed_steps.min()) < 1:
        j = int(np.argmax(packed_steps < 1))
        raise fail(f"expected block offsets rising, got block {j + 1} at or before block {j}")
    if int(plain[0]) != 0 or int(plain[-1]) != int(offsets[-1]):
        raise fail(
            f"expected blocks from 0 to the stream size {int(offsets[-1])}, "
            f"got {int(plain[0])} to {int(plain[-1])}"
        )
    if int(plain_steps.min()) < 0 or (plain_steps > _EXPANSION * packed_steps).any():
        j = int(np.argmax((plain_steps < 0) | (plain_steps > _EXPANSION * packed_steps)))
        raise fail(
            f"expected block {j} to inflate to 0 to {_EXPANSION * int(packed_steps[j])} bytes, "
            f"got {int(plain_steps[j])}"
        )
    want_first = np.searchsorted(offsets[:-1], plain[:-1], side="left")
    if not np.array_equal(first, want_first):
        j = int(np.argmax(first != want_first))
        raise fail(f"expected record {int(want_first[j])} first in block {j}, got {int(first[j])}")
    return Restarts(offsets, packed, plain, first)


def _read_file(directory: str, shard: Shard, compression: str | None = None) -> tuple[str, bytes]:
    """The path and bytes of ``shard``'s index, checked against the header's size and CRC.

    Raises:
        ValueError: ``shard`` has no index (callers check ``shard.index`` first).
        CorruptDataError: The index file is missing, or of the wrong size or CRC-32C.
    """
    if shard.index is None:
        raise ValueError(f"expected a shard with an index, got {shard.file} without one")
    ref: IndexFile = shard.index
    path = fs.join(directory, ref.file)
    try:
        # One request, not an existence check before it: a round trip less per index
        # on an object store, where a reader's first batch waits for its indexes.
        data = fs.read_bytes(path, limit=ref.bytes + 1)
    except FileNotFoundError as e:
        raise CorruptDataError(
            f"expected the index {path} of shard {shard.file}, found no file; rebuild it with "
            + rebuild_hint(directory, compression),
            reason=f"expected the index of shard {shard.file}, found no file",
        ) from e
    if len(data) != ref.bytes:
        raise CorruptDataError(
            f"expected {ref.bytes} bytes in the index {path}, got {len(data)}; rebuild it with "
            + rebuild_hint(directory, compression),
            reason=f"expected {ref.bytes} bytes, got {len(data)} (truncated or replaced index)",
        )
    crc = f"{crc32c(data):08x}"
    if crc != ref.crc32c:
        raise CorruptDataError(
            f"expected the crc32c {ref.crc32c} of the index {path}, got {crc}; rebuild it with "
            + rebuild_hint(directory, compression),
            reason=f"expected crc32c {ref.crc32c}, got {crc} (damaged index)",
        )
    return path, data


def read_index(directory: str, shard: Shard) -> np.ndarray:
    """Reads and checks the index of uncompressed ``shard`` in ``directory``; returns its offsets.

    Raises:
        ValueError: ``shard`` has no index (callers check ``shard.index`` first).
        CorruptDataError: The index file is missing, of the wrong size or
            CRC-32C, or does not check out (see :func:`decode`).
    """
    path, data = _read_file(directory, shard)
    return decode(data, shard, path, directory)


def read_restarts(directory: str, shard: Shard, compression: str) -> Restarts:
    """Reads and checks the index of compressed ``shard`` in ``directory``.

    Raises:
        ValueError: ``shard`` has no index (callers check ``shard.index`` first).
        CorruptDataError: The index file is missing, of the wrong size or
            CRC-32C, or does not check out (see :func:`decode_restarts`).
    """
    path, data = _read_file(directory, shard, compression)
    return decode_restarts(data, shard, compression, path, directory)


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

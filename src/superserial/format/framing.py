"""TFRecord framing, read and written without TensorFlow.

A TFRecord file is a sequence of records, each::

    u64 LE length | u32 masked CRC-32C of those 8 bytes | data | u32 masked CRC-32C of data

optionally inside one GZIP or ZLIB stream. This module reads that framing:
:func:`read_records` yields the records of a file, checking both CRCs and
naming the file, the record and its byte offset in any
:class:`~superserial.errors.CorruptDataError`; :func:`record_offset` and
:func:`count_records` walk the record headers of an uncompressed file without
reading the data. Files are reached through :mod:`superserial.storage.fs` only.

On the write side, :func:`frame_records` frames a whole batch of records in
one buffer, and :func:`range_crc32cs` / :func:`buffer_crc32c` compute
CRC-32Cs over parts of a numpy buffer without copying them.
"""

from __future__ import annotations

import ctypes
import glob
import gzip
import io
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import google_crc32c
import numpy as np

from superserial.errors import CorruptDataError
from superserial.storage import fs

__all__ = [
    "COMPRESSIONS",
    "NATIVE_RANGES",
    "buffer_crc32c",
    "count_records",
    "frame_batches",
    "frame_records",
    "length_crcs",
    "masked_crc",
    "masked_crc_array",
    "masked_crcs",
    "range_crc32cs",
    "range_records",
    "read_frames",
    "read_records",
    "record_offset",
    "record_offsets",
    "shard_records",
]

COMPRESSIONS = (None, "GZIP", "ZLIB")

_MASK_DELTA = 0xA282EAD8
_HEAD = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_CHUNK = 16 << 20
_BUFFER = 1 << 20
# Walking record headers reads 12 bytes per record: a small buffer keeps short
# records cheap without reading long ones.
_SCAN_BUFFER = 1 << 16


def masked_crc(data: bytes) -> int:
    """The masked CRC-32C of ``data``, as TFRecord framing stores it."""
    crc: int = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crcs(chunks: list[bytes]) -> np.ndarray:
    """:func:`masked_crc` of each of ``chunks``, as uint32 (the masking done once, in numpy)."""
    crcs = np.fromiter(map(google_crc32c.value, chunks), dtype=np.uint64, count=len(chunks))
    return masked_crc_array(crcs).astype(np.uint32)


def _native_extend() -> Any:
    """google-crc32c's own C ``crc32c_extend``, called on buffers by address; None if not found.

    Its Python binding takes only ``bytes`` (``y#``), so a CRC of a slice of a
    numpy buffer would cost a copy per call; the library it wraps takes a
    pointer, and ctypes releases the GIL around the call.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(google_crc32c.__file__)))
    patterns = ("google_crc32c.libs/libcrc32c*", "google_crc32c/.dylibs/libcrc32c*")
    for path in sorted(p for pat in patterns for p in glob.glob(os.path.join(here, pat))):
        try:
            fn = ctypes.CDLL(path).crc32c_extend
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint32
        fn.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
        if fn(0, b"123456789", 9) == 0xE3069283:  # the CRC-32C check value
            return fn
    return None


_EXTEND = _native_extend()
_EXTEND_ADDRESS = ctypes.cast(_EXTEND, ctypes.c_void_p).value if _EXTEND is not None else None
_RANGES: Any
try:  # built by setuptools where a C compiler was found (pyproject.toml)
    import superserial.format._crc_ranges as _RANGES
except ImportError:
    _RANGES = None
# Whether range_crc32cs runs in one C call (else a call per range: slicing ``bytes``
# and masked_crcs is then cheaper, about 0.4 us a record against 1).
NATIVE_RANGES = _EXTEND is not None and _RANGES is not None


def buffer_crc32c(buf: np.ndarray, start: int = 0, stop: int | None = None, crc: int = 0) -> int:
    """CRC-32C of ``buf[start:stop]`` (a contiguous uint8 array), extending ``crc``; no copy."""
    stop = len(buf) if stop is None else stop
    if _EXTEND is not None:
        return int(_EXTEND(crc, buf.ctypes.data + start, stop - start))
    return int(google_crc32c.extend(crc, buf[start:stop].tobytes()))


def range_crc32cs(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC-32C of each ``buf[start : start + length]`` (a contiguous uint8 array), as uint64.

    In one C loop with the GIL released where the ``_crc_ranges`` extension was built
    (a call per range from Python otherwise, about 0.4-1 us each).

    Raises:
        ValueError: A range is not within ``buf``.
    """
    if NATIVE_RANGES:
        out = np.empty(len(starts), dtype=np.uint32)
        _RANGES.crc32c_ranges(
            _EXTEND_ADDRESS,
            buf,
            np.ascontiguousarray(starts, dtype=np.int64),
            np.ascontiguousarray(lengths, dtype=np.int64),
            out,
        )
        return out.astype(np.uint64)
    if len(starts) and (
        int(np.min(starts)) < 0
        or int(np.min(lengths)) < 0
        or int(np.max(starts + lengths)) > len(buf)
    ):
        raise ValueError(f"expected ranges within the {len(buf)} bytes, got one outside")
    if _EXTEND is None:
        data = buf.tobytes()
        crcs = (
            google_crc32c.value(data[s : s + n])
            for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)
        )
    else:
        base, extend = buf.ctypes.data, _EXTEND
        crcs = (
            extend(0, base + s, n) for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)
        )
    return np.fromiter(crcs, dtype=np.uint64, count=len(starts))


def masked_crc_array(crcs: np.ndarray) -> np.ndarray:
    """:func:`masked_crc`'s masking of an array of CRC-32C values, as little-endian uint32."""
    crcs = crcs.astype(np.uint64)
    rotated = ((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) & np.uint64(0xFFFFFFFF)
    return ((rotated + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype("<u4")


def length_crcs(sizes: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each record's 8 length bytes (computed once per distinct length)."""
    unique, inverse = np.unique(sizes, return_inverse=True)
    heads = unique.astype("<u8")
    crcs = np.fromiter(
        (google_crc32c.value(heads[i : i + 1].tobytes()) for i in range(len(heads))),
        dtype=np.uint64,
        count=len(heads),
    )
    return masked_crc_array(crcs)[inverse.reshape(-1)]


def frame_records(records: Sequence[bytes] | np.ndarray, sizes: np.ndarray) -> bytes:
    """The TFRecord framing of ``records`` (of ``sizes`` bytes), as one buffer.

    The bytes :class:`tf.io.TFRecordWriter` writes for them, built with one
    join instead of one write call per record.
    """
    n = len(records)
    heads = np.empty(n, dtype=[("length", "<u8"), ("crc", "<u4")])
    heads["length"] = sizes
    heads["crc"] = length_crcs(np.asarray(sizes))
    pieces: list[Any] = [None] * (3 * n)
    # A void array's tolist() gives bytes objects, with no per-record Python bytecode.
    pieces[0::3] = heads.view("V12").tolist()
    pieces[1::3] = records
    pieces[2::3] = masked_crcs(list(records)).astype("<u4").view("V4").tolist()
    return b"".join(pieces)


def frame_batches(
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches of serialized records in their TFRecord framing, for the write loop.

    Every writer whose records come unframed (the graph encoder, ``infer``'s
    copied records, Beam's encoded batches) is framed here, a batch at once.

    Args:
        batches: (records as a numpy array of ``bytes``, their sizes) per batch.

    Yields:
        (the framed records as one uint8 buffer, their data sizes as int64) per
        non-empty batch.
    """
    for records, sizes in batches:
        if len(records):
            sizes = np.asarray(sizes, np.int64)
            yield np.frombuffer(frame_records(records, sizes), np.uint8), sizes


def _check_compression(compression: str | None) -> str | None:
    compression = compression.upper() if compression else None
    if compression not in COMPRESSIONS:
        raise ValueError(f"expected compression None, 'GZIP' or 'ZLIB', got {compression!r}")
    return compression


class _ZlibReader(io.RawIOBase):
    """A raw stream inflating one zlib stream (TensorFlow's ``ZLIB`` option).

    With ``wbits=-15`` it inflates raw deflate data from a restart block of a
    GZIP or ZLIB shard to the stream's final block; the trailer after it (the
    whole stream's CRC and size, which a start mid-stream cannot check) is left.
    """

    def __init__(self, raw: BinaryIO, wbits: int = zlib.MAX_WBITS) -> None:
        self._raw = raw
        self._z = zlib.decompressobj(wbits)
        self._trailer_ok = wbits < 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = len(b)
        while True:
            if self._z.unconsumed_tail:
                out = self._z.decompress(self._z.unconsumed_tail, n)
            elif self._z.eof:
                if not self._trailer_ok and (self._z.unused_data or self._raw.read(1)):
                    raise zlib.error("data after the end of the zlib stream")
                return 0
            else:
                chunk = self._raw.read(1 << 16)
                if not chunk:
                    raise EOFError("the zlib stream ended before its end marker")
                out = self._z.decompress(chunk, n)
            if out:
                b[: len(out)] = out
                return len(out)


def _decompressed(raw: BinaryIO, compression: str | None) -> BinaryIO:
    if not compression:
        return raw
    if compression == "GZIP":
        # GzipFile is a binary stream, though typeshed does not call it a BinaryIO.
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if compression == "ZLIB":
        return io.BufferedReader(_ZlibReader(raw), _BUFFER)
    raise ValueError(f"expected compression None, 'GZIP' or 'ZLIB', got {compression!r}")


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    """Reads ``n`` bytes, or fewer at the end; allocates no more than the stream holds."""
    data = stream.read(min(n, _CHUNK))
    if len(data) == n or not data:
        return data
    parts, left = [data], n - len(data)
    while left:
        part = stream.read(min(left, _CHUNK))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_frames(
    stream: BinaryIO, name: str, first: int = 0, first_offset: int = 0
) -> Iterator[bytes]:
    """Yields the records of a TFRecord stream, checking lengths and both CRCs.

    Reads in chunks of ``_BUFFER`` bytes and cuts records out of them, so
    that a record costs a few slices, not several read calls.

    Args:
        stream: The (decompressed) stream, at the first record to read.
        name: The file name, for messages.
        first: The index of the stream's first record in its file.
        first_offset: The byte offset of that record in its file.

    Raises:
        CorruptDataError: A record is truncated, a CRC does not match, or the
            compressed stream is damaged; the message names the file, the
            record and its byte offset.
    """
    # offset: the current record's first byte in the file
    buf, pos, index, offset = b"", 0, first, first_offset
    read = stream.read

    def fail(text: str, in_data: bool = False) -> CorruptDataError:
        # The byte offset TensorFlow's "corrupted record at N" gives: of the
        # record's 12-byte header, or of its data for a fault there.
        at = offset + 12 if in_data else offset
        return CorruptDataError(
            f"{text} at {name} record {index} (byte offset {at})",
            reason=f"{text} at byte offset {at}",
        )

    try:
        while True:
            if len(buf) - pos < 12:
                buf, pos = buf[pos:] + read(_BUFFER), 0
                if not buf:
                    return
                if len(buf) < 12:
                    raise fail(
                        f"expected a 12-byte record header, got {len(buf)} bytes (truncated file)"
                    )
            length, length_crc = _HEAD.unpack_from(buf, pos)
            if masked_crc(buf[pos : pos + 8]) != length_crc:
                raise fail(
                    f"expected the length CRC {length_crc:08x}, got another (corrupted length)"
                )
            end = pos + 12 + length
            if len(buf) < end + 4:
                rest = buf[pos:]
                buf, pos = rest + _read_exact(stream, max(16 + length - len(rest), _BUFFER)), 0
                end = 12 + length
                if len(buf) < end + 4:
                    got = max(len(buf) - 12, 0)
                    what = f"{length} record bytes and a 4-byte CRC"
                    raise fail(f"expected {what}, got {got} bytes (truncated file)", True)
            data = buf[pos + 12 : end]
            (data_crc,) = _CRC.unpack_from(buf, end)
            if masked_crc(data) != data_crc:
                raise fail(
                    f"expected the data CRC {data_crc:08x}, got another (corrupted record)", True
                )
            pos = end + 4
            yield data
            index += 1
            offset += 16 + length
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise fail(f"expected a well-formed compressed stream, got {e}") from e


def read_records(
    file: str | os.PathLike[str] | BinaryIO,
    compression: str | None = None,
    *,
    buffering: int = _BUFFER,
) -> Iterator[bytes]:
    """Yields the records of one TFRecord file, checking its framing.

    Args:
        file: A path or URL (anything :mod:`superserial.storage.fs` reaches), or a
            binary file object.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``, as written.
        buffering: The read size of a path (on object stores, the bytes one
            request fetches).

    Yields:
        Each record's bytes, in order.

    Raises:
        CorruptDataError: A record is truncated, a length or data CRC does not
            match, or the compressed stream is damaged; the message names the
            file and the record index.
    """
    compression = _check_compression(compression)
    if hasattr(file, "read"):
        name = getattr(file, "name", "<stream>")
        # ``file`` has read(): a binary stream whatever its declared type.
        yield from read_frames(_decompressed(file, compression), name)  # type: ignore[arg-type]
        return
    name = os.fspath(file)
    with fs.open_file(name, "rb", buffering=buffering) as raw:
        yield from read_frames(_decompressed(raw, compression), name)


def shard_records(
    file: str, compression: str | None, expected: int, *, buffering: int = _BUFFER
) -> Iterator[tuple[bytes, str]]:
    """The records of one shard with their location; exactly ``expected`` of them.

    ``buffering`` is as in :func:`read_records`.

    Raises:
        CorruptDataError: The framing is damaged, or the shard holds more or
            fewer records than ``expected``.
    """
    n = 0
    for record in read_records(file, compression, buffering=buffering):
        if n == expected:
            raise CorruptDataError(f"expected {expected} records, got more at {file} record {n}")
        yield record, f"{file} record {n}"
        n += 1
    if n != expected:
        raise CorruptDataError(f"expected {expected} records, got {n} (truncated shard) at {file}")


def range_records(
    file: str, start: int, count: int, total: int | None
) -> Iterator[tuple[bytes, str]]:
    """Records ``start .. start+count-1`` of an uncompressed shard of ``total`` records.

    The record headers before ``start`` are walked, not read (see
    :func:`record_offset`). The range that ends the shard also checks that no
    record follows.

    Raises:
        CorruptDataError: The framing is damaged, or the shard ends early (or
            goes on past ``total``).
    """
    offset = record_offset(file, start)
    with fs.open_file(file, "rb", buffering=_BUFFER) as raw:
        raw.seek(offset)
        yield from _take(read_frames(raw, file, start, offset), file, start, count, total)


def inflated_range_records(
    file: str, start: int, count: int, total: int, *, packed: int, skip: int, offset: int
) -> Iterator[tuple[bytes, str]]:
    """Records ``start .. start+count-1`` of a compressed shard, inflated from a restart block.

    Args:
        file: The GZIP or ZLIB shard (written with restart blocks).
        start: The first record read; ``count`` are read, of ``total`` in the shard.
        packed: The file offset of the restart block holding record ``start``.
        skip: How many inflated bytes of that block come before the record.
        offset: The record's offset in the uncompressed stream (for messages).

    Raises:
        CorruptDataError: The block does not inflate, the framing is damaged, or
            the shard ends early (or goes on past ``total``).
    """
    fail = f"expected well-formed deflate data from offset {packed} of {file} (record {start})"
    with fs.open_file(file, "rb", buffering=_BUFFER) as raw:
        raw.seek(packed)
        stream = io.BufferedReader(_ZlibReader(raw, -zlib.MAX_WBITS), _BUFFER)
        try:
            if len(_read_exact(stream, skip)) != skip:
                raise CorruptDataError(f"{fail}, got a stream that ends before the record")
            yield from _take(read_frames(stream, file, start, offset), file, start, count, total)
        except (EOFError, zlib.error) as e:
            raise CorruptDataError(f"{fail}, got {e}") from e


def _take(
    frames: Iterator[bytes], file: str, start: int, count: int, total: int | None
) -> Iterator[tuple[bytes, str]]:
    """``count`` records of ``frames`` (from record ``start``), with their location."""
    for n in range(start, start + count):
        record = next(frames, None)
        if record is None:
            raise CorruptDataError(
                f"expected {total or start + count} records, got {n} (truncated shard) at {file}"
            )
        yield record, f"{file} record {n}"
    # Only the range that ends the shard reads on: the others stop at their last record.
    if start + count == total and next(frames, None) is not None:
        raise CorruptDataError(f"expected {total} records, got more at {file} record {total}")


def _walk(
    f: BinaryIO, name: str, count: int | None, size: int | None, starts: list[int] | None = None
) -> tuple[int, int]:
    """Walks the record headers of an uncompressed file from its start.

    Reads each record's 12-byte header (length and its CRC, checked, so that
    a damaged length cannot send the walk astray) and seeks past the data and
    its CRC: about 12 bytes read per record.

    Args:
        f: The file, opened for reading.
        name: Its name, for messages.
        count: How many records to walk; None: all of them, to ``size``.
        size: The file's size, to check that no record runs past the end;
            None: not checked (a reader of the records checks it).
        starts: If given, each walked record's offset is appended to it.

    Returns:
        (records walked, byte offset of the next record).
    """
    index = offset = 0
    while (index < count) if count is not None else (offset < (size or 0)):
        f.seek(offset)
        head = f.read(12)
        where = f"{name} record {index} (byte offset {offset})"
        if len(head) < 12:
            raise CorruptDataError(
                f"expected a 12-byte record header, got {len(head)} bytes (truncated file) "
                f"at {where}"
            )
        length, length_crc = _HEAD.unpack(head)
        if starts is not None:
            starts.append(offset)
        got = masked_crc(head[:8])
        if got != length_crc:
            raise CorruptDataError(
                f"expected the length CRC-32C {length_crc:08x}, got {got:08x} (corrupted length) "
                f"at {where}"
            )
        offset += 16 + length
        if size is not None and offset > size:
            raise CorruptDataError(
                f"expected {length + 4} more bytes of record data and CRC, the file ends first "
                f"(truncated file) at {where}"
            )
        index += 1
    return index, offset


def record_offset(file: str, index: int) -> int:
    """The byte offset of record ``index`` of an uncompressed TFRecord file.

    Raises:
        CorruptDataError: A record header before it is damaged or truncated.
    """
    with fs.open_file(file, "rb", buffering=_SCAN_BUFFER) as f:
        return _walk(f, file, index, None)[1]


def record_offsets(file: str, size: int) -> np.ndarray:
    """``offsets[0..N]`` of an uncompressed TFRecord file of ``size`` bytes.

    ``offsets[k]`` is where record ``k`` starts, ``offsets[N]`` is ``size``.

    Raises:
        CorruptDataError: A length header is damaged, or the file ends inside a record.
    """
    starts: list[int] = []
    with fs.open_file(file, "rb", buffering=_SCAN_BUFFER) as f:
        _walk(f, file, None, size, starts)
    starts.append(size)
    return np.array(starts, dtype=np.int64)


def count_records(file: str) -> int:
    """Counts the records of an uncompressed TFRecord file without reading their data.

    Raises:
        CorruptDataError: A length header is damaged, or the file ends inside a
            record. The message names the file, the record and its offset.
    """
    size = fs.size(file)
    with fs.open_file(file, "rb", buffering=_SCAN_BUFFER) as f:
        return _walk(f, file, None, size)[0]

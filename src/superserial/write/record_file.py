"""TFRecord files written without TensorFlow, through :mod:`superserial.storage.fs`.

:class:`RecordFileWriter` writes the bytes ``tf.io.TFRecordWriter`` writes
(the framing of :mod:`superserial.format.framing`, optionally in one GZIP or ZLIB
stream) to any file :mod:`superserial.storage.fs` opens: local files, TensorFlow's
filesystems, and those TensorFlow does not reach (``s3://`` in TF 2.21: an
s3fs object, a multipart upload). It takes whole batches of framed records
(:meth:`RecordFileWriter.write_framed`, one ``write`` call per batch, not per
record) and counts the bytes and the CRC-32C of what it writes, so that a
closed shard is never read back.

Compression is parallel, as ``pigz`` does it: the uncompressed stream is cut
into chunks of ``_CHUNK`` bytes, each deflated on its own by a pool of
threads (zlib releases the GIL). Within a chunk, every ``_RESTART`` bytes
(a restart block) get a compressor of their own and end with a sync flush,
the stream's last one with the final block, so that a raw inflater can start
at any block: :attr:`RecordFileWriter.restarts` lists where each starts, in
the file and in the stream, for the shard's index (random access); the chunks' outputs, in order, with the GZIP (or ZLIB)
header and a trailer of the whole stream's CRC-32 (Adler-32) and size, are
one ordinary stream that any inflater (TensorFlow's, ``gzip``, ``zlib``)
reads. The chunk size is fixed, so the same records give the same bytes.
The deflater is zlib at level 6, as TensorFlow's writer uses, so files are
the size they were (within the few hundred bytes a chunk boundary costs).
ISA-L (``isal``) deflates 2-5 times faster here, but at its best level its
files of repetitive data were up to 40% larger (sklearn's digits, GZIP:
131 KB against 93 KB); a user who asks for GZIP asks for small files.

This module does not import TensorFlow.
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import os
import struct
import threading
import zlib
from typing import Any

import numpy as np

from superserial.format.framing import buffer_crc32c
from superserial.storage import fs

__all__ = ["RecordFileWriter"]

# Uncompressed bytes per independently deflated chunk: large enough that
# losing the window across chunks costs nothing measurable in size.
_CHUNK = 4 << 20
# Uncompressed bytes per restart block: each deflated afresh, so that a random
# read inflates one block, not the shard. Measured (benchmarks/restart_spacing.py,
# sklearn digits tiled to 60k, GZIP, a shared 2-core machine at load 6-9, rough):
# against TF's GZIP writer 32 KiB +10.4%, 64 KiB +5.2%, 128 KiB +2.3%, 256 KiB
# +0.8%, 4 MiB -0.3%; warm ds[i] median without the block LRU 71, 154, 190, 238
# and 11,586 us. 128 KiB is the largest spacing under 300 us and the smallest
# within 3% of TF's size. Must divide _CHUNK for every block to be full-size.
_RESTART = 128 << 10
_LEVEL = 6  # zlib's default, as TensorFlow's writer uses
# The stream's framing around the raw deflate chunks. GZIP (RFC 1952): magic,
# deflate, no flags, no mtime, no extra flags, OS unknown; ZLIB (RFC 1950):
# deflate with a 32 KiB window, default level, and its check bits.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_ZLIB_HEADER = b"\x78\x9c"

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> concurrent.futures.ThreadPoolExecutor:
    """The process's compression threads, one per CPU, made on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=os.cpu_count() or 1, thread_name_prefix="superserial-deflate"
            )
        return _pool


def _deflate(data: bytes, last: bool, restart: int) -> tuple[bytes, list[int], list[int]]:
    """Raw deflate of one chunk, as blocks of ``restart`` bytes each deflated afresh.

    Each block has its own compressor (no dictionary crosses a block
    boundary) and ends on a byte boundary (a sync flush), the stream's last
    one with the final block: a raw inflater can start at any block.

    Returns:
        The compressed bytes, and each block's compressed and uncompressed sizes.
    """
    pieces: list[bytes] = []
    sizes: list[int] = []
    plain: list[int] = []
    view = memoryview(data)
    starts = range(0, len(view), restart) if len(view) else range(1)
    for s in starts:
        block = view[s : s + restart]
        z = zlib.compressobj(_LEVEL, zlib.DEFLATED, -15)
        end = last and s == starts[-1]
        piece = z.compress(block) + z.flush(zlib.Z_FINISH if end else zlib.Z_SYNC_FLUSH)
        pieces.append(piece)
        sizes.append(len(piece))
        plain.append(len(block))
    return b"".join(pieces), sizes, plain


class _ParallelDeflate:
    """One GZIP or ZLIB stream, its chunks deflated by :func:`_threads` in order."""

    def __init__(self, compression: str) -> None:
        self._gzip = compression == "GZIP"
        self._check = 0 if self._gzip else 1  # CRC-32 or Adler-32 of the uncompressed bytes
        self._size = 0
        self._buffer = bytearray()
        self._inflight: collections.deque[
            concurrent.futures.Future[tuple[bytes, list[int], list[int]]]
        ] = collections.deque()
        self._started = False
        self._header = len(_GZIP_HEADER if self._gzip else _ZLIB_HEADER)
        self._at = self._header  # the compressed offset of the next block
        self._plain_at = 0  # its uncompressed offset
        self.restarts: list[tuple[int, int]] = []  # (compressed, uncompressed) block offsets

    def _submit(self, chunk: bytes, last: bool) -> None:
        self._inflight.append(_threads().submit(_deflate, chunk, last, _RESTART))

    def _take(self) -> bytes:
        """The oldest chunk's compressed bytes, its blocks' offsets recorded."""
        data, sizes, plain = self._inflight.popleft().result()
        for c, u in zip(sizes, plain, strict=True):
            self.restarts.append((self._at, self._plain_at))
            self._at += c
            self._plain_at += u
        return data

    @property
    def plain_size(self) -> int:
        """The uncompressed bytes taken so far."""
        return self._size

    @property
    def end(self) -> int:
        """The compressed offset where the blocks end (the trailer's), once flushed."""
        return self._at

    def compress(self, data: Any) -> list[bytes]:
        """Takes uncompressed bytes; returns the compressed pieces now ready, in order."""
        view = memoryview(data).cast("B")
        self._size += len(view)
        self._check = (zlib.crc32 if self._gzip else zlib.adler32)(view, self._check)
        self._buffer += view
        out = [] if self._started else [_GZIP_HEADER if self._gzip else _ZLIB_HEADER]
        self._started = True
        while len(self._buffer) >= _CHUNK:
            self._submit(bytes(self._buffer[:_CHUNK]), False)
            del self._buffer[:_CHUNK]
        # Bounded: a few chunks in flight per thread, so memory stays a few chunks.
        limit = 2 * (os.cpu_count() or 1)
        while self._inflight and (len(self._inflight) > limit or self._inflight[0].done()):
            out.append(self._take())
        return out

    def flush(self) -> list[bytes]:
        """Ends the stream: the remaining pieces, then the trailer."""
        out = self.compress(b"")
        self._submit(bytes(self._buffer), True)
        self._buffer = bytearray()
        while self._inflight:
            out.append(self._take())
        if self._gzip:
            out.append(struct.pack("<II", self._check, self._size & 0xFFFFFFFF))
        else:
            out.append(struct.pack(">I", self._check))
        return out

    def cancel(self) -> None:
        """Drops the chunks not yet deflated (an aborted file)."""
        for f in self._inflight:
            f.cancel()
        self._inflight.clear()


def _naming(e: OSError, path: str) -> OSError:
    """``e`` naming the file (Python's own write errors, e.g. a full disk, do not)."""
    if e.filename is not None or e.errno is None:
        return e
    return type(e)(e.errno, e.strerror, path)


class RecordFileWriter:
    """Writes one TFRecord file, as ``tf.io.TFRecordWriter`` would.

    Args:
        path: The file to create (anything :mod:`superserial.storage.fs` reaches).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.

    Attributes:
        bytes: Bytes written to the file so far (after compression).
        crc32c: CRC-32C of those bytes, as an int.
    """

    def __init__(self, path: str, compression: str | None = None) -> None:
        if compression not in (None, "", "GZIP", "ZLIB"):
            raise ValueError(f"expected compression None, 'GZIP' or 'ZLIB', got {compression!r}")
        self.path = path
        self._zip = _ParallelDeflate(compression) if compression else None
        self._file: Any = fs.open_file(path, "wb")
        # Python's files and fsspec's take any buffer; tf.io.gfile's want bytes.
        self._buffers_ok = isinstance(self._file, io.IOBase)
        self.bytes = 0
        self.crc32c = 0

    @property
    def restarts(self) -> tuple[np.ndarray, np.ndarray] | None:
        """A closed compressed file's restart points; None uncompressed.

        Returns:
            ``(compressed, plain)``, int64 arrays of ``M + 1`` offsets: block
            ``j``'s raw deflate data starts at byte ``compressed[j]`` of the
            file and inflates to the bytes from ``plain[j]`` of the stream;
            ``compressed[M]`` is where the trailer starts, ``plain[M]`` the
            stream's size.
        """
        if self._zip is None:
            return None
        points = [*self._zip.restarts, (self._zip.end, self._zip.plain_size)]
        table = np.asarray(points, dtype=np.int64).reshape(-1, 2)
        return table[:, 0].copy(), table[:, 1].copy()

    def write_framed(self, framed: np.ndarray | bytes) -> None:
        """Appends records already framed (:func:`superserial.format.framing.frame_records`), in one write."""
        if self._zip is None:
            self._put(framed)
        else:
            for piece in self._zip.compress(framed):
                self._put(piece)

    def _put(self, data: np.ndarray | bytes) -> None:
        if not len(data):
            return
        array = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
        try:
            self._file.write(
                data if self._buffers_ok or isinstance(data, bytes) else data.tobytes()
            )
        except OSError as e:
            raise _naming(e, self.path) from e
        self.bytes += len(array)
        self.crc32c = buffer_crc32c(array, crc=self.crc32c)

    def close(self) -> None:
        """Ends the compressed stream, if any, and closes the file (an upload completes here)."""
        if self._file is None:
            return
        try:
            if self._zip is not None:
                for piece in self._zip.flush():
                    self._put(piece)
            try:
                self._file.close()
            except OSError as e:
                raise _naming(e, self.path) from e
        finally:
            self._file = None

"""TFRecord files written without TensorFlow, through :mod:`superserial.fs`.

:class:`RecordFileWriter` writes the bytes ``tf.io.TFRecordWriter`` writes
(the framing of :mod:`superserial.framing`, optionally in one GZIP or ZLIB
stream) to any file :mod:`superserial.fs` opens: local files, TensorFlow's
filesystems, and those TensorFlow does not reach (``s3://`` in TF 2.21: an
s3fs object, a multipart upload). It takes whole batches of framed records
(:meth:`RecordFileWriter.write_framed`, one ``write`` call per batch, not per
record) and counts the bytes and the CRC-32C of what it writes, so that a
closed shard is never read back.

This module does not import TensorFlow.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np

from superserial import fs
from superserial.framing import buffer_crc32c, masked_crc

__all__ = ["RecordFileWriter"]

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# Framed records are gathered up to this size before one write: one call per
# megabyte, not per record, and the object store's client uploads in parts anyway.
_FLUSH = 1 << 20
# zlib window bits: 15 is a zlib stream, 31 a gzip one (as TensorFlow writes them).
_WBITS = {"ZLIB": 15, "GZIP": 31}


def _naming(e: OSError, path: str) -> OSError:
    """``e`` naming the file (Python's own write errors, e.g. a full disk, do not)."""
    if e.filename is not None or e.errno is None:
        return e
    return type(e)(e.errno, e.strerror, path)


class RecordFileWriter:
    """Writes one TFRecord file, as ``tf.io.TFRecordWriter`` would.

    Args:
        path: The file to create (anything :mod:`superserial.fs` reaches).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.

    Attributes:
        bytes: Bytes written to the file so far (after compression).
        crc32c: CRC-32C of those bytes, as an int.
    """

    def __init__(self, path: str, compression: str | None = None) -> None:
        if compression not in (None, "", "GZIP", "ZLIB"):
            raise ValueError(f"expected compression None, 'GZIP' or 'ZLIB', got {compression!r}")
        self.path = path
        self._zip: Any = zlib.compressobj(wbits=_WBITS[compression]) if compression else None
        self._file: Any = fs.open_file(path, "wb")
        # Python's files and fsspec's take any buffer; tf.io.gfile's want bytes.
        self._buffers_ok = isinstance(self._file, io.IOBase)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.bytes = 0
        self.crc32c = 0

    def write(self, record: bytes) -> None:
        """Appends one record (its framing: length, CRCs)."""
        head = _LENGTH.pack(len(record))
        self._pending += (head, _CRC.pack(masked_crc(head)), record, _CRC.pack(masked_crc(record)))
        self._pending_bytes += 16 + len(record)
        if self._pending_bytes >= _FLUSH:
            self._flush()

    def write_framed(self, framed: np.ndarray | bytes) -> None:
        """Appends records already framed (:func:`superserial.framing.frame_records`), in one write."""
        self._flush()
        self._put(self._zip.compress(framed) if self._zip is not None else framed)

    def _put(self, data: np.ndarray | bytes) -> None:
        if not len(data):
            return
        array = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
        try:
            self._file.write(data if self._buffers_ok or isinstance(data, bytes) else data.tobytes())
        except OSError as e:
            raise _naming(e, self.path) from e
        self.bytes += len(array)
        self.crc32c = buffer_crc32c(array, crc=self.crc32c)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        self._put(self._zip.compress(data) if self._zip is not None else data)

    def close(self) -> None:
        """Writes what is pending and closes the file (an upload completes here)."""
        if self._file is None:
            return
        try:
            self._flush()
            if self._zip is not None:
                self._put(self._zip.flush())
            try:
                self._file.close()
            except OSError as e:
                raise _naming(e, self.path) from e
        finally:
            self._file = None

"""TFRecord files written without TensorFlow, through :mod:`superserial.fs`.

``tf.io.TFRecordWriter`` reaches only the filesystems TensorFlow registers;
TensorFlow 2.21 has no ``s3://``. :class:`RecordFileWriter` writes the same
bytes (the framing of :mod:`superserial.framing`, optionally in one GZIP or
ZLIB stream) to any file :mod:`superserial.fs` opens, such as an s3fs object
(a multipart upload), and counts the bytes and the CRC-32C of what it writes,
so that a closed shard need not be read back from the object store.

This module does not import TensorFlow.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import google_crc32c

from superserial import fs
from superserial.framing import masked_crc

__all__ = ["RecordFileWriter"]

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# Framed records are gathered up to this size before one write: one call per
# megabyte, not per record, and the object store's client uploads in parts anyway.
_FLUSH = 1 << 20
# zlib window bits: 15 is a zlib stream, 31 a gzip one (as TensorFlow writes them).
_WBITS = {"ZLIB": 15, "GZIP": 31}


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

    def _put(self, data: bytes) -> None:
        if data:
            self._file.write(data)
            self.bytes += len(data)
            self.crc32c = google_crc32c.extend(self.crc32c, data)

    def _flush(self) -> None:
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
            self._file.close()
        finally:
            self._file = None

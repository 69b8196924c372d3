"""The checks of records read at the offsets a shard's index gives: framing and data CRCs.

A TFRecord record is framed as its length (8 bytes), the masked CRC-32C of
the length (4), the data, and the masked CRC-32C of the data (4); see
``docs/format.md``. The index gives each record's framed size, so its 12
bytes of length and length CRC are known before it is read: one comparison
checks both, and the details are worked out only on a mismatch. A record
that fails is a :class:`~superserial.errors.CorruptDataError` naming the
file, the record and where it is.

:class:`RecordChecks` is one reader's (:class:`superserial.read.random_access.RecordReader`):
it names the reader's files, and keeps the length heads of the sizes it has
seen. This module does not import TensorFlow.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Sequence
from typing import NoReturn

import numpy as np

from superserial.errors import CorruptDataError
from superserial.format import framing
from superserial.format.framing import masked_crc, masked_crc_array, masked_crcs, range_crc32cs

__all__ = ["RecordChecks"]

_HEAD = struct.Struct("<QI")
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# Record sizes whose expected length head is kept; more distinct sizes start over.
_HEADS_MAX = 4096


class RecordChecks:
    """Checks the records one reader reads (see the module docstring).

    Args:
        path: The dataset, for the ``superserial verify`` hint.
        files: The name of each of the reader's ranges (shards), by range number.
        at: Where byte ``offset`` of range ``k`` is, for messages: ``at(k, offset)``.
    """

    def __init__(self, path: str, files: Sequence[str], at: Callable[[int, int], str]) -> None:
        self._path, self._files, self._at = path, files, at
        self._heads: dict[int, bytes] = {}

    def head(self, size: int) -> bytes:
        """The 12 bytes that frame a record of ``size`` bytes: its length and length CRC."""
        head = self._heads.get(size)
        if head is None:
            length = _LEN.pack(size - 16)
            head = length + _CRC.pack(masked_crc(length))
            if len(self._heads) >= _HEADS_MAX:
                self._heads.clear()
            self._heads[size] = head
        return head

    def one(self, data: bytes, lo: int, hi: int, k: int, record: int, offset: int) -> bytes:
        """The data of the record framed in ``data[lo:hi]``, its framing checked.

        Args:
            data: The bytes read.
            lo: Where the framed record starts in ``data``.
            hi: Where it ends.
            k: The range it is in.
            record: Its record number in the shard.
            offset: Its byte offset in the shard.

        Raises:
            CorruptDataError: Its length, length CRC or data CRC is wrong.
        """
        if not data.startswith(self.head(hi - lo), lo):
            self._bad_head(data, lo, hi, k, record, offset)
        rec = data[lo + 12 : hi - 4]
        (crc,) = _CRC.unpack_from(data, hi - 4)
        if masked_crc(rec) != crc:
            raise CorruptDataError(
                f"expected the data CRC {crc:08x}, got another (corrupted record) at "
                f"{self._files[k]} record {record} ({self._at(k, offset + 12)})",
                reason=f"corrupted record at {self._at(k, offset + 12)}",
            )
        return rec

    def all(
        self,
        buffer: bytes | mmap.mmap,
        at: np.ndarray,
        framed: np.ndarray,
        k: int,
        records: np.ndarray,
        offsets: np.ndarray,
        keep: bool = True,
    ) -> list[bytes]:
        """The data of the framed records at ``at`` in ``buffer`` (``framed`` bytes each), checked.

        Args:
            buffer: The bytes read (or the file's map).
            at: Where each framed record starts in ``buffer``.
            framed: The framed size of each, from the index.
            k: The range the records are in.
            records: Their record numbers in the shard.
            offsets: Their byte offsets in the shard.
            keep: False: the records are only checked, and ``[]`` comes back (no
                ``bytes`` made per record; the CRCs are computed in the buffer).

        Raises:
            CorruptDataError: From :meth:`one`, for the first damaged record.
        """
        raw = np.frombuffer(buffer, dtype=np.uint8)
        heads = raw[at[:, None] + np.arange(12)].view("<u4")  # length (2 words) and its CRC
        data_crcs = raw[(at + framed - 4)[:, None] + np.arange(4)].view("<u4")[:, 0]
        # Without the C loop, slicing the records and a call each is the cheaper way.
        data = None if framing.NATIVE_RANGES else _cut(buffer, at, framed)
        if data is None:
            # Within the buffer, as the two reads above were; a size under 16 (the
            # index checks that none is) fails the head check below, as it should.
            crcs = masked_crc_array(range_crc32cs(raw, at + 12, np.maximum(framed - 16, 0)))
        else:
            crcs = masked_crcs(data)
        del raw  # a map cannot be closed while numpy views it
        if framed.min() == framed.max():  # records of one size (fixed-shape data): no sort
            sizes, which = framed[:1], np.zeros(len(framed), dtype=np.int64)
        else:
            sizes, which = np.unique(framed, return_inverse=True)
        expected = np.frombuffer(b"".join(self.head(s) for s in sizes.tolist()), dtype="<u4")
        bad = (heads != expected.reshape(-1, 3)[which]).any(axis=1) | (data_crcs != crcs)
        if bad.any():
            j = int(np.argmax(bad))
            f, a = int(framed[j]), int(at[j])
            self.one(bytes(buffer[a : a + f]), 0, f, k, int(records[j]), int(offsets[j]))
        if not keep:
            return []
        return _cut(buffer, at, framed) if data is None else data

    def _bad_head(
        self, data: bytes, lo: int, hi: int, k: int, record: int, offset: int
    ) -> NoReturn:
        """Raises for a length head other than :meth:`head` expects."""
        where = f"{self._files[k]} record {record}"
        length, length_crc = _HEAD.unpack_from(data, lo)
        if length != hi - lo - 16:
            raise CorruptDataError(
                f"expected a record of {hi - lo - 16} bytes as the index says, got a length "
                f"field of {length} at {where} ({self._at(k, offset)}); the shard or its index "
                f"is damaged: `superserial verify {self._path}` tells which",
                reason=f"length {length} disagrees with the index at {self._at(k, offset)}",
            )
        # The length is as expected, so its CRC is not.
        raise CorruptDataError(
            f"expected the length CRC {length_crc:08x}, got another (corrupted length) "
            f"at {where} ({self._at(k, offset)})",
            reason=f"corrupted length at {self._at(k, offset)}",
        )


def _cut(buffer: bytes | mmap.mmap, at: np.ndarray, framed: np.ndarray) -> list[bytes]:
    """The data of each framed record at ``at`` in ``buffer``, as ``bytes``."""
    a_l, e_l = at.tolist(), (at + framed - 4).tolist()
    return [buffer[x + 12 : e] for x, e in zip(a_l, e_l, strict=True)]

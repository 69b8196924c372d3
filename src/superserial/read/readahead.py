"""Sequential reads of remote shards: large range requests in flight ahead of the reader.

A reader that goes through its shards in order (numpy iteration and
``batches()``, hence the torch ``TorchDataset``; tf.data's ``load`` where
fsspec serves the scheme) would otherwise wait one round trip per buffer:
about 10 MB/s through a 50 ms round trip with 1 MiB buffers. Here the bytes
of every span the reader will read, in its order and across shard
boundaries, are cut into blocks of at most ``RUN_MAX`` (8 MiB; the first ones
smaller, from 1 MiB doubling, for an early first batch) and requested
through the process's fetch pool (:mod:`superserial.storage.fetch`) ahead of
the reader, while the blocks issued and not yet read stay within a byte
budget: ``SUPERSERIAL_READ_AHEAD`` (default 64 MiB; ``"64MiB"``-style sizes;
0 turns read-ahead off; read when a pass starts) and never more requests than the pool's
``concurrency()``. A block is let go once read past, so memory is that
budget plus one block, whatever the dataset's size.

Every block is one :meth:`~superserial.storage.fs.RangeReader.read`, so the
one retry policy (:mod:`superserial.storage.retry`) covers it and a failure
that outlasts it is a :class:`~superserial.errors.RemoteReadError` naming the
URL and the byte range. The records themselves are cut out and checked as
a plain read checks them, naming the shard and the record: for uncompressed
shards with indexes, a chunk of records at a time by
:meth:`~superserial.read.random_access.RecordReader.read_span` over
:meth:`Stream.take` (numpy, no Python per record but its data CRC); else by
:func:`records`, over :func:`superserial.format.framing.read_frames`.

Fork-safe: a pass started in a parent and read on in a forked child (whose
pool's threads and requests in flight do not exist there) issues its blocks
again from where it stands. Only readers whose range reads are concurrent
requests (fsspec's async filesystems: s3, gcs, http) come here; others read
as before.

This module does not import TensorFlow.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, BinaryIO, NamedTuple, cast

from superserial.base import settings
from superserial.errors import CorruptDataError
from superserial.format.framing import read_frames, read_records
from superserial.format.header import Header, Shard
from superserial.format.record_index import read_index
from superserial.storage import fetch, fs

__all__ = [
    "DEFAULT_READ_AHEAD",
    "READ_AHEAD_ENV",
    "Span",
    "Stream",
    "budget",
    "indexed",
    "records",
    "spans",
    "steps",
    "whole_batches",
]

READ_AHEAD_ENV = "SUPERSERIAL_READ_AHEAD"
# Eight blocks of RUN_MAX in flight: at a 50 ms round trip, 8 x 8 MiB keep
# over 1 GB/s requested, well past what one process decodes; and memory stays
# a fixed 64 MiB (plus the block being read) whatever the shards' sizes.
DEFAULT_READ_AHEAD = 64 << 20
# The first block, doubled block by block up to the block size: requests in
# flight share the bandwidth, so a small first one arrives (and is decoded)
# early, while the large ones behind it come.
_FIRST = 1 << 20
# A read of a span returns at least this much (unless the span ends): more
# than a record header, so the framing reader never sees a false truncation.
_MIN = 64 << 10


def steps(n: int, size: int, most: int) -> Iterator[tuple[int, int]]:
    """Bounds ``[a, b)`` of a pass's chunks over ``n`` records: ``size`` first, doubling to ``most``.

    A pass hands on its first records early and the rest in chunks large
    enough that the cost per chunk (a decoder's numpy calls, a generator's
    element) is small next to their records'.
    """
    a = 0
    while a < n:
        b = min(a + size, n)
        yield a, b
        a, size = b, min(2 * size, most)


def whole_batches(header: Header, per_batch: int, size: int) -> int:
    """How many whole batches of ``per_batch`` records fit ``size`` bytes: at least 1.

    At the mean record size of ``header``'s shards: what a pass's chunks
    (:func:`steps`' ``most``) and the batches a reader keeps ahead are sized by.
    """
    return max(1, size * header.element_count // max(per_batch * header.total_bytes, 1))


def budget() -> int:
    """The bytes a sequential pass keeps requested ahead (``SUPERSERIAL_READ_AHEAD``; 0: none).

    Raises:
        ValueError: The variable is no size (``"64MiB"``, ``"32M"``, bytes).
    """
    # 0: off: each read waits for its own request, as a plain file read does.
    return settings.size(READ_AHEAD_ENV, DEFAULT_READ_AHEAD)


class Span(NamedTuple):
    """Records ``first .. first+records-1`` of a shard, at bytes ``[lo, hi)`` of ``file``."""

    file: str
    lo: int
    hi: int
    first: int
    records: int


def applies(file: str) -> bool:
    """Whether reads of ``file`` go ahead: a remote file of concurrent range reads, budget on."""
    if fs.is_local(file) or not budget():
        return False
    with fs.open_range_reader(file) as reader:
        return reader.concurrent


def indexed(header: Header, files: Sequence[str]) -> bool:
    """Whether the records of ``files`` can be cut by their shards' indexes, a chunk at a time.

    Uncompressed, and every shard with an index: what
    :meth:`~superserial.read.random_access.RecordReader.read_span` reads, for the numpy
    reader's and tf.data's sequential passes.
    """
    by_name = {s.file: s for s in header.shards}
    return not header.compression and all(by_name[fs.basename(f)].index is not None for f in files)


def spans(
    root: str,
    header: Header,
    files: Sequence[str],
    counts: Sequence[int],
    starts: Sequence[int],
) -> list[Span] | None:
    """The byte spans of a reader's records, or None where read-ahead does not apply.

    Whole shards span their header size (opening checked the files' sizes
    against it); part of an uncompressed shard spans its records' bytes, from
    the shard's index. None: local files, readers whose range reads are not
    concurrent requests, a part of a shard without an index, or read-ahead
    turned off (``SUPERSERIAL_READ_AHEAD=0``): read as before.
    """
    if not files or not applies(files[0]):  # one scheme, one filesystem
        return None
    by_name = {s.file: s for s in header.shards}
    out: list[Span] = []
    for file, count, start in zip(files, counts, starts, strict=True):
        shard: Shard | None = by_name.get(fs.basename(file))
        if shard is None:
            return None
        if start == 0 and (count == shard.records or header.compression):
            out.append(Span(file, 0, shard.bytes, 0, count))
        elif count:
            if shard.index is None or header.compression:
                return None
            offsets = read_index(root, shard)
            out.append(Span(file, int(offsets[start]), int(offsets[start + count]), start, count))
    return out


class Stream:
    """The bytes of some spans of remote files, fetched ahead in blocks (see the module docstring).

    Args:
        spans: What to read, in order: ``(file, lo, hi)`` each.
        limit: The bytes requested ahead and not yet read (None: :func:`budget`).
        block: The most bytes one request fetches.
        on_block: Called with ``(file, start, data)`` of each block as the
            reader reaches it, in order (the streaming cache keeps a copy of
            the bytes read, :meth:`superserial.read.cache.stream.Stream.tee`);
            what it raises fails the read.
    """

    def __init__(
        self,
        spans: Sequence[tuple[str, int, int]],
        *,
        limit: int | None = None,
        block: int = fetch.RUN_MAX,
        on_block: Callable[[str, int, bytes], None] | None = None,
    ) -> None:
        self.limit = budget() if limit is None else limit
        # At least two blocks fit the budget: one read while the next comes.
        block = max(1, min(block, self.limit // 2))
        self._blocks: list[tuple[int, int, int]] = []  # (span, start, stop)
        self._first: list[int] = []  # the first block of each span
        size = min(_FIRST, block)
        for k, (_, lo, hi) in enumerate(spans):
            self._first.append(len(self._blocks))
            while lo < hi:
                self._blocks.append((k, lo, min(lo + size, hi)))
                lo, size = lo + size, min(2 * size, block)
        self._first.append(len(self._blocks))
        self._files = [s[0] for s in spans]
        self._on_block = on_block
        self._readers: dict[str, fs.RangeReader] = {}
        self._pending: collections.deque[Future[bytes]] = collections.deque()
        self._issued = 0  # blocks submitted so far
        self._held = 0  # bytes of the pending blocks
        self._pid = os.getpid()
        self._width = fetch.concurrency()
        self._error: BaseException | None = None
        # take(): the block being taken from, and its number.
        self._cur: memoryview = memoryview(b"")
        self._cur_i = -1
        self._fill()  # the first requests go out now: the reader may have more to do first

    @property
    def error(self) -> BaseException | None:
        """What failed the pass (a block's read, or ``on_block``), or None: every later read fails alike."""
        return self._error

    def _reader(self, file: str) -> fs.RangeReader:
        reader = self._readers.get(file)
        if reader is None:
            reader = self._readers[file] = fs.open_range_reader(file)
        return reader

    def _fill(self) -> None:
        """Submits blocks while the budget and the pool's width allow (at least one)."""
        pool = fetch.executor()
        while self._issued < len(self._blocks) and len(self._pending) < self._width:
            k, a, b = self._blocks[self._issued]
            if self._pending and self._held + (b - a) > self.limit:
                return
            self._pending.append(pool.submit(self._reader(self._files[k]).read, a, b - a))
            self._held += b - a
            self._issued += 1

    def block(self, i: int) -> bytes:
        """Block ``i``; blocks are asked for in order, each once."""
        if self._pid != os.getpid():
            # A forked child: the parent's requests in flight never finish here.
            self._pid, self._readers = os.getpid(), {}
            self._pending.clear()
            self._issued, self._held = i, 0
        if self._error is not None:
            raise self._error  # the pass failed: every later read fails alike
        if i != self._issued - len(self._pending):
            raise ValueError(f"expected block {self._issued - len(self._pending)}, got {i}")
        self._fill()
        future = self._pending[0]
        try:
            data = future.result()
        except BaseException as e:
            self.close()
            self._error = e
            raise
        self._pending.popleft()
        k, a, b = self._blocks[i]
        self._held -= b - a
        self._fill()
        if self._on_block is not None:
            try:
                self._on_block(self._files[k], a, data)
            except BaseException as e:
                self.close()
                self._error = e
                raise
        return data

    def take(self, k: int, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of span ``k``; the spans' bytes are taken in order, each once."""
        parts: list[memoryview] = []
        pos = lo
        while pos < hi:
            _, a, b = self._blocks[self._cur_i] if self._cur_i >= 0 else (k, 0, 0)
            if not (self._cur_i >= 0 and self._blocks[self._cur_i][0] == k and a <= pos < b):
                i = self._cur_i + 1
                if i >= len(self._blocks) or self._blocks[i][:2] != (k, pos):
                    raise ValueError(f"expected the next bytes of the stream, got {k}:{pos}")
                self._cur, self._cur_i = memoryview(self.block(i)), i
                _, a, b = self._blocks[i]
            n = min(hi, b) - pos
            parts.append(self._cur[pos - a : pos - a + n])
            pos += n
        return b"".join(parts)

    def file(self, k: int) -> BinaryIO:
        """Span ``k``'s bytes as a file object (read to its end before the next span's)."""
        # A readable binary stream, though typeshed does not call RawIOBase a BinaryIO.
        return cast(BinaryIO, _SpanFile(self, k, self._first[k], self._first[k + 1]))

    def close(self) -> None:
        """Cancels the blocks not yet started and lets go of the ones read ahead."""
        for f in self._pending:
            f.cancel()
        self._pending.clear()
        self._issued = len(self._blocks)
        self._held = 0
        self._cur = memoryview(b"")
        readers, self._readers = self._readers, {}
        for r in readers.values():
            r.close()


class _SpanFile(io.RawIOBase):
    """One span of a :class:`Stream`: its blocks ``[begin, end)``, read once, in order.

    A read returns at most what is left of the current block once it has
    ``_MIN`` bytes (fewer only at the span's end): the reader's buffer never
    pulls blocks out of the budget before it reaches them, and the framing
    reader always gets a whole record header.
    """

    def __init__(self, stream: Stream, k: int, begin: int, end: int) -> None:
        super().__init__()
        self.name = stream._files[k]
        self._stream, self._next, self._end = stream, begin, end
        self._data: memoryview = memoryview(b"")
        self._at = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = size if size is not None and size >= 0 else 1 << 62
        parts: list[memoryview] = []
        got = 0
        while got < want:
            if self._at == len(self._data):
                if self._next == self._end:
                    break
                # The block before is let go here (only its slices handed out live on).
                self._data, self._at = memoryview(self._stream.block(self._next)), 0
                self._next += 1
            n = min(want - got, len(self._data) - self._at)
            parts.append(self._data[self._at : self._at + n])
            self._at += n
            got += n
            if got >= min(want, _MIN):
                break
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)


@contextlib.contextmanager
def _renamed(missing: Callable[[str], Exception] | None, file: str) -> Iterator[None]:
    """A ``FileNotFoundError`` inside as ``missing(file)``, if given."""
    try:
        yield
    except FileNotFoundError as e:
        if missing is None:
            raise
        raise missing(file) from e


def records(
    spans: Sequence[Span],
    compression: str | None,
    *,
    limit: int | None = None,
    missing: Callable[[str], Exception] | None = None,
    on_block: Callable[[str, int, bytes], None] | None = None,
) -> Iterator[tuple[bytes, str]]:
    """The records of ``spans`` with where they are, read ahead (see :class:`Stream`).

    ``on_block`` is :class:`Stream`'s.

    Each span yields exactly its ``records`` records, checked as
    :func:`superserial.format.framing.shard_records` checks a whole shard.

    Raises:
        CorruptDataError: A span's framing is damaged, or it holds more or
            fewer records than it should (naming the shard).
        RemoteReadError: A block could not be read (naming the URL and range).
        FileNotFoundError: A shard is gone; or ``missing(file)``, raised from it.
    """
    stream = Stream([(s.file, s.lo, s.hi) for s in spans], limit=limit, on_block=on_block)
    try:
        for k, s in enumerate(spans):
            with stream.file(k) as raw, _renamed(missing, s.file):
                # A compressed span is a whole shard: its stream starts at record 0.
                frames = (
                    read_records(raw, compression)
                    if compression
                    else read_frames(raw, s.file, s.first, s.lo)
                )
                n = s.first
                for record in frames:
                    if n == s.first + s.records:
                        raise CorruptDataError(
                            f"expected {s.first + s.records} records, got more at {s.file} record {n}"
                        )
                    yield record, f"{s.file} record {n}"
                    n += 1
                if n != s.first + s.records:
                    raise CorruptDataError(
                        f"expected {s.first + s.records} records, got {n} (truncated shard) at "
                        f"{s.file}"
                    )
    finally:
        stream.close()

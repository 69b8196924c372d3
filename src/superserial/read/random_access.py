"""Random access to the records of a dataset, through the record index of each shard.

A :class:`RecordReader` reads record ``i`` of a sequence of shard ranges
(whole shards, or ``counts[k]`` records from ``starts[k]`` on) with one range
read: ``pread`` locally, a byte-range request elsewhere (see
:func:`superserial.storage.fs.open_range_reader`). A batch of positions is sorted by
file and offset; a local file is mapped and each record sliced out of the map
(after checking that the file still reaches the last one: a truncated shard is
an error, never a SIGBUS); elsewhere the range reads of a batch, for every file,
are issued at once, many in flight, each bounded in the bytes it fetches beyond
the records (:mod:`superserial.storage.fetch`). The records are returned in the
order asked for. Every record read is checked
(:mod:`superserial.read.record_checks`): its length against the index, both
masked CRC-32Cs of its framing. A damaged record is a
:class:`~superserial.errors.CorruptDataError` naming the file, the record and
its byte offset; the records around it still read.

Indexes are read and checked (:func:`superserial.format.record_index.read_index`) the first
time a shard is touched. A reader is safe to share between threads, and to
pickle or fork into worker processes: files are opened lazily in each process.

A GZIP or ZLIB shard is read through its restart points: its index gives
each record's offset in the uncompressed stream and where each block of the
stream starts; a batch inflates each block it needs once
(:class:`superserial.read.blocks.Blocks`, which keeps a few recent ones), and
its records are sliced from the inflated bytes and checked as above.

A remote reader may be given ``local``, which names a shard's local copy once
there is one (the pinned shards of :mod:`superserial.read.cache.pins`): a
shard read remotely until then is read from its copy from the next read on.

This module does not import TensorFlow.
"""

from __future__ import annotations

import bisect
import itertools
import mmap
import operator
import os
import shlex
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from superserial.errors import UnsupportedError
from superserial.format.header import Header, Shard
from superserial.format.record_index import Restarts, read_index, read_restarts, rebuild_hint
from superserial.read.blocks import Blocks, Want, block_where
from superserial.read.record_checks import RecordChecks
from superserial.storage import fetch, fs

__all__ = ["RecordReader", "check_indices"]

# Records closer than this in one local file (not mapped) are read with one
# pread, which costs about what copying 16 KiB does. Remote files: see
# superserial.storage.fetch.
_GAP_LOCAL = 16 << 10
# read_packed hands on a fetched buffer as it is (framing included) when it is at most
# this many times its records' framed bytes; else it copies out the records' data.
_DENSE = 1.25
# What _init_state makes: a process's own, never pickled.
_PER_PROCESS: tuple[str, ...] = ("_lock", "_offsets", "_tables", "_blocks", "_readers", "_pid")
_PER_PROCESS += ("_checks", "_remote", "_retired")


def check_indices(indices: Any, length: int) -> np.ndarray:
    """``indices`` as an int64 array in ``[0, length)``; negative ones count from the end.

    Raises:
        TypeError: ``indices`` are not integers.
        IndexError: An index is out of range (the first such is named).
    """
    arr = np.asarray(indices)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        raise TypeError(
            f"expected a sequence of integer indices, got an array of {arr.dtype} "
            f"and shape {arr.shape}"
        )
    if arr.dtype == np.bool_:
        raise TypeError("expected integer indices, got booleans")
    out = arr.astype(np.int64)
    out = np.where(out < 0, out + length, out)
    bad = (out < 0) | (out >= length)
    if bad.any():
        k = int(np.argmax(bad))
        raise IndexError(
            f"expected indices in [-{length}, {length}), got {int(arr[k])} at position {k}"
        )
    return out


class RecordReader:
    """The records of some shards of a dataset, by position.

    Args:
        path: The dataset directory or URL.
        header: Its header.
        shards: The header's shard of each range, in order.
        starts: The first record of each range in its shard.
        counts: The number of records of each range.
        local: For a remote ``path``: the local path of a shard file's
            complete copy, given its name, or None while there is none
            (called before reads of a shard that is still read remotely).

    Raises:
        UnsupportedError: A shard has no index (a dataset written before
            indexes existed; compressed: before restart points existed).
    """

    def __init__(
        self,
        path: str,
        header: Header,
        shards: Sequence[Shard],
        starts: Sequence[int],
        counts: Sequence[int],
        *,
        local: Callable[[str], str | None] | None = None,
    ) -> None:
        missing = [s.file for s, n in zip(shards, counts, strict=True) if n and s.index is None]
        if missing and header.compression:
            raise UnsupportedError(
                f"expected restart points in every {header.compression} shard for random "
                f"access, got none for {missing[0]} at {path} (written before restart points "
                "existed: a compressed stream has no record offsets); rewrite it with them, "
                f"compressed, with `superserial convert {shlex.quote(path)} -o NEW_PATH "
                f"--compression {header.compression}`"
            )
        if missing:
            raise UnsupportedError(
                f"expected a record index for every shard for random access, got none for "
                f"{missing[0]} at {path} (written before indexes existed); add them with "
                + rebuild_hint(path)
            )
        self.path = path
        self._compression = header.compression
        self._shards = list(shards)
        self._files = [fs.join(path, s.file) for s in shards]
        self._starts = list(starts)
        self._ends = list(itertools.accumulate(counts))
        self._begins = [0, *self._ends[:-1]]
        self._gap = _GAP_LOCAL if fs.is_local(path) else None
        self._local = None if fs.is_local(path) else local
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._offsets: dict[int, np.ndarray] = {}
        self._tables: dict[int, Restarts] = {}  # compressed shards' restart points
        self._blocks = Blocks()
        self._readers: dict[int, fs.RangeReader] = {}
        self._pid = os.getpid()
        self._checks = RecordChecks(self.path, self._files, self._at)
        self._remote: set[int] = set()  # ranges read remotely that may get a local copy
        self._retired: list[fs.RangeReader] = []  # remote readers a local copy replaced

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in _PER_PROCESS:
            del state[k]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def record_bytes(self) -> float:
        """The mean size of a record in its shards' files (framing included; compressed: as stored)."""
        records = sum(s.records for s in self._shards)
        return sum(s.bytes for s in self._shards) / max(records, 1)

    def _after_fork(self) -> None:
        # A forked child starts afresh: the parent's readers are the parent's to close,
        # and its lock may have been held by a thread that does not exist here.
        if self._pid != os.getpid():
            self._init_state()

    def _open(self, k: int) -> tuple[np.ndarray, fs.RangeReader]:
        """The offsets and an open reader of range ``k``'s shard, made on first use."""
        self._after_fork()
        offsets, reader = self._offsets.get(k), self._readers.get(k)
        copy = None
        if self._local is not None and (reader is None or k in self._remote):
            copy = self._local(self._shards[k].file)
        if offsets is None or reader is None or copy is not None:
            with self._lock:
                if k not in self._offsets:
                    self._offsets[k] = self._read_index(k)
                old = self._readers.get(k)
                opened = None
                if copy is not None and (old is None or k in self._remote):
                    try:
                        opened = fs.open_range_reader(copy)
                    except FileNotFoundError:  # its view went with the reader that made it
                        opened = None
                if opened is not None:
                    self._readers[k] = opened
                    self._remote.discard(k)
                    if old is not None:  # retired, not closed: a thread may be reading it
                        self._retired.append(old)
                elif old is None:
                    self._readers[k] = fs.open_range_reader(self._files[k])
                    if self._local is not None:
                        self._remote.add(k)
                offsets, reader = self._offsets[k], self._readers[k]
        return offsets, reader

    def extents(self) -> list[tuple[str, int, int]]:
        """Each range's file and the bytes ``[lo, hi)`` its records fill, in order.

        A whole shard by the header (no index read); part of one by its index.
        """
        out: list[tuple[str, int, int]] = []
        for k, shard in enumerate(self._shards):
            first, count = self._starts[k], self._counts(k)
            if first == 0 and count == shard.records:
                out.append((self._files[k], 0, shard.bytes))
            elif not count:
                out.append((self._files[k], 0, 0))
            else:
                offsets, _ = self._open(k)
                out.append((self._files[k], int(offsets[first]), int(offsets[first + count])))
        return out

    def open_all(self, ranges: Sequence[int] | None = None) -> None:
        """Reads the index of every range (or of ``ranges``) not read yet, all at once.

        Remote: through the fetch pool; locally, and for fewer than two, each
        is read on first touch instead.
        """
        # Before the indexes are kept: a forked child's first _open would drop them.
        self._after_fork()
        wanted = range(len(self._shards)) if ranges is None else ranges
        todo = [k for k in wanted if k not in self._offsets and self._counts(k)]
        if len(todo) < 2 or fs.is_local(self.path):
            return
        indexes = fetch.executor().map(self._read_index_unlocked, todo)
        for k, (offsets, table) in zip(todo, indexes, strict=True):
            with self._lock:
                if k not in self._offsets:
                    self._offsets[k] = offsets
                    if table is not None:
                        self._tables[k] = table

    def _read_index_unlocked(self, k: int) -> tuple[np.ndarray, Restarts | None]:
        """Range ``k``'s record offsets, and its restart points if compressed."""
        if self._compression is None:
            return read_index(self.path, self._shards[k]), None
        table = read_restarts(self.path, self._shards[k], self._compression)
        return table.offsets, table

    def _read_index(self, k: int) -> np.ndarray:
        """Range ``k``'s record offsets (under the lock: its restart points kept)."""
        offsets, table = self._read_index_unlocked(k)
        if table is not None:
            self._tables[k] = table
        return offsets

    def _at(self, k: int, offset: int) -> str:
        """Where byte ``offset`` of range ``k`` is, for messages (compressed: and its block)."""
        table = self._tables.get(k)
        if table is None:
            return f"byte offset {offset}"
        return block_where(self._files[k], table, offset)

    def _plain(
        self, groups: list[tuple[int, np.ndarray, np.ndarray, fs.RangeReader]]
    ) -> list[tuple[bytes, np.ndarray]]:
        """For compressed ranges ``(k, lo, hi, reader)``: inflated buffers and where records are."""
        wants = [
            Want(k, self._files[k], reader, self._tables[k], lo, hi) for k, lo, hi, reader in groups
        ]
        return self._blocks.gather(wants, remote=self._gap is None)

    def _counts(self, k: int) -> int:
        return self._ends[k] - self._begins[k]

    def close(self) -> None:
        """Closes the files this process opened (they reopen on the next read)."""
        with self._lock:
            readers, self._readers = self._readers, {}
            retired, self._retired = self._retired, []
            self._remote = set()
        if self._pid == os.getpid():
            for r in [*readers.values(), *retired]:
                r.close()

    def where(self, i: int) -> str:
        """Where record ``i`` (in ``[0, len)``) is: ``FILE record N``."""
        k = bisect.bisect_right(self._ends, i)
        return f"{self._files[k]} record {i - self._begins[k] + self._starts[k]}"

    def read(self, i: int) -> tuple[bytes, str]:
        """Record ``i`` (in ``[0, len)``) and where it is, checked.

        Raises:
            CorruptDataError: The record or the shard's index is damaged.
        """
        k = bisect.bisect_right(self._ends, i)
        record = i - self._begins[k] + self._starts[k]
        offsets, reader = self._open(k)
        lo, hi = int(offsets[record]), int(offsets[record + 1])
        if self._compression is None:
            data, at = reader.read(lo, hi - lo), 0
        else:
            data, at = self._blocks.span(k, self._files[k], reader, self._tables[k], lo, hi), 0
        rec = self._checks.one(data, at, at + hi - lo, k, record, lo)
        return rec, f"{self._files[k]} record {record}"

    def _gather(
        self, indices: np.ndarray, amplification: float | None = None, packed: bool = False
    ) -> _Gathered:
        """Reads the records at ``indices`` and checks their framing.

        Records of one file are read in offset order. A local file is mapped
        and each record sliced out of the map (a copy of the record alone, no
        system call); elsewhere neighbours are fetched with one range read
        (see :meth:`_fetch`), into one buffer per file. Python runs once per range read
        and once per record (a slice and its data CRC); the rest is numpy
        over all records at once.

        With ``packed``, ``data`` is one buffer per file instead, and ``at`` says where
        each record's data starts in them, joined (see :meth:`read_packed`).

        Raises:
            CorruptDataError: A record or a shard's index is damaged (the
                first damaged record in file order is named).
        """
        indices = np.asarray(indices, dtype=np.int64)
        if not len(indices):
            return _Gathered([], indices, indices, indices, indices, indices)
        # Ranges and the records in them follow the indices: sorting the
        # indices sorts by file, then by offset.
        order = np.argsort(indices, kind="stable")
        ks = np.searchsorted(np.asarray(self._ends), indices, side="right")
        records = indices - np.asarray(self._begins)[ks] + np.asarray(self._starts)[ks]
        lengths = np.zeros(len(indices), dtype=np.int64)  # of each record's data, in ``order``
        data: list[bytes] = []  # in ``order``
        bounds = np.flatnonzero(np.diff(ks[order])) + 1
        if self._gap is None:
            # A remote batch's first touch of many shards (a shuffled load's
            # first chunk touches them all) reads their indexes together, not
            # one round trip after another.
            self.open_all(ks[order][np.r_[0, bounds]].tolist())
        groups: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, fs.RangeReader]] = []
        for group in np.split(order, bounds):
            k = int(ks[group[0]])
            offsets, reader = self._open(k)
            recs = records[group]
            groups.append((k, recs, offsets[recs], offsets[recs + 1], reader))
        fetched: Sequence[tuple[bytes | mmap.mmap, np.ndarray]]
        if self._compression is None:
            fetched = self._fetch(
                [(reader, lo, hi) for _, _, lo, hi, reader in groups], amplification
            )
        else:
            fetched = self._plain([(k, lo, hi, reader) for k, _, lo, hi, reader in groups])
        a0 = base = 0
        starts: list[np.ndarray] = []  # with ``packed``: of each file's records' data
        for (k, recs, lo, hi, _), (buffer, at) in zip(groups, fetched, strict=True):
            framed = hi - lo
            lengths[a0 : a0 + len(recs)] = framed - 16
            a0 += len(recs)
            if not packed:
                data += self._checks.all(buffer, at, framed, k, recs, lo)
            elif isinstance(buffer, bytes) and len(buffer) <= _DENSE * int(framed.sum()):
                # Fetched records that fill their buffer (a windowed group's blocks):
                # handed on as fetched, framing and all. Cut record by record into
                # 800-byte objects, 60,000 of them at once, and joined again, they
                # took 0.16-0.19 s of CPU over nginx, most of it faulting in new heap.
                self._checks.all(buffer, at, framed, k, recs, lo, keep=False)
                data.append(buffer)
                starts.append(at + (base + 12))
                base += len(buffer)
            else:
                piece = b"".join(self._checks.all(buffer, at, framed, k, recs, lo))
                data.append(piece)
                starts.append(np.r_[0, np.cumsum(framed[:-1] - 16)] + base)
                base += len(piece)
        # Back from file order to the order asked for.
        back = np.empty(len(indices), dtype=np.int64)
        back[order] = np.arange(len(indices))
        at = np.concatenate(starts) if packed else np.zeros(0, dtype=np.int64)
        return _Gathered(data, ks, records, lengths, back, at)

    def _fetch(
        self,
        files: list[tuple[fs.RangeReader, np.ndarray, np.ndarray]],
        amplification: float | None = None,
    ) -> list[tuple[bytes | mmap.mmap, np.ndarray]]:
        """Buffers holding the framed records ``[lo, hi)`` (sorted) of files, and where each is.

        For each ``(reader, lo, hi)``: a local file is its map, or read with
        one ``pread`` for neighbours closer than a gap; a remote one with the
        range reads :func:`superserial.storage.fetch.plan` plans, issued
        together for every file by :func:`superserial.storage.fetch.read_all`.

        Raises:
            CorruptDataError: A file ends before its last record.
        """
        views = [reader.view(int(hi.max())) for reader, _, hi in files]
        runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # of the files not mapped
        reads: list[tuple[fs.RangeReader, int, int]] = []
        for (reader, lo, hi), view in zip(files, views, strict=True):
            if view is not None:
                continue
            reach = np.maximum.accumulate(hi)
            if self._gap is None:
                firsts = fetch.plan(lo, hi, amplification)
            else:
                # A new range read where the next record starts more than a gap after the last end.
                firsts = np.flatnonzero(np.r_[True, lo[1:] - reach[:-1] > self._gap])
            run_lo = lo[firsts]
            run_hi = reach[np.r_[firsts[1:], len(lo)] - 1]
            runs.append((firsts, run_lo, run_hi))
            reads += zip(itertools.repeat(reader), run_lo.tolist(), run_hi.tolist(), strict=False)
        blocks = iter(fetch.read_all(reads))
        planned = iter(runs)
        out: list[tuple[bytes | mmap.mmap, np.ndarray]] = []
        for (_, lo, _), view in zip(files, views, strict=True):
            if view is not None:
                out.append((view, lo))
                continue
            firsts, run_lo, run_hi = next(planned)
            run_at = np.r_[0, np.cumsum(run_hi - run_lo)[:-1]]
            run_of = np.zeros(len(lo), dtype=np.int64)  # the run of each record
            run_of[firsts[1:]] = 1
            np.cumsum(run_of, out=run_of)
            buffer = b"".join(itertools.islice(blocks, len(firsts)))
            out.append((buffer, run_at[run_of] + (lo - run_lo[run_of])))
        return out

    def read_many(self, indices: np.ndarray) -> tuple[list[bytes], list[str]]:
        """Records at ``indices`` (checked, in ``[0, len)``), in that order, with where they are.

        Records of one file are read in offset order, neighbours with one
        range read (see :meth:`_fetch`). Duplicates are allowed.

        Raises:
            CorruptDataError: A record or a shard's index is damaged.
        """
        g = self._gather(indices)
        data = list(operator.itemgetter(*g.back.tolist())(g.data)) if len(g.data) > 1 else g.data
        files = self._files
        wheres = [
            f"{files[k]} record {r}" for k, r in zip(g.ks.tolist(), g.records.tolist(), strict=True)
        ]
        return data, wheres

    def read_span(
        self, i: int, j: int, take: Callable[[int, int, int], bytes] | None = None
    ) -> tuple[bytes, np.ndarray, np.ndarray]:
        """Records ``i .. j-1`` (``0 <= i < j <= len``), framing checked: one range read per shard.

        For reading in order: the records of each shard's part come with one
        read (``pread`` locally; else ``take(k, lo, hi)``, the bytes
        ``[lo, hi)`` of range ``k`` from a read-ahead stream) and are checked
        together, so Python runs once per record only for its data CRC.

        Returns:
            ``(buffer, starts, ends)``: record ``i + m`` is
            ``buffer[starts[m] : ends[m]]`` (the buffer holds the framing too).

        Raises:
            CorruptDataError: A record or a shard's index is damaged.
        """
        blocks: list[bytes] = []
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        base = 0
        while i < j:
            k = bisect.bisect_right(self._ends, i)
            stop = min(j, self._ends[k])
            first = i - self._begins[k] + self._starts[k]
            recs = np.arange(first, first + stop - i, dtype=np.int64)
            offsets, reader = self._open(k)
            lo, hi = offsets[recs], offsets[recs + 1]
            if self._compression is not None:
                ((plain, a),) = self._plain([(k, lo[:1], hi[-1:], reader)])
                block = plain[int(a[0]) : int(a[0]) + int(hi[-1] - lo[0])]
            elif take is None:
                block = reader.read(int(lo[0]), int(hi[-1] - lo[0]))
            else:
                block = take(k, int(lo[0]), int(hi[-1]))
            at = lo - lo[0]
            self._checks.all(block, at, hi - lo, k, recs, lo, keep=False)
            blocks.append(block)
            starts.append(at + (base + 12))
            ends.append(hi - lo[0] + (base - 4))
            base += len(block)
            i = stop
        buffer = blocks[0] if len(blocks) == 1 else b"".join(blocks)
        return buffer, np.concatenate(starts), np.concatenate(ends)

    def read_packed(
        self, indices: np.ndarray, amplification: float | None = None
    ) -> tuple[bytes, np.ndarray, np.ndarray]:
        """Records at ``indices`` (checked, in ``[0, len)``), packed in one buffer.

        Cheaper than :meth:`read_many` for many small records: one object,
        not one per record (and no ``where``). Record ``indices[i]`` is
        ``buffer[starts[i] : starts[i] + lengths[i]]``. The buffer holds the
        records' data one after the other in file order, not the framing and
        gaps of the range reads, which can be many times larger when few
        records of a large span are read; but a file's fetched bytes that are
        at most :data:`_DENSE` times its records' (a windowed group's blocks)
        come as they were fetched, framing included, not copied out record by
        record. Duplicates are allowed.

        Args:
            indices: The records.
            amplification: A remote read's bound on the bytes fetched over the
                records' (:func:`superserial.storage.fetch.plan`); None: the default.

        Returns:
            ``(buffer, starts, lengths)``, the latter two int64 arrays.

        Raises:
            CorruptDataError: A record or a shard's index is damaged.
        """
        data, starts, lengths = self.read_pieces(indices, amplification)
        return (data[0] if len(data) == 1 else b"".join(data)), starts, lengths

    def read_pieces(
        self, indices: np.ndarray, amplification: float | None = None
    ) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        """:meth:`read_packed`'s records with its buffer left in pieces (one per file read).

        Record ``indices[i]`` is ``b"".join(pieces)[starts[i] : starts[i] + lengths[i]]``:
        for a caller that joins the pieces with others anyway (or writes them out),
        which the join here would copy once more.
        """
        g = self._gather(indices, amplification, packed=True)
        return g.data, g.at[g.back], g.lengths[g.back]


class _Gathered(NamedTuple):
    """What :meth:`RecordReader._gather` read: the records at some indices, and where they are."""

    data: list[bytes]  # in file order
    ks: np.ndarray  # the range of each index
    records: np.ndarray  # the record number of each index in its shard
    lengths: np.ndarray  # the length of each record's data, in file order
    back: np.ndarray  # where the record of each index is in file order
    at: np.ndarray  # packed: each record's data start in the joined buffers (else empty)

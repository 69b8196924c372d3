"""The restart blocks of compressed shards: inflated one by one, checked, kept in an LRU.

A GZIP or ZLIB shard written by superserial is one ordinary stream whose
deflate data is cut into blocks, each deflated afresh and ended on a byte
boundary; its index lists where each block starts in the file and in the
uncompressed stream (:class:`superserial.format.record_index.Restarts`). So a
raw inflater (``wbits=-15``) can start at any block, and the uncompressed
bytes ``[lo, hi)`` of a record are read by inflating the blocks that hold
them alone, not the stream up to them.

:class:`Blocks` does that for a batch of records of many shards at once:
each block a batch needs is read once (neighbours with one range read; the
range reads of every remote file issued together through
:func:`superserial.storage.fetch.read_all`) and inflated once, however many of
the batch's records it holds, and the block's bytes are laid out in one
buffer per shard, so a record spanning blocks is contiguous there. Inflated
blocks are kept in a small LRU bounded in bytes (``CACHE_BYTES``), so
neighbouring reads do not inflate their block again.

A block is checked as it is inflated: it must inflate without error to
exactly its length in the index, ending where the next block starts (the
last one with the stream's final block). A block that does not is a
:class:`~superserial.errors.CorruptDataError` naming the file and the
block's compressed offset; the other blocks of the shard still read. The
records in a block are then checked by their framing CRCs, as uncompressed
ones are (:mod:`superserial.read.random_access`).

This module does not import TensorFlow.
"""

from __future__ import annotations

import collections
import itertools
import threading
import zlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from superserial.errors import CorruptDataError, UnsupportedError
from superserial.format.framing import inflated_range_records
from superserial.format.header import Shard
from superserial.format.record_index import Restarts, read_restarts
from superserial.storage import fetch, fs

__all__ = [
    "CACHE_BYTES",
    "Blocks",
    "Want",
    "block_where",
    "check_blocks",
    "inflate",
    "range_records",
]

# Inflated bytes kept per reader: a few hundred blocks, a small part of a
# shard, enough that reads of neighbouring records inflate their block once.
CACHE_BYTES = 16 << 20
# Blocks a batch needs beyond which they are inflated on the fetch pool's
# threads (zlib releases the GIL) rather than one after another.
_PARALLEL = 8


class Want(NamedTuple):
    """The records of one shard a batch reads: their uncompressed ``[lo, hi)``, sorted."""

    k: int  # the reader's range, the key of its blocks in the cache
    file: str  # for messages
    reader: fs.RangeReader
    table: Restarts
    lo: np.ndarray
    hi: np.ndarray


def block_where(file: str, table: Restarts, offset: int) -> str:
    """``offset`` of the uncompressed stream of ``file``, with the block holding it."""
    j = int(table.block_of(offset))
    return (
        f"byte offset {offset} of the uncompressed stream, in block {j} at compressed "
        f"byte offset {int(table.packed[j])}"
    )


def inflate(comp: bytes, want: int, reach: int, last: bool) -> bytes | str:
    """Block ``comp`` inflated, or what is wrong with it.

    Args:
        comp: The block's compressed bytes.
        want: The block's uncompressed size, by the index.
        reach: How much of it to inflate: ``want`` (the whole block,
            checked to end where the index says), or fewer (its first
            ``reach`` bytes: a read that needs no more stops there).
        last: Whether it is the stream's last block.
    """
    d = zlib.decompressobj(-15)
    try:
        out = d.decompress(comp, reach + 1 if reach == want else reach)
    except zlib.error as e:
        return f"an inflate error ({e})"
    if reach < want:
        return out if len(out) == reach else f"{len(out)} bytes"
    if len(out) != want:
        return f"{len(out) if len(out) <= want else 'more'} bytes"
    if d.unconsumed_tail or d.unused_data:
        return "the block's deflate data ending before its end in the index"
    if d.eof != last:
        return (
            "no final block at the stream's end"
            if last
            else "a final block (the stream ending) inside it"
        )
    return out


class Blocks:
    """Inflated blocks of the shards of one reader, read and checked as batches need them.

    Safe to share between threads (one lock around the LRU). Not pickled:
    a reader makes a new one in each process.

    Args:
        limit: The inflated bytes the LRU keeps (None: ``CACHE_BYTES``).
    """

    def __init__(self, limit: int | None = None) -> None:
        self._limit = CACHE_BYTES if limit is None else limit
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[int, int], bytes] = collections.OrderedDict()
        self._size = 0

    def _cached(self, key: tuple[int, int]) -> bytes | None:
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
            return got

    def _keep(self, key: tuple[int, int], data: bytes) -> None:
        if len(data) > self._limit:
            return
        with self._lock:
            old = self._cache.get(key)
            if old is not None and len(old) >= len(data):
                return
            self._cache[key] = data  # a longer prefix of the block replaces a shorter one
            self._cache.move_to_end(key)
            self._size += len(data) - (0 if old is None else len(old))
            while self._size > self._limit:
                _, old = self._cache.popitem(last=False)
                self._size -= len(old)

    def clear(self) -> None:
        """Drops every inflated block kept."""
        with self._lock:
            self._cache.clear()
            self._size = 0

    def gather(self, wants: Sequence[Want], remote: bool) -> list[tuple[bytes, np.ndarray]]:
        """For each :class:`Want`: a buffer of uncompressed bytes and where each record is in it.

        The buffer of a want holds the blocks its records touch, in order;
        record ``m`` is ``buffer[at[m] : at[m] + hi[m] - lo[m]]``.

        Args:
            wants: The records to read, one entry per shard.
            remote: Whether the files are remote: their range reads then go
                out together through :func:`superserial.storage.fetch.read_all`.

        Raises:
            CorruptDataError: A block does not inflate as its index says, or
                a file ends before a block.
        """
        needs: list[np.ndarray] = []
        missing: list[tuple[int, int, int]] = []  # (want, block, reach) not in the cache
        got: dict[tuple[int, int], bytes] = {}
        for w, want in enumerate(wants):
            need, reach = _blocks_of(want.table, want.lo, want.hi)
            needs.append(need)
            for j, r in zip(need.tolist(), reach.tolist(), strict=True):
                data = self._cached((want.k, j))
                if data is None:
                    missing.append((w, j, r))
                elif len(data) < r:  # touched again: now the whole block, once
                    missing.append((w, j, int(want.table.plain[j + 1] - want.table.plain[j])))
                else:
                    got[(want.k, j)] = data
        if missing:
            self._inflate_missing(wants, missing, got, remote)
        out: list[tuple[bytes, np.ndarray]] = []
        for want, need in zip(wants, needs, strict=True):
            # A block inflated in part is followed by none of the records' bytes.
            parts = [got[(want.k, j)] for j in need.tolist()]
            sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
            pos = np.zeros(len(parts), dtype=np.int64)
            np.cumsum(sizes[:-1], out=pos[1:])
            first = want.table.block_of(want.lo)
            at = pos[np.searchsorted(need, first)] + (want.lo - want.table.plain[first])
            out.append((parts[0] if len(parts) == 1 else b"".join(parts), at))
        return out

    def _inflate_missing(
        self,
        wants: Sequence[Want],
        missing: list[tuple[int, int, int]],
        got: dict[tuple[int, int], bytes],
        remote: bool,
    ) -> None:
        """Reads and inflates the ``missing`` blocks (as far as each needs) into ``got`` and the LRU."""
        comps = self._read_compressed(wants, [(w, j) for w, j, _ in missing], remote)

        def one(item: tuple[tuple[int, int, int], bytes]) -> bytes | str:
            (w, j, reach), comp = item
            table = wants[w].table
            want = int(table.plain[j + 1] - table.plain[j])
            return inflate(comp, want, reach, j == len(table.packed) - 2)

        items = list(zip(missing, comps, strict=True))
        if len(items) >= _PARALLEL:
            results = list(fetch.executor().map(one, items))
        else:
            results = [one(item) for item in items]
        for (w, j, _), result in zip(missing, results, strict=True):
            want = wants[w]
            if isinstance(result, str):
                raise _damaged(want.file, want.table, j, result)
            got[(want.k, j)] = result
            self._keep((want.k, j), result)

    def span(
        self, k: int, file: str, reader: fs.RangeReader, table: Restarts, lo: int, hi: int
    ) -> bytes:
        """The uncompressed bytes ``[lo, hi)`` of one record (for ``ds[i]``).

        A record in one block is read with one range read of the block and
        inflated only up to the record's end, the first time: a second read
        of the block inflates it whole, kept in the LRU. Else as :meth:`gather`.

        Raises:
            CorruptDataError: As :meth:`gather`.
        """
        j = int(table.block_of(lo))
        start = int(table.plain[j])
        if hi > int(table.plain[j + 1]):
            ((spanned, at),) = self.gather(
                [Want(k, file, reader, table, np.array([lo]), np.array([hi]))], remote=False
            )
            return spanned[int(at[0]) : int(at[0]) + hi - lo]
        key = (k, j)
        data = self._cached(key)
        if data is None or len(data) < hi - start:
            whole = int(table.plain[j + 1]) - start
            a, b = int(table.packed[j]), int(table.packed[j + 1])
            view = reader.view(b)
            comp = view[a:b] if view is not None else reader.read(a, b - a)
            got = inflate(comp, whole, whole if data else hi - start, j == len(table.packed) - 2)
            if isinstance(got, str):
                raise _damaged(file, table, j, got)
            data = got
            self._keep(key, data)
        return data[lo - start : hi - start]

    @staticmethod
    def _read_compressed(
        wants: Sequence[Want], missing: list[tuple[int, int]], remote: bool
    ) -> list[bytes]:
        """The compressed bytes of each ``missing`` block: neighbours with one read."""
        # Runs of consecutive blocks of one file, one range read each.
        runs: list[tuple[int, int, int]] = []  # (want, first block, last block + 1)
        for w, j in missing:
            if runs and runs[-1][0] == w and runs[-1][2] == j:
                runs[-1] = (w, runs[-1][1], j + 1)
            else:
                runs.append((w, j, j + 1))
        reads = []
        for w, a, b in runs:
            table = wants[w].table
            reads.append((wants[w].reader, int(table.packed[a]), int(table.packed[b])))
        if remote:
            datas = list(fetch.read_all(reads))
        else:
            datas = []
            for reader, lo, hi in reads:
                view = reader.view(hi)
                datas.append(view[lo:hi] if view is not None else reader.read(lo, hi - lo))
        comps: list[bytes] = []
        for (w, a, b), (_, lo, _), data in zip(runs, reads, datas, strict=True):
            packed = wants[w].table.packed
            for j0, j1 in itertools.pairwise(range(a, b + 1)):
                comps.append(data[int(packed[j0]) - lo : int(packed[j1]) - lo])
        return comps


def _damaged(file: str, table: Restarts, j: int, found: str) -> CorruptDataError:
    offset = int(table.packed[j])
    length = int(table.plain[j + 1] - table.plain[j])
    return CorruptDataError(
        f"expected block {j} of {file} at compressed byte offset {offset} to inflate to "
        f"{length} bytes as its index says, got {found} (a damaged block, or an index whose "
        "restart points disagree with the stream); the shard's other blocks still read",
        reason=f"damaged block at compressed byte offset {offset}",
    )


def _blocks_of(table: Restarts, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The blocks (sorted, each once) that hold the bytes ``[lo, hi)`` of the records.

    Returns:
        ``(blocks, reach)``: the blocks, and how many of each one's first
        bytes the records need (a block's records end before its end, or
        the block is needed whole: a record continues past it).
    """
    first = table.block_of(lo)
    last = table.block_of(hi - 1)
    sizes = np.diff(table.plain)
    reach = np.zeros(len(sizes), dtype=np.int64)
    np.maximum.at(reach, last, hi - table.plain[last])
    if np.array_equal(first, last):
        need: np.ndarray = np.unique(first)
        return need, reach[need]
    # Blocks from a record's first up to (not including) its last are needed whole.
    cover = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.add.at(cover, first, 1)
    np.add.at(cover, last, -1)
    whole = np.cumsum(cover[:-1]) > 0
    reach = np.where(whole, sizes, reach)
    need = np.flatnonzero(whole | (reach > 0))
    return need, reach[need]


def check_blocks(file: str, table: Restarts) -> tuple[int, str] | None:
    """Inflates every block of ``file`` from its own start, as its index says.

    The restart points are checked against the stream: each block inflates
    alone to exactly its bytes and ends where the next one starts, the last
    with the stream's final block. One block in memory at a time.

    Returns:
        None, or the first bad block and what is wrong with it.
    """
    with fs.open_range_reader(file) as reader:
        for j in range(len(table.packed) - 1):
            a, b = int(table.packed[j]), int(table.packed[j + 1])
            want = int(table.plain[j + 1] - table.plain[j])
            try:
                comp = reader.read(a, b - a)
            except CorruptDataError as e:
                return j, f"the file ending first ({e.reason})"
            got = inflate(comp, want, want, j == len(table.packed) - 2)
            if isinstance(got, str):
                return j, got
    return None


def range_records(
    directory: str, shard: Shard, file: str, start: int, count: int, compression: str
) -> Iterator[tuple[bytes, str]]:
    """Records ``start .. start+count-1`` of a compressed shard, read from the block holding ``start``.

    The shard's index gives the record's offset in the stream and the restart
    block holding it; the records are inflated from that block on, not from the
    start of the file, so readers splitting a shard by records each inflate
    only their share.

    Args:
        directory: The dataset directory (where the shard's index file is).
        shard: The shard as the header lists it.
        file: The shard file's path.
        start: The first record read.
        count: How many are read.
        compression: ``"GZIP"`` or ``"ZLIB"``.

    Raises:
        UnsupportedError: The shard has no index (written before restart points).
        CorruptDataError: The index, a block or a record is damaged.
    """
    if shard.index is None:
        raise UnsupportedError(
            f"expected restart points in the {compression} shard {file} to read it from record "
            f"{start}, got none (written before restart points existed); rewrite the dataset "
            f"with `superserial convert {directory} -o NEW_PATH --compression {compression}`"
        )
    table = read_restarts(directory, shard, compression)
    offset = int(table.offsets[start])
    j = int(table.block_of(offset))
    yield from inflated_range_records(
        file,
        start,
        count,
        shard.records,
        packed=int(table.packed[j]),
        skip=offset - int(table.plain[j]),
        offset=offset,
    )

"""The streaming side of the cache: shards fetched ahead in reader order, never over the limit.

When a sequential reader's shards do not all fit in ``cache_limit``,
:func:`superserial.read.opening.open_dataset` (asked with ``stream=True``)
gives it a :class:`Stream` instead of a view of every shard. A pass over the
data then goes one of two ways, each with its own view in the cache of
:mod:`superserial.read.cache.directory` (same entries, views, locks and checks):

* :meth:`Stream.tee` (the numpy reader, hence torch's ``TorchDataset``, and
  tf.data's ``load``, wherever read-ahead applies): the reader reads ahead as
  without a cache (:mod:`superserial.read.readahead`), the shards the cache holds
  from their copies, and a :class:`Tee` keeps a copy of each other shard as its
  blocks are read, checked against the header once complete. The reader never
  waits for a download, and no request is made twice.
* :meth:`Stream.files` (read-ahead off, or a reader it does not serve): whole
  shards are fetched in the order the reader reads them, in a background
  thread, as many ahead as fit beside the one being read, each yielded once
  checked; the view's links to a shard are dropped once the reader has moved
  to the next (its entry stays in the cache, least recently used, evictable).

Either way, before a download (or a copy) starts, under the cache's lock, the
bytes on disk of ``entries/``, ``views/`` and ``tmp/`` are counted (each inode
once: a view's link to an entry costs nothing, an evicted entry a view still
links costs its size; a download in progress counts its full size from the
moment it starts), least recently used entries no view links are evicted, and
the shard is fetched only if it then fits. Otherwise :meth:`Stream.files` waits
for the reader to move on (or, when the reader holds nothing, for other readers
of the directory to free room, up to :data:`WAIT_SECONDS`), and a :class:`Tee`
reads the shard without a copy. So the bytes of files in the directory never
exceed ``cache_limit`` while the readers over it stream with that limit (an
eager reader, when it evicts, counts ``entries/`` alone, as it always has).

A shard larger than the limit is a ``ValueError`` before anything is
downloaded. The random-access readers pin what fits instead
(:mod:`superserial.read.cache.pins`), counting the bytes on disk the same way
(:func:`make_room`) and storing entries the same way (:func:`store`).

This module does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import BinaryIO

import google_crc32c

from superserial.errors import CorruptDataError
from superserial.format.header import Header
from superserial.read.cache.directory import (
    TMP_RE,
    CacheDir,
    Entry,
    Lease,
    check_download,
    entry_of,
)
from superserial.storage import fetch, fs

__all__ = ["INDEX_AHEAD_BYTES", "WAIT_SECONDS", "Stream", "Tee", "make_room", "plan", "store"]

log = logging.getLogger("superserial")

# How long a pass waits for other readers of the directory to free room for the
# one shard it needs (holding nothing itself), before it gives up.
WAIT_SECONDS = 60.0
_POLL = 0.05
# A Tee fetches the indexes of the shards it will copy ahead, up to this many bytes
# of them (and always the next one). Each is a round trip the copy's end waits for:
# fetched a fixed two shards ahead, a reader that decodes a shard in less than a
# round trip waited for each (75 ms of a 0.3 s epoch over nginx +50 ms).
INDEX_AHEAD_BYTES = 8 << 20


def plan(
    path: str, header: Header, shards: Sequence[int], cache_dir: str, limit: int
) -> Stream | None:
    """A :class:`Stream` when ``shards`` do not all fit ``limit``; None when they do.

    Raises:
        ValueError: One shard (with its index) is larger than ``limit``.
    """
    entries = [entry_of(path, header.shards[k]) for k in shards]
    if sum(e.nbytes for e in entries) <= limit:
        return None
    for k, e in zip(shards, entries, strict=True):
        if e.nbytes > limit:
            raise ValueError(
                f"expected every shard of {path} to fit cache_limit={limit} bytes (a reader "
                f"streams the shards through the cache one or more at a time), got shard "
                f"{header.shards[k].file} of {e.nbytes} bytes with its index"
            )
    return Stream(path, header, tuple(shards), os.fspath(cache_dir), limit)


class Stream:
    """The shards of one reader, to be streamed through the cache (plain data: picklable).

    Attributes:
        path: The dataset's URL.
        header: Its whole header.
        shards: Indices into ``header.shards`` of the shards read, in order.
        cache_dir: The cache directory.
        limit: The most bytes the cache directory holds.
    """

    def __init__(
        self, path: str, header: Header, shards: tuple[int, ...], cache_dir: str, limit: int
    ) -> None:
        self.path = path
        self.header = header
        self.shards = shards
        self.cache_dir = cache_dir
        self.limit = limit

    @property
    def nbytes(self) -> int:
        """The bytes of the shards (and indexes) together."""
        return sum(entry_of(self.path, self.header.shards[k]).nbytes for k in self.shards)

    def subset(self, positions: Sequence[int]) -> Stream:
        """The stream of ``self.shards[p]`` for each of ``positions``, in that order."""
        shards = tuple(self.shards[p] for p in positions)
        return Stream(self.path, self.header, shards, self.cache_dir, self.limit)

    def tee(self) -> Tee:
        """A pass that reads the shards remotely, ahead, and keeps copies of what it read.

        See :class:`Tee`: the reader gets the bytes as fast as without a cache,
        and the cache still fills, bounded and checked.
        """
        return Tee(self)

    def files(self) -> Iterator[str]:
        """Yields the local path of each shard in order, fetching ahead in a thread.

        A path stays readable until the next one is asked for (or the
        generator is closed): then its view links are dropped.

        Raises:
            CorruptDataError: A download disagrees with the header.
            ValueError: A shard did not fit beside what other readers hold,
                for :data:`WAIT_SECONDS`.
        """
        return _Pass(self).run()

    def __repr__(self) -> str:
        return f"Stream({self.path!r}, {len(self.shards)} shard(s), limit {self.limit})"


class _Pass:
    """One pass over a :class:`Stream`: its view, its fetching thread, what it holds."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.entries = [entry_of(stream.path, stream.header.shards[k]) for k in stream.shards]
        self.cache = CacheDir(stream.cache_dir)
        self.cond = threading.Condition()
        self.ready = 0  # shards 0 .. ready-1 are linked in the view
        self.wanted = 0  # the shard the reader waits for or reads
        self.error: BaseException | None = None
        self.stop = False

    def run(self) -> Iterator[str]:
        with self.cache.locked():
            self.cache.collect()
            view, fd = self.cache.new_view()
        self.view = view
        lease = Lease(view, fd)
        thread = threading.Thread(target=self._ahead, name="superserial-cache", daemon=True)
        thread.start()
        try:
            for i, e in enumerate(self.entries):
                with self.cond:
                    self.wanted = i
                    self.cond.notify_all()
                    while self.ready <= i and self.error is None:
                        self.cond.wait()
                    if self.error is not None:
                        raise self.error
                yield os.path.join(view, e.files[0][0])
                self._drop(e)
        finally:
            with self.cond:
                self.stop = True
                self.cond.notify_all()
            thread.join()
            lease.close()

    def _drop(self, entry: Entry) -> None:
        with self.cache.locked():
            for name, _, _ in entry.files:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.view, name))
        with self.cond:
            self.cond.notify_all()

    def _ahead(self) -> None:
        try:
            for i, e in enumerate(self.entries):
                if not self._fetch(i, e):
                    return
                with self.cond:
                    self.ready = i + 1
                    self.cond.notify_all()
        except BaseException as err:  # noqa: BLE001  # handed to the reader, raised there
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _fetch(self, i: int, entry: Entry) -> bool:
        """Links entry ``i`` into the view, downloading it when room is made; False: stopped."""
        cache = self.cache
        with cache.flock(os.path.join(cache.fetches, entry.name + ".lock")):
            since: float | None = None
            while True:
                with cache.locked():
                    if cache.link(entry, self.view):
                        return True
                    used = make_room(cache, entry.nbytes, self.stream.limit)
                    if used + entry.nbytes <= self.stream.limit:
                        tmp = os.path.join(
                            cache.tmp, f"{os.getpid()}-{uuid.uuid4().hex[:12]}-{entry.name}"
                        )
                        os.mkdir(tmp)  # counted at its full size from now on
                        break
                with self.cond:
                    if self.stop:
                        return False
                    alone = self.wanted == i  # the reader holds nothing: others must free room
                    if alone:
                        since = time.monotonic() if since is None else since
                        if time.monotonic() - since > WAIT_SECONDS:
                            raise ValueError(
                                f"expected room in cache_limit={self.stream.limit} bytes of "
                                f"{cache.root} for shard {entry.files[0][0]} of {self.stream.path} "
                                f"({entry.nbytes} bytes), got {used} bytes held by other readers "
                                f"for {WAIT_SECONDS:.0f} s"
                            )
                    self.cond.wait(_POLL)
            store(cache, entry, tmp, self.view)
        log.debug("cache %s: streamed %s", cache.root, entry.files[0][0])
        return True


class _Copy:
    """One shard being copied into the cache as the reader reads it."""

    def __init__(self, entry: Entry, tmp: str, lock: int) -> None:
        self.entry, self.tmp, self.lock = entry, tmp, lock
        name = entry.files[0][0]
        self.out: BinaryIO = open(os.path.join(tmp, name), "wb")  # noqa: SIM115  # closed by the Tee
        self.crc = 0
        self.n = 0


class Tee:
    """One sequential pass that reads remote shards ahead and keeps copies of what it read.

    The reader reads its spans through :class:`superserial.read.readahead.Stream`
    (requests in flight ahead of it, within the read-ahead budget, whatever the
    ``cache_limit``), pointed (by :meth:`local`) at the cached copies of the shards
    the cache holds. Each block of a remote shard is handed to :meth:`feed` as
    the reader reaches it, and written to a download of the shard's entry in
    ``tmp/``, whose CRC-32C grows with it (its index comes in one request,
    fetched ahead, up to :data:`INDEX_AHEAD_BYTES` of them). So the reader
    never waits for a download, and the cache fills as it did:

    * a copy starts only at the shard's first byte, holding the entry's fetch
      lock (not waited for: another process already downloading the entry
      leaves this pass reading remotely), and only if, under the cache's lock,
      the shard fits ``cache_limit`` beside every byte on disk (:func:`make_room`,
      least recently used entries no view links evicted first; its ``tmp/``
      counts its full size from then on). Otherwise the shard is read remotely,
      not copied: the limit is never exceeded.
    * once its last byte is read, the shard's size and CRC-32C and its index's
      are checked against the header: a mismatch is a
      :class:`~superserial.errors.CorruptDataError` naming the remote file,
      raised to the reader, and nothing of it is cached. Else the entry is
      stored (least recently used first to go), and its lock let go.
    * a copy the reader leaves unfinished (a part of a shard, a pass closed
      early) is removed.

    Every byte the reader gets was checked as a read without a cache checks it
    (each record's CRC-32Cs); the whole shard's CRC-32C guards what is kept.
    """

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.cache = CacheDir(stream.cache_dir)
        self.entries = {
            stream.header.shards[k].file: entry_of(stream.path, stream.header.shards[k])
            for k in stream.shards
        }
        self.order = [stream.header.shards[k].file for k in stream.shards]
        self._position = {name: pos for pos, name in enumerate(self.order)}
        with self.cache.locked():
            self.cache.collect()
            view, fd = self.cache.new_view()
            self.lease = Lease(view, fd)
            # Shards the cache holds are read from it (linked for the pass: kept).
            self.held = {n for n, e in self.entries.items() if self.cache.link(e, view)}
        self.view = view
        self._copy: _Copy | None = None
        # The indexes of the next shards to copy, fetched ahead (a small GET each, in
        # memory): one fetched when its shard's copy starts would be waited for at its
        # end, queued behind the reader's large requests.
        self._indexes: dict[str, Future[bytes]] = {}
        self._index_ahead(0)

    def local(self, name: str) -> str | None:
        """The cached copy of shard file ``name`` this pass reads, or None (read remotely)."""
        return os.path.join(self.view, name) if name in self.held else None

    def feed(self, file: str, start: int, data: bytes) -> None:
        """Keeps a copy of bytes ``[start, start + len(data))`` of ``file`` the reader reached.

        Raises:
            CorruptDataError: The shard's last bytes came and it (or its index)
                disagrees with the header.
        """
        name = fs.basename(file)
        copy = self._copy
        if copy is not None and (copy.entry.files[0][0] != name or start != copy.n):
            self._abort()  # the reader left that shard before its end
            copy = None
        if copy is None:
            entry = self.entries.get(name)
            if start != 0 or entry is None or name in self.held or not data:
                return  # not a shard's first bytes, or one read from the cache
            copy = self._copy = self._begin(entry)
            if copy is None:
                return  # no room, or another process downloads it: read, not copied
        copy.out.write(data)
        copy.crc = google_crc32c.extend(copy.crc, data)
        copy.n += len(data)
        if copy.n >= copy.entry.files[0][1]:
            self._finish(copy)

    def _index_ahead(self, at: int) -> None:
        """Fetches the indexes of the shards to copy from position ``at`` on.

        As many as :data:`INDEX_AHEAD_BYTES` allows beside those fetched and
        not used yet, and always the one at ``at``; those of shards before
        ``at`` (passed without a copy) are let go.
        """
        for name in [n for n in self._indexes if self._position[n] < at]:
            self._indexes.pop(name).cancel()
        ahead = sum(self.entries[name].files[1][1] for name in self._indexes)
        for pos in range(at, len(self.order)):
            name = self.order[pos]
            entry = self.entries[name]
            if name in self.held or name in self._indexes or len(entry.files) < 2:
                continue
            index, nbytes, _ = entry.files[1]
            if pos > at and ahead + nbytes > INDEX_AHEAD_BYTES:
                break
            if nbytes:
                src = fs.join(entry.url, index)
                self._indexes[name] = fetch.executor().submit(_read_whole, src, nbytes)
                ahead += nbytes

    def _begin(self, entry: Entry) -> _Copy | None:
        cache = self.cache
        name = entry.files[0][0]
        self._index_ahead(self._position[name])
        lock = cache.try_flock(os.path.join(cache.fetches, entry.name + ".lock"))
        if lock is None:
            return None  # another process downloads it
        try:
            with cache.locked():
                if os.path.isdir(os.path.join(cache.entries, entry.name)):
                    cache.unlock(lock)
                    return None  # stored since this pass began
                used = make_room(cache, entry.nbytes, self.stream.limit)
                if used + entry.nbytes > self.stream.limit:
                    cache.unlock(lock)
                    return None
                tmp = os.path.join(cache.tmp, f"{os.getpid()}-{uuid.uuid4().hex[:12]}-{entry.name}")
                os.mkdir(tmp)  # counted at its full size from now on
        except BaseException:
            cache.unlock(lock)
            raise
        try:
            return _Copy(entry, tmp, lock)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            cache.unlock(lock)
            raise

    def _finish(self, copy: _Copy) -> None:
        self._copy = None
        cache, entry = self.cache, copy.entry
        try:
            copy.out.close()
            name, nbytes, crc = entry.files[0]
            check_download(
                cache.root, fs.join(entry.url, name), nbytes, crc, copy.n, f"{copy.crc:08x}"
            )
            index = self._indexes.pop(name, None)
            if len(entry.files) > 1:
                name, nbytes, crc = entry.files[1]
                data = b"" if index is None else index.result()
                got_crc = f"{google_crc32c.value(data):08x}"
                check_download(
                    cache.root, fs.join(entry.url, name), nbytes, crc, len(data), got_crc
                )
                with open(os.path.join(copy.tmp, name), "wb") as out:
                    out.write(data)
            with cache.locked():
                dst = os.path.join(cache.entries, entry.name)
                if not os.path.isdir(dst):  # else another process stored it (same bytes)
                    os.rename(copy.tmp, dst)
            log.debug("cache %s: kept %s as it was read", cache.root, entry.files[0][0])
        finally:
            self._drop(copy)

    def _drop(self, copy: _Copy) -> None:
        copy.out.close()
        shutil.rmtree(copy.tmp, ignore_errors=True)
        self.cache.unlock(copy.lock)

    def _abort(self) -> None:
        copy, self._copy = self._copy, None
        if copy is not None:
            self._drop(copy)

    def close(self) -> None:
        """Removes an unfinished copy and this pass's view (its cached copies stay cached)."""
        self._abort()
        for index in self._indexes.values():
            index.cancel()
        self._indexes.clear()
        self.lease.close()


def _read_whole(src: str, nbytes: int) -> bytes:
    """The bytes of ``src``, asked for one past ``nbytes`` (a longer file shows, one request)."""
    with fs.open_range_reader(src) as reader:
        return reader.read_some(0, nbytes + 1)


def store(cache: CacheDir, entry: Entry, tmp: str, view: str) -> None:
    """Downloads ``entry`` into its reserved ``tmp``, stores it and links it into ``view``.

    Call holding the entry's fetch lock, not the cache's lock; ``tmp`` is
    removed whatever happens.

    Raises:
        CorruptDataError: A file's size or CRC-32C disagrees with the header.
    """
    try:
        cache.download(entry, tmp)
        with cache.locked():
            dst = os.path.join(cache.entries, entry.name)
            if not os.path.isdir(dst):
                os.rename(tmp, dst)
            if not cache.link(entry, view):
                raise CorruptDataError(
                    f"expected the entry {entry.name} in {cache.entries} just stored, found it gone"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_room(cache: CacheDir, nbytes: int, limit: int) -> int:
    """Evicts LRU entries no view links until ``nbytes`` more fit; the bytes then used.

    Call locked.
    """
    used, free = _usage(cache)
    for _, name, size in sorted(free):
        if used + nbytes <= limit:
            break
        log.debug("cache %s: evicting %s (%d bytes)", cache.root, name, size)
        cache.remove(name)
        used -= size
    return used


def _usage(cache: CacheDir) -> tuple[int, list[tuple[int, str, int]]]:
    """The bytes of files in the cache (each inode once), and the entries eviction frees.

    Downloads in progress count their full size. Returns ``(used, [(mtime_ns,
    name, bytes)])`` of the entries whose files no view links.
    """
    seen: set[tuple[int, int]] = set()
    used = 0
    free = []

    def add(file: str) -> os.stat_result | None:
        nonlocal used
        try:
            st = os.stat(file)
        except FileNotFoundError:
            return None
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            used += st.st_size
        return st

    for name in os.listdir(cache.entries):
        where = os.path.join(cache.entries, name)
        stats = [add(os.path.join(where, f)) for f in _listdir(where)]
        alone = [st for st in stats if st is not None and st.st_nlink == 1]
        if stats and len(alone) == len(stats):  # no view links it: evicting frees its bytes
            with contextlib.suppress(FileNotFoundError):
                free.append((os.stat(where).st_mtime_ns, name, sum(st.st_size for st in alone)))
    for name in os.listdir(cache.views):
        where = os.path.join(cache.views, name)
        for f in _listdir(where):
            add(os.path.join(where, f))
    for name in os.listdir(cache.tmp):
        m = TMP_RE.match(name)
        where = os.path.join(cache.tmp, name)
        if m is not None and m.group(1) != "evicted":
            used += int(m.group(1).rpartition("-")[2])  # reserved at its full size
            continue
        for f in _listdir(where):
            add(os.path.join(where, f))
    return used, free


def _listdir(where: str) -> list[str]:
    try:
        return os.listdir(where)
    except (FileNotFoundError, NotADirectoryError):
        return []

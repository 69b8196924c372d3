"""A local cache of remote datasets' shards: fetched once, checked, shared, bounded.

``load(url, cache_dir=DIR, cache_limit="20GB")`` (and the numpy, torch and
Grain readers) open the dataset through
:func:`superserial.read.opening.open_dataset`, which calls :func:`localize`:
it returns local copies of the shard files (and their record indexes) the
reader needs; the rest of the reader then reads an ordinary local dataset. Each shard is downloaded once, through
:mod:`superserial.storage.fs`, and checked against its size and CRC-32C from the
header before it is used or kept: a bad download is a
:class:`~superserial.errors.CorruptDataError` naming the remote file, and is
never cached. Later loads (later epochs, other processes) read the copy.

The cache directory::

    DIR/lock                    flock'd around every change of entries/ and views/
    DIR/entries/KEY-BYTES/      one shard: its file and its index, under their own names
    DIR/views/ID/               one open reader's shards: hard links to entries
    DIR/views/ID.lock           flock'd by the process holding that reader open
    DIR/fetch/KEY-BYTES.lock    flock'd while a process downloads that entry (empty
                                files, kept: one per shard ever fetched)
    DIR/tmp/                    downloads in progress (live while their fetch lock is
                                held), entries being removed

* **Keys.** ``KEY`` hashes the shard's URL with the size and CRC-32C of the
  shard and of its index, as the header gives them. A dataset overwritten at
  the same path (even with the same shard names) has new CRCs, so it never
  reads a stale copy. The header itself is read from the remote path on
  every load.
* **Bound.** ``cache_limit`` bounds the bytes of ``entries/``. After each
  download, least recently used entries are removed until the total fits
  (recency: the last load that used the entry). One reader's own shards must
  fit, or :func:`localize` raises ``ValueError`` before downloading. A
  sequential reader whose shards do not fit streams them instead, through the
  same entries and views, keeping copies of what it reads
  (:mod:`superserial.read.cache.stream`); a
  random-access reader pins as many as fit and reads the others remotely
  (:mod:`superserial.read.cache.pins`).
* **Sharing.** Any number of processes (and threads) may use one directory at
  once. Downloads go to ``tmp/`` and are renamed into place, so an entry is
  complete or absent; one process downloads an entry while the others wait
  for it (``fetch/``). Each reader reads hard links in its own view, so an
  entry evicted meanwhile stays readable by the readers that hold it (its
  disk space is freed when the last one is closed or garbage collected). Views
  and downloads of dead processes (their locks free) are removed by the next
  :func:`localize`.
* **Local paths** are not cached: :func:`localize` returns their own files.

POSIX only (``fcntl.flock``, hard links). This module does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import google_crc32c

from superserial.base.sizes import parse_size
from superserial.errors import CorruptDataError, RemoteReadError, UnsupportedError
from superserial.format import layout
from superserial.format.header import Header, Shard
from superserial.storage import fetch, fs

__all__ = [
    "DOWNLOAD_AHEAD",
    "DOWNLOAD_PIECE",
    "TMP_RE",
    "CacheDir",
    "Entry",
    "Lease",
    "Localized",
    "check_download",
    "download_file",
    "entry_of",
    "localize",
]

log = logging.getLogger("superserial")

_ENTRY_RE = re.compile(r"^[0-9a-f]{32}-(\d+)$")
# Names in tmp/: PID-HEX-ENTRY (a download of ENTRY), PID-HEX-evicted (an entry being removed).
TMP_RE = re.compile(r"^\d+-[0-9a-f]+-(evicted|[0-9a-f]{32}-\d+)$")

# Descriptors of the locks this process holds in CacheDir.flock. A forked child
# (a DataLoader worker) inherits copies of them; a lock lasts while any copy is
# open, so the child would hold a background thread's lock for its whole life,
# long after the thread let it go in the parent. The child closes its copies.
_held: set[int] = set()


def _close_held() -> None:
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held)


# A remote file is downloaded in pieces of this size, this many in flight: one
# request at a time carries a fraction of what parallel ranges do on an object
# store (each waits its time to first byte). In memory: at most DOWNLOAD_PIECE * DOWNLOAD_AHEAD.
DOWNLOAD_PIECE = 1 << 20
DOWNLOAD_AHEAD = 16


def download_file(src: str, dst: str, nbytes: int) -> tuple[int, str]:
    """Copies ``src`` to the local ``dst``: the bytes copied and their CRC-32C (hex).

    A remote file the header says is ``nbytes`` long is read in parallel range
    requests through the process's fetch pool, written in order, with no request
    for its size: the last piece asks for one byte past ``nbytes``, so a longer
    file shows as one byte more and a shorter one as fewer (which the caller
    reports). Anything else (a local file, a small one, or a call from a
    fetch-pool thread, which must not wait on its own pool) is copied in one stream.
    """
    on_pool = threading.current_thread().name.startswith("superserial-fetch")
    if fs.is_local(src) or nbytes <= DOWNLOAD_PIECE or on_pool:
        return fs.copy_file(src, dst)
    with fs.open_range_reader(src) as reader:
        if not reader.concurrent:
            return fs.copy_file(src, dst)
        pool = fetch.executor()
        starts = iter(range(0, nbytes, DOWNLOAD_PIECE))
        pending: deque[tuple[int, Future[bytes]]] = deque()

        def submit() -> None:
            a = next(starts, None)
            if a is not None:
                n = min(DOWNLOAD_PIECE, nbytes - a)
                # The last piece asks for one byte more: is the file longer than the header says?
                want = n + 1 if a + n == nbytes else n
                pending.append((want, pool.submit(reader.read_some, a, want)))

        crc, n = 0, 0
        try:
            for _ in range(DOWNLOAD_AHEAD):
                submit()
            with open(dst, "wb") as out:
                while pending:
                    want, future = pending.popleft()
                    try:
                        chunk = future.result()
                    except RemoteReadError:
                        # A piece wholly past the end of a shorter file (a 416), or a
                        # failure: only then is the size asked for, to tell which.
                        if fs.size(src) < nbytes:
                            break
                        raise
                    submit()
                    crc = google_crc32c.extend(crc, chunk)
                    n += len(chunk)
                    out.write(chunk)
                    if len(chunk) < want:
                        break  # the file ends here
        finally:
            for _, f in pending:
                f.cancel()
    return n, f"{crc:08x}"


def check_download(
    root: str, src: str, nbytes: int, crc: str, got_bytes: int, got_crc: str
) -> None:
    """Raises the error of a download of ``src`` that disagrees with its header.

    Raises:
        CorruptDataError: ``(got_bytes, got_crc)`` is not ``(nbytes, crc)``.
    """
    if (got_bytes, got_crc) == (nbytes, crc):
        return
    got = f"{got_bytes} bytes of crc32c {got_crc}"
    raise CorruptDataError(
        f"expected {nbytes} bytes of crc32c {crc} in {src} (as its header "
        f"says), downloaded {got}; not cached in {root} (is the dataset being "
        "overwritten, or damaged? `superserial verify` tells)",
        reason=f"expected {nbytes} bytes of crc32c {crc}, downloaded {got}",
    )


class Lease:
    """Keeps one reader's view of the cache: its files stay until the lease is closed.

    Closed by :meth:`close` or when garbage collected; only in the process
    that made it (a forked or unpickled copy holds nothing and removes
    nothing: the original keeps the files).
    """

    def __init__(self, view: str | None = None, fd: int | None = None) -> None:
        self.view = view
        self._finalizer = (
            None
            if view is None or fd is None
            else weakref.finalize(self, _release, view, fd, os.getpid())
        )

    def close(self) -> None:
        """Removes the view (files already open keep reading, as POSIX allows)."""
        if self._finalizer is not None:
            self._finalizer()

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # A pickled reader (a DataLoader or Grain worker) reads the files its
        # parent's lease keeps; the copy itself holds nothing.
        return (Lease, ())

    def __repr__(self) -> str:
        return f"Lease({self.view!r})"


def _release(view: str, fd: int, pid: int) -> None:
    if os.getpid() != pid:
        return  # a fork's copy: the parent removes the view
    shutil.rmtree(view, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(view + ".lock")
    os.close(fd)


class Localized(NamedTuple):
    """What :func:`localize` gives a reader.

    Attributes:
        path: The directory to read: the cache view (or ``path`` itself when
            nothing is cached).
        files: The local paths of the shards asked for, in that order.
        lease: Keeps the view's files; hold it as long as the reader (None
            when nothing is cached).
        fetched: The shards this call downloaded (the others were in the cache).
    """

    path: str
    files: list[str]
    lease: Lease | None
    fetched: list[str]


class Entry(NamedTuple):
    """One cache entry: a shard of a remote dataset, with its index."""

    name: str  # KEY-BYTES
    url: str  # the dataset directory
    files: tuple[tuple[str, int, str], ...]  # (name, bytes, crc32c) of shard and index
    nbytes: int  # their total size


def entry_of(path: str, shard: Shard) -> Entry:
    url = str(path).rstrip("/")
    files = shard.files()
    key = "\n".join([fs.join(url, shard.file), *(f"{n}:{b}:{c}" for n, b, c in files)])
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    nbytes = sum(b for _, b, _ in files)
    return Entry(f"{digest}-{nbytes}", url, files, nbytes)


def localize(
    path: str,
    header: Header,
    shards: Sequence[int],
    cache_dir: str | os.PathLike[str] | None,
    cache_limit: int | str | None = None,
) -> Localized:
    """Local copies of shards ``shards`` of the dataset at ``path`` (the reader's hook).

    Args:
        path: The dataset directory or URL.
        header: Its header (read from ``path``).
        shards: Indices into ``header.shards`` of the shards to read.
        cache_dir: The cache directory (created if needed); None reads
            ``path`` directly.
        cache_limit: The most bytes the cache keeps (see :func:`superserial.base.sizes.parse_size`);
            None: no bound.

    Returns:
        The files to read, and the lease that keeps them. For a local
        ``path``, or no ``cache_dir``, the dataset's own files, checked as
        :func:`superserial.format.layout.shard_paths` checks them.

    Raises:
        ValueError: A bad ``cache_limit``, or one without ``cache_dir``, or
            the shards asked for are larger than it.
        CorruptDataError: A downloaded file's size or CRC-32C disagrees with
            the header (nothing is cached of it).
        UnsupportedError: No ``fcntl`` on this platform.
    """
    limit = parse_size(cache_limit, "cache_limit")
    if cache_dir is None and limit is not None:
        raise ValueError(
            f"expected a cache_dir with cache_limit={cache_limit!r} (the limit of what?), got none"
        )
    if cache_dir is None or fs.is_local(path):
        files = layout.shard_paths(path, header)
        return Localized(str(path), [files[k] for k in shards], None, [])
    entries = [entry_of(path, header.shards[k]) for k in shards]
    need = sum(e.nbytes for e in entries)
    if limit is not None and need > limit:
        raise ValueError(
            f"expected a cache_limit of at least the {need} bytes this reader needs of {path} "
            f"(its {len(entries)} shard(s) with their indexes), got {limit} bytes"
        )
    cache = CacheDir(os.fspath(cache_dir))
    with cache.locked():
        cache.collect()
        view, fd = cache.new_view()
        lease = Lease(view, fd)
        missing = [e for e in entries if not cache.link(e, view)]
    fetched = []
    for e in missing:
        if cache.fetch(e, view, limit):
            fetched.append(e.files[0][0])
    if len(shards) == len(header.shards):
        # Every shard is here: the view is a whole dataset (for `superserial verify`).
        with open(os.path.join(view, layout.HEADER_FILE), "w", encoding="utf-8") as f:
            f.write(header.to_json())
    log.debug(
        "cache %s: %s, %d of %d shard(s) fetched", cache.root, path, len(fetched), len(entries)
    )
    files = [os.path.join(view, header.shards[k].file) for k in shards]
    return Localized(view, files, lease, fetched)


class CacheDir:
    """The cache directory: locking, entries, views (see the module docstring)."""

    def __init__(self, root: str) -> None:
        try:
            import fcntl
        except ImportError as e:  # pragma: no cover - POSIX CI only
            raise UnsupportedError(
                f"expected a POSIX system for cache_dir={root!r} (it locks with fcntl.flock), "
                "got one without fcntl; read without cache_dir"
            ) from e
        self._fcntl = fcntl
        self.root = os.path.abspath(root)
        self.entries = os.path.join(self.root, "entries")
        self.views = os.path.join(self.root, "views")
        self.fetches = os.path.join(self.root, "fetch")
        self.tmp = os.path.join(self.root, "tmp")
        for d in (self.entries, self.views, self.fetches, self.tmp):
            os.makedirs(d, exist_ok=True)

    @contextlib.contextmanager
    def flock(self, file: str) -> Iterator[None]:
        # A new open file description per use: flock then excludes threads of
        # this process as well as other processes.
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        _held.add(fd)
        try:
            self._fcntl.flock(fd, self._fcntl.LOCK_EX)
            yield
        finally:
            _held.discard(fd)
            os.close(fd)

    def try_flock(self, file: str) -> int | None:
        """Takes the lock of ``file`` if it is free: its descriptor (close it to let go), or None."""
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._fcntl.flock(fd, self._fcntl.LOCK_EX | self._fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        _held.add(fd)
        return fd

    def unlock(self, fd: int) -> None:
        """Lets go of a lock :meth:`try_flock` took."""
        _held.discard(fd)
        os.close(fd)

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Holds the cache's lock: entries and views change only under it."""
        return self.flock(os.path.join(self.root, "lock"))

    def new_view(self) -> tuple[str, int]:
        """A new empty view and the descriptor holding its lock (call locked)."""
        view = os.path.join(self.views, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
        os.mkdir(view)
        fd = os.open(view + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._fcntl.flock(fd, self._fcntl.LOCK_EX | self._fcntl.LOCK_NB)
        return view, fd

    def link(self, entry: Entry, view: str) -> bool:
        """Links a cached entry's files into ``view`` and marks it used; False if absent.

        Call locked. An entry whose files are not of the expected sizes (changed
        behind the cache's back) is removed and counts as absent.
        """
        where = os.path.join(self.entries, entry.name)
        try:
            sizes = [os.stat(os.path.join(where, n)).st_size for n, _, _ in entry.files]
        except FileNotFoundError:
            if os.path.isdir(where):
                self.remove(entry.name)
            return False
        if sizes != [b for _, b, _ in entry.files]:
            log.warning(
                "cache %s: entry %s has files of other sizes; fetching again", self.root, where
            )
            self.remove(entry.name)
            return False
        for name, _, _ in entry.files:
            src, dst = os.path.join(where, name), os.path.join(view, name)
            try:
                os.link(src, dst)
            except OSError:  # no hard links here (some network filesystems): copy
                shutil.copyfile(src, dst)
        # The clock's own nanoseconds, not the filesystem's "now" (utime with no times),
        # which advances a kernel tick (1-4 ms) at a time: two entries used within one
        # tick tied, and eviction then took the one used last (CI saw it).
        now = time.time_ns()
        os.utime(where, ns=(now, now))
        return True

    def fetch(self, entry: Entry, view: str, limit: int | None) -> bool:
        """Downloads an entry, checks it, puts it in the cache and links it into ``view``.

        Returns:
            True if this call downloaded it, False if another process did meanwhile.

        Raises:
            CorruptDataError: A file's size or CRC-32C disagrees with the header.
        """
        with self.flock(os.path.join(self.fetches, entry.name + ".lock")):
            with self.locked():
                if self.link(entry, view):
                    return False
            tmp = os.path.join(self.tmp, f"{os.getpid()}-{uuid.uuid4().hex[:12]}-{entry.name}")
            os.mkdir(tmp)
            try:
                self.download(entry, tmp)
                with self.locked():
                    dst = os.path.join(self.entries, entry.name)
                    if not os.path.isdir(dst):  # else another process beat us to it (same bytes)
                        os.rename(tmp, dst)
                    if not self.link(entry, view):
                        raise CorruptDataError(
                            f"expected the entry {entry.name} in {self.entries} just stored, "
                            "found it gone"
                        )
                    self.evict(limit)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return True

    def download(self, entry: Entry, tmp: str) -> None:
        """Downloads an entry's files into the directory ``tmp``, checking each.

        Raises:
            CorruptDataError: A file's size or CRC-32C disagrees with the header.
        """
        for name, nbytes, crc in entry.files:
            src = fs.join(entry.url, name)
            got_bytes, got_crc = download_file(src, os.path.join(tmp, name), nbytes)
            check_download(self.root, src, nbytes, crc, got_bytes, got_crc)

    def evict(self, limit: int | None) -> None:
        """Removes least recently used entries until the rest fit ``limit`` (call locked)."""
        if limit is None:
            return
        found = []
        with os.scandir(self.entries) as it:
            for d in it:
                m = _ENTRY_RE.match(d.name)
                if m is not None:
                    with contextlib.suppress(FileNotFoundError):
                        found.append((d.stat().st_mtime_ns, d.name, int(m.group(1))))
        total = sum(n for _, _, n in found)
        for _, name, nbytes in sorted(found):
            if total <= limit:
                break
            log.debug("cache %s: evicting %s (%d bytes)", self.root, name, nbytes)
            self.remove(name)
            total -= nbytes

    def remove(self, name: str) -> None:
        """Removes an entry: renamed away first, so it is never seen half removed."""
        gone = os.path.join(self.tmp, f"{os.getpid()}-{uuid.uuid4().hex[:12]}-evicted")
        os.rename(os.path.join(self.entries, name), gone)
        shutil.rmtree(gone, ignore_errors=True)
        # Its fetch lock file stays: a process may hold or wait on it right now, and
        # removing it would let a second lock file (and download) appear beside it.

    def collect(self) -> None:
        """Removes the views and downloads of processes that are gone (call locked)."""
        for name in os.listdir(self.views):
            if not name.endswith(".lock"):
                continue
            lock = os.path.join(self.views, name)
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                self._fcntl.flock(fd, self._fcntl.LOCK_EX | self._fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # held: its reader is alive
            finally:
                os.close(fd)
            shutil.rmtree(lock.removesuffix(".lock"), ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock)
        for name in os.listdir(self.tmp):
            m = TMP_RE.match(name)
            # A download is live while its fetch lock is held (by a lock, not a pid: the
            # processes sharing a directory may be in different pid namespaces).
            if m is None or (m.group(1) != "evicted" and self._busy(m.group(1))):
                continue
            shutil.rmtree(os.path.join(self.tmp, name), ignore_errors=True)

    def _busy(self, entry: str) -> bool:
        """Whether a process holds the fetch lock of ``entry`` (is downloading it)."""
        try:
            fd = os.open(os.path.join(self.fetches, entry + ".lock"), os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            self._fcntl.flock(fd, self._fcntl.LOCK_EX | self._fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

"""Partial pinning: a random-access reader's shards, as many whole ones as fit the cache.

When the shards a random-access reader (``ds[i]``, ``get_batch``, ``MapDataset``,
the Grain ``DataSource``, ``load(shuffle=True)``) reads do not all fit
``cache_limit``, :func:`superserial.read.opening.open_dataset` gives it
:class:`Pins` instead of raising. Then:

* :func:`plan` picks the shards to pin: in shard order, each one that still
  fits beside those picked before it (a shard larger than what is left is
  skipped, and later smaller ones may still be picked). The pick depends on
  the header, the shards read and the limit alone, so every reader of the
  dataset with the same limit, in any process, pins the same entries (which
  then cost their bytes once: views link them).
* :meth:`Pins.start` makes a view in the cache of
  :mod:`superserial.read.cache.directory` and returns at once: a background thread
  links the picked shards already cached, then downloads the others one
  after another. Each download is made only if, counted as
  :mod:`superserial.read.cache.stream` counts (the bytes of ``entries/``,
  ``views/`` and ``tmp/`` on disk, each inode once, a download in progress
  at its full size), it fits the limit after least recently used entries no
  view links are evicted; otherwise the shard is left unpinned. So the
  cache never holds more than ``cache_limit``, and the time to the first
  read does not depend on the dataset's size.
* Until a shard is pinned, and for the shards never pinned, the reader
  reads it remotely by range reads (:mod:`superserial.storage.fetch`). Once its
  copy is complete and checked (size and CRC-32C against the header, as
  every cache download is), :meth:`Pins.local` names the copy and the reader
  reads it there. The view lives as long as the reader: later epochs read the
  pinned shards locally and fetch only the rest.
* A download that disagrees with the header is a
  :class:`~superserial.errors.CorruptDataError` naming the remote file, never
  cached, and raised by every later :meth:`Pins.local` of this reader (its
  records cannot be trusted). Any other error of a download (the network)
  is logged; the shards not yet pinned stay remote, where reads retry and
  name their URL.
* **Forks and pickles.** Only the process that started the pins runs the
  thread. A forked child (a DataLoader worker) or an unpickled copy never
  touches the parent's thread or its locks: it finds the pinned copies in
  the parent's view by their size, and reads remotely what is not there
  yet. (:mod:`superserial.read.cache.directory` closes, in a forked child, its copies
  of the lock descriptors the thread held at the fork.)

This module does not import TensorFlow.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from superserial.errors import CorruptDataError
from superserial.format.header import Header
from superserial.read.cache.directory import CacheDir, Entry, Lease, entry_of
from superserial.read.cache.stream import make_room, store

__all__ = ["Pins", "plan"]

log = logging.getLogger("superserial")


def plan(
    path: str, header: Header, shards: Sequence[int], cache_dir: str, limit: int
) -> Pins | None:
    """The :class:`Pins` of ``shards`` when they do not all fit ``limit``; None when they do.

    Not started: call :meth:`Pins.start`.
    """
    entries = [entry_of(path, header.shards[k]) for k in shards]
    if sum(e.nbytes for e in entries) <= limit:
        return None
    picked, left = [], limit
    for k, e in zip(shards, entries, strict=True):
        if e.nbytes <= left:
            picked.append(k)
            left -= e.nbytes
    return Pins(path, header, tuple(shards), tuple(picked), os.fspath(cache_dir), limit)


class Pins:
    """The pinned shards of one random-access reader (see the module docstring).

    Attributes:
        path: The dataset's URL.
        header: Its whole header.
        shards: Indices into ``header.shards`` of the shards the reader reads.
        pinned: Of those, the ones to pin, in the order they are fetched.
        cache_dir: The cache directory.
        limit: The most bytes the cache directory holds.
    """

    def __init__(
        self,
        path: str,
        header: Header,
        shards: tuple[int, ...],
        pinned: tuple[int, ...],
        cache_dir: str,
        limit: int,
    ) -> None:
        self.path = path
        self.header = header
        self.shards = shards
        self.pinned = pinned
        self.cache_dir = cache_dir
        self.limit = limit
        # The bytes of each pinned shard file, by name: what a complete copy measures.
        self._sizes = {header.shards[k].file: header.shards[k].bytes for k in pinned}
        self.view: str | None = None
        self._owner = 0  # the pid of the process whose thread fetches; 0: none
        self._init_local()

    def _init_local(self) -> None:
        self._ready: set[str] = set()  # the shard files complete in the view
        self._error: CorruptDataError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease: Lease | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_ready", "_error", "_stop", "_thread", "_lease"):
            del state[k]
        state["_owner"] = 0  # a copy looks at the view; it fetches nothing
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()

    @property
    def nbytes(self) -> int:
        """The bytes of the shards read (and their indexes) together."""
        return sum(entry_of(self.path, self.header.shards[k]).nbytes for k in self.shards)

    def _fetching(self) -> bool:
        """Whether this process is the one whose thread fetches (not a fork or a copy)."""
        return self._owner == os.getpid()

    def start(self) -> Pins:
        """Makes the view and starts fetching in a background thread; returns at once."""
        cache = CacheDir(self.cache_dir)
        with cache.locked():
            cache.collect()
            view, fd = cache.new_view()
        self.view, self._lease = view, Lease(view, fd)
        self._owner = os.getpid()
        self._thread = threading.Thread(
            target=self._run, args=(cache, view), name="superserial-pin", daemon=True
        )
        self._thread.start()
        return self

    def local(self, name: str) -> str | None:
        """The local path of shard file ``name`` once its copy is pinned; else None.

        Raises:
            CorruptDataError: A download of this reader's pins disagreed with the header.
        """
        view = self.view
        fetching = self._fetching()
        if fetching and self._error is not None:
            raise self._error
        if view is None or name not in self._sizes:
            return None
        if fetching:
            return os.path.join(view, name) if name in self._ready else None
        if name in self._ready:
            return os.path.join(view, name)
        file = os.path.join(view, name)
        try:
            complete = os.stat(file).st_size == self._sizes[name]
        except FileNotFoundError:
            return None
        if complete:  # links appear complete; a copy (no hard links) once it is whole
            self._ready.add(name)
            return file
        return None

    @property
    def ready(self) -> list[str]:
        """The shard files pinned so far, as this process sees them."""
        if self._fetching():
            return [n for n in self._sizes if n in self._ready]
        return [n for n in self._sizes if self.local(n) is not None]

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the thread to finish fetching; whether it has (True in other processes)."""
        thread = self._thread
        if thread is None or not self._fetching():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def close(self) -> None:
        """Stops fetching after the download in progress, and lets go of the view."""
        self._stop.set()
        if self._fetching() and self._thread is not None:
            self._thread.join()
        if self._lease is not None:
            self._lease.close()

    def _run(self, cache: CacheDir, view: str) -> None:
        entries = [
            (self.header.shards[k].file, entry_of(self.path, self.header.shards[k]))
            for k in self.pinned
        ]
        try:
            # What is cached already first, before any eviction can take it.
            with cache.locked():
                missing = []
                for name, e in entries:
                    if cache.link(e, view):
                        self._ready.add(name)
                    else:
                        missing.append((name, e))
            for name, e in missing:
                if self._stop.is_set():
                    return
                if self._fetch(cache, e, view):
                    self._ready.add(name)
        except CorruptDataError as err:
            self._error = err
        except Exception as err:  # noqa: BLE001  # the shards stay remote, where reads name errors
            log.warning(
                "cache %s: pinning shards of %s stopped (%s: %s); they are read remotely",
                cache.root,
                self.path,
                type(err).__name__,
                err,
            )
        log.debug(
            "cache %s: pinned %d of %d shard(s) of %s",
            cache.root,
            len(self._ready),
            len(entries),
            self.path,
        )

    def _fetch(self, cache: CacheDir, entry: Entry, view: str) -> bool:
        """Links ``entry`` into the view, downloading it if it fits; False: no room."""
        with cache.flock(os.path.join(cache.fetches, entry.name + ".lock")):
            with cache.locked():
                if cache.link(entry, view):
                    return True
                used = make_room(cache, entry.nbytes, self.limit)
                if used + entry.nbytes > self.limit:
                    log.debug(
                        "cache %s: no room for %s (%d of %d bytes used); read remotely",
                        cache.root,
                        entry.files[0][0],
                        used,
                        self.limit,
                    )
                    return False
                tmp = os.path.join(cache.tmp, f"{os.getpid()}-{uuid.uuid4().hex[:12]}-{entry.name}")
                os.mkdir(tmp)  # counted at its full size from now on
            store(cache, entry, tmp, view)
        return True

    def __repr__(self) -> str:
        return (
            f"Pins({self.path!r}, {len(self.pinned)} of {len(self.shards)} shard(s), "
            f"limit {self.limit})"
        )

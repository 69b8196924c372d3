"""A windowed unit's records fetched once for all the DataLoader workers of a host.

A DataLoader with ``k`` workers deals batches to them in turn, so each worker's share
of a windowed group (:mod:`superserial.read.group_reads`) has records in every block
of the group: each worker reading its share alone fetches nearly every block, ``k``
times the dataset in all, in many more range requests (a share's reads are cut to
stay within the read-amplification bound). Here the workers split a unit's records
instead: the records every worker needs from the unit, sorted, cut into ``k``
consecutive *parts*, each part fetched by one worker in a few large range reads
(:meth:`~superserial.read.random_access.RecordReader.read_packed`, which checks the
CRCs) and written to a file in a directory the workers share (in ``/dev/shm`` where
there is one), which the workers that need it read and the last of them deletes.

How the workers agree, with files alone (no worker waits on another that may never
come):

- A part is *claimed* by creating ``<key>.p<part>.claim`` exclusively, holding the
  claimer's pid. Worker ``w`` claims part ``w`` first and fetches it, then takes the
  other parts it needs: a part written is read; a part nobody claimed (its worker is
  late, or has no batches in this unit) it claims and fetches itself; a part claimed
  and not yet written it waits for, while the claimer lives, and fetches itself once
  it does not (or after :data:`WAIT_SECONDS`).
- A part's data is written as ``<key>.p<part>`` through a temporary name and a rename,
  so a file of that name is always whole: the fetching worker, then the count, then the
  records' starts and lengths (int64, little-endian), then their bytes. A reader
  checks that the sizes agree before it uses it.
- A part that cannot be written (no room) marks the directory *full*: from then on each
  worker reads its own records (as a share read alone does), and nothing is shared.
- Only the workers that need a part read it; each marks ``<key>.p<part>.r<worker>``
  once it has, and the one that finds every reader's mark deletes the part, its claim
  and the marks. A part no other worker needs is never written.

Keys name the order (``n``, seed, window, epoch, rank), the share (batch, workers),
the unit's groups and the DataLoader iterator (its base seed), so two iterators or
orders never meet. The directory is made by the process that made the
:class:`UnitExchange` (the DataLoader's), and removed with it; one left by a process
that was killed is removed by the next one made on the machine.

This module does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from superserial.base.processes import pid_alive
from superserial.errors import CorruptDataError

__all__ = ["WAIT_SECONDS", "UnitExchange"]

# How long a worker waits for a part another worker claimed, even while that worker
# lives, before it fetches the part itself: far over a part's fetch (a unit is at most
# UNIT_BYTES), well under a hang.
WAIT_SECONDS = 120.0
# Between looks for a part being written.
_POLL_SECONDS = 0.002

# A part's records: buffers that, joined, hold record ``i`` at ``[starts[i], starts[i] +
# lengths[i])`` (RecordReader.read_pieces); left in pieces, for the caller's one join.
Packed = tuple[Sequence[bytes | memoryview], np.ndarray, np.ndarray]

# The directories' names: this, the pid of the process that made one, a random suffix.
_PREFIX = "superserial-units-"
# In a directory, the mark that a part could not be written.
_FULL = "full"
# /dev/shm is used if it has this much room; else the temporary directory (on disk,
# where the page cache serves the parts).
_SHM_FREE = 1 << 30


def _shared_root() -> str:
    """Where the exchange directories go: memory (``/dev/shm``) where it has room."""
    shm = "/dev/shm"
    try:
        room = os.statvfs(shm)
        if room.f_bavail * room.f_frsize >= _SHM_FREE and os.access(shm, os.W_OK | os.X_OK):
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


class UnitExchange:
    """A directory where the DataLoader workers of one process share a unit's parts.

    Made in the process that starts the workers (it only names the directory, which is
    made there and removed when this object is collected or the process exits); the
    workers get it by fork or by pickle and call :meth:`records`.
    """

    def __init__(self) -> None:
        root = _shared_root()
        _sweep(root)
        self.directory = os.path.join(root, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        os.mkdir(self.directory, 0o700)
        self._cleanup = weakref.finalize(self, _remove, self.directory, os.getpid())

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory}  # a worker never removes it

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def records(
        self,
        key: str,
        parts: list[np.ndarray],
        needed: np.ndarray,
        worker: int,
        fetch: Callable[[np.ndarray], Packed],
    ) -> list[Packed | None]:
        """The records of the parts worker ``worker`` needs, fetched or read from the others.

        Once the directory is :attr:`full`, parts not yet shared come back None: the
        caller then reads the records it needs itself.

        Args:
            key: The unit's name, the same in every worker (see the module docstring).
            parts: The records (sorted indices) of each part; part ``p`` is worker ``p``'s.
            needed: ``needed[q, p]``: worker ``q`` needs records of part ``p``.
            worker: This worker.
            fetch: Reads records by index, packed (checked).

        Returns:
            For each part: its records packed in the order of ``parts[p]``, or None where
            this worker does not need it (or the directory is full).

        Raises:
            CorruptDataError: A part another worker wrote is damaged.
        """
        out: list[Packed | None] = [None] * len(parts)
        mine = [p for p in range(len(parts)) if needed[worker, p] and len(parts[p])]
        # This worker's own part first, so that the others find it early; then the rest.
        for p in sorted(mine, key=lambda p: p != worker):
            out[p] = self._part(key, p, parts[p], needed, worker, fetch)
        return out

    def _part(
        self,
        key: str,
        p: int,
        indices: np.ndarray,
        needed: np.ndarray,
        worker: int,
        fetch: Callable[[np.ndarray], Packed],
    ) -> Packed | None:
        base = os.path.join(self.directory, f"{key}.p{p}")
        readers = [q for q in range(needed.shape[0]) if needed[q, p] and q != worker]
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            got = self._load(base, indices)
            if got is not None:
                self._mark_read(base, worker, needed[:, p], int(got[0]))
                return got[1]
            if self.full:
                return None  # nothing more is shared: the caller reads its own records
            # A part no other worker needs is fetched without a claim, and never written.
            claimer = self._claim(base) if readers else os.getpid()
            if claimer == os.getpid():
                try:
                    packed = fetch(indices)
                except BaseException:
                    # The others fetch it themselves (and meet the same error) at once.
                    _unlink(base + ".claim")
                    raise
                if readers:
                    self._write(base, worker, packed)
                return packed
            if claimer is None or not pid_alive(claimer) or time.monotonic() > deadline:
                return fetch(indices)  # its claimer died or hangs: not worth waiting for
            time.sleep(_POLL_SECONDS)

    @property
    def full(self) -> bool:
        """Whether a part could not be written (no room): from then on nothing is shared."""
        return os.path.exists(os.path.join(self.directory, _FULL))

    def _claim(self, base: str) -> int | None:
        """Claims the part (this pid), or the pid of the worker that did (None: unknown)."""
        try:
            fd = os.open(base + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            try:
                with open(base + ".claim", "rb") as f:
                    text = f.read()
            except FileNotFoundError:  # deleted by the last reader: the part was read
                return None
            # Written right after the exclusive create: empty for a moment.
            try:
                return int(text) if text else 0
            except ValueError:  # not one of ours: fetch the part rather than wait
                return None
        except OSError:  # the directory is gone (the DataLoader's process ended)
            return None
        with os.fdopen(fd, "wb") as f:
            f.write(str(os.getpid()).encode())
        return os.getpid()

    def _write(self, base: str, worker: int, packed: Packed) -> None:
        pieces, starts, lengths = packed
        head = np.array([worker, len(starts)], dtype="<i8")
        tmp = f"{base}.tmp{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(head.tobytes())
                f.write(np.asarray(starts, dtype="<i8").tobytes())
                f.write(np.asarray(lengths, dtype="<i8").tobytes())
                for piece in pieces:
                    f.write(piece)
            os.replace(tmp, base)
        except OSError:
            # No room (a container's /dev/shm is often 64 MB): every worker reads its
            # own records from now on, within the share's bound, rather than fetch
            # whole parts for the others in vain.
            with contextlib.suppress(OSError):
                open(os.path.join(self.directory, _FULL), "wb").close()
            for name in (tmp, base + ".claim"):
                _unlink(name)

    def _load(self, base: str, indices: np.ndarray) -> tuple[int, Packed] | None:
        """A part's records as another worker wrote them (and that worker), or None if not yet."""
        count = len(indices)
        fixed = 16 + 16 * count
        try:
            with open(base, "rb") as f:
                blob = f.read(fixed)
                # The data mapped, not read: the caller's join is its only copy. (A part
                # file is never changed in place; one deleted stays mapped.)
                size = os.fstat(f.fileno()).st_size
                data = _mapped(f.fileno(), len(blob)) if size > len(blob) else memoryview(b"")
        except FileNotFoundError:
            return None
        head = np.frombuffer(blob, dtype="<i8", count=2) if len(blob) >= 16 else None
        if head is None or int(head[1]) != count or len(blob) < fixed:
            raise CorruptDataError(
                f"{base}: expected a part of {count} records from another DataLoader worker, "
                f"found {len(blob) + len(data)} bytes"
                + ("" if head is None else f" for {int(head[1])}")
            )
        starts = np.frombuffer(blob, dtype="<i8", count=count, offset=16).astype(np.int64)
        lengths = np.frombuffer(blob, dtype="<i8", count=count, offset=16 + 8 * count)
        lengths = lengths.astype(np.int64)
        if count and (
            starts.min() < 0 or lengths.min() < 0 or int((starts + lengths).max()) > len(data)
        ):
            raise CorruptDataError(
                f"{base}: a record of another DataLoader worker's part lies outside its "
                f"{len(data)} bytes of data"
            )
        return int(head[0]), ([data], starts, lengths)

    def _mark_read(self, base: str, worker: int, needers: np.ndarray, writer: int) -> None:
        """Marks the part read by this worker; the last of its readers deletes it all."""
        marks = [f"{base}.r{q}" for q in np.flatnonzero(needers).tolist() if q != writer]
        try:
            with open(f"{base}.r{worker}", "wb"):
                pass
        except OSError:
            return
        if not all(os.path.exists(m) for m in marks):
            return
        for name in [base, base + ".claim", *marks]:
            _unlink(name)  # (another reader, last at the same time, may be first)


def _mapped(fd: int, offset: int) -> memoryview:
    """The file's bytes from ``offset`` on, mapped read-only (they stay mapped after a close)."""
    return memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))[offset:]


def _unlink(name: str) -> None:
    with contextlib.suppress(OSError):  # gone already, or its directory is
        os.unlink(name)


def _sweep(root: str) -> None:
    """Removes the directories of processes that are gone (killed before they could)."""
    try:
        names = [x for x in os.listdir(root) if x.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        path = os.path.join(root, name)
        try:
            ours = os.stat(path).st_uid == os.getuid()
        except OSError:
            continue
        if ours and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _remove(directory: str, owner: int) -> None:
    """Removes the directory, in the process that made it only (not in a forked worker)."""
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)

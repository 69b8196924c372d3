"""Range reads of remote files: planned within a read-amplification bound, many in flight.

A request to an object store costs its round trip (tens of milliseconds)
whatever its size, so a batch of records scattered over remote shards is
read with many byte-range requests at once, not one after another, and
neighbours share a request only while that does not fetch much more than
the records themselves:

- :func:`plan` groups a file's records (sorted by offset) into runs, one
  request each. A record joins the run before it while the run's bytes stay
  within ``AMPLIFICATION`` (2) times the records' bytes, and under
  ``RUN_MAX``. The requests in flight hide the round trips, and bytes are
  not free: what a batch fetches stays within twice its records, so memory
  follows the batch, not the shard, and an epoch that reads every record once
  downloads at most twice the dataset (a 2 MiB gap alone once fetched 47 MB
  for 200 KB of records; an allowance of 64 KiB a request, next, fetched 10
  times the dataset in a global-shuffle epoch of records of 800 bytes, and
  3 times in a windowed one, at nginx behind a 50 ms proxy, for 25% and 2x
  more requests: fewer requests are not worth that). ``RUN_MAX`` (8 MiB, the part size object
  stores suggest for parallel downloads) splits long spans so that they too
  come in parallel.
- :func:`read_all` issues the requests of a batch (of every file at once)
  together, at most ``concurrency()`` in flight in the process whatever the
  number of readers and threads asking (``SUPERSERIAL_REMOTE_CONCURRENCY``,
  default 256; read at each call). Only readers whose reads are stateless
  requests (:attr:`~superserial.storage.fs.RangeReader.concurrent`) are read
  together; others read one range after another. An async filesystem's
  ranges (fsspec's HTTP, s3fs, gcsfs: those with a
  :meth:`~superserial.storage.fs.RangeReader.loop`) are coroutines on its
  event loop, bounded by one semaphore per loop; the others' (``hf://``)
  go through one thread pool of the process, of as many threads. A thread
  per request blocked on the loop cost more CPU than the requests: measured
  at nginx behind a 50 ms proxy on a shared, loaded 2-core machine, random
  reads of 838-byte records ran at 720-1,000 el/s through the pool and
  1,160-1,290 as coroutines, against 1,160-1,210 requests/s for a plain
  client's 64 threads through the same proxy (rough: the proxy and the
  client share the 2 cores).

The pool and the semaphores are made on first use and made anew in a forked
child (torch DataLoader workers fork): the parent's threads do not exist
there. Local files never come here: they are mapped or read with ``pread``.

This module does not import TensorFlow.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from superserial.base import settings
from superserial.storage import fs

__all__ = [
    "AMPLIFICATION",
    "CONCURRENCY_ENV",
    "DEFAULT_CONCURRENCY",
    "RUN_MAX",
    "concurrency",
    "executor",
    "plan",
    "read_all",
]

CONCURRENCY_ENV = "SUPERSERIAL_REMOTE_CONCURRENCY"
# Object stores serve thousands of GETs a second per prefix. Measured at a
# 50 ms round trip (nginx behind tests/netproxy.py, benchmarks/remote_fetch.py,
# a shared 2-core machine at load 4-11, rough): get_batch(256 random of 60k)
# gave 1,040-1,270 el/s at 64 in flight, 1,090-1,400 at 128 and 1,430-1,750
# at 256 (where aiohttp's 100 connections had capped http before). fsspec's
# own async batch, cat_ranges, against this pool on the same range reads:
# 1,160-1,930 against 1,110-1,220 requests/s at 256, within the noise at 64
# and 128; the pool is kept, for its process-wide bound and one retry per
# range. moto's server is request-bound (30-150 req/s) at any width.
DEFAULT_CONCURRENCY = 256
AMPLIFICATION = 2
RUN_MAX = 8 << 20

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0
# Per event loop: (its size, the semaphore that bounds its requests). Only
# touched from the loop's own thread.
_gates: dict[Any, tuple[int, asyncio.Semaphore]] = {}


def _forget_pool() -> None:
    # In a forked child the pool's threads are gone, and the lock may have
    # been held by one of the parent's threads; the parent's loops are not
    # this process's to wait on.
    global _lock, _pool
    _lock = threading.Lock()
    _pool = None
    _gates.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def concurrency() -> int:
    """The most range requests in flight in this process (``SUPERSERIAL_REMOTE_CONCURRENCY``).

    Raises:
        ValueError: The variable is set to other than a positive integer.
    """
    return settings.count(CONCURRENCY_ENV, DEFAULT_CONCURRENCY)


def _executor(size: int) -> ThreadPoolExecutor:
    """The process's pool of ``size`` threads (a pool of another size is replaced)."""
    global _pool, _pool_size, _pool_pid
    with _lock:
        if _pool is None or _pool_size != size or _pool_pid != os.getpid():
            old = _pool if _pool_pid == os.getpid() else None
            _pool = ThreadPoolExecutor(size, thread_name_prefix="superserial-fetch")
            _pool_size, _pool_pid = size, os.getpid()
            if old is not None:
                old.shutdown(wait=False)  # its reads in flight still finish
        return _pool


def executor() -> ThreadPoolExecutor:
    """The process's pool of :func:`concurrency` threads, which every remote range read shares.

    Raises:
        ValueError: ``SUPERSERIAL_REMOTE_CONCURRENCY`` is set to other than a positive integer.
    """
    return _executor(concurrency())


def plan(lo: np.ndarray, hi: np.ndarray, amplification: float | None = None) -> np.ndarray:
    """The first record of each run: one range request each, for records ``[lo, hi)`` of a file.

    Greedy, record by record in offset order: a record joins the run before it
    while the run's span stays within ``amplification`` times the bytes of its
    records (their union) and within ``RUN_MAX``; otherwise it starts a run.

    Python runs once per *segment* (records that touch or overlap, with no gap
    between them), not once per record: inside a segment only ``RUN_MAX`` can
    start a run (a record that adds no gap adds as much to the span as to the
    records' bytes, and the span was within the bound of those), so the splits are
    found with ``searchsorted``. A batch of a whole file's records (a windowed
    unit) is then a few segments, not 60,000 steps.

    Args:
        lo: Where each record starts, sorted (duplicates and overlaps allowed).
        hi: Where each ends.
        amplification: The bound on a run's span over its records' bytes;
            None: ``AMPLIFICATION``.

    Returns:
        The positions in ``lo`` where a new run starts (the first is 0); a
        run reaches from its first record's ``lo`` to the largest ``hi`` of
        its records.
    """
    amp = AMPLIFICATION if amplification is None else amplification
    n = len(lo)
    if not n:
        return np.zeros(0, dtype=np.int64)
    reach = np.maximum.accumulate(hi)
    # A segment starts at a record that begins after every record before it ends.
    seg = np.flatnonzero(np.r_[True, lo[1:] > reach[:-1]])
    seg_end = np.r_[seg[1:], n]
    firsts: list[int] = []
    start = useful = 0
    for s, e, a, b, top in zip(
        seg.tolist(),
        seg_end.tolist(),
        lo[seg].tolist(),
        hi[seg].tolist(),
        reach[seg_end - 1].tolist(),
        strict=True,
    ):
        # The segment's first record comes after a gap: it joins the run before it
        # on both bounds, or starts one.
        if firsts and b - start <= min(amp * (useful + b - a), RUN_MAX):
            base, origin = useful, a
        else:
            firsts.append(s)
            start, base, origin = a, 0, a
        # The rest of it adds no gap: only RUN_MAX splits it, at the first record
        # that reaches past the run's start plus RUN_MAX (reach never decreases).
        # (The segment's last reach is past it, so that record is always found.)
        j = s + 1
        while j < e and top - start > RUN_MAX:
            k = j + int(np.searchsorted(reach[j:e], start + RUN_MAX, side="right"))
            firsts.append(k)
            start = origin = int(lo[k])
            base, j = 0, k + 1
        useful = base + top - origin
    return np.asarray(firsts, dtype=np.int64)


def read_all(reads: Sequence[tuple[fs.RangeReader, int, int]]) -> list[bytes]:
    """The bytes ``[start, stop)`` of each ``(reader, start, stop)``, in that order.

    Concurrent readers' ranges are read together, at most :func:`concurrency`
    at once (coroutines on an async filesystem's loop, else the process's
    pool); the others one after another here.

    Raises:
        CorruptDataError: A file ends before its range (the first such in
            ``reads`` order); any error of a read is raised likewise, after
            the reads not yet started are cancelled.
    """
    pooled = [i for i, (r, _, _) in enumerate(reads) if r.concurrent]
    if len(pooled) < 2:
        return [r.read(a, b - a) for r, a, b in reads]
    loops: dict[int, Any] = {}
    by_loop: dict[Any, list[int]] = {}
    threaded: list[int] = []
    for i in pooled:
        r = reads[i][0]
        loop = loops.get(id(r), False)
        if loop is False:
            loop = loops[id(r)] = _usable(r.loop())
        if loop is None:
            threaded.append(i)
        else:
            by_loop.setdefault(loop, []).append(i)
    size = concurrency()
    waits: list[Future[list[bytes]]] = []
    where: dict[int, tuple[int, int]] = {}  # read -> (its wait, its place in the wait's list)
    for loop, indices in by_loop.items():
        coro = _gather(size, [reads[i] for i in indices])
        where.update((i, (len(waits), j)) for j, i in enumerate(indices))
        waits.append(asyncio.run_coroutine_threadsafe(coro, loop))
    futures: dict[int, Future[bytes]] = {}
    if threaded:
        pool = executor()
        for i in threaded:
            r, a, b = reads[i]
            futures[i] = pool.submit(r.read, a, b - a)
    try:
        got = [wait.result() for wait in waits]
        out = []
        for i, (r, a, b) in enumerate(reads):
            if i in where:
                k, j = where[i]
                out.append(got[k][j])
            elif i in futures:
                out.append(futures[i].result())
            else:
                out.append(r.read(a, b - a))
        return out
    finally:
        for wait in waits:
            wait.cancel()
        for f in futures.values():
            f.cancel()


def _usable(loop: Any) -> Any:
    """``loop``, or None where this thread cannot wait on it (it is the loop's own thread)."""
    if loop is None:
        return None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread: the usual case
        return loop
    return None if running is loop else loop


async def _gather(size: int, reads: list[tuple[fs.RangeReader, int, int]]) -> list[bytes]:
    """The reads, as coroutines on this loop, at most ``size`` in flight on it.

    Results are taken in order, so the first failure in ``reads`` order is
    the one raised; the reads still pending are cancelled then.
    """
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None or gate[0] != size:
        gate = _gates[loop] = (size, asyncio.Semaphore(size))
    sem = gate[1]

    async def one(r: fs.RangeReader, a: int, b: int) -> bytes:
        async with sem:
            return await r.read_async(a, b - a)

    tasks = [loop.create_task(one(r, a, b)) for r, a, b in reads]
    try:
        return [await t for t in tasks]
    finally:
        for t in tasks:
            t.cancel()

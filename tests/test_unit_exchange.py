"""DataLoader workers fetch a windowed unit once between them (superserial.read.unit_exchange).

Real processes (forked, as DataLoader workers are) meet in a real directory: each part
is fetched by exactly one of them, every worker gets exactly the records of the parts it
needs, the directory is left empty, and a worker never waits on one that is absent,
dead or failed.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import resource
import signal
import time
from typing import Any

import numpy as np
import pytest

from superserial.errors import CorruptDataError
from superserial.read.unit_exchange import UnitExchange

_RECORDS = 600


def _record(i: int) -> bytes:
    return f"record {i} ".encode() * (1 + i % 7)


def _fetch_logged(log: str) -> Any:
    """A fetch that packs records by index and logs each call's first index to ``log``."""

    def fetch(indices: np.ndarray) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {int(indices[0])} {len(indices)}\n")
        time.sleep(0.05)  # a round trip: the other workers start meanwhile
        records = [_record(int(i)) for i in indices]
        lengths = np.array([len(r) for r in records], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        data = b"".join(records)
        # In pieces, as RecordReader.read_pieces gives them (one per file read).
        cuts = [0, len(data) // 3, len(data) // 2, len(data)]
        return [data[a:b] for a, b in itertools.pairwise(cuts)], starts, lengths

    return fetch


def _parts(workers: int) -> tuple[list[np.ndarray], np.ndarray]:
    ordered = np.arange(_RECORDS, dtype=np.int64)
    cuts = [_RECORDS * p // workers for p in range(workers + 1)]
    return [ordered[cuts[p] : cuts[p + 1]] for p in range(workers)], np.ones(
        (workers, workers), dtype=bool
    )


def _worker(ex: UnitExchange, key: str, workers: int, w: int, log: str, out: Any) -> None:
    parts, needed = _parts(workers)
    got = ex.records(key, parts, needed, w, _fetch_logged(log))
    ok = all(
        pack is not None
        and [bytes(b"".join(pack[0])[a : a + n]) for a, n in zip(pack[1], pack[2], strict=True)]
        == [_record(int(i)) for i in idx]
        for idx, pack in zip(parts, got, strict=True)
    )
    out.put((w, ok))


def _run(ex: UnitExchange, key: str, workers: int, log: str) -> dict[int, bool]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(ex, key, workers, w, log, out)) for w in range(workers)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("workers", [2, 3])
def test_each_part_fetched_once_and_every_worker_gets_all(tmp_path: Any, workers: int) -> None:
    ex = UnitExchange()
    log = str(tmp_path / "fetches")
    assert _run(ex, "unit", workers, log) == {w: True for w in range(workers)}
    with open(log) as f:
        firsts = sorted(int(line.split()[1]) for line in f)
    parts, _ = _parts(workers)
    assert firsts == [int(p[0]) for p in parts]  # each part once, by one worker
    assert os.listdir(ex.directory) == []  # the last reader of each part deleted it


def test_a_worker_alone_fetches_every_part_itself(tmp_path: Any) -> None:
    ex = UnitExchange()
    parts, needed = _parts(2)
    start = time.monotonic()
    got = ex.records("alone", parts, needed, 0, _fetch_logged(str(tmp_path / "log")))
    assert time.monotonic() - start < 5  # no waiting for a worker that never comes
    assert all(g is not None for g in got)
    # Both parts wait there for the absent worker, which needs them too.
    assert sorted(os.listdir(ex.directory)) == [
        "alone.p0",
        "alone.p0.claim",
        "alone.p1",
        "alone.p1.claim",
    ]


def test_a_part_claimed_by_a_dead_worker_is_fetched_at_once(tmp_path: Any) -> None:
    ex = UnitExchange()
    ctx = mp.get_context("fork")
    dead = ctx.Process(target=os._exit, args=(0,))
    dead.start()
    dead.join()
    with open(os.path.join(ex.directory, "dead.p1.claim"), "w") as f:
        f.write(str(dead.pid))
    parts, needed = _parts(2)
    start = time.monotonic()
    got = ex.records("dead", parts, needed, 0, _fetch_logged(str(tmp_path / "log")))
    assert time.monotonic() - start < 5
    assert got[1] is not None and b"".join(got[1][0])[: got[1][2][0]] == _record(int(parts[1][0]))


def test_a_failed_fetch_lets_go_of_its_claim(tmp_path: Any) -> None:
    ex = UnitExchange()
    parts, needed = _parts(2)

    def failing(indices: np.ndarray) -> Any:
        raise OSError("the server went away")

    with pytest.raises(OSError, match="went away"):
        ex.records("failed", parts, needed, 0, failing)
    assert os.listdir(ex.directory) == []  # a peer would fetch the part itself, not wait


def test_a_damaged_part_is_an_error_naming_it(tmp_path: Any) -> None:
    ex = UnitExchange()
    parts, needed = _parts(2)
    bad = os.path.join(ex.directory, "bad.p1")
    with open(bad, "wb") as f:
        f.write(np.array([1, 5], dtype="<i8").tobytes())  # 5 records, none of them there
    with pytest.raises(CorruptDataError, match=r"bad\.p1.*expected a part of 300 records"):
        ex.records("bad", parts, needed, 0, _fetch_logged(str(tmp_path / "log")))


def _collect(ex: UnitExchange) -> None:
    """A forked worker collecting its copy of the exchange."""
    ex._cleanup()


def test_the_directory_goes_with_its_maker_not_with_a_worker() -> None:
    ex = UnitExchange()
    directory = ex.directory
    ctx = mp.get_context("fork")
    child = ctx.Process(target=_collect, args=(ex,))
    child.start()
    child.join()
    assert child.exitcode == 0 and os.path.isdir(directory)
    del ex, child
    assert not os.path.exists(directory)


def _made_and_killed(out: str) -> None:
    ex = UnitExchange()
    with open(out, "w") as f:
        f.write(ex.directory)
    os._exit(0)  # as SIGKILL would: no finalizer runs


def test_the_directory_of_a_killed_process_goes_with_the_next_one_made(tmp_path: Any) -> None:
    out = str(tmp_path / "made")
    child = mp.get_context("fork").Process(target=_made_and_killed, args=(out,))
    child.start()
    child.join(timeout=30)
    with open(out) as f:
        left = f.read()
    assert child.exitcode == 0 and os.path.isdir(left)
    alive = UnitExchange()
    assert not os.path.exists(left)
    assert os.path.isdir(alive.directory)  # and not the directory of a process alive
    other = UnitExchange()
    assert os.path.isdir(alive.directory) and os.path.isdir(other.directory)


def _full_worker(ex: UnitExchange, log: str) -> None:
    # As a small /dev/shm would: the claims (a pid each) fit, a part does not.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    parts, needed = _parts(2)
    got = ex.records("full", parts, needed, 0, _fetch_logged(log))
    own = got[0] is not None and b"".join(got[0][0])[: got[0][2][0]] == _record(0)
    os._exit(0 if own and got[1] is None and ex.full else 1)


def test_a_part_that_does_not_fit_ends_the_sharing(tmp_path: Any) -> None:
    ex = UnitExchange()
    child = mp.get_context("fork").Process(target=_full_worker, args=(ex, str(tmp_path / "log")))
    child.start()
    child.join(timeout=60)
    # Its own part came back; the other's it left to be read by whoever needs it.
    assert child.exitcode == 0
    assert ex.full and os.listdir(ex.directory) == ["full"]
    parts, needed = _parts(2)
    start = time.monotonic()
    assert ex.records("full", parts, needed, 1, _fetch_logged(str(tmp_path / "log"))) == [
        None,
        None,
    ]
    assert time.monotonic() - start < 1  # no waiting, no fetching

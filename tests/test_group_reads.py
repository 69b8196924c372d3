"""GroupReads' cold group, and the groups it holds while their positions are read.

tf.data's parallel map asks for several chunks at once, in no fixed order; the one that
comes first makes a cold group's head. The others, for earlier positions, must not wait
behind the whole group's read. The group's read here is held (a gate) until the end, so
a read that waits for it fails by its timeout.

The groups here are small enough to be read without a head (``HEADLESS_BYTES``); these
tests hold them to the head's path, which larger groups take.

Grain's 16 threads read element by element; one descheduled falls behind the others by
groups. Its reads must still come out of its group, not one request each.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
from superserial.format.layout import read_header
from superserial.read import group_reads, order
from superserial.read.group_reads import HEAD, MOST, REACH, GroupReads
from superserial.read.random_access import RecordReader

_N, _W, _SEED = 10_000, 1000, 3


class _Gated:
    """A RecordReader whose reads of more than ``HEAD + REACH`` records wait for ``gate``."""

    def __init__(self, reader: RecordReader) -> None:
        self.reader, self.gate, self.sizes = reader, threading.Event(), []

    def __getattr__(self, name: str) -> Any:  # the reader's path, record_bytes, ...
        return getattr(self.reader, name)

    def open_all(self) -> None:
        self.reader.open_all()

    def read_packed(self, indices: np.ndarray, amplification: float | None = None) -> Any:
        self.sizes.append(len(indices))
        if len(indices) > HEAD + REACH + 64:
            self.gate.wait()
        return self.reader.read_packed(indices, amplification)


@pytest.fixture(autouse=True)
def _with_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_reads, "HEADLESS_BYTES", -1)


@pytest.fixture(scope="module")
def path(tmp_path_factory: Any) -> str:
    root = str(tmp_path_factory.mktemp("groups") / "ds")
    superserial.save(tf.data.Dataset.range(_N), root, num_shards=3)
    return root


def _gated(path: str) -> tuple[GroupReads, _Gated]:
    header = read_header(path)
    counts = [s.records for s in header.shards]
    reader = _Gated(RecordReader(path, header, header.shards, [0] * len(counts), counts))
    return GroupReads(reader, _N, _SEED, _W), reader  # type: ignore[arg-type]


def _expected(positions: np.ndarray) -> list[int]:
    return order.indices_at(positions, _N, _SEED, 0, _W).tolist()


def _read_within(groups: GroupReads, positions: np.ndarray, seconds: float = 10.0) -> list[int]:
    """The elements read at ``positions``; fails if the read waits ``seconds`` (the group)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(groups.read(positions, 0)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"the read of positions {positions[0]}.. waited for the group's read"
    return out[0][3].tolist()


@pytest.mark.parametrize("first", [64, 256, 600])
def test_earlier_positions_do_not_wait_for_a_cold_group(path: str, first: int) -> None:
    groups, reader = _gated(path)
    try:
        later = np.arange(first, first + 64)
        assert _read_within(groups, later) == _expected(later)
        # The earlier chunk tf.data asked for beside it: within the head's reach, or
        # read by itself (600 - REACH > 64), never behind the held group.
        earlier = np.arange(0, 64)
        assert _read_within(groups, earlier) == _expected(earlier)
    finally:
        reader.gate.set()
    # Past the head, reads wait for the group and get its records.
    rest = np.arange(2000, 2064)
    assert _read_within(groups, rest) == _expected(rest)


def test_later_positions_wait_for_the_group(path: str) -> None:
    groups, reader = _gated(path)
    later = np.arange(0, 64)
    assert _read_within(groups, later) == _expected(later)
    beyond = np.arange(HEAD + REACH + 100, HEAD + REACH + 164)
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(groups.read(beyond, 0)), daemon=True)
    thread.start()
    thread.join(1.0)
    assert not out  # held: it is served from the group, which is not read yet
    reader.gate.set()
    thread.join(10)
    assert out and out[0][3].tolist() == _expected(beyond)


class _Counting:
    """A RecordReader that keeps the records of each of its reads."""

    def __init__(self, reader: RecordReader) -> None:
        self.reader, self.reads = reader, []

    def __getattr__(self, name: str) -> Any:  # the reader's path, record_bytes, ...
        return getattr(self.reader, name)

    def open_all(self) -> None:
        self.reader.open_all()

    def read_packed(self, indices: np.ndarray, amplification: float | None = None) -> Any:
        self.reads.append(np.array(indices))
        return self.reader.read_packed(indices, amplification)

    def of(self, elements: np.ndarray, since: int) -> list[int]:
        """The sizes of the reads from read ``since`` on that took any of ``elements``."""
        return [len(r) for r in self.reads[since:] if np.isin(r, elements).any()]


def _counting(path: str, window: int) -> tuple[GroupReads, _Counting]:
    header = read_header(path)
    counts = [s.records for s in header.shards]
    reader = _Counting(RecordReader(path, header, header.shards, [0] * len(counts), counts))
    return GroupReads(reader, _N, _SEED, window), reader  # type: ignore[arg-type]


def _read(groups: GroupReads, positions: np.ndarray, window: int) -> None:
    found = groups.read(positions, 0)[3].tolist()
    assert found == order.indices_at(positions, _N, _SEED, 0, window).tolist()


@pytest.mark.parametrize("ahead", [3, MOST + 1])
def test_a_group_with_unread_positions_is_held_up_to_most(path: str, ahead: int) -> None:
    window = 100
    group = order.read_unit(_N, window)[0]  # 500 positions: 20 groups
    groups, reader = _counting(path, window)
    late = np.arange(group - 64, group)  # a straggling thread's batch of group 0
    for g in range(ahead + 1):
        # The other threads' batches: all of group 0 but the straggler's, and the
        # first batch of each later group (a later group's other positions unread).
        lo, hi = g * group, (g + 1) * group - 64 if g == 0 else g * group + 64
        for a in range(lo, hi, 64):
            _read(groups, np.arange(a, min(a + 64, hi)), window)
    calls = len(reader.reads)
    _read(groups, late, window)
    # (Reads of later groups ahead, in their threads, may land any time: only the
    # reads of the straggler's records count.)
    taken = reader.of(order.indices_at(late, _N, _SEED, 0, window), calls)
    if ahead < MOST:
        # Groups 1.. were read past 3 held, yet group 0 (positions unread) is held:
        # the straggler's batch comes out of it, no read of its own.
        assert taken == [], taken
    else:
        # Beyond MOST groups the oldest is let go, however much of it is unread: read
        # anew, cold (its head, then the group), as a new pass would.
        assert taken, "group 0 was held beyond MOST groups"
        assert sum(taken) <= 64 + REACH + group, taken


def _records(got: tuple[bytes, np.ndarray, np.ndarray, np.ndarray]) -> list[bytes]:
    data, starts, lengths, _ = got
    return [bytes(data[a : a + n]) for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)]


@pytest.mark.parametrize("span", ["one group", "two groups"])
def test_uncompacted_reads_cut_from_the_groups_buffer_compacted_ones_copy(
    path: str, span: str
) -> None:
    # A torch worker decodes a batch straight out of the group's buffer (compact=False);
    # tf.data is handed the buffer whole, so its reads (the default) hold only their
    # records. Both give the same records, in the order of the positions.
    window = 1000
    groups, _ = _counting(path, window)
    group = order.read_unit(_N, window)[0]
    lo = 64 if span == "one group" else group - 32
    positions = np.arange(lo, lo + 64)
    loose = groups.read(positions, 0, compact=False)
    packed = groups.read(positions, 0)
    assert _records(loose) == _records(packed)
    assert loose[3].tolist() == packed[3].tolist() == _expected(positions)
    assert len(packed[0]) == int(packed[2].sum())  # exactly its records
    assert packed[0] is not loose[0]
    again = groups.read(positions + 64, 0, compact=False)
    if span == "one group":
        # The group's buffer itself, for every read of it: no copy of the records.
        assert again[0] is loose[0]
        assert len(loose[0]) > int(loose[2].sum())
    else:
        # Two groups' records are joined, and the join holds only theirs.
        assert len(loose[0]) == int(loose[2].sum())

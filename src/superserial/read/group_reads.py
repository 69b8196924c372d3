"""A windowed shuffle's groups, read whole and kept: what every reader of that order goes through.

The windowed order (``docs/shuffle.md``) comes in *groups* of five windows that share
their blocks of consecutive records (:func:`superserial.read.order.read_unit`). A reader
that holds a group's records reads each block once, whole, in one range read (or fewer:
neighbours coalesce). :class:`GroupReads` is that holder for one reader's positions
(``start, start + step, ...``, or a share of them), for ``load(shuffle=True,
shuffle_window=W)``, ``superserial.torch.MapDataset`` under a windowed ``Sampler`` and
``superserial.grain.dataset(shuffle_window=W)``:

- A group is read with one batched read by offset
  (:meth:`~superserial.read.random_access.RecordReader.read_packed`) in a thread of its
  own, and kept while its positions are read.
- When a group is first read from, the next one is read ahead in the background, so a
  reader that consumes no faster than the network never waits for a group. Remotely,
  groups are read as many at a time as their records fit :data:`UNIT_BYTES` (a *unit*:
  one batched read, whose blocks lie as many times denser in the files and coalesce
  into far fewer range requests), and the next unit is read ahead when the first group
  of the current one is first read from. DataLoader workers fetch each unit once
  between them, a part each (:mod:`superserial.read.unit_exchange`); a reader of a
  share without them reads its units within :data:`SHARE_AMPLIFICATION`. A group is let go once every
  one of this reader's positions in it has been read (while more than :data:`KEPT` (3)
  groups are held), or as the oldest beyond :data:`MOST` (6) groups, or beyond two
  units and two groups when units are larger than two groups: about ``15 W`` records
  held locally, ``30 W`` at most, and remotely, when units are larger than one group,
  at most three times ``UNIT_BYTES`` of records. Reads of one group thus never go one
  by one while a straggling thread still reads it (Grain's 16 threads read element by
  element, and one of them descheduled long enough fell a group behind).
- A group nobody read ahead (the first of an epoch or of a resume) is *cold*. If its
  unit's records are at most :data:`HEADLESS_BYTES` (64 MiB), its first reads wait for
  the unit, which comes about as soon as scattered records would. Otherwise its
  *head*, the positions asked for and :data:`HEAD` (512) of this reader's from
  :data:`REACH` (128) before the first of them (for reads of earlier positions that
  came in beside), is read at once, by itself, and the whole group beside it (its
  few large requests take a few of the fetch pool's slots). The first batches thus wait for
  the head (a round trip or two), not for five windows; that reads up to ``HEAD``
  records (and those asked for) twice, once per epoch or resume. Reads of a cold group beyond its head wait for the
  group; reads before it, while the group loads, are read by themselves.
- Positions not among a group's records held (outside this reader's share, or a share
  guessed wrong) are read by themselves.

The records are exactly those of :func:`~superserial.read.order.indices_at`: the reads
change how records are fetched, never which ones. A holder pickles without its groups
and starts afresh in a forked child.

This module does not import TensorFlow.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from superserial.read import order
from superserial.read.random_access import RecordReader
from superserial.read.unit_exchange import UnitExchange
from superserial.storage import fs

__all__ = [
    "HEAD",
    "HEADLESS_BYTES",
    "KEPT",
    "MOST",
    "REACH",
    "SHARE_AMPLIFICATION",
    "UNIT_BYTES",
    "GroupReads",
]

# Groups held though all their positions were read: the previous one, the current one
# and the next, being read ahead.
KEPT = 3
# Groups held at most: beyond KEPT, those with positions still unread are held (a
# straggling thread's reads still need them) up to this many, the oldest let go first.
MOST = 6
# The positions of this reader a cold group's first read takes from the first one asked
# for on: a few batches (tf.data's parallel chunks, Grain's reads element by element)
# come out of it while the group is read.
HEAD = 512
# And the ones before the first asked for (clipped to the group's): see _head.
REACH = 128
# A cold unit whose records' bytes are at most this is read without a head: it comes in
# about as soon as the head's scattered records would, and where requests cost more
# than bytes it comes sooner (moto's S3 copies the whole object for each range GET,
# about 230 a second: a head of 512 records is about 500 GETs, 2-3 s, against the
# unit's 8 range reads of 47 MB, 0.3 s alone, over moto +50 ms). At 100 MB/s, 64 MiB
# is 0.7 s; a larger unit (a larger dataset's group) keeps its head.
HEADLESS_BYTES = 64 << 20
# Remote: as many groups are read together, with one batched read, as their records'
# bytes fit in this (all of an epoch's, for a dataset this small). Their blocks then lie
# that many times denser in the files, so neighbours coalesce within the
# read-amplification bound: for 60,000 mnist-shaped records and W = 3,000 (four
# groups), one group at a time makes 5,985 range reads an epoch for 1.34x the
# dataset's bytes, two 224 for 1.93x, all four 8 for 1.00x
# (superserial.storage.fetch.plan over the order).
UNIT_BYTES = 256 << 20
# A share (a DataLoader worker's: one batch in ``period`` of every block) of a unit of
# several groups lies so dense in the files that, within the default bound of twice
# its records' bytes, a worker's reads take every block whole: the workers together
# fetch the bound itself, twice the dataset, and their indexes and heads on top (2.07x
# in tests/test_windowed_reads.py). Their unit reads are planned within this instead.
# 2 workers, 60,000 mnist-shaped records, W = 3,000, all four groups at once (fetch.plan
# over the order): 373 range reads an epoch for 1.97x at 2, 1,515 for 1.90x at 1.95,
# 2,641 for 1.83x at 1.9; two groups at a time at 2, 13,670 for 1.54x. (Workers that
# share a UnitExchange fetch a unit once between them instead: 1,057 range reads an
# epoch for 1.03x, nearly all of them the workers' heads.)
SHARE_AMPLIFICATION = 1.9


class _Group:
    """One group's records for this reader, once ``done`` is set (or the error reading them)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        # A cold group's first records, read before the group (see the module doc).
        self.head: _Group | None = None
        self.numbers = np.zeros(0, dtype=np.int64)  # this reader's numbers of them, sorted
        # This reader's numbers of the group's positions, and which of them were read.
        self.expected = self.numbers
        self.read = np.zeros(0, dtype=bool)
        self.data = b""
        self.starts = self.lengths = self.indices = self.numbers
        self.group = -1  # its number in the order (-1: a head)

    def fill(self, numbers: np.ndarray, indices: np.ndarray, packed: Any) -> None:
        self.data, self.starts, self.lengths = packed
        self.numbers, self.indices = numbers, indices


class GroupReads:
    """One reader's records of the windowed order of ``n`` records, read a group at a time.

    Args:
        reader: The dataset's records.
        n: The number of records of the order.
        seed: The order's seed.
        window: Its window ``W``.
        start: The first position this reader reads.
        step: It reads positions ``start, start + step, ...``: its number ``m`` is
            position ``start + m * step``.
        share: ``(batch, period, phase)``: of those, only the numbers ``m`` with
            ``(m // batch) % period == phase`` are read with the groups (a DataLoader
            worker's batches); None: all of them.
        exchange: With ``share``: where the workers of ``period`` fetch each unit's
            records once between them (:class:`~superserial.read.unit_exchange.UnitExchange`);
            None: each reads its share itself.
        nonce: Names this pass of the workers in ``exchange`` (the DataLoader
            iterator's base seed): the same in every worker of it.
    """

    def __init__(
        self,
        reader: RecordReader,
        n: int,
        seed: int,
        window: int,
        *,
        start: int = 0,
        step: int = 1,
        share: tuple[int, int, int] | None = None,
        exchange: UnitExchange | None = None,
        nonce: int = 0,
    ) -> None:
        self.reader, self.n, self.seed, self.window = reader, n, seed, window
        self.start, self.step, self.share = start, step, share
        self.exchange = None if share is None or share[1] < 2 else exchange
        self.nonce = nonce
        self._group, self._rest = order.read_unit(n, window)
        # The last group's number: the rest, if any, is group rest // group.
        self._last = (self._rest if self._rest < n else self._rest - 1) // self._group
        # Groups read together (see UNIT_BYTES); locally a record is a slice of a map.
        fit = int(UNIT_BYTES // max(1.0, self._group * reader.record_bytes))
        # A share's unit reads are planned within SHARE_AMPLIFICATION (see there), unless
        # the workers fetch the unit between them.
        alone = share is not None and self.exchange is None
        self._amplification = SHARE_AMPLIFICATION if alone else None
        self._span = 1 if fs.is_local(reader.path) else max(1, min(self._last + 1, fit))
        # Held at most: this unit and the next, read ahead, and two groups of stragglers.
        self._most = max(MOST, 2 * self._span + 2)
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[tuple[int, int], _Group] = {}  # (epoch, group): oldest first
        # The epoch and group of the furthest group read or read ahead in this pass.
        self._furthest = (-1, -1)
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_lock", "_groups", "_furthest", "_pid"):
            del state[k]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    def read(
        self, positions: np.ndarray, epoch: int, *, compact: bool = True
    ) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
        """The records at ``positions`` (this reader's) of epoch ``epoch``'s order, packed.

        Args:
            positions: Positions of the order, this reader's.
            epoch: The order's epoch.
            compact: Pack the records into a buffer of their own. False: records
                of one group come in the buffer the group holds (megabytes, shared
                with its other reads, never changed), which saves a copy where the
                records are cut or decoded from it at once, but not where the
                buffer is handed on whole (to TensorFlow, which copies it).

        Returns:
            ``(buffer, starts, lengths, indices)``: the record at ``positions[i]`` is
            ``buffer[starts[i] : starts[i] + lengths[i]]`` and is element ``indices[i]``.

        Raises:
            CorruptDataError: A record or a shard's index is damaged (any error of the
                group's read, re-raised in each read that needs it).
        """
        positions = np.asarray(positions, dtype=np.int64)
        if not len(positions):
            empty = np.zeros(0, dtype=np.int64)
            return b"", empty, empty, empty
        if self._pid != os.getpid():  # a forked child: the parent's threads are not here
            self._init_state()
        numbers = (positions - self.start) // self.step
        groups = np.minimum(positions, self._rest) // self._group
        pieces: list[tuple[bytes, np.ndarray, np.ndarray, np.ndarray]] = []
        where: list[np.ndarray] = []
        for g in np.unique(groups).tolist():
            here = np.flatnonzero(groups == g)
            where.append(here)
            pieces.append(self._from_group(epoch, g, positions[here], numbers[here]))
        if len(pieces) == 1:
            data, starts, lengths, indices = pieces[0]
            return (_compacted(data, starts, lengths) if compact else (data, starts, lengths)) + (
                indices,
            )
        at = np.concatenate(where)
        back = np.empty(len(positions), dtype=np.int64)
        back[at] = np.arange(len(positions))
        return _join(pieces, back)

    def read_many(self, positions: np.ndarray, epoch: int) -> tuple[list[bytes], np.ndarray]:
        """The records at ``positions`` as :meth:`read`, one ``bytes`` each, and their elements."""
        data, starts, lengths, indices = self.read(positions, epoch, compact=False)
        view = memoryview(data)
        ends = (starts + lengths).tolist()
        return [bytes(view[a:b]) for a, b in zip(starts.tolist(), ends, strict=True)], indices

    def _direct(
        self, positions: np.ndarray, epoch: int
    ) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
        indices = order.indices_at(positions, self.n, self.seed, epoch, self.window)
        data, starts, lengths = self.reader.read_packed(indices)
        return data, starts, lengths, indices

    def _from_group(
        self, epoch: int, g: int, positions: np.ndarray, numbers: np.ndarray
    ) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
        """The records at ``positions`` (of group ``g``), out of the group's records held."""
        key = (epoch, g)
        with self._lock:
            slot = self._groups.get(key)
            # A group let go lies at most _most behind the furthest of this pass (a
            # straggler's read: its records alone); any other group not held starts
            # a pass (or meets a straggler that far behind): cold, and read on from.
            e, furthest = self._furthest
            first = slot is None and not (e == epoch and furthest - self._most <= g <= furthest)
            unit: list[_Group] = []
            if first:
                unit = self._add_unit(epoch, g)
                slot = unit[0]
                if self._unit_bytes(unit) > HEADLESS_BYTES:
                    slot.head = _Group()
            if slot is not None:
                _mark_read(slot, numbers)
                # The next unit, unless it was read ahead already (and maybe let go),
                # while this group is at most a unit behind it.
                e, furthest = self._furthest
                nxt = (epoch, furthest + 1)
                if (
                    e == epoch
                    and furthest < self._last
                    and furthest + 1 - g <= self._span
                    and nxt not in self._groups
                ):
                    ahead = self._add_unit(epoch, furthest + 1)
                    self._start_load(epoch, ahead, after=slot if first else None)
        if slot is None:
            # An older group already let go (a read long in flight): its records alone.
            return self._direct(positions, epoch)
        if first and slot.head is None:
            self._start_load(epoch, unit)  # small enough to wait for (HEADLESS_BYTES)
        elif first and slot.head is not None:
            try:
                self.reader.open_all()  # the shards' indexes at once, not one by one
            except BaseException:
                slot.head.done.set()
                self._start_load(epoch, unit)  # which meets the error too, for every read
                raise
            # Beside the head, not behind it: a unit is a few large requests, which
            # take a few of the fetch pool's slots while the head's many small ones
            # wait on round trips. nginx +50 ms, 60,000 mnist-shaped records: the
            # last batch of a tf.data epoch came at 0.87 s (median of 12) against 0.97
            # s, of a DataLoader's (2 workers) at 1.24 s against 1.35 s.
            self._start_load(epoch, unit)
            try:
                self._fill([slot.head], epoch, [_head(slot.expected, numbers)])
            finally:
                slot.head.done.set()
        head = slot.head
        if head is not None and not slot.done.is_set():
            head.done.wait()
            if head.error is not None:
                raise head.error
            at, held = _find(head.numbers, numbers)
            if held.all():
                return _take(head, at)
            if not slot.done.is_set() and (numbers[~held] < head.numbers[0]).all():
                # Positions before the head (a read that came in beside the one that
                # made it, for earlier positions): they are needed before the head's,
                # so they are read now rather than behind the whole group.
                return self._mixed(head, at, held, positions, epoch)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        at, held = _find(slot.numbers, numbers)
        if held.all():
            return _take(slot, at)
        return self._mixed(slot, at, held, positions, epoch)

    def _mixed(
        self, piece: _Group, at: np.ndarray, held: np.ndarray, positions: np.ndarray, epoch: int
    ) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
        """The records at ``positions``: those ``held`` from ``piece``, the others read by themselves."""
        if not held.any():
            return self._direct(positions, epoch)
        parts = [_take(piece, at[held]), self._direct(positions[~held], epoch)]
        back = np.empty(len(positions), dtype=np.int64)
        back[np.r_[np.flatnonzero(held), np.flatnonzero(~held)]] = np.arange(len(positions))
        return _join(parts, back)

    def _add(self, key: tuple[int, int]) -> _Group:
        """A new slot for group ``key``, older ones let go as the module doc says (lock held)."""
        slot = self._groups[key] = _Group()
        slot.group = key[1]
        slot.expected = self._numbers(key[1])
        slot.read = np.zeros(len(slot.expected), dtype=bool)
        if len(self._groups) > KEPT:
            for old in [k for k, s in self._groups.items() if k != key and s.read.all()]:
                if len(self._groups) <= KEPT:
                    break
                del self._groups[old]
        while len(self._groups) > self._most:
            del self._groups[next(iter(self._groups))]
        return slot

    def _add_unit(self, epoch: int, g: int) -> list[_Group]:
        """New slots for group ``g`` and the groups read with it (lock held)."""
        last = min(g + self._span, self._last + 1) - 1
        self._furthest = (epoch, last)
        keys = [(epoch, h) for h in range(g, last + 1)]
        return [self._add(k) for k in keys if k == keys[0] or k not in self._groups]

    def _unit_bytes(self, unit: list[_Group]) -> float:
        """About the bytes a unit's read fetches (all the workers' that share it)."""
        records = sum(len(slot.expected) for slot in unit)
        if self.exchange is not None and self.share is not None:
            records *= self.share[1]
        return records * self.reader.record_bytes

    def _numbers(self, g: int, everyone: bool = False) -> np.ndarray:
        """This reader's numbers of group ``g``'s positions (its share of them), sorted.

        ``everyone``: those of every share (all the DataLoader workers').
        """
        lo = g * self._group
        hi = lo + self._group if lo < self._rest else self.n
        first = max(0, -(-(lo - self.start) // self.step))
        last = max(first, -(-(hi - self.start) // self.step))
        numbers = np.arange(first, last, dtype=np.int64)
        if self.share is not None and not everyone:
            batch, period, phase = self.share
            numbers = numbers[(numbers // batch) % period == phase]
        return numbers

    def _start_load(self, epoch: int, unit: list[_Group], after: _Group | None = None) -> None:
        thread = threading.Thread(
            target=self._load, args=(epoch, unit, after), name="superserial-group", daemon=True
        )
        thread.start()

    def _load(self, epoch: int, unit: list[_Group], after: _Group | None) -> None:
        """Reads the records of a unit's groups into their slots (once ``after`` is read)."""
        try:
            if after is not None:
                # The unit read ahead of a cold one comes behind it, not beside it.
                after.done.wait()
            self._fill(unit, epoch, [slot.expected for slot in unit])
        finally:
            for slot in unit:
                slot.done.set()

    def _fill(self, pieces: list[_Group], epoch: int, numbers: list[np.ndarray]) -> None:
        """Reads this reader's records of ``numbers[i]`` into ``pieces[i]``, with one read.

        An error of the read is given to every piece (and raised by the reads of it).
        """
        try:
            positions = self.start + np.concatenate(numbers) * self.step
            indices = order.indices_at(positions, self.n, self.seed, epoch, self.window)
            groups = [piece.group for piece in pieces]
            if self.exchange is not None and min(groups) >= 0:
                data, starts, lengths = self._exchanged(epoch, groups, indices)
            else:
                data, starts, lengths = self.reader.read_packed(indices, self._amplification)
        except BaseException as e:  # noqa: BLE001  # handed to every read of it, raised there
            for piece in pieces:
                piece.error = e
            return
        a = 0
        for piece, mine in zip(pieces, numbers, strict=True):
            b = a + len(mine)
            piece.fill(mine, indices[a:b], (data, starts[a:b], lengths[a:b]))
            a = b

    def _exchanged(
        self, epoch: int, groups: list[int], indices: np.ndarray
    ) -> tuple[bytes, np.ndarray, np.ndarray]:
        """Records ``indices`` of a unit's groups, the unit fetched by all the workers at once.

        Every worker's records of the unit, sorted, are cut into one part per worker;
        :meth:`UnitExchange.records` gives the parts this worker needs.
        """
        if self.exchange is None or self.share is None:
            raise ValueError("internal: an exchanged read without an exchange")
        batch, period, phase = self.share
        if self.exchange.full:
            return self.reader.read_packed(indices, SHARE_AMPLIFICATION)
        everyone = np.concatenate([self._numbers(g, everyone=True) for g in groups])
        every = order.indices_at(
            self.start + everyone * self.step, self.n, self.seed, epoch, self.window
        )
        sorter = np.argsort(every, kind="stable")
        cuts = [len(every) * p // period for p in range(period + 1)]
        part_of = np.arange(len(every)) * period // max(1, len(every))
        needed = np.zeros((period, period), dtype=bool)
        needed[((everyone // batch) % period)[sorter], part_of] = True
        ordered = every[sorter]
        parts = [ordered[cuts[p] : cuts[p + 1]] for p in range(period)]
        names = (self.n, self.seed, self.window, epoch, self.start, self.step, batch, period)
        key = "-".join(str(x) for x in (*names, groups[0], groups[-1], self.nonce))
        got = self.exchange.records(
            key, parts, needed, phase, lambda at: self.reader.read_pieces(at)
        )
        packs = [(parts[p], pack) for p, pack in enumerate(got) if pack is not None]
        held = np.concatenate([idx for idx, _ in packs]) if packs else ordered[:0]
        at = np.minimum(np.searchsorted(held, indices), max(0, len(held) - 1))
        if not len(held) or not np.array_equal(held[at], indices):
            # Not among the parts shared (the directory is full): read them itself.
            return self.reader.read_packed(indices, SHARE_AMPLIFICATION)
        sizes = [sum(len(piece) for piece in pack[0]) for _, pack in packs]
        offsets = np.cumsum([0, *sizes[:-1]])
        starts = np.concatenate([pack[1] + o for (_, pack), o in zip(packs, offsets, strict=True)])
        lengths = np.concatenate([pack[2] for _, pack in packs])
        # The one copy of the unit's records: the parts are left in pieces (fetched, or
        # mapped from another worker's file) until here.
        data = b"".join(piece for _, pack in packs for piece in pack[0])
        return data, starts[at], lengths[at]


def _head(mine: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """The numbers a cold group's first read takes: ``numbers`` and the next of ``mine``.

    ``mine`` are this reader's numbers of the group, sorted.
    """
    # From REACH before the first number asked for: the reads that come in beside
    # this one (tf.data's parallel chunks) may be for earlier positions.
    # HEAD positions from that, so the head's size does not depend on which of
    # the reads beside each other came first.
    lo = max(0, int(np.searchsorted(mine, int(numbers.min()))) - REACH)
    return np.union1d(mine[lo : lo + HEAD], numbers)


def _mark_read(slot: _Group, numbers: np.ndarray) -> None:
    """Marks ``numbers`` (those of the slot's group that are this reader's) as read."""
    at, found = _find(slot.expected, numbers)
    slot.read[at[found]] = True


def _find(sorted_numbers: np.ndarray, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``numbers`` is in ``sorted_numbers``, and whether it is there."""
    if not len(sorted_numbers):
        return np.zeros(len(numbers), dtype=np.int64), np.zeros(len(numbers), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_numbers, numbers), len(sorted_numbers) - 1)
    return at, sorted_numbers[at] == numbers


def _take(slot: _Group, at: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """The records at ``at`` of a group held, where they lie in its buffer (not copied)."""
    return slot.data, slot.starts[at], slot.lengths[at], slot.indices[at]


def _compacted(
    data: bytes, starts: np.ndarray, lengths: np.ndarray
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The records ``data[starts[i] : starts[i] + lengths[i]]`` packed into a buffer of their own."""
    at = np.zeros(len(starts), dtype=np.int64)
    np.cumsum(lengths[:-1], out=at[1:])
    if len(data) == int(lengths.sum()) and np.array_equal(starts, at):
        return data, starts, lengths  # packed already (a read of its own)
    view = memoryview(data)
    ends = starts + lengths
    packed = b"".join(view[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True))
    return packed, at, lengths


def _join(
    parts: list[tuple[bytes, np.ndarray, np.ndarray, np.ndarray]], back: np.ndarray
) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """Packed parts as one, record ``back[i]`` of their concatenation being record ``i``."""
    parts = [(*_compacted(d, s, n), i) for d, s, n, i in parts]  # not whole groups' buffers
    offsets = np.cumsum([0] + [len(d) for d, _, _, _ in parts[:-1]])
    starts = np.concatenate([s + o for (_, s, _, _), o in zip(parts, offsets, strict=True)])
    lengths = np.concatenate([p[2] for p in parts])
    indices = np.concatenate([p[3] for p in parts])
    return b"".join(p[0] for p in parts), starts[back], lengths[back], indices[back]

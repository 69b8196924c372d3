"""A windowed ``Sampler``'s indices, and ``MapDataset``'s reads of them a group at a time (TF-free).

``Sampler(n, seed=..., shuffle_window=W)`` yields plain ``int`` indices, one in
:data:`MARK` of them a :class:`WindowedIndex`: an ``int`` (the element, as before) that
also says where it is: the order's arguments (a :class:`Plan`) and this rank's number of
its position, from which the indices after it count on. A DataLoader hands a batch of
them to ``MapDataset.__getitems__`` (in a worker process, pickled), which reads them
through :class:`BatchReads`: one :class:`~superserial.read.group_reads.GroupReads` per
process reads the group of the windowed order the batch is in, whole blocks in one
range read each, and the next group ahead, so that a batch is sliced out of records
already read rather than read by itself (256 records in 256 blocks: 256 requests).

A DataLoader with ``num_workers=k`` deals batches to its workers in turn, so worker
``w`` reads batches ``w, w + k, ...`` of the sampler's: each worker reads that share of
each group, guessed from the first batch it gets (and guessed again when a batch falls
outside it). Remotely, the workers fetch each unit of groups once between them, a part
each, and read the others' parts from a directory they share
(:mod:`superserial.read.unit_exchange`). The records returned are always those of the indices asked for: a batch
whose indices disagree with the order they carry, or that carries none and does not
follow the worker's previous batch, is read index by index as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np
from torch.utils.data import get_worker_info

from superserial.read import order
from superserial.read.group_reads import GroupReads
from superserial.read.numpy_reader import NumpyDataset
from superserial.read.unit_exchange import UnitExchange
from superserial.storage import fs

__all__ = ["MARK", "BatchReads", "Plan", "WindowedIndex"]

# One index in this many of a windowed Sampler's carries its place (the others are plain
# ints): creating and pickling one object per element cost the DataLoader's process
# more than its workers' reads. Local disk, 2 workers, 60,000 mnist-shaped records:
# 81-115k el/s with every index placed, 162-196k with one in 8 (epochs with the
# workers' start).
MARK = 8


class Plan(NamedTuple):
    """The windowed order a :class:`WindowedIndex` is of, and the rank that reads it."""

    n: int
    seed: int
    window: int
    epoch: int
    num_replicas: int
    rank: int


class WindowedIndex(int):
    """An index of a windowed order that knows its place: position ``rank + number * num_replicas``.

    It is the ``int`` of the element; ``plan`` and ``number`` are for
    :class:`BatchReads`, and survive pickling into DataLoader workers.
    """

    plan: Plan
    number: int

    def __new__(cls, value: int, plan: Plan, number: int) -> WindowedIndex:
        index = super().__new__(cls, value)
        index.plan, index.number = plan, number
        return index

    def __reduce__(self) -> tuple[Any, ...]:
        return (WindowedIndex, (int(self), self.plan, self.number))


class BatchReads:
    """``MapDataset``'s batched reads: a windowed Sampler's batches by group, others by index.

    Args:
        source: The dataset read.
    """

    def __init__(self, source: NumpyDataset) -> None:
        self.source = source
        self._reads: GroupReads | None = None
        self._batch = 0
        self._next: tuple[Plan, int] | None = None  # see _place
        # Made here, in the process that starts the DataLoader's workers, for them to
        # share (a directory, in memory where it can be); locally a map serves them all.
        remote = not fs.is_local(source.records.path)
        self._exchange = UnitExchange() if remote else None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "_reads": None,
            "_batch": 0,
            "_next": None,
            "_exchange": self._exchange,
        }

    def __call__(self, indices: Sequence[int]) -> list[Any]:
        """The elements at ``indices``, in that order (``NumpyDataset.get_elements``)."""
        got = self._read(indices)
        if got is None:
            return self.source.get_elements(indices)
        data, starts, lengths, elements = got
        view, where, ends = memoryview(data), self.source.records.where, starts + lengths
        records = [bytes(view[a:b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        return self.source.decode(records, [where(i) for i in elements.tolist()])

    def batch(self, indices: Sequence[int]) -> Any:
        """The elements at ``indices`` as one batch (``NumpyDataset.get_batch``'s layout),
        decoded vectorized from the group's buffer where the fast decoder serves."""
        got = self._read(indices)
        return self.source.get_batch(indices) if got is None else self.source.decode_packed(*got)

    def _read(
        self, indices: Sequence[int]
    ) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray] | None:
        """The records of a windowed Sampler's batch read by group, packed, or None to read
        by index."""
        placed = self._place(indices)
        if placed is None:
            return None
        plan, numbers = placed
        reads = self._reads_for(plan, numbers)
        positions = plan.rank + numbers * plan.num_replicas
        # Cut and decoded from the group's buffer at once: no copy of the batch's records.
        got = reads.read(positions, plan.epoch, compact=False)
        if not np.array_equal(got[3], np.asarray(indices, dtype=np.int64)):
            return None
        return got

    def _place(self, indices: Sequence[int]) -> tuple[Plan, np.ndarray] | None:
        """The order of a batch's indices and this rank's numbers of them, or None if unknown.

        From the first index among the first :data:`MARK` that carries its place: the
        batch's others are the sampler's next ones, as a ``BatchSampler`` takes them.
        A batch that carries none (one shorter than ``MARK``) is guessed to follow this
        worker's previous one, and taken only if the order gives its very indices.
        (Either way the elements read are checked against the indices.)
        """
        head = itertools.islice(indices, MARK)
        at = next((j for j, i in enumerate(head) if isinstance(i, WindowedIndex)), None)
        if at is not None:
            first = cast(WindowedIndex, indices[at])
            plan, start = first.plan, first.number - at
        elif self._next is not None:
            plan, start = self._next
        else:
            return None
        if plan.n != len(self.source) or start < 0:
            return None
        numbers = np.arange(start, start + len(indices), dtype=np.int64)
        if at is None:
            positions = plan.rank + numbers * plan.num_replicas
            if positions[-1] >= plan.n or not np.array_equal(
                order.indices_at(positions, plan.n, plan.seed, plan.epoch, plan.window),
                np.asarray(indices, dtype=np.int64),
            ):
                self._next = None
                return None
        info = get_worker_info()
        period = 1 if info is None else info.num_workers
        self._next = (plan, start + period * len(indices))  # this worker's next batch, if alike
        return plan, numbers

    def _reads_for(self, plan: Plan, numbers: np.ndarray) -> GroupReads:
        """The group reads of ``plan``'s order for this worker's share, made anew if it changed."""
        info = get_worker_info()
        period = 1 if info is None else info.num_workers
        self._batch = max(self._batch, len(numbers))
        share = None
        nonce = 0
        if info is not None and period > 1:
            share = (self._batch, period, int(numbers[0]) // self._batch % period)
            nonce = info.seed - info.id  # the iterator's base seed: the same in its workers
        reads = self._reads
        mine = (plan.n, plan.seed, plan.window, plan.rank, plan.num_replicas, share)
        if (
            reads is None
            or (reads.n, reads.seed, reads.window, reads.start, reads.step, reads.share) != mine
        ):
            reads = self._reads = GroupReads(
                self.source.records,
                plan.n,
                plan.seed,
                plan.window,
                start=plan.rank,
                step=plan.num_replicas,
                share=share,
                exchange=self._exchange,
                nonce=nonce,
            )
        return reads

"""The global shuffled order as a Grain ``MapDataset`` (imports Grain).

:class:`ShuffledMapDataset` presents a Grain ``MapDataset`` of ``n``
elements in the order :func:`superserial.read.order.permutation` ``(n, seed,
epoch)``: its element ``p`` is the parent's element ``indices_at(p)``. It
is what :func:`superserial.grain.dataset` returns over a saved dataset;
:mod:`superserial.grain` imports this module only then, so that its
``DataSource`` works without Grain installed.

Past the first ``n`` indices (what ``repeat()`` asks for), index ``j * n +
p`` is position ``p`` of epoch ``epoch + j``: pass ``j`` of
``ds.repeat()`` is ``permutation(n, seed, epoch + j)``, as Grain's own
``shuffle`` reseeds each pass. With ``repeat(reseed_each_epoch=False)``
every pass is the first.

Grain iterators over it (``to_iter_dataset()``, with ``batch`` or other
transformations after it) checkpoint the next index to read, so
``get_state()`` / ``set_state()`` resume exactly: the order is a function of
the index alone. Worker ``i`` of ``k`` takes ``ds[i::k]``: positions ``i,
i+k, ...`` of the global order, as every superserial reader splits it.

A windowed order reads its groups for the indices this process asks for.
Grain does not tell a dataset which slice of it a worker reads, so the step
between them is learned from the indices themselves (:class:`WorkerReads`): the
first few are read by themselves, then each group is read for this
process's share alone (``start, start + step, ...``), and a host whose
workers split the indices reads each block once, not once per worker.

This module does not import TensorFlow.
"""

from __future__ import annotations

import math
import operator
import os
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from superserial.read.group_reads import GroupReads
from superserial.read.numpy_reader import NumpyDataset
from superserial.read.order import check_seed, check_window, indices_at

__all__ = ["ShuffledMapDataset", "WorkerReads"]

# Grain reads a MapDataset one index at a time (its iterators, and its batch,
# call ds[i]); one call of indices_at costs ~150 us, about what a block of 256
# positions costs. So ds[i] computes the aligned block of positions around i
# and keeps the last few blocks: a sequential read pays ~1 us per element.
_BLOCK = 256
_KEPT_BLOCKS = 64
# A windowed order's first indices in a process are read by themselves, to learn the
# step between them before any group is read (see WorkerReads).
_PROBE = 4


class WorkerReads:
    """A windowed order's group reads for the indices one process asks for, and their step.

    The step is the greatest common divisor of the differences between the
    indices seen (Grain worker ``i`` of ``k`` asks for ``i, i + k, ...``; one
    iterator alone, for ``0, 1, ...``); it only ever shrinks, and the readers
    are made anew when it does. Pass ``j`` of the indices (``j * n + p``)
    holds positions ``p = start, start + step, ...`` with ``start`` the first
    index's remainder, shifted by ``j * n``. A pickled or forked copy starts
    afresh: a worker learns its own step.
    """

    def __init__(self, source: NumpyDataset, n: int, seed: int, window: int) -> None:
        self.source, self.n, self.seed, self.window = source, n, seed, window
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._first: int | None = None
        self._seen = 0
        self._step = 0
        self._reads: dict[int, GroupReads] = {}  # start -> the reads of that pass's share

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "n": self.n, "seed": self.seed, "window": self.window}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    def step(self, indices: np.ndarray) -> int:
        """The step learned with ``indices`` seen too; 0 while still probing."""
        with self._lock:
            if self._pid != os.getpid():
                self._init_state()
            if self._first is None:
                self._first = int(indices[0])
            step = math.gcd(self._step, *(abs(int(i) - self._first) for i in indices.tolist()))
            if step != self._step:
                self._step, self._reads = step, {}
            self._seen += len(indices)
            return self._step if self._seen > _PROBE else 0

    def reads(self, epoch_pass: int) -> GroupReads:
        """The group reads of pass ``epoch_pass``'s positions for this process's step.

        The step is the one learned so far, not the one :meth:`step` returned
        to the caller: Grain's threads ask for indices concurrently, so another
        thread may have shrunk it in between. A smaller step divides the
        larger, so the caller's positions are in the new share too.
        """
        with self._lock:
            if self._first is None or not self._step:
                raise RuntimeError("expected a step learned before group reads, got none")
            step = self._step
            start = (self._first - epoch_pass * self.n) % step
            reads = self._reads.get(start)
            if reads is None:
                reads = self._reads[start] = GroupReads(
                    self.source.records, self.n, self.seed, self.window, start=start, step=step
                )
            return reads


class ShuffledMapDataset(grain.MapDataset):
    """A Grain ``MapDataset`` in superserial's global shuffled order.

    Args:
        parent: The ``MapDataset`` to reorder, of ``n`` elements (such as
            ``grain.MapDataset.source(superserial.grain.DataSource(path))``).
        seed: The order's seed, an integer in ``[0, 2**64)``; None draws one
            (kept in :attr:`shuffle_seed`: pass it again to resume from a
            checkpoint in another process).
        shuffle: False keeps the parent's order (index ``p`` is element
            ``p``), with the same epochs and splitting.
        epoch: The epoch of the first pass, an integer in ``[0, 2**64)``.
        shuffle_window: None: the global order. An integer ``W``: the
            windowed order ``permutation(n, seed, epoch, window=W)``
            (``docs/shuffle.md``).
        source: The dataset the parent reads (``superserial.grain.dataset``
            gives it): a windowed order then reads its records a group at a
            time (:class:`~superserial.read.group_reads.GroupReads`: whole
            blocks, the next group ahead) rather than element by element.

    Attributes:
        shuffle_seed: The seed used (given or drawn).
        shuffled: ``shuffle`` as given (``shuffle`` is Grain's method).
        epoch, shuffle_window: As given.

    Raises:
        ValueError: ``seed`` or ``epoch`` is not an integer in ``[0, 2**64)``,
            or ``shuffle_window`` is not None nor a positive integer (or is
            given with ``shuffle=False``).
    """

    _MUTATES_ELEMENT_SPEC = False  # (Grain's statistics: elements pass through unchanged)

    def __init__(
        self,
        parent: Any,
        *,
        seed: int | None = None,
        shuffle: bool = True,
        epoch: int = 0,
        shuffle_window: int | None = None,
        source: NumpyDataset | None = None,
    ) -> None:
        super().__init__(parent)
        self.shuffle_seed = secrets.randbits(64) if seed is None else check_seed(seed)
        self.shuffled = bool(shuffle)
        self.epoch = check_seed(epoch, "epoch")
        self.shuffle_window = check_window(shuffle_window)
        if self.shuffle_window is not None and not self.shuffled:
            raise ValueError(
                f"expected shuffle_window=None with shuffle=False (the saved order), "
                f"got shuffle_window={self.shuffle_window}"
            )
        self._n = len(parent)
        # (epoch, block) -> the elements at that block's positions. Threads of
        # a Grain iterator share it: a race computes a block twice, no worse.
        self._blocks: dict[tuple[int, int], np.ndarray] = {}
        # The windowed order read a group at a time, when the parent is this source's.
        self._reads: WorkerReads | None = None
        if source is not None and self.shuffle_window is not None:
            self._reads = WorkerReads(source, self._n, self.shuffle_seed, self.shuffle_window)

    def __len__(self) -> int:
        return self._n

    def _check(self, lowest: int) -> None:
        if lowest < 0:
            raise IndexError(f"expected non-negative indices into {self}, got {lowest}")
        if not self._n:
            raise IndexError(f"expected no index into {self}: it is empty")

    def _elements(self, indices: np.ndarray) -> list[int]:
        """The parent's indices for ``indices`` of this dataset (any passes)."""
        self._check(int(indices.min()))
        passes, positions = np.divmod(indices, self._n)
        if not self.shuffled:
            return [int(p) for p in positions.tolist()]
        out = np.empty_like(positions)
        for j in np.unique(passes).tolist():
            here = passes == j
            epoch = check_seed(self.epoch + j, "epoch (first epoch + pass)")
            out[here] = indices_at(
                positions[here], self._n, self.shuffle_seed, epoch, self.shuffle_window
            )
        return [int(i) for i in out.tolist()]

    def _block(self, epoch: int, block: int) -> np.ndarray:
        key = (epoch, block)
        found = self._blocks.get(key)
        if found is None:
            lo = block * _BLOCK
            positions = np.arange(lo, min(lo + _BLOCK, self._n), dtype=np.int64)
            found = indices_at(positions, self._n, self.shuffle_seed, epoch, self.shuffle_window)
            if len(self._blocks) >= _KEPT_BLOCKS:
                self._blocks.clear()
            self._blocks[key] = found
        return found

    def __getitem__(self, index: Any) -> Any:
        """Element ``index``: position ``index % n`` of epoch ``epoch + index // n``.

        A slice gives a sliced ``MapDataset`` (``ds[i::k]``: worker ``i`` of ``k``).

        Raises:
            IndexError: ``index`` is negative, or the dataset is empty.
            ValueError: ``epoch + index // n`` is not below ``2**64``.
        """
        if isinstance(index, slice):
            return self.slice(index)
        index = operator.index(index)
        self._check(index)
        j, position = divmod(index, self._n)
        if not self.shuffled:
            return self._parent[position]
        epoch = check_seed(self.epoch + j, "epoch (first epoch + pass)")
        if self._reads is not None:
            return self._read(np.array([index], dtype=np.int64))[0]
        block, offset = divmod(position, _BLOCK)
        return self._parent[int(self._block(epoch, block)[offset])]

    def _getitems(self, indices: Sequence[int]) -> Sequence[Any]:
        # Grain's batched read, for transformations that ask for many indices
        # at once (Grain 0.2's own batch still reads element by element): one
        # vectorized computation of the order, one batched read of the parent.
        if not len(indices):
            return []
        if self._reads is not None and self.shuffled:
            return self._read(np.asarray(indices, dtype=np.int64))
        elements = self._elements(np.asarray(indices, dtype=np.int64))
        return self._parent._getitems(elements)  # type: ignore[no-any-return]

    def _read(self, indices: np.ndarray) -> list[Any]:
        """The elements at ``indices`` (any passes) of the windowed order, out of whole groups."""
        if self._reads is None:
            raise RuntimeError("expected group reads of a windowed order, got none")
        self._check(int(indices.min()))
        step = self._reads.step(indices)
        if not step:  # still learning the step: read by themselves
            return self._parent._getitems(self._elements(indices))  # type: ignore[no-any-return]
        source = self._reads.source
        where = source.records.where
        passes, positions = np.divmod(indices, self._n)
        out: list[Any] = [None] * len(indices)
        for j in np.unique(passes).tolist():
            here = np.flatnonzero(passes == j)
            epoch = check_seed(self.epoch + j, "epoch (first epoch + pass)")
            records, elements = self._reads.reads(j).read_many(positions[here], epoch)
            decoded = source.decode(records, [where(i) for i in elements.tolist()])
            for i, e in zip(here.tolist(), decoded, strict=True):
                out[i] = e
        return out

    def __str__(self) -> str:
        return (
            f"ShuffledMapDataset(seed={self.shuffle_seed}, shuffle={self.shuffled}, "
            f"epoch={self.epoch}, shuffle_window={self.shuffle_window})"
        )

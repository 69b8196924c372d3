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

This module does not import TensorFlow.
"""

from __future__ import annotations

import operator
import secrets
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from superserial.read.group_reads import GroupReads
from superserial.read.numpy_reader import NumpyDataset
from superserial.read.order import check_seed, check_window, indices_at

__all__ = ["ShuffledMapDataset"]

# Grain reads a MapDataset one index at a time (its iterators, and its batch,
# call ds[i]); one call of indices_at costs ~150 us, about what a block of 256
# positions costs. So ds[i] computes the aligned block of positions around i
# and keeps the last few blocks: a sequential read pays ~1 us per element.
_BLOCK = 256
_KEPT_BLOCKS = 64


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
        self._source = source if self.shuffle_window is not None else None
        self._reads: GroupReads | None = None
        if self._source is not None and self.shuffle_window is not None:
            self._reads = GroupReads(
                self._source.records, self._n, self.shuffle_seed, self.shuffle_window
            )

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
            return self._read(np.array([position]), epoch)[0]
        block, offset = divmod(position, _BLOCK)
        return self._parent[int(self._block(epoch, block)[offset])]

    def _getitems(self, indices: Sequence[int]) -> Sequence[Any]:
        # Grain's batched read, for transformations that ask for many indices
        # at once (Grain 0.2's own batch still reads element by element): one
        # vectorized computation of the order, one batched read of the parent.
        if not len(indices):
            return []
        if self._reads is not None and self.shuffled:
            wanted = np.asarray(indices, dtype=np.int64)
            self._check(int(wanted.min()))
            passes, positions = np.divmod(wanted, self._n)
            out: list[Any] = [None] * len(wanted)
            for j in np.unique(passes).tolist():
                here = np.flatnonzero(passes == j)
                epoch = check_seed(self.epoch + j, "epoch (first epoch + pass)")
                for i, e in zip(here.tolist(), self._read(positions[here], epoch), strict=True):
                    out[i] = e
            return out
        elements = self._elements(np.asarray(indices, dtype=np.int64))
        return self._parent._getitems(elements)  # type: ignore[no-any-return]

    def _read(self, positions: np.ndarray, epoch: int) -> list[Any]:
        """The elements at ``positions`` of ``epoch``'s windowed order, out of whole groups."""
        if self._reads is None or self._source is None:
            raise RuntimeError("expected group reads of a windowed order, got none")
        records, elements = self._reads.read_many(positions, epoch)
        where = self._source.records.where
        return self._source.decode(records, [where(i) for i in elements.tolist()])

    def __str__(self) -> str:
        return (
            f"ShuffledMapDataset(seed={self.shuffle_seed}, shuffle={self.shuffled}, "
            f"epoch={self.epoch}, shuffle_window={self.shuffle_window})"
        )

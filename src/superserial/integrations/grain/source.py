"""Grain input from superserial datasets, without TensorFlow.

    import grain
    from superserial.grain import DataSource

    source = DataSource("/data/digits")
    ds = grain.MapDataset.source(source).shuffle(seed=0).batch(256, batch_fn=source.collate)
    for batch in ds: ...

    loader = grain.python.DataLoader(            # Grain's samplers, worker processes
        data_source=source,
        sampler=grain.python.IndexSampler(len(source), grain.python.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=0),
        operations=[grain.python.Batch(256, batch_fn=source.collate)],
        worker_count=2)

    ds = dataset(source, seed=1234)              # superserial's global shuffled order
    it = iter(ds.batch(256, batch_fn=source.collate).to_iter_dataset())
    state = it.get_state()                      # ... it.set_state(state) resumes exactly

:class:`DataSource` satisfies Grain's ``RandomAccessDataSource`` protocol:
``len(source)``, ``source[i]`` (one record read through the shard's record
index) and ``_getitems(indices)``, the batched read of Grain's
``SupportsBatchedReadRandomAccessDataSource`` (also as ``__getitems__``, the
name ``ArrayRecordDataSource`` gives it). It pickles without open files (each
Grain worker process opens its own), is safe to share between threads, and its
``repr`` names the dataset and its length, which Grain's ``DataLoader``
compares to refuse a checkpoint made on another source. Random access needs
uncompressed shards with record indexes (see :mod:`superserial.numpy`).

Elements are the numpy values :mod:`superserial.numpy` gives: a dense leaf is
an ``np.ndarray`` (0-d for scalars, ``object`` holding ``bytes`` for
strings), ragged and sparse leaves are :class:`~superserial.numpy.Ragged` and
:class:`~superserial.numpy.Sparse`.

:func:`dataset` gives the dataset as a ``grain.MapDataset`` in the order
:func:`superserial.permutation` ``(n, seed, epoch)``, the order
``superserial.load(path, shuffle=True)`` and ``superserial.torch.Sampler``
give for the same seed (see :mod:`superserial.integrations.grain.shuffle`). This module
imports Grain only there.

Batching: Grain's default ``batch`` stacks every leaf with ``np.stack`` and
fails on a variable-length dense leaf (such as ``int64[None]``); ragged and
sparse leaves become ``object`` arrays of their values. Pass
``batch_fn=source.collate`` for the layout of
:meth:`superserial.numpy.NumpyDataset.get_batch`: fixed-shape dense leaves
stacked ``[B, *shape]``, every other leaf a list of its ``B`` values.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, SupportsIndex

import numpy as np

from superserial.errors import require
from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, Node, iter_leaves, pack
from superserial.read import numpy_reader as ssnp
from superserial.read.opening import open_dataset

if TYPE_CHECKING:
    from superserial.integrations.grain.shuffle import ShuffledMapDataset

__all__ = ["DataSource", "dataset"]


class DataSource:
    """A saved dataset as a Grain random-access data source: ``source[i]`` is element ``i``.

    Args:
        path: The dataset directory (local, or an fsspec URL).
        cache_dir: For a URL: a local cache directory for the shards, as
            :func:`superserial.numpy.load` takes it.
        cache_limit: The most bytes ``cache_dir`` keeps, as
            :func:`superserial.numpy.load` takes it. Shards that do not all
            fit: as many whole ones as fit are pinned in the background, the
            others read remotely (see :mod:`superserial.read.cache.pins`).
        select: Read only these leaves, as :func:`superserial.numpy.load`
            takes it.

    Attributes:
        source: The :class:`~superserial.numpy.NumpyDataset` read.
        path: The dataset directory or URL.
        header: The dataset's header.

    Raises:
        DatasetNotFoundError, HeaderError, CorruptDataError: As
            :func:`superserial.numpy.load`.
        UnsupportedError: A shard has no record index (written before
            indexes, or compressed before restart points, existed): here, not in a worker.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        select: Iterable[str] | None = None,
    ) -> None:
        self.source = ssnp.NumpyDataset.from_opened(
            open_dataset(
                path,
                select=select,
                cache_dir=cache_dir,
                cache_limit=cache_limit,
                random_access=True,
            )
        )
        self.path = self.source.path
        self.header: Header = self.source.header
        self.source.records  # noqa: B018  # raises UnsupportedError now rather than in a worker
        self._fixed = [leaf.fixed for leaf in iter_leaves(self.header.structure)]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: SupportsIndex) -> Any:
        """Element ``index`` (negative from the end).

        Raises:
            IndexError: ``index`` is out of range.
            CorruptDataError: The record or its shard's index is damaged.
        """
        return self.source[operator.index(index)]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The elements at ``indices``, in that order, duplicates allowed: one batched read.

        Raises:
            IndexError: An index is out of range.
            CorruptDataError: A record or a shard's index is damaged.
        """
        return self.source.get_elements(indices)

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        # The name Grain's SourceMapDataset calls for a batched read.
        return self.__getitems__(indices)

    def collate(self, elements: Sequence[Any]) -> Any:
        """Batches elements of this source as :meth:`NumpyDataset.get_batch` lays them out.

        For ``batch_fn=`` of Grain's ``MapDataset.batch`` and ``Batch``:
        fixed-shape dense leaves (by the header, whatever the lengths in the
        batch) are stacked ``[B, *shape]``, every other leaf becomes a list of
        its ``B`` values.

        Raises:
            ValueError: No elements, or an element not of the dataset's
                structure (e.g. changed by a ``map`` before the batch).
        """
        if not elements:
            raise ValueError("expected at least one element to batch, got none")
        node = self.header.structure
        try:
            flat = [_flatten(node, e) for e in elements]
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(
                f"expected elements of the structure of {self.path} (as the source gives "
                f"them), got one that does not fit it ({type(e).__name__}: {e}); after a "
                "map that changes it, pass a batch_fn of your own"
            ) from e
        columns = [list(c) for c in zip(*flat, strict=True)]
        leaves = [np.stack(c) if f else c for c, f in zip(columns, self._fixed, strict=True)]
        return pack(node, leaves)

    def __repr__(self) -> str:
        return f"DataSource({self.path!r}, {len(self)} elements)"


def dataset(
    path: str | os.PathLike[str] | DataSource,
    *,
    seed: int | None = None,
    shuffle: bool = True,
    epoch: int = 0,
    shuffle_window: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    select: Iterable[str] | None = None,
) -> ShuffledMapDataset:
    """A saved dataset as a ``grain.MapDataset`` in superserial's global shuffled order.

    Element ``p`` is element ``permutation(n, seed, epoch)[p]`` of the
    dataset, computed from ``p`` alone (the order is never held whole), read
    through the record index; batches (``.batch(...)``) are read in one
    batched read each. Iterators over it (``to_iter_dataset()``) resume
    exactly from ``get_state()`` / ``set_state()``.

    Later epochs: ``dataset(path, seed=s, epoch=e)`` is epoch ``e``; or
    ``.repeat(k)`` (or ``.repeat()``, endless) makes pass ``j`` epoch
    ``epoch + j``: one iterator, one checkpoint, across epoch boundaries.
    Worker ``i`` of ``k`` takes ``ds[i::k]`` (positions ``i, i+k, ...``).

    Args:
        path: The dataset directory (local, or an fsspec URL), or a
            :class:`DataSource` of it (to keep its ``collate`` at hand).
        seed: The order's seed, an integer in ``[0, 2**64)``. None draws one,
            kept in the dataset's ``shuffle_seed``: pass it when resuming in
            another process, or the checkpoint's positions fall in another
            order.
        shuffle: False keeps the saved order (epochs and splitting alike).
        epoch: The epoch of the first pass, an integer in ``[0, 2**64)``.
        shuffle_window: None: the global order. An integer ``W``: the
            windowed order ``permutation(n, seed, epoch, window=W)``, whose
            windows read runs of consecutive records (``docs/shuffle.md``).
            Give the same ``W`` when resuming: Grain's state holds the
            next index only, as it does not hold the seed.
        cache_dir: For a URL: a local cache directory for the shards, as
            :func:`superserial.numpy.load` takes it (not with a
            :class:`DataSource`, which has its own).
        cache_limit: The most bytes ``cache_dir`` keeps, as
            :func:`superserial.numpy.load` takes it.
        select: Read only these leaves, as :class:`DataSource` takes it
            (give it there when ``path`` is a :class:`DataSource`).

    Returns:
        A :class:`~superserial.integrations.grain.shuffle.ShuffledMapDataset` of ``len``
        the dataset's element count.

    Raises:
        MissingDependencyError: Grain is not installed (a ``ModuleNotFoundError``).
        ValueError: A bad ``seed``, ``epoch`` or ``shuffle_window``; ``select`` with a
            :class:`DataSource`, or naming no leaf of the dataset.
        DatasetNotFoundError, HeaderError, CorruptDataError: As
            :func:`superserial.numpy.load`.
        UnsupportedError: A shard has no record index.
    """
    # Here, not at the top: DataSource works without Grain.
    grain = require("grain", extra="grain", needed_for="superserial.grain.dataset", package="Grain")
    from superserial.integrations.grain.shuffle import ShuffledMapDataset

    if isinstance(path, DataSource):
        if cache_dir is not None or cache_limit is not None:
            raise ValueError(
                "expected cache_dir and cache_limit with a path, not with a DataSource "
                f"({path!r}), which was made with its own; pass them to DataSource"
            )
        if select is not None:
            raise ValueError(
                f"expected select= on the DataSource of {path.path} (it is read as it was "
                f"made), got select={select!r} beside it"
            )
        source = path
    else:
        source = DataSource(path, cache_dir=cache_dir, cache_limit=cache_limit, select=select)
    return ShuffledMapDataset(
        grain.MapDataset.source(source),
        seed=seed,
        shuffle=shuffle,
        epoch=epoch,
        shuffle_window=shuffle_window,
        source=source.source,
    )


def _flatten(node: Node, value: Any) -> list[Any]:
    """The leaves of ``value`` in :func:`~superserial.format.structure.iter_leaves` order."""
    if isinstance(node, Leaf):
        return [value]
    if isinstance(node, DictNode):
        return [x for k in sorted(node.items) for x in _flatten(node.items[k], value[k])]
    if len(value) != len(node.items):
        raise IndexError(f"{len(node.items)} items (it has {len(value)})")
    return [x for n, v in zip(node.items, value, strict=True) for x in _flatten(n, v)]

"""PyTorch input from superserial datasets, without TensorFlow.

    from torch.utils.data import DataLoader
    from superserial.torch import TorchDataset, collate, collate_padded

    ds = TorchDataset("/data/digits")          # rank/world size from torch.distributed
    loader = DataLoader(ds, batch_size=256, num_workers=4, collate_fn=collate)
    text = DataLoader(TorchDataset("/data/text"), batch_size=32, num_workers=2,
                      collate_fn=collate_padded(pad_value=0))
    shuffled = DataLoader(MapDataset("/data/digits"), batch_size=256, shuffle=True,
                          num_workers=4, collate_fn=collate)   # random access
    ordered = DataLoader(MapDataset("/data/digits"), batch_size=256, collate_fn=collate,
                         sampler=Sampler(60_000, seed=1))      # the global shuffled order

:class:`TorchDataset` streams whole shards (any compression); :class:`MapDataset` is
map-style: any sampler (``shuffle=True``, ``DistributedSampler``) picks the elements,
read one batch at a time through the record index (uncompressed shards only).
:class:`Sampler` (from :mod:`superserial.integrations.torch.sampler`) yields
superserial's global shuffled order, split among ranks, and resumes mid-epoch under
torchdata's ``StatefulDataLoader``.

Splitting: every element is read exactly once per epoch, by one reader (a
DataLoader worker of one rank), in two steps.

1. Ranks. With at least as many shard files as ranks, rank ``r`` reads
   whole shards ``r, r + world_size, ...`` (in order, or in an order
   shuffled the same way on every rank with ``shuffle_shards``). With fewer
   shards than ranks and uncompressed shards, the records of all shards
   (in that order) are cut into ``world_size`` contiguous ranges of
   near-equal size and rank ``r`` reads range ``r``. Either way ``len(ds)``,
   the rank's element count, is known in the main process.
2. Workers. With at least as many of its shards as workers, worker ``w``
   of a rank reads the rank's shards ``w, w + num_workers, ...``. With
   fewer, and uncompressed shards, the rank's records are cut into
   ``num_workers`` contiguous ranges of near-equal size and worker ``w``
   reads range ``w``: the outputs of workers ``0, 1, ...`` concatenated are
   then the rank's records in order. (A DataLoader interleaves its workers'
   batches, so batches arrive in neither order.)

Cutting a shard by records walks its TFRecord framing up to the range's
first record, reading 12 bytes per record skipped. Compressed (GZIP, ZLIB)
shards cannot be cut: a reader left without records then warns
(:class:`~superserial.errors.IdleReaderWarning`) and yields nothing; save
with ``num_shards`` a multiple of ``world_size * num_workers``. Ranks get
equal element counts only if the split is by records or the shards are of
equal sizes; distributed training that needs equal step counts per rank
must cap or pad the epoch itself (e.g. stop at the smallest rank's
``len(ds)``).

Leaves are converted as the numpy reader (:mod:`superserial.numpy`) gives
them: dense numeric leaves become ``torch.Tensor`` of the same dtype (bool,
int8-64, uint8-64, float16, bfloat16, float32, float64, complex64,
complex128; torch has uint16/32/64 tensors with limited operator support:
cast them with ``.to(torch.int64)`` if needed). Strings stay ``bytes``: a
scalar string is ``bytes``, a string array a nested list of ``bytes``.
Ragged and sparse leaves are :class:`~superserial.numpy.Ragged` /
:class:`~superserial.numpy.Sparse` holding torch tensors (for a torch
sparse tensor: ``torch.sparse_coo_tensor(s.indices.T, s.values,
tuple(s.dense_shape))``); a ragged leaf of ``ragged_rank`` 0 (what
``from_tensor_slices`` makes of a ragged column) is a plain tensor.

Batching, as :func:`superserial.numpy.iter_batches` does it: with
``collate_fn=collate``, dense leaves whose shape the header fixes are
stacked into ``[B, *shape]`` tensors; every other leaf (a dense leaf with an
unknown dimension such as ``int64[None]``, ragged of any ``ragged_rank``,
sparse, strings) becomes a list of its ``B`` per-element values. With
``collate_fn=collate_padded(pad_value=0)``, variable-length numeric leaves
become a :class:`Padded` instead: ``values``, the elements padded with
``pad_value`` to ``[B, *max_shape]``, and ``lengths``, int64, each
element's size along each variable dimension (the dimensions the header
leaves unknown; for a :class:`~superserial.numpy.Ragged`, its outer and
every ragged dimension, the largest row for inner ones): ``[B]`` for a
leaf with one variable dimension (a sequence), ``[B, k]`` for ``k``. The
choice is made per leaf from the header, never from the lengths in a
batch, so every batch has the same structure. Strings and sparse leaves
stay lists.

Batched reading: ``TorchDataset(path, batch_size=B)`` with
``DataLoader(ds, batch_size=None, num_workers=...)`` yields whole batches,
each decoded at once by :meth:`superserial.numpy.NumpyDataset.batches`
(vectorized for fixed-shape leaves) rather than element by element, with
the types ``collate`` gives; variable-length values leave a worker as
views of one storage, stacked tensors in a shared-memory slot the worker
reuses once no tensor of that batch is left in the main process
(:mod:`superserial.integrations.torch.share`). Each reader batches its own share, in its order: the
last batch of every worker may be short (``drop_remainder=True`` drops it).
For a dataset saved as tuples, pass ``collate_fn=keep``: the DataLoader's
default for ``batch_size=None`` turns tuples into lists.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from superserial.errors import IdleReaderWarning
from superserial.format.header import Header
from superserial.integrations.torch.collate import (
    Elements,
    Padded,
    collate,
    collate_padded,
    mark,
    variable_leaves,
)
from superserial.integrations.torch.convert import batch_to_torch, keep, to_torch
from superserial.integrations.torch.sampler import Sampler
from superserial.integrations.torch.windowed import BatchReads
from superserial.read import numpy_reader as ssnp
from superserial.read.opening import open_dataset

__all__ = [
    "MapDataset",
    "Padded",
    "Sampler",
    "TorchDataset",
    "collate",
    "collate_padded",
    "keep",
    "to_torch",
]

# (shard index, first record, record count): what one reader reads of a shard.
ShardRange = tuple[int, int, int]


def _split(parts: list[ShardRange], k: int, i: int) -> list[ShardRange]:
    """Range ``i`` of ``k`` contiguous, near-equal record ranges of ``parts`` in order."""
    total = sum(c for _, _, c in parts)
    lo, hi = i * total // k, (i + 1) * total // k
    out, at = [], 0
    for shard, start, count in parts:
        a, b = max(lo, at), min(hi, at + count)
        if a < b:
            out.append((shard, start + a - at, b - a))
        at += count
    return out


def _check_rank(rank: int, world_size: int) -> None:
    ok = isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size
    if not ok:
        raise ValueError(
            f"expected 0 <= rank < world_size, got rank={rank!r} world_size={world_size!r}"
        )


# IterableDataset is generic in its element type; ours is a nested structure (Any).
class TorchDataset(IterableDataset):  # type: ignore[type-arg]
    """A saved dataset as a ``torch.utils.data.IterableDataset``.

    See the module docstring for how shards (or records, when there are
    fewer shards than readers) are dealt out to ranks and DataLoader
    workers, and how :func:`collate` batches elements.

    Args:
        path: The dataset directory (local, or an fsspec URL).
        rank: This process's rank; with ``world_size``. Default: from
            ``torch.distributed`` if it is initialized when the dataset is
            made, else 0.
        world_size: The number of ranks (default: as ``rank``, else 1).
        shuffle_shards: Read the shards in an order shuffled per epoch (the
            same on every rank, from ``seed`` and :meth:`set_epoch`).
        seed: Seed of the shard shuffle.
        convert: Convert leaves to torch tensors (default); False yields
            the numpy reader's values.
        cache_dir: For a URL: a local cache directory for the shards, as
            :func:`superserial.numpy.load` takes it.
        cache_limit: The most bytes ``cache_dir`` keeps, as
            :func:`superserial.numpy.load` takes it.
        select: Read only these leaves, as :func:`superserial.numpy.load`
            takes it.
        batch_size: Yield batches of this many elements (of one reader's
            share; use ``DataLoader(ds, batch_size=None)``), as
            :func:`collate` would make them; None (default) yields elements.
        drop_remainder: With ``batch_size``: drop each reader's last batch
            if it is short.

    Raises:
        DatasetNotFoundError, HeaderError, CorruptDataError: As
            :func:`superserial.numpy.load`.
        ValueError: ``batch_size`` is not a positive int.

    Warns:
        IdleReaderWarning: This rank gets no records (more ranks than
            compressed shards); in a DataLoader worker, that worker gets none.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_shards: bool = False,
        seed: int = 0,
        convert: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        select: Iterable[str] | None = None,
        batch_size: int | None = None,
        drop_remainder: bool = False,
    ) -> None:
        super().__init__()
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"expected batch_size None or an int >= 1, got {batch_size!r}")
        self.batch_size, self.drop_remainder = batch_size, drop_remainder
        self._all = ssnp.NumpyDataset.from_opened(
            open_dataset(
                path, select=select, cache_dir=cache_dir, cache_limit=cache_limit, stream=True
            )
        )
        self.path = self._all.path
        self.header: Header = self._all.header
        if (rank is None) != (world_size is None):
            raise ValueError(
                f"expected rank and world_size together, got rank={rank!r} world_size={world_size!r}"
            )
        if rank is None or world_size is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank, world_size = dist.get_rank(), dist.get_world_size()
            else:
                rank, world_size = 0, 1
        _check_rank(rank, world_size)
        self.rank, self.world_size = rank, world_size
        self.shuffle_shards, self.seed, self.convert = shuffle_shards, seed, convert
        self.epoch = 0
        self._variable = variable_leaves(self.header.structure)
        if len(self) == 0 and len(self._all):
            self._warn_idle(f"rank {rank} of {world_size}", world_size)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch for the shard shuffle; call before each epoch's iteration.

        DataLoader workers get a copy of the dataset when an epoch starts; with
        ``persistent_workers=True`` they keep the epoch they started with.
        """
        self.epoch = epoch

    def _order(self) -> list[int]:
        order = list(range(len(self._all.files)))
        if self.shuffle_shards:
            rng = np.random.default_rng([self.seed, self.epoch])
            order = [int(i) for i in rng.permutation(len(order))]
        return order

    def _rank_parts(self) -> list[ShardRange]:
        parts = [(i, 0, self._all.counts[i]) for i in self._order()]
        if len(parts) >= self.world_size or not self.header.splittable:
            return parts[self.rank :: self.world_size]
        return _split(parts, self.world_size, self.rank)

    def parts_for(self, worker_id: int = 0, num_workers: int = 1) -> list[ShardRange]:
        """What one DataLoader worker of this rank reads, in order.

        Returns:
            ``(shard index, first record, record count)`` per shard read:
            whole shards when there are enough for every worker, else
            contiguous record ranges (of compressed shards: by their index).
        """
        parts = self._rank_parts()
        if len(parts) >= num_workers or not self.header.splittable:
            return parts[worker_id::num_workers]
        return _split(parts, num_workers, worker_id)

    def shards_for(self, worker_id: int = 0, num_workers: int = 1) -> list[int]:
        """The shard indices one DataLoader worker of this rank reads (some maybe in part)."""
        return [shard for shard, _, _ in self.parts_for(worker_id, num_workers)]

    def __len__(self) -> int:
        """The number of elements this rank reads per epoch (over all its workers)."""
        return sum(count for _, _, count in self._rank_parts())

    def _warn_idle(self, who: str, readers: int) -> None:
        shards = len(self._all.files)
        why = (
            f"its {self.header.compression} shards have no restart points to split them by"
            if not self.header.splittable and shards < readers
            else f"it has {len(self._all)} records for {readers} readers"
        )
        warnings.warn(
            f"superserial: {who} gets no records of {self.path} and yields nothing: the "
            f"dataset has {shards} shard file(s) for {readers} readers (ranks x DataLoader "
            f"workers) and {why}; save it with num_shards= a multiple of {readers}",
            IdleReaderWarning,
            stacklevel=3,
        )

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        picked = self.parts_for(worker_id, num_workers)
        if not any(count for _, _, count in picked) and len(self._all):
            self._warn_idle(
                f"worker {worker_id} of {num_workers} of rank {self.rank}",
                num_workers * self.world_size,
            )
        part = ssnp.NumpyDataset(
            self.path,
            self.header,
            [self._all.files[i] for i, _, _ in picked],
            [count for _, _, count in picked],
            starts=[start for _, start, _ in picked],
        )
        if self._all.cache_stream is not None:
            # Each worker streams its own shards, in its order, through the shared cache.
            part.cache_stream = self._all.cache_stream.subset([i for i, _, _ in picked])
        if self.batch_size is not None:
            for batch in part.batches(self.batch_size, drop_remainder=self.drop_remainder):
                yield batch_to_torch(batch) if self.convert else batch
            return
        variable = self._variable
        for element in part:
            if self.convert:
                yield mark(to_torch(element), variable) if variable else to_torch(element)
            else:
                yield element


# Dataset is generic in its element type; ours is a nested structure (Any).
class MapDataset(Dataset):  # type: ignore[type-arg]
    """A saved dataset as a map-style ``torch.utils.data.Dataset``: ``ds[i]`` is element ``i``.

    Elements are what :class:`TorchDataset` yields (see the module
    docstring), read through the record index of each shard: ``ds[i]``
    (negative ``i`` from the end) reads one record, ``ds.__getitems__(indices)`` a
    batch's at once (:meth:`superserial.numpy.NumpyDataset.get_elements`; a windowed
    ``Sampler``'s batches by group, :mod:`superserial.integrations.torch.windowed`).

    ``DataLoader`` calls ``__getitems__`` with each batch of the sampler's indices when
    it batches (``batch_size`` set), ``ds[i]`` otherwise; it works with any sampler
    (``shuffle=True``, ``DistributedSampler``) and any ``num_workers`` (the dataset
    pickles without open files; each worker opens its own). The list of elements then
    goes to ``collate_fn``: pass ``collate_fn=collate`` (or :func:`collate_padded`).
    torch's default ``default_collate`` stacks only leaves of one shape and fails on a
    variable-length leaf (``stack expects each tensor to be equal size``), a ragged or a
    sparse one (``Ragged``/``Sparse`` are not types it knows).

    Args:
        path: The dataset directory (local, or an fsspec URL).
        shard: ``(i, n)``: only shard files ``i, i+n, ...``, as
            :func:`superserial.numpy.load` takes it (for splitting by hand;
            ``DistributedSampler`` splits the indices of the whole dataset).
        cache_dir: For a URL: a local cache directory, as :func:`superserial.numpy.load` takes it.
        cache_limit: The most bytes ``cache_dir`` keeps, as
            :func:`superserial.numpy.load` takes it (see also ``docs/storage.md``).
        select: Read only these leaves, as :func:`superserial.numpy.load` takes it.

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
        shard: tuple[int, int] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        select: Iterable[str] | None = None,
    ) -> None:
        super().__init__()
        # An idle host's warning points at the caller of MapDataset(...).
        opened = open_dataset(
            path,
            select=select,
            shard=shard,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            random_access=True,  # pins what fits cache_limit (superserial.read.cache.pins)
        )
        self.source = ssnp.NumpyDataset.from_opened(opened)
        self.path = self.source.path
        self.header: Header = self.source.header
        self.source.records  # noqa: B018  # raises UnsupportedError now rather than in a worker
        self._variable = variable_leaves(self.header.structure)
        self._reads = BatchReads(self.source)

    def __len__(self) -> int:
        return len(self.source)

    def _convert(self, element: Any) -> Any:
        return mark(to_torch(element), self._variable) if self._variable else to_torch(element)

    def __getitem__(self, index: int | slice) -> Any:
        """Element ``index`` (negative from the end), or a list of elements for a slice.

        Raises:
            IndexError: ``index`` is out of range.
            CorruptDataError: The record or its shard's index is damaged.
        """
        if isinstance(index, slice):
            return [self._convert(e) for e in self.source[index]]
        return self._convert(self.source[index])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The elements at ``indices``, in that order, duplicates allowed: one batched read.

        Decoded as one batch (:meth:`superserial.numpy.NumpyDataset.get_batch`), in
        an :class:`~superserial.integrations.torch.collate.Elements` list: the
        elements are cut from the batch when first looked at, and :func:`collate`
        of a list no one has looked into is that batch.

        Raises:
            IndexError: An index is out of range.
            CorruptDataError: A record or a shard's index is damaged.
        """
        # Decoded as one batch, and handed out as elements cut from it, which
        # collate turns back into that batch rather than stacking them again.
        return Elements(batch_to_torch(self._reads.batch(indices)), self._variable)

    def __repr__(self) -> str:
        return f"MapDataset({self.path!r}, {len(self)} elements)"

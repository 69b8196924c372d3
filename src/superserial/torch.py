"""PyTorch input from superserial datasets, without TensorFlow.

    from torch.utils.data import DataLoader
    from superserial.torch import TorchDataset, collate

    ds = TorchDataset("/data/digits")          # rank/world size from torch.distributed
    loader = DataLoader(ds, batch_size=256, num_workers=4, collate_fn=collate)

Splitting: shard files are dealt out over every reader of the job, the
DataLoader workers of every rank: the reader with global index
``g = worker_id * world_size + rank`` out of ``N = num_workers * world_size``
reads shards ``g, g + N, g + 2N, ...`` (in order, or in an order shuffled the
same way on every rank with ``shuffle_shards``). Every element is read exactly
once per epoch. Rank ``r`` as a whole reads shards ``r, r + world_size, ...``,
whatever its number of workers, so ``len(ds)`` is known in the main process.

The split is shard-granular: readers get whole files, so ranks get equal
element counts only if the shards are of equal sizes (save with
``num_shards`` a multiple of ``world_size * num_workers`` for an even
split), and with fewer shards than readers some readers get no shard and
yield nothing (a warning is logged); nothing is lost or repeated.
Distributed training that needs equal step counts per rank must cap or pad
the epoch itself (e.g. stop at the smallest rank's ``len(ds)``).

Leaves are converted as the numpy reader (:mod:`superserial.numpy`) gives
them: dense numeric leaves become ``torch.Tensor`` of the same dtype (bool,
int8-64, uint8-64, float16, bfloat16, float32, float64, complex64,
complex128; torch has uint16/32/64 tensors with limited operator support:
cast them with ``.to(torch.int64)`` if needed). Strings stay ``bytes``: a
scalar string is ``bytes``, a string array a nested list of ``bytes``.
Ragged and sparse leaves are :class:`~superserial.numpy.Ragged` /
:class:`~superserial.numpy.Sparse` holding torch tensors (for a torch
sparse tensor: ``torch.sparse_coo_tensor(s.indices.T, s.values,
tuple(s.dense_shape))``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from superserial import numpy as ssnp

__all__ = ["TorchDataset", "collate", "to_torch"]

log = logging.getLogger("superserial")


def _tensor(a: np.ndarray) -> Any:
    if a.dtype == object:
        return a.item() if a.ndim == 0 else a.tolist()
    if not a.flags.c_contiguous or not a.flags.writeable:
        a = a.copy()  # (not np.ascontiguousarray: it makes 0-d arrays 1-d)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_torch(element: Any) -> Any:
    """Converts a numpy-reader element (or batch) to torch tensors, structure kept."""
    if isinstance(element, dict):
        return {k: to_torch(v) for k, v in element.items()}
    if isinstance(element, tuple) and hasattr(element, "_fields"):
        return type(element)(*[to_torch(v) for v in element])
    if isinstance(element, tuple):
        return tuple(to_torch(v) for v in element)
    if isinstance(element, list):
        return [to_torch(v) for v in element]
    if isinstance(element, ssnp.Ragged):
        return ssnp.Ragged(
            _tensor(element.flat_values), tuple(_tensor(s) for s in element.nested_row_splits)
        )
    if isinstance(element, ssnp.Sparse):
        return ssnp.Sparse(
            _tensor(element.indices), _tensor(element.values), _tensor(element.dense_shape)
        )
    if isinstance(element, np.ndarray):
        return _tensor(element)
    return element


def collate(batch: list[Any]) -> Any:
    """Stacks a list of elements into one batch of the same structure.

    Tensor leaves are stacked with ``torch.stack`` (they must have equal
    shapes); string, ragged and sparse leaves become lists of the
    per-element values.

    Raises:
        ValueError: Elements differ in structure, or tensors of one leaf in
            shape.
    """
    return _collate(batch, "<element>")


def _collate(items: list[Any], where: str) -> Any:
    first = items[0]
    if isinstance(first, dict):
        keys = list(first)
        for x in items:
            if not isinstance(x, dict) or list(x) != keys:
                raise ValueError(f"expected dicts with keys {keys}, got {_describe(x)} at {where}")
        return {k: _collate([x[k] for x in items], f"{where}/{k}") for k in keys}
    if isinstance(first, tuple):
        for x in items:
            if type(x) is not type(first) or len(x) != len(first):
                raise ValueError(f"expected {_describe(first)}, got {_describe(x)} at {where}")
        parts = [_collate([x[i] for x in items], f"{where}/{i}") for i in range(len(first))]
        return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
    if isinstance(first, torch.Tensor):
        shapes = {tuple(x.shape) for x in items}
        if len(shapes) > 1:
            raise ValueError(
                f"expected tensors of one shape to stack, got shapes {sorted(shapes)} at {where}"
            )
        return torch.stack(items)
    return list(items)


def _describe(x: Any) -> str:
    if isinstance(x, dict):
        return f"a dict with keys {list(x)}"
    if isinstance(x, tuple):
        return f"a {type(x).__name__} of {len(x)}"
    return type(x).__name__


def _check_rank(rank: int, world_size: int) -> None:
    ok = isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size
    if not ok:
        raise ValueError(
            f"expected 0 <= rank < world_size, got rank={rank!r} world_size={world_size!r}"
        )


class TorchDataset(IterableDataset):  # type: ignore[type-arg]
    """A saved dataset as a ``torch.utils.data.IterableDataset``, split by shard files.

    See the module docstring for how shards are dealt out to ranks and
    DataLoader workers.

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

    Raises:
        DatasetNotFoundError, HeaderError, CorruptDataError: As
            :func:`superserial.numpy.load`.
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
    ) -> None:
        super().__init__()
        self._all = ssnp.load(path)
        self.path = self._all.path
        self.header = self._all.header
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

    def shards_for(self, worker_id: int = 0, num_workers: int = 1) -> list[int]:
        """The shard indices one DataLoader worker of this rank reads, in order."""
        g = worker_id * self.world_size + self.rank
        return self._order()[g :: num_workers * self.world_size]

    def __len__(self) -> int:
        """The number of elements this rank reads per epoch (over all its workers)."""
        return sum(self._all.counts[i] for i in self._order()[self.rank :: self.world_size])

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        picked = self.shards_for(worker_id, num_workers)
        if not picked:
            log.warning(
                "superserial: worker %d of rank %d gets no shard (%d shards for %d readers); it yields nothing",
                worker_id, self.rank, len(self._all.files), num_workers * self.world_size,
            )  # fmt: skip
        part = ssnp.NumpyDataset(
            self.path,
            self.header,
            [self._all.files[i] for i in picked],
            [self._all.counts[i] for i in picked],
        )
        for element in part:
            yield to_torch(element) if self.convert else element

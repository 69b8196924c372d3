"""numpy-reader values to torch tensors, element by element or a whole batch at once (TF-free).

:func:`to_torch` converts one element (or any nested value) of
:mod:`superserial.numpy`: dense arrays become tensors of the same dtype
(bfloat16 through a uint16 view), string arrays ``bytes`` or nested lists of
``bytes``, :class:`~superserial.codec_numpy.Ragged` and
:class:`~superserial.codec_numpy.Sparse` hold tensors.

:func:`batch_to_torch` converts a batch of
:meth:`superserial.numpy.NumpyDataset.batches`: stacked arrays become
stacked tensors, and each list of per-element values (a leaf that is not of
a fixed shape) a list of converted values, sent from a DataLoader worker as
views of one storage per tensor kind (see :mod:`superserial.torch_share`):
the values of B elements travel as one shared-memory segment, not B.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from superserial.codec_numpy import Ragged, Sparse
from superserial.torch_share import one_storage

__all__ = ["batch_to_torch", "tensor", "to_torch"]


def tensor(a: np.ndarray) -> Any:
    """``a`` as a tensor sharing its memory where it can; string arrays as ``bytes`` or lists."""
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
    if isinstance(element, Ragged):
        return Ragged(
            tensor(element.flat_values), tuple(tensor(s) for s in element.nested_row_splits)
        )
    if isinstance(element, Sparse):
        return Sparse(tensor(element.indices), tensor(element.values), tensor(element.dense_shape))
    if isinstance(element, np.ndarray):
        return tensor(element)
    return element


def batch_to_torch(batch: Any) -> Any:
    """Converts a numpy-reader batch to torch, each leaf's list of values shared in one storage.

    The result has the types ``collate`` (:mod:`superserial.torch`) gives
    for the same elements: stacked tensors for fixed-shape leaves, lists of
    per-element values for the others. In a DataLoader worker, every tensor
    is moved to shared memory here, as the DataLoader would when sending it:
    the decoded arrays are freed now rather than by the queue's feeder
    thread while the next batch is decoded. Those interleaved lifetimes
    fragmented glibc's heap: a worker reading 64 KiB records in batches of
    256 grew to 1 GB, not 0.3.
    """
    out = _convert(batch)
    if get_worker_info() is not None:
        _share(out)
    return out


def _convert(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _convert(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*[_convert(v) for v in batch])
    if isinstance(batch, tuple):
        return tuple(_convert(v) for v in batch)
    if isinstance(batch, list):  # one leaf: its B per-element values
        return _shared([to_torch(v) for v in batch])
    return to_torch(batch)


def _share(x: Any) -> None:
    """Moves the tensors of ``x`` to shared memory (views of one storage move it once)."""
    if isinstance(x, torch.Tensor):
        x.share_memory_()  # type: ignore[no-untyped-call]  # (torch leaves it unannotated)
    elif isinstance(x, dict):
        for v in x.values():
            _share(v)
    elif isinstance(x, (tuple, list)):
        for v in x:
            _share(v)
    elif isinstance(x, Ragged):
        _share([x.flat_values, *x.nested_row_splits])
    elif isinstance(x, Sparse):
        _share([x.indices, x.values, x.dense_shape])


def _shared(items: list[Any]) -> list[Any]:
    """A leaf's per-element values with their tensors in one storage per part (in a worker)."""
    if not items:
        return items
    if all(isinstance(x, torch.Tensor) for x in items):
        return one_storage(items)
    if all(isinstance(x, Ragged) and isinstance(x.flat_values, torch.Tensor) for x in items):
        flat = one_storage([x.flat_values for x in items])
        levels = len(items[0].nested_row_splits)
        splits = [one_storage([x.nested_row_splits[k] for x in items]) for k in range(levels)]
        return [Ragged(f, tuple(s[i] for s in splits)) for i, f in enumerate(flat)]
    if all(isinstance(x, Sparse) and isinstance(x.values, torch.Tensor) for x in items):
        idx = one_storage([x.indices for x in items])
        val = one_storage([x.values for x in items])
        shape = one_storage([x.dense_shape for x in items])
        return [Sparse(*parts) for parts in zip(idx, val, shape, strict=True)]
    return items

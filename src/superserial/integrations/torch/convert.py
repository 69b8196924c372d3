"""numpy-reader values to torch tensors, element by element or a whole batch at once (TF-free).

:func:`to_torch` converts one element (or any nested value) of
:mod:`superserial.numpy`: dense arrays become tensors of the same dtype
(bfloat16 through a uint16 view), string arrays ``bytes`` or nested lists of
``bytes``, :class:`~superserial.codec.numpy_decode.Ragged` and
:class:`~superserial.codec.numpy_decode.Sparse` hold tensors.

:func:`batch_to_torch` converts a batch of
:meth:`superserial.numpy.NumpyDataset.batches`: stacked arrays become
stacked tensors, and each list of per-element values (a leaf that is not of
a fixed shape) a list of converted values, sent from a DataLoader worker as
views of one storage per tensor kind (see :mod:`superserial.integrations.torch.share`):
the values of B elements travel as one shared-memory segment, not B.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from superserial.codec.numpy_decode import Ragged, Sparse
from superserial.integrations.torch import share
from superserial.integrations.torch.share import TensorRun

__all__ = ["batch_to_torch", "keep", "tensor", "to_torch"]


def tensor(a: np.ndarray) -> Any:
    """``a`` as a tensor sharing its memory where it can; string arrays as ``bytes`` or lists."""
    if a.dtype == object:
        return a.item() if a.ndim == 0 else a.tolist()
    if not a.flags.c_contiguous or not a.flags.writeable:
        a = a.copy()  # (not np.ascontiguousarray: it makes 0-d arrays 1-d)
    if a.dtype.kind == "V" and a.dtype.name == "bfloat16":  # (kind first: name is slow)
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


def keep(batch: Any) -> Any:
    """A ``collate_fn`` that keeps batches as they are: ``DataLoader(ds, batch_size=None, collate_fn=keep)``.

    With ``batch_size=None`` a DataLoader's default ``collate_fn``
    (``default_convert``) turns tuples into lists (dicts and namedtuples
    stay); with this, a dataset saved as tuples gives tuples, as ``collate`` does.
    """
    return batch


def batch_to_torch(batch: Any) -> Any:
    """Converts a numpy-reader batch to torch, each leaf's list of values shared in one storage.

    The result has the types ``collate`` (:mod:`superserial.torch`) gives
    for the same elements: stacked tensors for fixed-shape leaves, lists of
    per-element values for the others. In a DataLoader worker, every tensor
    is moved to shared memory here, as the DataLoader would when sending it:
    the decoded arrays are freed now rather than by the queue's feeder
    thread while the next batch is decoded. Those interleaved lifetimes
    fragmented glibc's heap: a worker reading 64 KiB records in batches of
    256 grew to 1 GB, not 0.3. Stacked arrays are copied instead into a
    shared-memory slot the worker reuses once the main process has let go of
    the batch (:mod:`superserial.integrations.torch.share`).
    """
    if get_worker_info() is None:
        return _convert(batch)
    # Stacked arrays go into a reused shared-memory slot (share.py); the rest as before.
    return share.send(batch, _shared)


def _shared(x: Any) -> Any:
    out = _convert(x)
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
        return _leaf_values(batch)
    return to_torch(batch)


def _leaf_values(values: list[Any]) -> list[Any]:
    """One leaf's per-element values converted, each part of them cut from one tensor.

    One ``np.concatenate`` and one ``torch.split`` instead of a tensor made,
    copied and sent per element. In a DataLoader worker the lists pickle as
    those tensors (:class:`~superserial.integrations.torch.share.TensorRun`).
    """
    first = values[0] if values else None
    worker = get_worker_info() is not None
    if isinstance(first, np.ndarray):
        run = _run(values)
        return run if run is not None else [to_torch(v) for v in values]
    if isinstance(first, Ragged) and isinstance(first.flat_values, np.ndarray):
        levels = range(len(first.nested_row_splits))
        parts = [[r.flat_values for r in values]]
        parts += [[r.nested_row_splits[k] for r in values] for k in levels]
        runs = [_run(p) for p in parts]
        if all(r is not None for r in runs):
            return _Zipped(Ragged, runs) if worker else _zip(Ragged, runs)  # type: ignore[arg-type]
    if isinstance(first, Sparse) and isinstance(first.values, np.ndarray):
        runs = [_run([getattr(s, f) for s in values]) for f in _SPARSE]
        if all(r is not None for r in runs):
            return _Zipped(Sparse, runs) if worker else _zip(Sparse, runs)  # type: ignore[arg-type]
    return [to_torch(v) for v in values]


def _run(arrays: list[np.ndarray]) -> list[torch.Tensor] | None:
    """The arrays as views of one tensor; None unless they are numeric of one dtype.

    One leaf's values have the header's dtype: the concatenation keeps it,
    and anything else (strings, another dtype) shows in its dtype.
    """
    dtype = arrays[0].dtype
    if dtype.kind == "O":
        return None
    joined = np.concatenate(arrays, axis=None)
    if joined.dtype != dtype:
        return None
    run = TensorRun.cut(tensor(joined), [a.size for a in arrays], [a.shape for a in arrays])
    return run if get_worker_info() is not None else list(run)


def _share(x: Any) -> None:
    """Moves the tensors of ``x`` to shared memory (views of one storage move it once)."""
    if isinstance(x, torch.Tensor):
        x.share_memory_()  # type: ignore[no-untyped-call]  # (torch leaves it unannotated)
    elif isinstance(x, TensorRun):  # its items are views of flat: moved with it
        x.flat.share_memory_()  # type: ignore[no-untyped-call]
    elif isinstance(x, _Zipped):
        _share(x.runs)
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


_SPARSE = ("indices", "values", "dense_shape")


class _Zipped(list[Any]):
    """Ragged or Sparse values made of runs of their parts; pickles as the runs (TensorRuns)."""

    def __init__(self, kind: type, runs: list[list[torch.Tensor]]) -> None:
        super().__init__(_zip(kind, runs))
        self.kind, self.runs = kind, runs

    def __copy__(self) -> _Zipped:
        # (DataLoader's default_convert copies lists: keep the runs until pickled.)
        return _Zipped(self.kind, self.runs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_zip, (self.kind, self.runs))


def _zip(kind: type, runs: list[list[torch.Tensor]]) -> list[Any]:
    if kind is Ragged:
        flat, *splits = runs
        return [Ragged(f, tuple(s[i] for s in splits)) for i, f in enumerate(flat)]
    return [Sparse(*parts) for parts in zip(*runs, strict=True)]

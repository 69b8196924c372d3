"""A DataLoader worker's batches through shared memory, in as few segments as can be (TF-free).

Two things travel better than torch sends them: lists of tensors
(:func:`one_storage`) and a batch's stacked tensors (:func:`send`, a pool
of reused slots).

**Lists of tensors.** A DataLoader worker sends each batch to the main process through shared
memory, one shared-memory segment (and, with torch's default
``file_descriptor`` strategy, one file descriptor passed over a socket) per
tensor storage. A batch of a variable-length leaf is a list of B small
tensors: B segments, which costs far more than the values (tens of seconds
per 100,000 token rows). Copied into one storage and handed out as views of
it, the list travels as one segment.

Pickled one by one, though, each view is rebuilt in the main process on its
own (about 12 microseconds each, 0.9 s per epoch of 100,000 token rows), so
the list is a :class:`TensorRun`: it pickles as the one storage, the dtype
and the sizes, and unpickles as a plain list cut from it by one
``torch.split``.

**Reused slots.** torch sends every tensor a worker returns through a fresh shared-memory
segment: about 5 ms per tensor here (a new segment, a file descriptor passed,
page faults into new pages), several times the decode of a batch of 256
mnist elements. A worker's :class:`Pool` instead keeps a few segments
(slots) and copies each batch's stacked arrays into a free one (0.1-0.8 ms);
the batch pickles as the slot's number and the arrays' layout, and the
segment itself (its file descriptor) goes to the main process only the first
time that slot is sent.

The risk of reused buffers is overwriting a batch a consumer still holds. A
slot is written again only when both sides have let go of it:

* in the worker, the batch's tensors are views of one numpy array whose
  finalizer marks the slot free locally when the last of them is gone (the
  DataLoader's feeder thread has pickled the batch, or it was dropped);
* in the main process, the batch rebuilt from a slot is views of one numpy
  array over the mapped segment; its finalizer clears the slot's first byte,
  set when the batch was pickled, once no tensor of that batch is left
  (views, slices and ``.numpy()`` arrays of it keep it). The worker reads
  that byte before reusing the slot.

A worker keeps at most :data:`MAX_SLOTS` slots; a consumer that holds more
batches than that gets the rest as torch sends them (a copy each). Only
batches whose top level is a dict or a plain tuple travel in slots, and of
them only fixed-shape numeric arrays; the rest of a batch pickles as before.
"""

from __future__ import annotations

import os
import secrets
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from superserial.base.processes import pid_alive

__all__ = [
    "MAX_SLOTS",
    "LeasedDict",
    "LeasedTuple",
    "Pool",
    "TensorRun",
    "in_slot",
    "one_storage",
    "pool",
    "send",
]


class TensorRun(list[torch.Tensor]):
    """Tensors of one dtype lying back to back in ``flat``; pickles as ``flat`` and their sizes.

    Made by :func:`one_storage`; unpickled, a plain ``list`` of views of one storage.
    """

    def __init__(self, items: list[torch.Tensor], flat: torch.Tensor) -> None:
        super().__init__(items)
        self.flat = flat

    @classmethod
    def cut(cls, flat: torch.Tensor, sizes: list[int], shapes: list[tuple[int, ...]]) -> TensorRun:
        """The run of tensors of ``shapes`` lying back to back in the 1-d ``flat``, of ``sizes``."""
        return cls(_cut(flat, sizes, shapes), flat)

    def __copy__(self) -> TensorRun:
        # (DataLoader's default_convert copies lists: keep the run until pickled.)
        return TensorRun(list(self), self.flat)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_cut, (self.flat, [x.numel() for x in self], _shapes(self)))


def _cut(flat: torch.Tensor, sizes: list[int], shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    parts = torch.split(flat, sizes)
    return [p if len(s) == 1 else p.view(s) for p, s in zip(parts, shapes, strict=True)]


def one_storage(items: list[torch.Tensor]) -> list[torch.Tensor]:
    """``items`` as views of one new storage, in a DataLoader worker; else ``items`` as they are.

    The views have the items' dtype, shapes and values (any dtype, unsigned
    and bfloat16 included), in a :class:`TensorRun`. Items of different
    dtypes are left as they are.
    """
    if get_worker_info() is None or len(items) < 2 or len({x.dtype for x in items}) > 1:
        return list(items)
    if not any(x.numel() for x in items):
        return list(items)  # nothing to share
    # One dtype: concatenated as it is, cut back by element counts (empty
    # items included, as empty views), reshaped where not one-dimensional.
    flat = torch.cat([x.detach().reshape(-1) for x in items])
    return TensorRun(_cut(flat, [x.numel() for x in items], _shapes(items)), flat)


def _shapes(items: list[torch.Tensor]) -> list[tuple[int, ...]]:
    return [tuple(x.shape) for x in items]


MAX_SLOTS = 16
# A slot's first bytes: byte 0 is 1 while the main process may hold a batch of it.
_HEADER = 64
_ALIGN = 64

# (worker pid, nonce) -> slot number -> the main process's view of that slot's segment.
_MAPPED: dict[tuple[int, int], dict[int, np.ndarray]] = {}


class _Slot:
    """One reusable shared-memory segment of a worker's pool."""

    def __init__(self, number: int, capacity: int) -> None:
        self.number, self.capacity = number, capacity
        self.tensor = torch.zeros(_HEADER + capacity, dtype=torch.uint8)
        self.tensor.share_memory_()  # type: ignore[no-untyped-call]  # (unannotated in torch)
        self.array = self.tensor.numpy()
        self.mapped = False  # the main process has been sent the segment
        self.local = False  # tensors of a batch in it are alive in the worker

    def free(self) -> bool:
        return not self.local and not self.array[0]


class Pool:
    """A worker process's slots; one per process (:func:`pool`)."""

    def __init__(self) -> None:
        self.token = (os.getpid(), secrets.randbits(62))
        self.slots: list[_Slot] = []

    def take(self, nbytes: int) -> _Slot | None:
        """A free slot of at least ``nbytes``, made if need be; None if all are held."""
        free = [s for s in self.slots if s.free()]
        for s in free:
            if s.capacity >= nbytes:
                return s
        capacity = -(-nbytes // 4096) * 4096
        if free:  # too small: its number gets a new segment (sent again on first use)
            s = self.slots[free[0].number] = _Slot(free[0].number, capacity)
            return s
        if len(self.slots) < MAX_SLOTS:
            self.slots.append(_Slot(len(self.slots), capacity))
            return self.slots[-1]
        return None


_POOL: Pool | None = None


def pool() -> Pool:
    """This process's pool (a forked child makes its own)."""
    global _POOL
    if _POOL is None or _POOL.token[0] != os.getpid():
        _POOL = Pool()
    return _POOL


def in_slot(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory lies in a slot of this process's pool (shared memory)."""
    if _POOL is None or _POOL.token[0] != os.getpid():
        return False
    at = t.data_ptr()
    return any(
        s.tensor.data_ptr() <= at < s.tensor.data_ptr() + s.tensor.numel() for s in _POOL.slots
    )


class _Lease:
    """Which slot a batch's tensors are in, and where."""

    def __init__(self, slot: _Slot, layout: list[tuple[int, str, tuple[int, ...], bool]]) -> None:
        self.token, self.slot, self.layout = pool().token, slot, layout
        self.tensors: list[torch.Tensor] = []


def _unlocal(slot: _Slot) -> None:
    slot.local = False


def _views(
    buffer: np.ndarray, layout: list[tuple[int, str, tuple[int, ...], bool]]
) -> list[torch.Tensor]:
    out = []
    for offset, dtype, shape, bf16 in layout:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        t = torch.from_numpy(buffer[offset : offset + n].view(dt).reshape(shape))
        out.append(t.view(torch.bfloat16) if bf16 else t)
    return out


def _eligible(a: Any) -> bool:
    if not isinstance(a, np.ndarray):
        return False
    return a.dtype.kind in "biufc" or (a.dtype.kind == "V" and a.dtype.name == "bfloat16")


def send(batch: Any, convert: Callable[[Any], Any]) -> Any:
    """``batch`` (numpy-reader layout) as torch, its stacked arrays in a slot of this worker's pool.

    Args:
        batch: A batch as :meth:`superserial.numpy.NumpyDataset.batches` gives it.
        convert: Converts (and shares) any other value of the batch.

    Returns:
        A :class:`LeasedDict` or :class:`LeasedTuple` for a dict or plain tuple
        batch with numeric arrays and a free slot; else ``convert(batch)``.
    """
    top = type(batch)
    if top is not dict and top is not tuple:
        return convert(batch)
    arrays: list[np.ndarray] = []
    skeleton = _strip(batch, arrays)
    if not arrays:
        return convert(batch)
    layout, at = [], 0
    for a in arrays:
        bf16 = a.dtype.kind == "V"
        stored = np.dtype(np.uint16) if bf16 else a.dtype
        layout.append((at, stored.str, tuple(a.shape), bf16))
        at += -(-a.nbytes // _ALIGN) * _ALIGN
    slot = pool().take(at)
    if slot is None:
        return convert(batch)
    buffer = np.frombuffer(slot.array.data[_HEADER : _HEADER + at], np.uint8)
    for (offset, dtype, shape, bf16), a in zip(layout, arrays, strict=True):
        dst = buffer[offset : offset + a.nbytes].view(dtype).reshape(shape)
        np.copyto(dst, a.view(np.uint16) if bf16 else a)
    lease = _Lease(slot, layout)
    lease.tensors = _views(buffer, layout)
    slot.local = True
    weakref.finalize(buffer, _unlocal, slot)
    del buffer
    filled = _fill(skeleton, lease.tensors, convert)
    return (LeasedDict if top is dict else LeasedTuple).make(filled, lease)


class _Here:
    """Where the ``i``-th slot tensor goes in a batch's skeleton."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def _strip(x: Any, arrays: list[np.ndarray]) -> Any:
    """``x`` with its eligible arrays (in dict and tuple nodes) replaced by :class:`_Here`."""
    if type(x) is dict:
        return {k: _strip(v, arrays) for k, v in x.items()}
    if type(x) is tuple:
        return tuple(_strip(v, arrays) for v in x)
    if _eligible(x) and x.ndim:
        arrays.append(x)
        return _Here(len(arrays) - 1)
    return x


def _fill(x: Any, tensors: list[torch.Tensor], convert: Callable[[Any], Any]) -> Any:
    if type(x) is dict:
        return {k: _fill(v, tensors, convert) for k, v in x.items()}
    if type(x) is tuple:
        return tuple(_fill(v, tensors, convert) for v in x)
    return tensors[x.i] if isinstance(x, _Here) else convert(x)


def _mark(x: Any, ids: dict[int, int]) -> Any:
    """``x`` with the lease's tensors (by identity) replaced by :class:`_Here`, for pickling."""
    if isinstance(x, torch.Tensor):
        i = ids.get(id(x))
        return x if i is None else _Here(i)
    if type(x) is dict or isinstance(x, LeasedDict):
        return {k: _mark(v, ids) for k, v in x.items()}
    if type(x) is tuple or isinstance(x, LeasedTuple):
        return tuple(_mark(v, ids) for v in x)
    return x


def _reduce(batch: LeasedDict | LeasedTuple, plain: Any) -> tuple[Any, ...]:
    lease = batch._lease
    slot = lease.slot
    slot.array[0] = 1  # from now the main process holds it, until its batch is freed there
    storage = None if slot.mapped else slot.tensor.untyped_storage()
    slot.mapped = True
    ids = {id(t): i for i, t in enumerate(lease.tensors)}
    skeleton = _mark(plain, ids)
    return (_rebuild, (lease.token, slot.number, storage, lease.layout, skeleton))


class LeasedDict(dict[Any, Any]):
    """A dict batch whose stacked tensors lie in a slot; pickles as the slot's number and layout."""

    _lease: _Lease

    @classmethod
    def make(cls, items: dict[Any, Any], lease: _Lease) -> LeasedDict:
        out = cls(items)
        out._lease = lease
        return out

    def __copy__(self) -> LeasedDict:
        # (DataLoader's default_convert copies dicts: keep the lease until pickled.)
        return LeasedDict.make(dict(self), self._lease)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        import copy

        return copy.deepcopy(dict(self), memo)

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce(self, dict(self))


class LeasedTuple(tuple[Any, ...]):
    """A tuple batch whose stacked tensors lie in a slot; pickles as :class:`LeasedDict` does."""

    _lease: _Lease

    @classmethod
    def make(cls, items: tuple[Any, ...], lease: _Lease) -> LeasedTuple:
        out = cls(items)
        out._lease = lease
        return out

    def __copy__(self) -> LeasedTuple:
        return LeasedTuple.make(tuple(self), self._lease)

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[Any, ...]:
        import copy

        return copy.deepcopy(tuple(self), memo)

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce(self, tuple(self))


def _release(segment: np.ndarray) -> None:
    segment[0] = 0


def _rebuild(
    token: tuple[int, int],
    number: int,
    storage: Any,
    layout: list[tuple[int, str, tuple[int, ...], bool]],
    skeleton: Any,
) -> Any:
    """A batch sent from a slot, as views of this process's mapping of it."""
    slots = _MAPPED.get(token)
    if slots is None:
        # A new worker: forget the segments of workers that are gone (their
        # batches still held keep their mappings).
        for old in [t for t in _MAPPED if not pid_alive(t[0])]:
            del _MAPPED[old]
        slots = _MAPPED[token] = {}
    if storage is not None:
        slots[number] = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    segment = slots.get(number)
    if segment is None:
        raise RuntimeError(
            f"expected shared-memory slot {number} of DataLoader worker {token[0]} to be "
            "mapped here, found it never sent to this process (a batch of superserial's "
            "TorchDataset unpickled outside the DataLoader that read it)"
        )
    end = max((o + int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for o, d, s, _ in layout))
    buffer = np.frombuffer(segment.data[_HEADER : _HEADER + end], np.uint8)
    tensors = _views(buffer, layout)
    weakref.finalize(buffer, _release, segment)
    del buffer
    return _fill(skeleton, tensors, lambda x: x)

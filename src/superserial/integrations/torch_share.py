"""Lists of tensors sent from DataLoader workers as views of one storage (TF-free).

A DataLoader worker sends each batch to the main process through shared
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
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import get_worker_info

__all__ = ["TensorRun", "one_storage"]


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

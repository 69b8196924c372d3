"""Lists of tensors sent from DataLoader workers as views of one storage (TF-free).

A DataLoader worker sends each batch to the main process through shared
memory, one shared-memory segment (and, with torch's default
``file_descriptor`` strategy, one file descriptor passed over a socket) per
tensor storage. A batch of a variable-length leaf is a list of B small
tensors: B segments, which costs far more than the values (tens of seconds
per 100,000 token rows). Copied into one storage and handed out as views of
it, the list travels as one segment.
"""

from __future__ import annotations

import torch
from torch.utils.data import get_worker_info

__all__ = ["one_storage"]


def one_storage(items: list[torch.Tensor]) -> list[torch.Tensor]:
    """``items`` as views of one new storage, in a DataLoader worker; else ``items`` as they are.

    The views have the items' dtype, shapes and values; the copy is of the
    values' bytes (any dtype, unsigned and bfloat16 included). Items of
    different dtypes are left as they are.
    """
    if get_worker_info() is None or len(items) < 2 or len({x.dtype for x in items}) > 1:
        return list(items)  # (one leaf's values have one dtype: offsets stay aligned)
    # Empty tensors are left as they are: nothing to share, and a view of no
    # bytes as another dtype is refused.
    full = [x for x in items if x.numel()]
    if not full:
        return list(items)
    flat = torch.cat([x.detach().contiguous().view(-1).view(torch.uint8) for x in full])
    parts = iter(torch.split(flat, [x.numel() * x.element_size() for x in full]))
    return [next(parts).view(x.dtype).view(x.shape) if x.numel() else x for x in items]

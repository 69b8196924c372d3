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

    The views have the items' dtypes, shapes and values; the copy is of the
    values' bytes (any dtype, unsigned and bfloat16 included).
    """
    if get_worker_info() is None or len(items) < 2:
        return list(items)
    flat = torch.cat([x.detach().contiguous().reshape(-1).view(torch.uint8) for x in items])
    sizes = [x.numel() * x.element_size() for x in items]
    return [
        part.view(x.dtype).view(x.shape) for part, x in zip(torch.split(flat, sizes), items, strict=True)
    ]

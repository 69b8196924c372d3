"""PyTorch input from superserial datasets, without TensorFlow.

    from torch.utils.data import DataLoader
    from superserial.torch import MapDataset, TorchDataset, collate

    loader = DataLoader(TorchDataset("/data/digits"), batch_size=256, num_workers=4,
                        collate_fn=collate)

The public face of :mod:`superserial.integrations.torch.dataset`. Importing it without
PyTorch raises :class:`~superserial.errors.MissingDependencyError` naming the ``torch`` extra.
"""

from __future__ import annotations

from superserial.errors import require

require("torch", extra="torch", needed_for="superserial.torch", package="PyTorch")

from superserial.integrations.torch.dataset import (  # noqa: E402  (after the check above)
    MapDataset,
    Padded,
    Sampler,
    TorchDataset,
    collate,
    collate_padded,
    keep,
    to_torch,
)

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

"""PyTorch input from superserial datasets, without TensorFlow.

    from torch.utils.data import DataLoader
    from superserial.torch import MapDataset, TorchDataset, collate

    loader = DataLoader(TorchDataset("/data/digits"), batch_size=256, num_workers=4,
                        collate_fn=collate)

The public face of :mod:`superserial.integrations.torch_dataset`.
"""

from __future__ import annotations

from superserial.integrations.torch_dataset import (
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

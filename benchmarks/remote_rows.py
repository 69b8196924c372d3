"""The superserial rows of benchmarks/remote.py: each reader as a user would call it.

Each row is a function ``(url, n, window, cache) -> iterator of batch lengths``; the
reader is made inside it, so opening (the header, indexes, a cache's first fetches,
DataLoader workers) is part of the time to the first batch. ``cache`` is ``{}`` or
``{"cache_dir": ..., "cache_limit": ...}``. Imported after the servers are forked
(it imports TensorFlow and torch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import superserial
import superserial.numpy as ssnp
from superserial.integrations.torch.convert import batch_to_torch
from superserial.torch import MapDataset, Sampler, TorchDataset, collate

BATCH = 256
SEED = 0
WORKERS = 2

Row = Callable[[str, int, int, dict[str, Any]], Iterator[int]]


def tf_sequential(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    for b in superserial.load(url, batch_size=BATCH, **cache):
        yield int(b["label"].shape[0])


def numpy_sequential(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    for b in ssnp.load(url, **cache).batches(BATCH):
        yield len(b["label"])


def torch_sequential(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    ds = TorchDataset(url, batch_size=BATCH, **cache)
    for b in DataLoader(ds, batch_size=None, num_workers=WORKERS):
        yield len(b["label"])


def tf_global(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    for b in superserial.load(url, shuffle=True, seed=SEED, batch_size=BATCH, **cache):
        yield int(b["label"].shape[0])


def tf_windowed(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    ds = superserial.load(
        url, shuffle=True, seed=SEED, shuffle_window=window, batch_size=BATCH, **cache
    )
    for b in ds:
        yield int(b["label"].shape[0])


def numpy_get_batch(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    ds = ssnp.load(url, **cache)
    order = np.random.default_rng(SEED).permutation(n)  # an epoch: every element once
    for i in range(0, n, BATCH):
        yield len(ds.get_batch(order[i : i + BATCH])["label"])


def _torch_map(url: str, sampler: Sampler, cache: dict[str, Any]) -> Iterator[int]:
    loader = DataLoader(
        MapDataset(url, **cache),
        batch_size=BATCH,
        sampler=sampler,
        num_workers=WORKERS,
        collate_fn=collate,
    )
    for b in loader:
        yield len(b["label"])


def torch_global(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    return _torch_map(url, Sampler(n, seed=SEED), cache)


def torch_windowed(url: str, n: int, window: int, cache: dict[str, Any]) -> Iterator[int]:
    return _torch_map(url, Sampler(n, seed=SEED, shuffle_window=window), cache)


# (name, kind, row): kind picks the ceiling and the target it is held to.
ROWS: list[tuple[str, str, Row]] = [
    ("tf load(batch_size=256)", "sequential", tf_sequential),
    ("numpy batches(256)", "sequential", numpy_sequential),
    ("torch TorchDataset(batch_size=256), 2 workers", "sequential", torch_sequential),
    ("tf load(shuffle=True, shuffle_window=W)", "windowed", tf_windowed),
    ("torch MapDataset + Sampler(shuffle_window=W), 2 workers", "windowed", torch_windowed),
    ("tf load(shuffle=True) global", "global", tf_global),
    ("torch MapDataset + Sampler() global, 2 workers", "global", torch_global),
    ("numpy get_batch(256 random)", "global", numpy_get_batch),
]


class _MemoryBatches(IterableDataset[dict[str, torch.Tensor]]):
    """Batches sliced from arrays in memory, worker ``k`` of ``w`` giving batches k, k + w, ...
    (the DataLoader takes them in turn: in order): a dataset that reads nothing. ``slots``
    False: as a user would write it, its tensors sent as torch sends them; True: each batch
    a copy (as a decode makes one) sent as ``TorchDataset`` sends it, through its reused
    shared-memory slots (``batch_to_torch``)."""

    def __init__(self, arrays: dict[str, np.ndarray], slots: bool) -> None:
        self.arrays, self.slots = arrays, slots

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        k, workers = (0, 1) if info is None else (info.id, info.num_workers)
        n = len(self.arrays["label"])
        for a in range(k * BATCH, n, workers * BATCH):
            if self.slots:
                yield batch_to_torch({m: v[a : a + BATCH].copy() for m, v in self.arrays.items()})
            else:
                yield {m: torch.from_numpy(v[a : a + BATCH]) for m, v in self.arrays.items()}


def torch_from_memory(arrays: dict[str, np.ndarray], slots: bool = False) -> Iterator[int]:
    """A DataLoader floor: 2 workers handing over in-memory batches of the same arrays."""
    for b in DataLoader(_MemoryBatches(arrays, slots), batch_size=None, num_workers=WORKERS):
        yield len(b["label"])


FLOOR = "torch DataLoader, 2 workers, batches from memory (reads nothing)"
# The torch rows' own floor: what is left of them when reading and decoding cost nothing.
SLOTS_FLOOR = "the same, sent through TorchDataset's shared-memory slots"


def save_mnist(path: str, n: int, shards: int) -> tuple[Any, dict[str, np.ndarray]]:
    """Saves mnist-shaped random data (``n`` x uint8[28, 28] + int64 label) to ``path``.

    Returns:
        The header, and the arrays (for the peers, which write their own formats).
    """
    import tensorflow as tf

    rng = np.random.default_rng(0)
    arrays = {
        "image": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        "label": rng.integers(0, 10, n).astype(np.int64),
    }
    header = superserial.save(tf.data.Dataset.from_tensor_slices(arrays), path, num_shards=shards)
    return header, arrays


def warm_up(path: str, n: int, window: int) -> None:
    """Traces the tf.data parsers on local files, so no row pays it."""
    for row in (tf_sequential, tf_global, tf_windowed):
        for _ in row(path, n, window, {}):
            break

"""PyTorch readers against the numpy reader in one process, side by side (issue 26).

    .venv/bin/python benchmarks/torch_speed.py [--dir DIR] [--repeat 3] [--cifar 20000]

Saves (once, in ``--dir``) mnist-shaped (60,000 x uint8[28, 28] + int64) and
cifar-shaped (``--cifar`` x uint8[32, 32, 3] + int64) datasets, then for
batch sizes 1024 and 256 takes, interleaved, best of ``--repeat``:

* ``numpy batches``: ``superserial.numpy`` ``batches(B)`` over the epoch, one process;
* ``TorchDataset``: ``DataLoader(TorchDataset(p, batch_size=B), batch_size=None,
  num_workers=2)`` over the epoch, a new DataLoader each time (worker start-up included);
* ``TorchDataset, persistent``: the same with ``persistent_workers=True``, epochs
  after the first (start-up paid once);
* ``numpy get_batch``: ``get_batch`` of B random indices, one process, the
  indices of one random permutation;
* ``MapDataset``: ``DataLoader(MapDataset(p), batch_sampler=BatchSampler(
  RandomSampler, B), num_workers=2, collate_fn=collate)`` over the epoch.

Prints elements per second and the ratios the issue sets (TorchDataset 0.9x
of numpy batches, MapDataset 0.8x of get_batch), with ``uptime`` before and
after: the figures are only as good as the machine is quiet.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np


def _save(path: str, n: int, shape: tuple[int, ...]) -> None:
    import tensorflow as tf

    import superserial

    rng = np.random.default_rng(0)
    cols = {
        "image": rng.integers(0, 256, (n, *shape), dtype=np.uint8),
        "label": rng.integers(0, 10, n, dtype=np.int64),
    }
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), path)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None, help="where to save (default: a temporary dir)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cifar", type=int, default=20_000, help="cifar-shaped elements")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    root = args.dir or tempfile.mkdtemp(prefix="torch_speed_")
    workloads = {"mnist": (60_000, (28, 28)), "cifar": (args.cifar, (32, 32, 3))}
    for name, (n, shape) in workloads.items():
        path = os.path.join(root, f"{name}_{n}")
        if not os.path.exists(path):
            _save(path, n, shape)

    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    import superserial.numpy as ssnp
    from superserial.torch import MapDataset, TorchDataset, collate

    workers = args.workers
    print(f"before: {_uptime()}")
    print(f"torch {torch.__version__}, {workers} workers, best of {args.repeat}, el/s")
    print(
        "| workload | B | numpy batches | TorchDataset | ratio | TorchDataset, persistent | ratio "
        "| numpy get_batch | MapDataset | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (n, _) in workloads.items():
        path = os.path.join(root, f"{name}_{n}")
        for batch in (1024, 256):
            ds = ssnp.load(path)
            perm = np.random.default_rng(1).permutation(len(ds))
            chunks = [perm[i : i + batch] for i in range(0, len(ds), batch)]
            torch_ds = TorchDataset(path, batch_size=batch)
            persistent = DataLoader(
                torch_ds, batch_size=None, num_workers=workers, persistent_workers=True
            )
            sum(len(b["label"]) for b in persistent)  # start the workers
            map_ds = MapDataset(path)

            def numpy_batches(ds: ssnp.NumpyDataset = ds, b: int = batch) -> int:
                return sum(len(x["label"]) for x in ds.batches(b))

            def torch_batches(t: TorchDataset = torch_ds) -> int:
                loader = DataLoader(t, batch_size=None, num_workers=workers)
                return sum(len(x["label"]) for x in loader)

            def torch_persistent(loader: DataLoader = persistent) -> int:  # type: ignore[type-arg]
                return sum(len(x["label"]) for x in loader)

            def numpy_get_batch(ds: ssnp.NumpyDataset = ds, c: list = chunks) -> int:  # type: ignore[type-arg]
                return sum(len(ds.get_batch(i)["label"]) for i in c)

            def map_batches(m: MapDataset = map_ds, b: int = batch) -> int:
                sampler = BatchSampler(RandomSampler(range(len(m))), b, drop_last=False)
                loader = DataLoader(
                    m, batch_sampler=sampler, num_workers=workers, collate_fn=collate
                )
                return sum(len(x["label"]) for x in loader)

            fns: list[Callable[[], int]] = [
                numpy_batches,
                torch_batches,
                torch_persistent,
                numpy_get_batch,
                map_batches,
            ]
            best = [float("inf")] * len(fns)
            for _ in range(args.repeat):  # interleaved: each round runs every reader once
                for k, fn in enumerate(fns):
                    t0 = time.perf_counter()
                    count = fn()
                    best[k] = min(best[k], time.perf_counter() - t0)
                    assert count == n, (fn.__name__, count)
            rate = [n / t for t in best]
            print(
                f"| {name} | {batch} | {rate[0]:,.0f} | {rate[1]:,.0f} | {rate[1] / rate[0]:.2f}x "
                f"| {rate[2]:,.0f} | {rate[2] / rate[0]:.2f}x | {rate[3]:,.0f} | {rate[4]:,.0f} "
                f"| {rate[4] / rate[3]:.2f}x |",
                flush=True,
            )
            del persistent
    print(f"after: {_uptime()}")


if __name__ == "__main__":
    main()

"""superserial.ray against Ray Data's own Parquet, side by side in one Ray session.

The same materialized ``ray.data.Dataset`` (images uint8[32, 32, 3] and an int64
label) is written with ``superserial.ray.write`` and with ``Dataset.write_parquet``,
then read back whole with ``superserial.ray.read`` and ``ray.data.read_parquet``,
batches of 1,024 consumed as numpy. Each measurement once per round, the systems
interleaved, best of ``--repeats``. Prints the times and the ratios (Parquet's time
over ours: above 1 means superserial is faster).

    .venv/bin/python benchmarks/ray_data.py --rows 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import ray

import superserial.ray as ssr


def _consume(ds: ray.data.Dataset) -> int:
    rows = 0
    for batch in ds.iter_batches(batch_size=1024, batch_format="numpy"):
        rows += len(batch["label"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    ray.init(
        num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR"
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.rows, 32, 32, 3), dtype=np.uint8)
    data = ray.data.from_numpy(images).map_batches(
        lambda b: {"image": b["data"], "label": np.arange(len(b["data"]), dtype=np.int64)}
    )
    data = data.repartition(4).materialize()
    root = tempfile.mkdtemp(prefix="ray-bench-")
    ours, theirs = os.path.join(root, "ss"), os.path.join(root, "pq")

    def write_ours() -> None:
        shutil.rmtree(ours, ignore_errors=True)
        ssr.write(data, ours)

    def write_theirs() -> None:
        shutil.rmtree(theirs, ignore_errors=True)
        data.write_parquet(theirs)

    def read_ours() -> None:
        assert _consume(ssr.read(ours)) == args.rows

    def read_theirs() -> None:
        assert _consume(ray.data.read_parquet(theirs)) == args.rows

    cases: dict[str, Callable[[], None]] = {
        "write superserial": write_ours,
        "write parquet": write_theirs,
        "read superserial": read_ours,
        "read parquet": read_theirs,
    }
    for fn in cases.values():  # warm-up: the workers started, the files there
        fn()
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    mb = images.nbytes / 1e6
    print(f"{args.rows} rows, {mb:.0f} MB of images, {args.cpus} CPUs, best of {args.repeats}")
    for name, t in best.items():
        print(f"  {name:18s} {t:7.2f} s  {mb / t:7.1f} MB/s")
    for what in ("write", "read"):
        ratio = best[f"{what} parquet"] / best[f"{what} superserial"]
        print(f"  {what}: parquet time / superserial time = {ratio:.2f}")
    shutil.rmtree(root, ignore_errors=True)
    ray.shutdown()


if __name__ == "__main__":
    main()

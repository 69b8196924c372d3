"""Reading speed: the TF-free numpy reader against ``superserial.load``.

    .venv/bin/python benchmarks/bench_numpy.py [--n 60000] [--repeat 2] [--dir DIR]

Saves ``n`` random elements ``{"image": uint8[28, 28], "label": int64}``
(MNIST-like) with superserial, then reads them back:

* ``superserial.numpy.load`` element by element;
* ``superserial.numpy.iter_batches`` in batches of 1024;
* ``superserial.load(path, batch_size=1024)``, iterated (TensorFlow tensors);

and prints elements per second (best of ``--repeat`` runs). Then the
bandwidth table (issue 26: the numpy reader near the memory bandwidth), MB/s
of the shards' bytes (framing included) read in each way, best of
``--repeat``:

* sequential: ``superserial.numpy`` ``batches(1024)``, against, over the same
  spans of 1,024 records of a memory-mapped shard, ``np.frombuffer(...).copy()``
  (bringing the bytes into memory: the floor), ``google_crc32c.value`` of each
  span in one call (the CRC's own speed) and of each record's data, one call a
  record after slicing it out (what the CRC check of every record costs from
  Python: the unavoidable part);
* random: ``get_batch`` of ``--random-batches`` batches of 256 random indices,
  against gathering the same records from the map with numpy fancy indexing
  (one copy) and the per-record CRC of the same records.

The map rows need records of one size (fixed-shape leaves, as here): their
offsets are computed, not read from the index.
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np


def _best(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - t0)
    return best, count


def bandwidth(path: str, batch: int, random_batches: int, repeat: int) -> list[tuple[str, float]]:
    """MB/s of each way of reading the shards' bytes (see the module docstring)."""
    import google_crc32c

    import superserial
    import superserial.numpy as ssnp

    header = superserial.read_header(path)
    ds = ssnp.load(path)
    maps, views = [], []
    size = None
    for shard in header.shards:
        if shard.records == 0:
            continue
        if shard.bytes % shard.records or size not in (None, shard.bytes // shard.records):
            raise SystemExit("the map rows need records of one size: fixed-shape leaves")
        size = shard.bytes // shard.records
        with open(os.path.join(path, shard.file), "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        views.append(np.frombuffer(maps[-1], dtype=np.uint8)[: shard.bytes].reshape(-1, size))
    if size is None:
        raise SystemExit("an empty dataset has no bandwidth")
    rec = np.concatenate(views) if len(views) > 1 else views[0]  # [n, size] framed records
    total = rec.nbytes
    spans = [rec[a : a + batch] for a in range(0, len(rec), batch)]
    rng = np.random.default_rng(0)
    picks = [np.sort(rng.integers(0, len(rec), 256)) for _ in range(random_batches)]
    rand_bytes = sum(len(p) for p in picks) * size

    def per_record_crc(block: np.ndarray) -> None:
        data = block.tobytes()
        for j in range(len(block)):  # the data of record j: after the 12-byte head, before its CRC
            google_crc32c.value(data[j * size + 12 : (j + 1) * size - 4])

    ways: list[tuple[str, int, Callable[[], object]]] = [
        (f"superserial.numpy batches({batch})", total, lambda: sum(1 for _ in ds.batches(batch))),
        ("np.frombuffer(mmap) span .copy()", total, lambda: [s.copy() for s in spans]),
        (
            "google_crc32c.value of each span",
            total,
            lambda: [google_crc32c.value(s) for s in spans],
        ),
        ("google_crc32c.value of each record", total, lambda: [per_record_crc(s) for s in spans]),
        (
            "superserial.numpy get_batch(256 random)",
            rand_bytes,
            lambda: [ds.get_batch(p) for p in picks],
        ),
        ("np.frombuffer(mmap)[256 random] gather", rand_bytes, lambda: [rec[p] for p in picks]),
        (
            "google_crc32c.value of each random record",
            rand_bytes,
            lambda: [per_record_crc(rec[p]) for p in picks],
        ),
    ]
    best = {name: float("inf") for name, _, _ in ways}
    for _ in range(repeat):  # interleaved: each way once per round
        for name, _, fn in ways:
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    # The maps close when the views on them go, with this call.
    return [(name, nbytes / best[name] / 1e6) for name, nbytes, _ in ways]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--random-batches", type=int, default=100)
    parser.add_argument("--bandwidth-only", action="store_true", help="only the MB/s table")
    parser.add_argument(
        "--dir", default=None, help="where to save (default: a temporary directory)"
    )
    args = parser.parse_args()

    import tensorflow as tf

    import superserial
    import superserial.numpy as ssnp

    root = args.dir or tempfile.mkdtemp(prefix="bench_numpy_")
    path = os.path.join(root, f"mnist_like_{args.n}")
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (args.n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, args.n, dtype=np.int64)
        t0 = time.perf_counter()
        superserial.save(
            tf.data.Dataset.from_tensor_slices({"image": images, "label": labels}), path
        )
        print(f"saved {args.n} elements in {time.perf_counter() - t0:.2f} s to {path}")
    header = superserial.read_header(path)
    print(
        f"{header.element_count} elements, {header.total_bytes / 1e6:.1f} MB in {len(header.shards)} shard(s)"
    )

    def numpy_elements() -> int:
        n = 0
        for e in ssnp.load(path):
            n += e["image"].shape[0] > 0
        return n

    def numpy_batches() -> int:
        return sum(len(b["label"]) for b in ssnp.iter_batches(path, args.batch))

    def tf_batches() -> int:
        return sum(int(b["label"].shape[0]) for b in superserial.load(path, batch_size=args.batch))

    rows = [
        ("superserial.numpy.load, per element", numpy_elements),
        (f"superserial.numpy.iter_batches({args.batch})", numpy_batches),
        (f"superserial.load(batch_size={args.batch}) [TF]", tf_batches),
    ]
    for name, fn in [] if args.bandwidth_only else rows:
        seconds, count = _best(fn, args.repeat)
        if count != header.element_count:
            raise SystemExit(f"{name}: expected {header.element_count} elements, got {count}")
        print(f"{name:48s} {count / seconds:>12,.0f} elements/s  ({seconds:.2f} s)")
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| read (same bytes) | MB/s |\n|---|---:|")
    for name, mb_s in bandwidth(path, args.batch, args.random_batches, args.repeat):
        print(f"| {name} | {mb_s:,.0f} |")


if __name__ == "__main__":
    main()

"""Reading speed: the TF-free numpy reader against ``superserial.load``.

    .venv/bin/python benchmarks/bench_numpy.py [--n 60000] [--repeat 2] [--dir DIR]

Saves ``n`` random elements ``{"image": uint8[28, 28], "label": int64}``
(MNIST-like) with superserial, then reads them back:

* ``superserial.numpy.load`` element by element;
* ``superserial.numpy.iter_batches`` in batches of 1024;
* ``superserial.load(path, batch_size=1024)``, iterated (TensorFlow tensors);

and prints elements per second (best of ``--repeat`` runs).
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1024)
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
    for name, fn in rows:
        seconds, count = _best(fn, args.repeat)
        assert count == header.element_count, (name, count)
        print(f"{name:48s} {count / seconds:>12,.0f} elements/s  ({seconds:.2f} s)")


if __name__ == "__main__":
    main()

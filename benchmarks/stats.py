"""Speed of ``superserial stats`` against the TF-free numpy reader it reads with.

    .venv/bin/python benchmarks/stats.py [--n 60000] [--repeat 3] [--dir DIR]

Saves ``n`` random MNIST-like elements ``{"image": uint8[28, 28], "label":
int64}`` with superserial (once, into ``--dir`` if given), then times, in
the same process:

* the reader alone: ``superserial.numpy.iter_batches(path, 1024)``, iterated;
* ``superserial.stats(path)``: the same reading plus every statistic;

and prints elements per second of each (best of ``--repeat`` runs, the two
alternating) and their ratio. Target: stats at 0.5x the reader or faster.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np


def _best_of_both(
    a: Callable[[], int], b: Callable[[], int], repeat: int
) -> tuple[tuple[float, int], tuple[float, int]]:
    """The best time of each, run alternately, so a machine busy for a while slows both alike."""
    best = [(float("inf"), 0), (float("inf"), 0)]
    for _ in range(repeat):
        for i, fn in enumerate((a, b)):
            t0 = time.perf_counter()
            count = fn()
            best[i] = min(best[i], (time.perf_counter() - t0, count))
    return best[0], best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--dir", default=None, help="where to save (default: a temporary directory)"
    )
    args = parser.parse_args()

    import superserial
    import superserial.numpy as ssnp

    root = args.dir or tempfile.mkdtemp(prefix="bench_stats_")
    path = os.path.join(root, f"mnist_like_{args.n}")
    if not os.path.exists(path):
        import tensorflow as tf

        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (args.n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, args.n, dtype=np.int64)
        superserial.save(
            tf.data.Dataset.from_tensor_slices({"image": images, "label": labels}), path
        )
    print(f"{args.n} elements at {path}")

    def reader() -> int:
        return sum(len(b["label"]) for b in ssnp.iter_batches(path, 1024))

    def stats() -> int:
        return int(superserial.stats(path).elements)

    (t_read, n_read), (t_stats, n_stats) = _best_of_both(reader, stats, args.repeat)
    assert n_read == n_stats == args.n, (n_read, n_stats, args.n)
    print(f"numpy reader, iter_batches(1024): {n_read / t_read:12,.0f} elements/s")
    print(f"superserial.stats:               {n_stats / t_stats:12,.0f} elements/s")
    print(f"ratio stats / reader: {t_read / t_stats:.2f}x (target >= 0.5x)")


if __name__ == "__main__":
    main()

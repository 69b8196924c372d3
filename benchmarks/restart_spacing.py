"""The restart spacing of compressed shards: file size against random-read cost, side by side.

For each candidate spacing (uncompressed bytes per restart block, set on
``superserial.write.record_file._RESTART`` for the run), on sklearn's digits
tiled to --n elements ({"image": float64[8, 8], "label": int64}, compressible):

- the GZIP shards' size against TensorFlow's own GZIP ``tf.io.TFRecordWriter``
  over the same records (and the indexes' size);
- warm random ``ds[i]`` (files in the page cache, 1,000 random positions):
  the median with the LRU of inflated blocks off (each read inflates its
  block: the cost of a read that misses) and with it on (its default size);
- random ``get_batch(256)`` elements/s against sequential ``batches(256)``
  of the same compressed dataset;
- the GZIP save's time, beside ``Dataset.save(compression="GZIP")`` timed in
  the same run.

    .venv/bin/python benchmarks/restart_spacing.py                 # 60,000 elements
    .venv/bin/python benchmarks/restart_spacing.py --spacings 16 64 256 --repeats 3

The machine's load falls on all the rows alike only roughly: on a shared
machine the figures are rough.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import superserial
import superserial.numpy as snp
from superserial.read import blocks
from superserial.write import record_file


def digits(n: int) -> tf.data.Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    reps = n // len(d.images) + 1
    images = np.tile(d.images, (reps, 1, 1))[:n]
    labels = np.tile(d.target, reps)[:n].astype(np.int64)
    return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})


def shard_bytes(path: str, index: bool = False) -> int:
    header = superserial.read_header(path)
    if index:
        return sum(s.index.bytes for s in header.shards if s.index is not None)
    return sum(s.bytes for s in header.shards)


def tf_gzip_bytes(plain: str, out: str) -> int:
    """Size of TensorFlow's GZIP writer's file of the records of the uncompressed dataset ``plain``."""
    header = superserial.read_header(plain)
    total = 0
    for i, s in enumerate(header.shards):
        file = os.path.join(out, f"tf-{i}.tfrecord.gz")
        with tf.io.TFRecordWriter(file, tf.io.TFRecordOptions(compression_type="GZIP")) as w:
            for r in tf.data.TFRecordDataset(os.path.join(plain, s.file)):
                w.write(r.numpy())
        total += os.path.getsize(file)
    return total


def read_costs(path: str, n: int, cache: bool) -> tuple[float, float, float]:
    """(median ds[i] us, get_batch(256) el/s, batches(256) el/s)."""
    saved = blocks.CACHE_BYTES
    blocks.CACHE_BYTES = saved if cache else 0
    try:
        ds = snp.load(path)
        rng = np.random.default_rng(1)
        for i in rng.integers(0, n, 200):  # warm: files open, pages cached
            ds[int(i)]
        times = []
        for i in rng.integers(0, n, 1000).tolist():
            t0 = time.perf_counter()
            ds[i]
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = 0
        for _ in range(20):
            got += len(ds.get_batch(rng.integers(0, n, 256))["label"])
        batch_rate = got / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        seq = sum(len(b["label"]) for b in ds.batches(256))
        seq_rate = seq / (time.perf_counter() - t0)
        return statistics.median(times) * 1e6, batch_rate, seq_rate
    finally:
        blocks.CACHE_BYTES = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=60000)
    ap.add_argument("--spacings", type=int, nargs="+", default=[16, 32, 64, 128, 256, 4096])
    ap.add_argument("--repeats", type=int, default=1, help="timed saves per row")
    args = ap.parse_args()
    ds = digits(args.n)
    root = tempfile.mkdtemp(prefix="restart-spacing-")
    try:
        plain = os.path.join(root, "plain")
        superserial.save(ds, plain, progress=False)
        tf_bytes = tf_gzip_bytes(plain, root)
        saved = record_file._RESTART
        print(f"digits x{args.n}: uncompressed {shard_bytes(plain):,} B, TF GZIP {tf_bytes:,} B")
        # Dataset.save GZIP, timed beside each row's save.
        rows = []
        for kib in args.spacings:
            record_file._RESTART = kib << 10
            ours, theirs = [], []
            for r in range(args.repeats + 1):
                p = os.path.join(root, f"gz-{kib}")
                shutil.rmtree(p, ignore_errors=True)
                t0 = time.perf_counter()
                superserial.save(ds, p, compression="GZIP", progress=False)
                ours.append(time.perf_counter() - t0)
                q = os.path.join(root, f"tfsave-{kib}-{r}")
                t0 = time.perf_counter()
                ds.save(q, compression="GZIP")
                theirs.append(time.perf_counter() - t0)
                shutil.rmtree(q)
            size, index = shard_bytes(p), shard_bytes(p, index=True)
            miss = read_costs(p, args.n, cache=False)
            hit = read_costs(p, args.n, cache=True)
            save_x = statistics.median(theirs[1:]) / statistics.median(ours[1:])
            rows.append((kib, size, index, miss, hit, save_x))
        record_file._RESTART = saved
        print(
            "| spacing KiB | GZIP bytes | vs TF GZIP | index bytes | ds[i] us, no LRU | "
            "ds[i] us, LRU | get_batch(256) el/s no LRU / LRU | batches(256) el/s | "
            "save x Dataset.save GZIP |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for kib, size, index, miss, hit, save_x in rows:
            print(
                f"| {kib} | {size:,} | {size / tf_bytes - 1:+.2%} | {index:,} | {miss[0]:.0f} | "
                f"{hit[0]:.0f} | {miss[1]:,.0f} / {hit[1]:,.0f} | {hit[2]:,.0f} | {save_x:.2f}x |"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

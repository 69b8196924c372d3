"""The way out, side by side in one run (issue 25): Arrow, Parquet, tfindex.

A dataset of N elements (``image`` uint8[32, 32, 3], ``label`` int64, ``feats``
float32[16], ``caption`` string, ``tokens`` int32[None]) is saved once, in a child
process (TensorFlow is not imported here: vahidk/tfrecord's protos clash with its
own). Then, interleaved, best of --repeats, each against its floor:

* ``to_arrow()`` vs ``batches(4096)`` of the numpy reader (decoding alone);
* ``export(..., "out.parquet")`` vs ``to_arrow()`` then ``pq.write_table`` (the same
  work without streaming);
* ``export_tfindex`` (from our record indexes) vs vahidk/tfrecord's ``create_index``
  (a scan of every shard).

    .venv/bin/python benchmarks/export.py [--elements 50000] [--repeats 3]

The figures are ratios measured in one run; on a shared machine they are rough.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import pyarrow.parquet as pq

import superserial.numpy as ssnp
from superserial.foreign.export import export
from superserial.foreign.tfindex import export_tfindex

_SAVE = """
import sys
import numpy as np
import tensorflow as tf
import superserial
n = int(sys.argv[2])
rng = np.random.default_rng(0)
lengths = rng.integers(0, 20, n)
tokens = tf.RaggedTensor.from_row_lengths(np.arange(lengths.sum(), dtype=np.int32), lengths)
columns = {
    "image": rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8),
    "label": rng.integers(0, 10, n),
    "feats": rng.standard_normal((n, 16)).astype(np.float32),
    "caption": np.array([b"caption %d" % i for i in range(n)], dtype=object),
}
fixed = tf.data.Dataset.from_tensor_slices(columns)
ds = tf.data.Dataset.zip((fixed, tf.data.Dataset.from_tensor_slices(tokens)))
ds = ds.map(lambda f, t: {**f, "tokens": t})
superserial.save(ds, sys.argv[1], num_shards=4)
"""


def _best(fn: Callable[[], object], times: list[float]) -> None:
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--elements", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ss-export-bench-")
    try:
        path = os.path.join(root, "ds")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        subprocess.run([sys.executable, "-c", _SAVE, path, str(args.elements)], check=True, env=env)
        from tfrecord.tools.tfrecord2idx import create_index

        ds = ssnp.load(path)
        shards = [os.path.join(path, s.file) for s in ds.header.shards]
        out = os.path.join(root, "out.parquet")

        def batches() -> None:
            for _ in ds.batches(4096):
                pass

        def arrow_then_write() -> None:
            pq.write_table(ds.to_arrow(), os.path.join(root, "plain.parquet"))

        def theirs_index() -> None:
            for i, shard in enumerate(shards):
                create_index(shard, os.path.join(root, f"theirs-{i}.idx"))

        systems: dict[str, Callable[[], object]] = {
            "numpy batches(4096)": batches,
            "to_arrow()": ds.to_arrow,
            "to_arrow + pq.write_table": arrow_then_write,
            "export parquet": lambda: export(path, out, overwrite=True, progress=False),
            "tfrecord2idx create_index": theirs_index,
            "export_tfindex": lambda: export_tfindex(
                path, os.path.join(root, "idx"), progress=False
            ),
        }
        times: dict[str, list[float]] = {k: [] for k in systems}
        for fn in systems.values():
            fn()  # warm-up: page cache, imports
        for _ in range(args.repeats):
            for name, fn in systems.items():
                _best(fn, times[name])
        best = {k: min(v) for k, v in times.items()}
        mb = ds.header.total_bytes / 1e6
        print(f"{args.elements} elements, {mb:,.1f} MB of records; best of {args.repeats}")
        for name, t in best.items():
            print(f"  {name:28s} {t:8.3f} s  {args.elements / t:12,.0f} el/s")
        print("ratios (higher is better for us):")
        print(
            f"  to_arrow vs numpy batches:        {best['numpy batches(4096)'] / best['to_arrow()']:.2f}x"
        )
        print(
            f"  export parquet vs arrow+write:    "
            f"{best['to_arrow + pq.write_table'] / best['export parquet']:.2f}x"
        )
        print(
            f"  export_tfindex vs tfrecord2idx:   "
            f"{best['tfrecord2idx create_index'] / best['export_tfindex']:.2f}x"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

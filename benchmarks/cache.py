"""The local cache of remote datasets: first epoch (fetch) vs later epochs (cached), on S3.

Starts moto's S3 server on 127.0.0.1 (``moto[server]``, the tests' fixture),
saves the mnist workload of bench.py (60,000 28x28 uint8 images and labels,
~50 MB in 8 shards) locally and uploads its files to a bucket. Then, in one run,
side by side, whole epochs of:

* the records' bytes, framing checked, not decoded (``superserial.numpy.read_records``
  over the files of ``superserial.numpy.load(url, ...)``),
* the numpy reader (``superserial.numpy.load(url, ...).batches(256)``) and
* ``superserial.load(url, batch_size=256, ...)`` (tf.data),

each read three ways: straight from S3 without a cache (where that reader can
read S3 on this branch), epoch 1 with an empty ``cache_dir`` (fetch, check,
read) and epoch 2 with the same ``cache_dir`` (a new ``load`` call, reading
the cached copies). Every epoch includes its ``load`` call (the header is read
from S3 each time). The best of ``--repeats`` (each with a fresh cache) is kept.

    PYTHONPATH=src .venv/bin/python benchmarks/cache.py
    PYTHONPATH=src .venv/bin/python benchmarks/cache.py --elements 20000 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import fsspec
import numpy as np
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from bench import fmt, machine

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
from servers import aws_env, start_moto

BATCH = 256


def _server() -> Any:
    """moto's S3 server (tests/servers.py), the AWS settings pointed at it."""
    server, endpoint = start_moto()
    os.environ.update(aws_env(endpoint))
    os.environ.pop("AWS_PROFILE", None)
    return server


def _mnist(n: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    return tf.data.Dataset.from_tensor_slices(
        {
            "image": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            "label": rng.integers(0, 10, n),
        }
    )


def _numpy_epoch(url: str, **kw: Any) -> int:
    n = 0
    for batch in ssnp.load(url, **kw).batches(BATCH):
        n += len(batch["label"])
    return n


def _raw_epoch(url: str, **kw: Any) -> int:
    # The records' bytes, framing checked, not decoded: what the cache speeds up.
    ds = ssnp.load(url, **kw)
    return sum(1 for f in ds.files for _ in ssnp.read_records(f))


def _tf_epoch(url: str, **kw: Any) -> int:
    n = 0
    for batch in superserial.load(url, batch_size=BATCH, **kw):
        n += int(batch["label"].shape[0])
    return n


def _timed(fn: Callable[[], int], want: int) -> float | None:
    t = time.perf_counter()
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - a reader that cannot read S3 here is reported, not fatal
        print(f"  ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
        return None
    if got != want:
        raise SystemExit(f"expected {want} elements, read {got}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--elements", type=int, default=60_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {machine()}", flush=True)
    server = _server()
    work = tempfile.mkdtemp(prefix="ss-cache-bench-")
    try:
        local = os.path.join(work, "mnist")
        header = superserial.save(_mnist(args.elements), local, num_shards=args.shards)
        mb = header.total_bytes / 1e6
        s3 = fsspec.filesystem("s3")
        s3.mkdir("s3://bench")
        url = "s3://bench/mnist"
        s3.put(local + "/", url + "/", recursive=True)
        s3.invalidate_cache()
        n = header.element_count
        print(f"mnist: {n} elements, {mb:.1f} MB in {args.shards} shards, at {url} (moto)")
        readers = {
            "numpy raw records": _raw_epoch,
            "numpy batches(256)": _numpy_epoch,
            "tf load(batch_size=256)": _tf_epoch,
        }
        _tf_epoch(local)  # trace the parser outside the timed runs
        best: dict[tuple[str, str], float | None] = {}
        for _ in range(args.repeats):
            for name, epoch in readers.items():
                cdir = os.path.join(work, "cache")
                shutil.rmtree(cdir, ignore_errors=True)
                runs = {
                    "no cache (S3)": lambda e=epoch: e(url),
                    "cache, epoch 1 (fetch)": lambda e=epoch, c=cdir: e(url, cache_dir=c),
                    "cache, epoch 2 (local)": lambda e=epoch, c=cdir: e(url, cache_dir=c),
                    "local files (floor)": lambda e=epoch: e(local),
                }
                for run, fn in runs.items():
                    t = _timed(fn, n)
                    old = best.get((name, run))
                    best[(name, run)] = t if old is None or (t is not None and t < old) else old
        print("\n| reader | read | s | MB/s | x epoch 1 |")
        print("|---|---|---:|---:|---:|")
        for name in readers:
            first = best[(name, "cache, epoch 1 (fetch)")]
            for run in (
                "no cache (S3)",
                "cache, epoch 1 (fetch)",
                "cache, epoch 2 (local)",
                "local files (floor)",
            ):
                t = best[(name, run)]
                rate = None if t is None else mb / t
                x = None if t is None or first is None else first / t
                print(
                    f"| {name} | {run} | {fmt(t, '.2f')} | {fmt(rate, '.0f')} | {fmt(x, '.1f')} |"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()

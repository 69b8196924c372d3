"""Filling the cache from a remote dataset: shards in parallel pieces vs one stream each.

nginx serves a mnist-shaped dataset (60,000 x uint8[28, 28] + int64, 8 shards) behind
tests/netproxy.py's latency proxy (in a process of its own, as in benchmarks/remote.py).
Side by side, interleaved, best of ``--repeats``, each with an empty ``cache_dir``:

* a full epoch of ``superserial.numpy.load(url, cache_dir=..., cache_limit=25%)``
  ``batches(256)`` (the streaming cache: the reader reads ahead as without a cache and
  the cache copies what it reads, so the piece size does not apply to it: its two rows
  differ by noise alone), and the same with the whole dataset fitting the cache (eager:
  every shard first);
* each with shards downloaded in 1 MiB pieces, 16 in flight (what the cache does), and
  in one stream per file (``superserial.storage.fs.copy_file``, what it did before),
  chosen by ``superserial.read.cache.directory.DOWNLOAD_PIECE``;
* beside them, the same epoch without a cache, and a plain client fetching the shard
  files whole, 8 at a time (the ceiling).

    PYTHONPATH=src .venv/bin/python benchmarks/cache_download.py [--latency-ms 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

import remote_net as net


def _save(path: str, n: int, shards: int) -> None:
    import tensorflow as tf

    import superserial

    rng = np.random.default_rng(0)
    data = {"image": rng.integers(0, 255, (n, 28, 28), np.uint8), "label": np.arange(n)}
    superserial.save(tf.data.Dataset.from_tensor_slices(data), path, num_shards=shards)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    # The proxy is forked before TensorFlow is imported.
    with net.nginx_behind_proxy(args.latency_ms / 1000, "superserial-cache-dl-") as (proxy, www):
        work = os.path.dirname(www)
        _save(os.path.join(www, "ds"), args.n, args.shards)
        import superserial.numpy as ssnp
        from superserial.read.cache import directory

        url = f"{proxy.url}/ds"
        size = sum(os.path.getsize(os.path.join(www, "ds", f)) for f in os.listdir(f"{www}/ds"))
        piece = directory.DOWNLOAD_PIECE  # the A/B switch of this benchmark

        def epoch(limit: int | None, pieces: bool) -> Callable[[], int]:
            def run_once() -> int:
                cdir = tempfile.mkdtemp(dir=work)
                directory.DOWNLOAD_PIECE = piece if pieces else 1 << 62
                try:
                    kw = {} if limit == 0 else {"cache_dir": cdir, "cache_limit": limit}
                    ds = ssnp.load(url, **kw)
                    return sum(len(b["label"]) for b in ds.batches(256))
                finally:
                    directory.DOWNLOAD_PIECE = piece
                    shutil.rmtree(cdir, ignore_errors=True)

            return run_once

        files = sorted(f for f in os.listdir(f"{www}/ds") if f.endswith(".tfrecord"))
        get = net.http_getter(proxy.url, "ds")

        def whole() -> int:
            net.whole_files(get, files, parallel=8)
            return args.n

        rows: dict[str, Callable[[], int]] = {
            "no cache": epoch(0, True),
            "cache 25%, pieces": epoch(size // 4, True),
            "cache 25%, one stream": epoch(size // 4, False),
            "cache all, pieces": epoch(None, True),
            "cache all, one stream": epoch(None, False),
            "plain client, whole files 8 at a time": whole,
        }
        best = dict.fromkeys(rows, float("inf"))
        for _ in range(args.repeats):
            for name, fn in rows.items():
                t0 = time.perf_counter()
                count = fn()
                best[name] = min(best[name], time.perf_counter() - t0)
                if count != args.n:
                    raise SystemExit(f"{name}: read {count} of {args.n} elements")
        print(
            f"{args.n:,} elements, {size / 1e6:.1f} MB in {args.shards} shards, nginx "
            f"+{args.latency_ms:g} ms, best of {args.repeats}; load {os.getloadavg()[0]:.1f}"
        )
        print("| read | el/s | x plain client |\n|---|---:|---:|")
        ceiling = args.n / best["plain client, whole files 8 at a time"]
        for name, t in best.items():
            print(f"| {name} | {args.n / t:,.0f} | {args.n / t / ceiling:.2f} |")


if __name__ == "__main__":
    main()

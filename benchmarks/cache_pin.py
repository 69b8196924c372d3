"""Random access over a cache smaller than the dataset: pinned shards vs none, on S3 + latency.

Starts moto's S3 server on 127.0.0.1 behind the repo's latency proxy
(tests/netproxy.py, ``--latency`` seconds per request), saves mnist-shaped data
(uint8[28, 28] images and int64 labels, ``--shards`` shards) and uploads it.
Then, in one run, side by side, epochs of ``superserial.numpy`` ``get_batch``
over random batches of 256 (a new permutation each epoch), read:

* ``no cache``: range reads of every record, remotely;
* ``pinned, epoch 1``: ``cache_limit`` at ``--fraction`` of the dataset, a new
  reader (its pins start downloading in the background when it is made);
* ``pinned, epoch 2``: the same reader, once its pins are complete;
* ``pinned, new reader``: another reader of the same cache directory (the pins
  are found cached: nothing is downloaded for them);
* ``all cached, epoch 1``: a limit the dataset fits: the eager cache (every
  shard fetched when the reader is made).

For each: elements a second, seconds to the first batch (from the ``load``
call), requests and body bytes through the proxy.

    PYTHONPATH=src:tests:benchmarks .venv/bin/python benchmarks/cache_pin.py
    PYTHONPATH=src:tests:benchmarks .venv/bin/python benchmarks/cache_pin.py --elements 8000
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

import fsspec
import numpy as np
import tensorflow as tf
from moto.server import ThreadedMotoServer

import superserial
import superserial.numpy as ssnp
from bench import machine
from netproxy import NetProxy

BATCH = 256


def _server() -> tuple[ThreadedMotoServer, str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    os.environ.pop("AWS_PROFILE", None)
    return server, endpoint


def _mnist(n: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    return tf.data.Dataset.from_tensor_slices(
        {
            "image": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            "label": np.arange(n, dtype=np.int64),
        }
    )


def _epoch(ds: Any, seed: int, proxy: NetProxy, t0: float) -> dict[str, float]:
    """One epoch of get_batch over random batches; the figures of it (``t0``: when load began)."""
    order = np.random.default_rng(seed).permutation(len(ds))
    first = None
    seen = 0
    for j in range(0, len(order), BATCH):
        b = ds.get_batch(order[j : j + BATCH])
        if not np.array_equal(b["label"], order[j : j + BATCH]):
            raise SystemExit("wrong labels")
        seen += len(b["label"])
        first = time.perf_counter() - t0 if first is None else first
    took = time.perf_counter() - t0
    return {
        "el/s": seen / took,
        "first batch s": first or 0.0,
        "requests": proxy.requests,
        "MB": proxy.body_bytes / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--elements", type=int, default=20_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--fraction", type=float, default=0.3)
    args = ap.parse_args()
    print(f"machine: {machine()}; load {os.getloadavg()[0]:.1f}", flush=True)
    server, endpoint = _server()
    work = tempfile.mkdtemp(prefix="ss-pin-bench-")
    try:
        local = os.path.join(work, "mnist")
        header = superserial.save(_mnist(args.elements), local, num_shards=args.shards)
        s3 = fsspec.filesystem("s3")
        s3.mkdir("s3://bench")
        url = "s3://bench/mnist"
        s3.put(local + "/", url + "/", recursive=True)
        total = sum(s.bytes + s.index.bytes for s in header.shards)  # type: ignore[union-attr]
        limit = int(total * args.fraction)
        print(
            f"mnist: {header.element_count} elements, {total / 1e6:.1f} MB in {args.shards} "
            f"shards; cache_limit {limit / 1e6:.1f} MB ({args.fraction:.0%}); proxy "
            f"+{args.latency * 1000:.0f} ms a request"
        )
        with NetProxy(endpoint, latency=args.latency) as proxy:
            fsspec.config.conf["s3"] = {"endpoint_url": proxy.url}
            fsspec.filesystem("s3").clear_instance_cache()
            rows: dict[str, dict[str, float]] = {}
            cdir = os.path.join(work, "cache")

            def run(name: str, ds: Any = None, seed: int = 0, **kw: Any) -> Any:
                proxy.reset()
                t0 = time.perf_counter()
                ds = ssnp.load(url, **kw) if ds is None else ds
                rows[name] = _epoch(ds, seed, proxy, t0)
                print(f"  {name}: {rows[name]}", file=sys.stderr, flush=True)
                return ds

            run("no cache")
            ds = run("pinned, epoch 1", seed=1, cache_dir=cdir, cache_limit=limit)
            ds.cache_pins.wait()
            pinned = len(ds.cache_pins.ready)
            run("pinned, epoch 2", ds, seed=2)
            del ds
            run("pinned, new reader", seed=3, cache_dir=cdir, cache_limit=limit)
            shutil.rmtree(cdir)
            run("all cached, epoch 1", seed=4, cache_dir=cdir, cache_limit=total)
        base = rows["no cache"]["el/s"]
        print(f"\npinned {pinned} of {args.shards} shards\n")
        print("| read | el/s | vs no cache | first batch (s) | requests | MB through proxy |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, r in rows.items():
            print(
                f"| {name} | {r['el/s']:,.0f} | {r['el/s'] / base:.2f}x | "
                f"{r['first batch s']:.2f} | {r['requests']:.0f} | {r['MB']:.1f} |"
            )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

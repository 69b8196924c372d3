"""Remote read speed, side by side in one run: read-ahead and request concurrency (issue 23.1).

mnist-shaped data (60k x uint8[28, 28] + int64, 8 shards) served by nginx
(``autoindex off``, as the suite's ``web_server``) and by moto's S3 server,
each behind tests/netproxy.py holding every request ``--latency`` (50 ms),
all on 127.0.0.1 (the proxy in a process of its own). Rows, each a ratio to a plain client's ceiling measured in
the same run:

* sequential ``superserial.numpy`` ``batches(256)`` with read-ahead (the
  default) and without (``SUPERSERIAL_READ_AHEAD=0``), against the shard files
  fetched whole, 8 at a time, and the same read from local disk (what decoding
  alone costs on this machine now), interleaved;
* ``get_batch(256 random indices)`` at ``SUPERSERIAL_REMOTE_CONCURRENCY`` 64,
  128 and 256, against range GETs of the same records, 64 in flight;
* the range reads of those batches through our pool of ``cat_file`` calls
  against fsspec's own async batch, ``fs.cat_ranges(..., batch_size=N)``.

The machine is shared: figures are rough, ratios are what to read.

    PYTHONPATH=src .venv/bin/python benchmarks/remote_fetch.py [--quick] [--servers nginx,moto]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import numpy as np

import servers
import superserial.numpy as ssnp
from superserial.storage import fetch, fs

N, SHARDS, BATCH = 60_000, 8, 256


def make_dataset(path: str) -> None:
    """mnist-shaped data saved at ``path`` (once: kept between runs)."""
    if os.path.exists(os.path.join(path, "header.json")):
        return
    import tensorflow as tf

    import superserial

    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        {
            "image": rng.integers(0, 255, (N, 28, 28), dtype=np.uint8),
            "label": np.arange(N, dtype=np.int64),
        }
    )
    superserial.save(data, path, num_shards=SHARDS)


@contextmanager
def nginx(root: str) -> Iterator[str]:
    """nginx serving ``root`` (tests/servers.py); yields its URL."""
    exe = servers.find_nginx()
    if exe is None:
        raise SystemExit("nginx is not installed (make test-services installs nginx-light)")
    run = tempfile.mkdtemp(prefix="rspeed-nginx-")
    proc, url = servers.start_nginx(exe, root, run)
    try:
        yield url
    finally:
        servers.stop_nginx(proc)
        shutil.rmtree(run, ignore_errors=True)


@contextmanager
def moto(local: str) -> Iterator[str]:
    """moto's S3 server holding the dataset at ``s3://rspeed/ds``; yields its endpoint."""
    import boto3

    server, endpoint = servers.start_moto()
    os.environ.update({k: v for k, v in servers.aws_env(endpoint).items() if k.startswith("AWS_")})
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="rspeed")
    for name in os.listdir(local):
        s3.upload_file(os.path.join(local, name), "rspeed", f"ds/{name}")
    try:
        yield endpoint
    finally:
        server.stop()


@contextmanager
def proxy(upstream: str, latency: float) -> Iterator[str]:
    """tests/netproxy.py in a process of its own (its threads would share our GIL); its URL."""
    code = (
        "import sys; from netproxy import NetProxy\n"
        f"with NetProxy({upstream!r}, latency={latency!r}) as p:\n"
        "    print(p.url, flush=True); sys.stdin.read()"
    )
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": tests},
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        proc.wait(10)


def point_s3(endpoint: str) -> None:
    import fsspec

    os.environ["AWS_ENDPOINT_URL"] = endpoint
    fsspec.config.conf["s3"] = {"endpoint_url": endpoint}
    fsspec.get_filesystem_class("s3").clear_instance_cache()


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def best(fn: Callable[[], Any], repeats: int) -> float:
    return min(timed(fn) for _ in range(repeats))


@contextmanager
def env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def whole_files(url: str, files: list[str], width: int = 8) -> None:
    """The ceiling: each shard fetched whole by fsspec, ``width`` at a time."""
    fsys, _ = fs._backend(url)._fs(url)  # type: ignore[attr-defined]
    paths = [fs._backend(url)._fs(fs.join(url, f))[1] for f in files]  # type: ignore[attr-defined]
    with ThreadPoolExecutor(width) as pool:
        list(pool.map(fsys.cat_file, paths))


def run(
    name: str, url: str, repeats: int, batches: int, local_path: str
) -> list[tuple[str, float, str]]:
    rows: list[tuple[str, float, str]] = []
    ds = ssnp.load(url)
    files = [s.file for s in ds.header.shards]
    nbytes = sum(s.bytes for s in ds.header.shards)
    ds.get_batch(np.arange(0, N, N // SHARDS))  # every index read, the pool made
    first: dict[str, float] = {}

    def sequential(label: str) -> None:
        t = time.perf_counter()
        it = ssnp.load(url).batches(BATCH)
        next(it)
        first[label] = min(first.get(label, 1e9), time.perf_counter() - t)
        for _ in it:
            pass

    def local() -> None:  # the reader's own cost: decoding from the page cache
        for _ in ssnp.load(local_path).batches(BATCH):
            pass

    # Interleaved, best of each: the ceiling and both reads meet the same load.
    t_whole, t_local = 1e9, 1e9
    t_seq = {"read-ahead (default)": 1e9, "no read-ahead": 1e9}
    for _ in range(repeats):
        t_whole = min(t_whole, timed(lambda: whole_files(url, files)))
        t_local = min(t_local, timed(local))
        for label, ahead in (("read-ahead (default)", ""), ("no read-ahead", "0")):
            with env(SUPERSERIAL_READ_AHEAD=ahead):
                t_seq[label] = min(t_seq[label], timed(lambda label=label: sequential(label)))
    rows.append(
        (
            f"{name}: shard files whole, 8 at a time",
            N / t_whole,
            f"{nbytes / t_whole / 1e6:.0f} MB/s",
        )
    )
    rows.append(("local disk: numpy batches(256), the decoding bound", N / t_local, ""))
    for label, t in t_seq.items():
        rows.append(
            (
                f"{name}: numpy batches(256), {label}",
                N / t,
                f"{t_whole / t:.2f}x whole; first batch {first[label]:.2f} s",
            )
        )

    rng = np.random.default_rng(1)
    picks = [rng.choice(N, BATCH, replace=False) for _ in range(batches)]
    reader = ds.records
    # The range reads get_batch plans for each batch (what both clients fetch).
    plans = []
    for idx in picks:
        idx = np.sort(idx)
        ks = np.searchsorted(np.asarray(reader._ends), idx, side="right")
        reads = []
        for k in np.unique(ks):
            offsets, rr = reader._open(int(k))
            recs = idx[ks == k] - reader._begins[k]
            lo, hi = offsets[recs], offsets[recs + 1]
            firsts = fetch.plan(lo, hi)
            reach = np.maximum.accumulate(hi)
            run_hi = reach[np.r_[firsts[1:], len(lo)] - 1]
            reads += [(rr, int(a), int(b)) for a, b in zip(lo[firsts], run_hi, strict=True)]
        plans.append(reads)
    nreq = sum(len(p) for p in plans)

    def ranges_64() -> None:  # the ceiling: plain range GETs, 64 in flight
        with ThreadPoolExecutor(64) as pool:
            list(
                pool.map(
                    lambda r: r[0]._fs.cat_file(r[0]._fpath, start=r[1], end=r[2]),
                    [r for p in plans for r in p],
                )
            )

    t64 = best(ranges_64, repeats)
    ceiling = batches * BATCH / t64
    rows.append((f"{name}: range GETs, 64 in flight (ceiling)", ceiling, f"{nreq / t64:.0f} req/s"))
    for width in (64, 128, 256):
        with env(SUPERSERIAL_REMOTE_CONCURRENCY=str(width)):
            fetch.executor()

            def gets() -> None:
                for idx in picks:
                    ds.get_batch(idx)

            t = best(gets, repeats)

            def pooled() -> None:
                for p in plans:
                    fetch.read_all(p)

            tp = best(pooled, repeats)

            def native(width: int = width) -> None:
                for p in plans:
                    r0 = p[0][0]
                    r0._fs.cat_ranges(
                        [r[0]._fpath for r in p],
                        [r[1] for r in p],
                        [r[2] for r in p],
                        batch_size=width,
                    )

            tn = best(native, repeats)
        el = batches * BATCH / t
        rows.append(
            (f"{name}: get_batch(256), concurrency {width}", el, f"{el / ceiling:.2f}x ranges-64")
        )
        rows.append((f"{name}: its range reads, our pool of cat_file, {width}", nreq / tp, "req/s"))
        rows.append(
            (f"{name}: its range reads, fs.cat_ranges(batch_size={width})", nreq / tn, "req/s")
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--servers", default="nginx,moto")
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--data", default="/tmp/rspeed-data")
    args = ap.parse_args()
    repeats, batches = (1, 4) if args.quick else (3, 8)
    root = args.data
    os.makedirs(root, exist_ok=True)
    make_dataset(os.path.join(root, "ds"))
    rows: list[tuple[str, float, str]] = []
    servers = args.servers.split(",")
    if "nginx" in servers:
        with nginx(root) as url, proxy(url, args.latency) as purl:
            rows += run("nginx", f"{purl}/ds", repeats, batches, os.path.join(root, "ds"))
    if "moto" in servers:
        with moto(os.path.join(root, "ds")) as endpoint, proxy(endpoint, args.latency) as purl:
            point_s3(purl)
            rows += run("moto", "s3://rspeed/ds", repeats, batches, os.path.join(root, "ds"))
    print(f"load average {os.getloadavg()[0]:.2f}, latency {args.latency * 1000:.0f} ms")
    print("| row | el/s (or req/s) | note |\n|---|---:|---|")
    for label, value, note in rows:
        print(f"| {label} | {value:,.0f} | {note} |")


if __name__ == "__main__":
    main()

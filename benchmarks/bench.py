"""superserial vs tf.data.Dataset.save/load vs per-element Python vs raw TFRecord reads.

One run, all systems, every workload; each measurement after a warm-up,
interleaved with the other systems, best of --repeats. Loaded data is
consumed in batches of 1,024, as training does. Prints a markdown table and
writes benchmarks/out/results.json.

    .venv/bin/python benchmarks/bench.py              # all workloads
    .venv/bin/python benchmarks/bench.py mnist --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import superserial
import superserial.numpy as superserial_numpy

BATCH = 1024
PY_SUBSET = 3000  # the per-element Python writer is slow: timed on a prefix


def workloads() -> dict[str, Callable[[], tf.data.Dataset]]:
    rng = np.random.default_rng(0)

    def mnist():
        return tf.data.Dataset.from_tensor_slices(
            {
                "image": rng.integers(0, 256, (60_000, 28, 28), dtype=np.uint8),
                "label": rng.integers(0, 10, 60_000),
            }
        )

    def cifar():
        return tf.data.Dataset.from_tensor_slices(
            {
                "image": rng.random((10_000, 32, 32, 3), dtype=np.float32),
                "label": rng.integers(0, 10, 10_000).astype(np.int32),
            }
        )

    def tabular():
        n = 100_000
        ids = np.array([f"id-{i:08d}".encode() for i in range(n)], dtype=object)
        return tf.data.Dataset.from_tensor_slices(
            {
                "x": rng.standard_normal((n, 16)).astype(np.float32),
                "y": rng.integers(0, 1000, n),
                "id": ids,
            }
        )

    def ragged():
        n = 100_000
        lengths = rng.integers(0, 41, n)
        tokens = tf.RaggedTensor.from_row_lengths(
            rng.integers(0, 30_000, lengths.sum()).astype(np.int32), lengths
        )
        return tf.data.Dataset.from_tensor_slices(
            {"tokens": tokens, "label": rng.integers(0, 2, n)}
        )

    return {"mnist": mnist, "cifar": cifar, "tabular": tabular, "ragged": ragged}


class PeakRSS:
    """Samples this process's resident set size while a block runs."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.01)

    def __enter__(self) -> PeakRSS:
        self.peak = self.rss()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.rss())


def dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def consume(ds: tf.data.Dataset) -> int:
    n = 0
    for _ in ds:
        n += 1
    return n


# --------------------------------------------------------------- systems


def py_example_save(ds: tf.data.Dataset, path: str) -> None:
    """The 2020 way: one tf.train.Example per element, built in Python."""

    def feature(v: np.ndarray) -> tf.train.Feature:
        v = np.asarray(v).reshape(-1)
        if v.dtype.kind in "OS":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(x) for x in v]))
        if np.issubdtype(v.dtype, np.floating):
            return tf.train.Feature(float_list=tf.train.FloatList(value=v))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=v))

    with tf.io.TFRecordWriter(path) as w:
        for el in ds.as_numpy_iterator():
            flat = {k: v for k, v in el.items()}
            if hasattr(flat.get("tokens"), "flat_values"):
                flat["tokens"] = flat["tokens"].flat_values
            ex = tf.train.Example(
                features=tf.train.Features(feature={k: feature(v) for k, v in flat.items()})
            )
            w.write(ex.SerializeToString())


def systems(root: str) -> list[dict[str, Any]]:
    def ss_save(ds, p, **kw):
        superserial.save(ds, p, progress=False, **kw)

    return [
        {
            "name": "superserial",
            "path": f"{root}/ss",
            "save": lambda ds, p: ss_save(ds, p),
            "load": lambda p: superserial.load(p, batch_size=BATCH),
        },
        {
            "name": "superserial GZIP",
            "path": f"{root}/ss_gz",
            "save": lambda ds, p: ss_save(ds, p, compression="GZIP"),
            "load": lambda p: superserial.load(p, batch_size=BATCH),
        },
        {
            "name": "Dataset.save",
            "path": f"{root}/tfsave",
            "save": lambda ds, p: ds.save(p),
            "load": lambda p: tf.data.Dataset.load(p).batch(BATCH),
        },
        {
            "name": "Dataset.save GZIP",
            "path": f"{root}/tfsave_gz",
            "save": lambda ds, p: ds.save(p, compression="GZIP"),
            "load": lambda p: tf.data.Dataset.load(p, compression="GZIP").batch(BATCH),
        },
        {
            "name": "superserial.numpy (no TF)",
            "path": f"{root}/ss",  # superserial's files, read by the TF-free reader
            "save": None,
            "load": lambda p: superserial_numpy.iter_batches(p, BATCH),
        },
        {
            "name": "raw TFRecord read (floor)",
            "path": f"{root}/ss",  # superserial's own files, read without parsing
            "save": None,
            "load": lambda p: tf.data.TFRecordDataset(
                sorted(tf.io.gfile.glob(f"{p}/data-*.tfrecord")), buffer_size=1 << 20
            ).batch(BATCH),
        },
        {
            "name": f"per-element Python Example (first {PY_SUBSET})",
            "path": f"{root}/py.tfrecord",
            "save": lambda ds, p: py_example_save(ds.take(PY_SUBSET), p),
            "load": None,
            "subset": PY_SUBSET,
        },
    ]


def clear(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def measure(fn: Callable[[], Any]) -> tuple[float, int]:
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
    return dt, rss.peak


def run_workload(
    name: str, make: Callable[[], tf.data.Dataset], repeats: int
) -> list[dict[str, Any]]:
    ds = make()
    n = int(ds.cardinality())
    root = tempfile.mkdtemp(prefix=f"bench-{name}-")
    syss = systems(root)
    best: dict[str, dict[str, Any]] = {
        s["name"]: {"save_s": None, "load_s": None, "rss_save": 0, "rss_load": 0} for s in syss
    }
    try:
        # Warm-up: one small pass of everything (tracing, caches).
        warm = ds.take(512)
        for s in syss:
            if s["save"]:
                clear(s["path"])
                s["save"](warm, s["path"])
            if s["load"]:
                consume(s["load"](s["path"]))
        for _ in range(repeats):
            for s in syss:  # interleaved: each system once per round
                r = best[s["name"]]
                if s["save"]:
                    clear(s["path"])
                    dt, rss = measure(lambda s=s: s["save"](ds, s["path"]))
                    r["save_s"] = dt if r["save_s"] is None else min(r["save_s"], dt)
                    r["rss_save"] = max(r["rss_save"], rss)
                    r["bytes"] = dir_bytes(s["path"])
            for s in syss:
                r = best[s["name"]]
                if s["load"]:
                    dt, rss = measure(lambda s=s: consume(s["load"](s["path"])))
                    r["load_s"] = dt if r["load_s"] is None else min(r["load_s"], dt)
                    r["rss_load"] = max(r["rss_load"], rss)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for s in syss:
        r = best[s["name"]]
        count = s.get("subset", n)
        rows.append(
            {
                "workload": name,
                "system": s["name"],
                "elements": count,
                "save_per_s": count / r["save_s"] if r["save_s"] else None,
                "load_per_s": count / r["load_s"] if r["load_s"] else None,
                "mb": r.get("bytes", best["superserial"].get("bytes", 0)) / 1e6
                if s["save"] or s["name"].startswith("raw")
                else None,
                "rss_mb": max(r["rss_save"], r["rss_load"]) / 1e6,
            }
        )
    base = next(r for r in rows if r["system"] == "Dataset.save")
    for r in rows:
        r["save_x"] = r["save_per_s"] / base["save_per_s"] if r["save_per_s"] else None
        r["load_x"] = r["load_per_s"] / base["load_per_s"] if r["load_per_s"] else None
        r["mb_x"] = r["mb"] / base["mb"] if r["mb"] else None
    return rows


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def machine() -> str:
    cpu = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, TF {tf.__version__}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("workloads", nargs="*", default=list(workloads()))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    all_rows = []
    print(f"machine: {machine()}", flush=True)
    print(
        "| workload | system | save el/s | x Dataset.save | load el/s | x Dataset.load | MB | x size | peak RSS MB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for w in args.workloads:
        rows = run_workload(w, workloads()[w], args.repeats)
        all_rows += rows
        for r in rows:
            print(
                f"| {r['workload']} | {r['system']} | {fmt(r['save_per_s'], ',.0f')} | {fmt(r['save_x'], '.2f')} | "
                f"{fmt(r['load_per_s'], ',.0f')} | {fmt(r['load_x'], '.2f')} | {fmt(r['mb'], '.1f')} | "
                f"{fmt(r['mb_x'], '.2f')} | {r['rss_mb']:,.0f} |",
                flush=True,
            )
    out = os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"machine": machine(), "argv": sys.argv, "rows": all_rows}, f, indent=2)


if __name__ == "__main__":
    main()

"""superserial against tf.data.Dataset.save/load, the raw TFRecord read, and its TF-free readers.

One run covers every row of issue 14's table, for every workload: each
measurement after a warm-up, interleaved with the other systems (each
system once per round), best of --repeats. Loaded data is consumed in
batches of 1,024, as training does. Prints

1. the ratio table (the README's): save vs ``Dataset.save``;
   ``load(p, batch_size=1024)`` vs the hand-written tf.data pipeline over
   the same files (``TFRecordDataset(files).batch(1024).map(parse_example(spec)
   + the decode a user needs, AUTOTUNE).prefetch(AUTOTUNE)``, checked to give
   the same values as ``load``), pipeline building included in both;
   ``load(p).batch(1024)`` vs
   ``Dataset.load(p).batch(1024)``; ``load(p, batch_size=1024)`` vs the same;
   its share of the read floor (``TFRecordDataset(files).batch(1024)`` of the
   same files, nothing parsed); ``superserial.numpy.iter_batches`` and
   ``DataLoader(TorchDataset, num_workers=2)`` vs ``load(p, batch_size=1024)``;
   GZIP save vs ``Dataset.save`` GZIP (mnist and cifar);
2. the elements/s of every system (the table of docs/performance.md);
3. the first call in a process: saving and loading + iterating sklearn's
   digits (1,797 x float64[8, 8] + int label), each in a fresh subprocess,
   the TensorFlow import excluded, against ``Dataset.save`` / ``Dataset.load``;

4. with ``--peers PYTHON``, the peer rows of benchmarks/peers.py (issue 26):
   superserial's numpy reader against Lance, HF ``datasets``,
   mosaicml-streaming and litdata on local mnist-shaped files, the peers
   that need their own venv run by ``PYTHON``;

and writes everything to benchmarks/out/results.json.

    .venv/bin/python benchmarks/bench.py              # all workloads
    .venv/bin/python benchmarks/bench.py mnist --repeats 1 --no-first-call
    .venv/bin/python benchmarks/bench.py --only ss,hand --no-first-call   # tf.data only
    .venv/bin/python benchmarks/bench.py --peers .venv-peers/bin/python   # the README's run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import superserial
import superserial.numpy as superserial_numpy

BATCH = 1024
PY_SUBSET = 3000  # the per-element Python writer is slow: timed on a prefix
GZIP_WORKLOADS = ("mnist", "cifar")  # GZIP rows only where the issue asks for them
TORCH_WORKERS = 2


def workloads() -> dict[str, Callable[[], tf.data.Dataset]]:
    rng = np.random.default_rng(0)

    def mnist() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(
            {
                "image": rng.integers(0, 256, (60_000, 28, 28), dtype=np.uint8),
                "label": rng.integers(0, 10, 60_000),
            }
        )

    def cifar() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(
            {
                "image": rng.random((10_000, 32, 32, 3), dtype=np.float32),
                "label": rng.integers(0, 10, 10_000).astype(np.int32),
            }
        )

    def tabular() -> tf.data.Dataset:
        n = 100_000
        ids = np.array([f"id-{i:08d}".encode() for i in range(n)], dtype=object)
        return tf.data.Dataset.from_tensor_slices(
            {
                "x": rng.standard_normal((n, 16)).astype(np.float32),
                "y": rng.integers(0, 1000, n),
                "id": ids,
            }
        )

    def ragged() -> tf.data.Dataset:
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


def consume(batches: Iterable[Any]) -> int:
    n = 0
    for _ in batches:
        n += 1
    return n


def load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


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
            flat = dict(el)
            if hasattr(flat.get("tokens"), "flat_values"):
                flat["tokens"] = flat["tokens"].flat_values
            ex = tf.train.Example(
                features=tf.train.Features(feature={k: feature(v) for k, v in flat.items()})
            )
            w.write(ex.SerializeToString())


def torch_batches(path: str) -> Iterable[Any]:
    """``DataLoader(TorchDataset(path, batch_size=1024), batch_size=None, num_workers=2)``.

    Batched mode: each worker decodes whole batches of its share at once.
    A whole epoch, worker start-up included.
    """
    from torch.utils.data import DataLoader

    from superserial.torch import TorchDataset

    return DataLoader(
        TorchDataset(path, batch_size=BATCH),
        batch_size=None,
        num_workers=TORCH_WORKERS,
        # The workers never touch TensorFlow: a fork is safe and starts fast.
        multiprocessing_context="fork",
    )


# The hand-written tf.data pipeline a user would write instead of ``load``:
# per workload, the feature spec and the decode back to the saved dtypes and
# shapes (decode_raw + reshape, casts), written out as a user would, not
# derived from our header. ``check_same`` makes sure it gives load's values.
def _mnist_parse(rec: tf.Tensor) -> dict[str, tf.Tensor]:
    f = tf.io.parse_example(
        rec,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    image = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [-1, 28, 28])
    return {"image": image, "label": f["label"]}


def _cifar_parse(rec: tf.Tensor) -> dict[str, tf.Tensor]:
    f = tf.io.parse_example(
        rec,
        {
            "image": tf.io.FixedLenFeature([32 * 32 * 3], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    return {
        "image": tf.reshape(f["image"], [-1, 32, 32, 3]),
        "label": tf.cast(f["label"], tf.int32),
    }


def _tabular_parse(rec: tf.Tensor) -> dict[str, tf.Tensor]:
    return tf.io.parse_example(
        rec,
        {
            "id": tf.io.FixedLenFeature([], tf.string),
            "x": tf.io.FixedLenFeature([16], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64),
        },
    )


def _ragged_parse(rec: tf.Tensor) -> dict[str, Any]:
    f = tf.io.parse_example(
        rec,
        {
            "tokens": tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    return {"tokens": tf.cast(f["tokens"], tf.int32), "label": f["label"]}


HAND_PARSE: dict[str, Callable[[tf.Tensor], Any]] = {
    "mnist": _mnist_parse,
    "cifar": _cifar_parse,
    "tabular": _tabular_parse,
    "ragged": _ragged_parse,
}


def hand_load(path: str, workload: str) -> tf.data.Dataset:
    """``TFRecordDataset(files).batch(B).map(parse, AUTOTUNE).prefetch(AUTOTUNE)``."""
    files = [f"{path}/{s.file}" for s in superserial.read_header(path).shards]
    return (
        tf.data.TFRecordDataset(files, buffer_size=1 << 20)
        .batch(BATCH)
        .map(HAND_PARSE[workload], num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def check_same(a: tf.data.Dataset, b: tf.data.Dataset, what: str) -> None:
    """The first batches of ``a`` and ``b`` hold the same values, dtypes and shapes."""
    xa, xb = next(iter(a)), next(iter(b))
    fa = tf.nest.flatten(xa, expand_composites=True)
    fb = tf.nest.flatten(xb, expand_composites=True)
    if tf.nest.map_structure(lambda s: s.dtype, a.element_spec) != tf.nest.map_structure(
        lambda s: s.dtype, b.element_spec
    ) or len(fa) != len(fb):
        raise SystemExit(
            f"{what}: expected the same structure, got {a.element_spec} and {b.element_spec}"
        )
    for x, y in zip(fa, fb, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x.numpy(), y.numpy()):
            raise SystemExit(f"{what}: expected the same first batch, got a difference")


def systems(root: str, workload: str, gzip: bool) -> list[dict[str, Any]]:
    """The systems timed, by name: how each saves (or None) and loads (or None)."""

    def ss_save(ds: tf.data.Dataset, p: str, **kw: Any) -> None:
        superserial.save(ds, p, progress=False, **kw)

    out: list[dict[str, Any]] = [
        {
            "name": "superserial load(p, batch_size=1024)",
            "key": "ss",
            "path": f"{root}/ss",
            "save": lambda ds, p: ss_save(ds, p),
            "load": lambda p: superserial.load(p, batch_size=BATCH),
        },
        {
            "name": "hand-written tf.data: TFRecordDataset.batch(1024).map(parse_example + decode)",
            "key": "hand",
            "path": f"{root}/ss",  # superserial's own files, parsed by hand
            "save": None,
            "load": lambda p: hand_load(p, workload),
        },
        {
            "name": "superserial load(p).batch(1024)",
            "key": "ss_rebatch",
            "path": f"{root}/ss",
            "save": None,
            # .batch, as the Dataset.load row: ragged leaves batch into ragged tensors.
            "load": lambda p: superserial.load(p).batch(BATCH),
        },
        {
            "name": "Dataset.save / Dataset.load(p).batch(1024)",
            "key": "tf",
            "path": f"{root}/tfsave",
            "save": lambda ds, p: ds.save(p),
            "load": lambda p: tf.data.Dataset.load(p).batch(BATCH),
        },
        {
            "name": "raw TFRecordDataset(files).batch(1024) (floor)",
            "key": "floor",
            "path": f"{root}/ss",  # superserial's own files, read without parsing
            "save": None,
            "load": lambda p: tf.data.TFRecordDataset(
                [f"{p}/{s.file}" for s in superserial.read_header(p).shards],
                buffer_size=1 << 20,
            ).batch(BATCH),
        },
        {
            "name": "superserial.numpy.iter_batches(p, 1024) (no TF)",
            "key": "numpy",
            "path": f"{root}/ss",
            "save": None,
            "load": lambda p: superserial_numpy.iter_batches(p, BATCH),
        },
        {
            "name": f"DataLoader(TorchDataset(p, batch_size=1024), {TORCH_WORKERS} workers)",
            "key": "torch",
            "path": f"{root}/ss",
            "save": None,
            "load": torch_batches,
        },
        {
            "name": f"per-element Python Example (first {PY_SUBSET})",
            "key": "py",
            "path": f"{root}/py.tfrecord",
            "save": lambda ds, p: py_example_save(ds.take(PY_SUBSET), p),
            "load": None,
            "subset": PY_SUBSET,
        },
    ]
    if gzip:
        out += [
            {
                "name": "superserial GZIP",
                "key": "ss_gz",
                "path": f"{root}/ss_gz",
                "save": lambda ds, p: ss_save(ds, p, compression="GZIP"),
                "load": lambda p: superserial.load(p, batch_size=BATCH),
            },
            {
                "name": "Dataset.save GZIP",
                "key": "tf_gz",
                "path": f"{root}/tfsave_gz",
                "save": lambda ds, p: ds.save(p, compression="GZIP"),
                "load": lambda p: tf.data.Dataset.load(p, compression="GZIP").batch(BATCH),
            },
        ]
    return out


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
    name: str, make: Callable[[], tf.data.Dataset], repeats: int, only: set[str] | None = None
) -> list[dict[str, Any]]:
    ds = make()
    n = int(ds.cardinality())
    root = tempfile.mkdtemp(prefix=f"bench-{name}-")
    syss = systems(root, name, name in GZIP_WORKLOADS)
    if only is not None:
        syss = [s for s in syss if s["key"] in only]
    best: dict[str, dict[str, Any]] = {
        s["key"]: {"save_s": None, "load_s": None, "rss_save": 0, "rss_load": 0} for s in syss
    }
    try:
        # Warm-up: one small pass of everything (tracing, caches, worker start-up code).
        warm = ds.take(512)
        for s in syss:
            if s["save"]:
                clear(s["path"])
                s["save"](warm, s["path"])
        for s in syss:
            if s["load"]:
                consume(s["load"](s["path"]))
        for _ in range(repeats):
            for s in syss:  # interleaved: each system once per round
                r = best[s["key"]]
                if s["save"]:
                    clear(s["path"])
                    dt, rss = measure(lambda s=s: s["save"](ds, s["path"]))
                    r["save_s"] = dt if r["save_s"] is None else min(r["save_s"], dt)
                    r["rss_save"] = max(r["rss_save"], rss)
                    r["bytes"] = dir_bytes(s["path"])
            for s in syss:
                r = best[s["key"]]
                if s["load"]:
                    dt, rss = measure(lambda s=s: consume(s["load"](s["path"])))
                    r["load_s"] = dt if r["load_s"] is None else min(r["load_s"], dt)
                    r["rss_load"] = max(r["rss_load"], rss)
        if {"ss", "hand"} <= {s["key"] for s in syss}:
            # Both decode the same files to the same values: the same work is timed.
            path = f"{root}/ss"
            check_same(superserial.load(path, batch_size=BATCH), hand_load(path, name), name)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for s in syss:
        r = best[s["key"]]
        count = min(n, s["subset"]) if "subset" in s else n
        rows.append(
            {
                "workload": name,
                "system": s["name"],
                "key": s["key"],
                "elements": count,
                "save_s": r["save_s"],
                "load_s": r["load_s"],
                "save_per_s": count / r["save_s"] if r["save_s"] else None,
                "load_per_s": count / r["load_s"] if r["load_s"] else None,
                "mb": r["bytes"] / 1e6 if "bytes" in r else None,
                "rss_mb": max(r["rss_save"], r["rss_load"]) / 1e6,
            }
        )
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The ratio columns of one workload (higher is better for superserial in each)."""
    by = {r["key"]: r for r in rows}

    def ratio(a: str, b: str, kind: str) -> float | None:
        """Elements/s of system ``b`` over those of ``a`` (``kind``: save or load)."""
        ra, rb = by.get(a, {}).get(f"{kind}_per_s"), by.get(b, {}).get(f"{kind}_per_s")
        return rb / ra if ra and rb else None

    return {
        "save_x": ratio("tf", "ss", "save"),
        "hand_x": ratio("hand", "ss", "load"),
        "rebatch_x": ratio("tf", "ss_rebatch", "load"),
        "batch_size_x": ratio("tf", "ss", "load"),
        "floor_share": ratio("floor", "ss", "load"),
        "numpy_x": ratio("ss", "numpy", "load"),
        "torch_x": ratio("ss", "torch", "load"),
        "gzip_save_x": ratio("tf_gz", "ss_gz", "save"),
        "size_x": (ss_mb / tf_mb)
        if (ss_mb := by.get("ss", {}).get("mb")) and (tf_mb := by.get("tf", {}).get("mb"))
        else None,
    }


# ------------------------------------------------------- the first call

FIRST_CALL = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import superserial
system, phase, path = sys.argv[1], sys.argv[2], sys.argv[3]
if phase == "save":
    from sklearn.datasets import load_digits
    d = load_digits()
    ds = tf.data.Dataset.from_tensor_slices(
        {"image": d.images.astype(np.float64), "label": d.target.astype(np.int64)}
    )
    t0 = time.perf_counter()
    if system == "superserial":
        superserial.save(ds, path, progress=False)
    else:
        ds.save(path)
else:
    t0 = time.perf_counter()
    ds = superserial.load(path) if system == "superserial" else tf.data.Dataset.load(path)
    n = 0
    for _ in ds:
        n += 1
    if n != 1797:
        raise SystemExit(f"expected 1797 elements, got {n}")
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def first_call(repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds of each first call, each in a fresh subprocess."""
    root = tempfile.mkdtemp(prefix="bench-first-call-")
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    best: dict[str, float] = {}

    def child(system: str, phase: str, path: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", FIRST_CALL, system, phase, path],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return float(json.loads(out.strip().splitlines()[-1])["seconds"])

    try:
        for _ in range(repeats):
            for system in ("superserial", "Dataset"):
                path = os.path.join(root, system)
                clear(path)
                for phase in ("save", "load"):
                    dt = child(system, phase, path)
                    key = f"{system} {phase}"
                    best[key] = min(best.get(key, dt), dt)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return best


# ------------------------------------------------------------- output


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


RATIO_COLUMNS = [
    ("save_x", "save vs `Dataset.save`", "x"),
    ("hand_x", "`load(p, batch_size=1024)` vs hand-written tf.data", "x"),
    ("rebatch_x", "`load(p).batch(1024)` vs `Dataset.load`", "x"),
    ("batch_size_x", "`load(p, batch_size=1024)` vs `Dataset.load`", "x"),
    ("floor_share", "share of the floor", ""),
    ("numpy_x", "`superserial.numpy.iter_batches` vs batched TF load", ""),
    ("torch_x", "`TorchDataset(p, batch_size=1024)`, 2 workers, vs batched TF load", ""),
    ("gzip_save_x", "GZIP save vs `Dataset.save` GZIP", "x"),
]


def ratio_table(per_workload: dict[str, dict[str, float | None]]) -> list[str]:
    lines = [
        "| workload | " + " | ".join(title for _, title, _ in RATIO_COLUMNS) + " |",
        "|---|" + "---:|" * len(RATIO_COLUMNS),
    ]
    for w, r in per_workload.items():
        cells = [
            fmt(r[k], ".2f") + (unit if r[k] is not None else "") for k, _, unit in RATIO_COLUMNS
        ]
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return lines


def detail_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| workload | system | save el/s | load el/s | MB | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['system']} | {fmt(r['save_per_s'], ',.0f')} | "
            f"{fmt(r['load_per_s'], ',.0f')} | {fmt(r['mb'], '.1f')} | {r['rss_mb']:,.0f} |"
        )
    return lines


def first_call_table(fc: dict[str, float]) -> list[str]:
    lines = [
        "| first call in a process (digits, TF import excluded) | superserial s | Dataset s |",
        "|---|---:|---:|",
    ]
    for phase, title in (("save", "save"), ("load", "load + iterate")):
        lines.append(
            f"| {title} | {fc[f'superserial {phase}']:.3f} | {fc[f'Dataset {phase}']:.3f} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("workloads", nargs="*", default=list(workloads()))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--only",
        help="comma-separated system keys to time (ss, hand, ss_rebatch, tf, floor, numpy, "
        "torch, py, ss_gz, tf_gz); ss saves the files the readers share",
    )
    ap.add_argument(
        "--no-first-call", action="store_true", help="skip the fresh-process digits runs"
    )
    ap.add_argument(
        "--peers",
        metavar="PYTHON",
        help="also the peer rows (benchmarks/peers.py), Lance, mosaic and litdata run by "
        "PYTHON (the venv of `make bench-remote-peers`)",
    )
    args = ap.parse_args()
    all_rows: list[dict[str, Any]] = []
    per_workload: dict[str, dict[str, float | None]] = {}
    print(f"machine: {machine()}", flush=True)
    print(f"load average at start: {load_avg()}", flush=True)
    t0 = time.perf_counter()
    for w in args.workloads:
        only = None if args.only is None else set(args.only.split(",")) | {"ss"}
        rows = run_workload(w, workloads()[w], args.repeats, only)
        all_rows += rows
        per_workload[w] = ratios(rows)
        print(f"{w} done ({time.perf_counter() - t0:.0f} s, load average {load_avg()})", flush=True)
    fc = {} if args.no_first_call else first_call(args.repeats)
    peer_rows: dict[str, dict[str, Any]] = {}
    if args.peers:
        import peers  # benchmarks/peers.py, beside this script

        peer_rows = peers.run(args.peers, repeats=args.repeats)
    print(f"load average at end: {load_avg()}; {time.perf_counter() - t0:.0f} s\n")
    print("\n".join(ratio_table(per_workload)) + "\n")
    print("\n".join(detail_table(all_rows)) + "\n")
    if fc:
        print("\n".join(first_call_table(fc)) + "\n")
    if peer_rows:
        print("peers on local files, mnist-shaped (benchmarks/peers.py):")
        print("\n".join(peers.table(peer_rows)))
    out = os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(
            {
                "machine": machine(),
                "argv": sys.argv,
                "ratios": per_workload,
                "rows": all_rows,
                "first_call": fc,
                "peers": peer_rows,
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()

"""Compressed datasets (issue 24): size, random reads, shuffle and save, side by side in one run.

Workload: sklearn's digits tiled to --n elements (60,000; see
``compressed_spacing.py``), saved with ``superserial.save`` uncompressed and
with ``compression="GZIP"``; the uncompressed shards' records are the "same
records" every other format is written from, shard for shard:

* **Size**: superserial's GZIP shard files against TensorFlow's own
  ``tf.io.TFRecordWriter(path, options="GZIP")`` and ArrayRecord (zstd, its
  default level 3, ``group_size`` 1 and 64) over the same records; index and
  header files counted apart.
* **Random reads**, warm (files in the page cache, readers open): single reads,
  median and p90 over the same random indices, of superserial decoded elements
  (``ds[i]``) and raw records (``ds.records.read(i)``), and of ArrayRecord raw
  records (``ArrayRecordDataSource[i]``); random batches of 256 (the same ones
  for all): superserial ``get_batch`` elements/s, ArrayRecord ``__getitems__``
  records/s; and the sequential pass each is held to: superserial numpy
  ``batches(256)``, ArrayRecord ``__getitems__`` of consecutive ranges of 256.
  The uncompressed superserial dataset has rows of its own, as context.
* **Shuffle**: ``superserial.load(p, shuffle=True, batch_size=1024)`` against
  ``load(p, batch_size=1024)``, on the GZIP dataset (and uncompressed, context),
  a whole epoch each; and the windowed order (``shuffle_window`` = 5% of n), as
  context.
* **Save**: ``superserial.save(ds, p, compression="GZIP")`` against
  ``Dataset.save(p, compression="GZIP")``, el/s.

Each measurement is interleaved with the others, once per repeat, and the best of
--repeats is kept (a shared machine makes single runs noisy). Where superserial
refuses a read on compressed data (``UnsupportedError``, before random access
on compressed shards exists), the row says "refused: ..." with the message and
its target is "refused"; the same script measures the rows once the reads work.
Every superserial read on GZIP is first checked against the uncompressed
dataset, element for element on a sample, and the GZIP shards are checked to
inflate (``gzip.decompress``) to the uncompressed shards' bytes.

Targets (issue 24): GZIP shards within 3% of TF's GZIP; warm ``ds[i]`` median
<= 300 us; random ``get_batch(256)`` >= 0.3x sequential ``batches(256)``;
shuffled load >= 0.5x the sequential GZIP load; GZIP save >= 1.3x
``Dataset.save`` GZIP.

    PYTHONPATH=src .venv/bin/python benchmarks/compressed.py
    PYTHONPATH=src .venv/bin/python benchmarks/compressed.py --quick

Prints markdown tables and writes benchmarks/out/compressed.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from array_record.python.array_record_data_source import ArrayRecordDataSource

import superserial
import superserial.numpy as ssnp
from bench import fmt, machine
from compressed_spacing import digits, latencies_us, seconds
from random_access import write_array_record
from superserial.errors import UnsupportedError

# ArrayRecordDataSource logs an error for group_size > 1 (Grain wants 1): measured on purpose.
logging.getLogger("absl").setLevel(logging.CRITICAL)

BATCH = 256
LOAD_BATCH = 1024
ARRAY_RECORD = {"ArrayRecord zstd group_size:1": "group_size:1,zstd:3",
                "ArrayRecord zstd group_size:64": "group_size:64,zstd:3"}  # fmt: skip
TARGET_SIZE_X = 1.03
TARGET_MEDIAN_US = 300.0
TARGET_RANDOM_X = 0.3
TARGET_SHUFFLE_X = 0.5
TARGET_SAVE_X = 1.3


def refusal(e: UnsupportedError) -> str:
    """The message's first clause, where the temporary directory is no news."""
    first = str(e).split(";")[0].split(" at /")[0]
    return f"refused: {first}"


# ------------------------------------------------------------ data


def shard_files(path: str) -> list[str]:
    return [os.path.join(path, s.file) for s in superserial.read_header(path).shards]


def other_files(path: str) -> list[str]:
    shards = set(shard_files(path))
    return [
        os.path.join(d, f)
        for d, _, fs in os.walk(path)
        for f in fs
        if os.path.join(d, f) not in shards
    ]


def total(paths: list[str]) -> int:
    return sum(map(os.path.getsize, paths))


def write_tf_gzip(plain: str, out: str) -> list[str]:
    """TensorFlow's own GZIP TFRecord file of each uncompressed shard's records."""
    os.makedirs(out)
    paths = []
    for k, shard in enumerate(shard_files(plain)):
        path = os.path.join(out, f"tf-{k:05d}.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for record in ssnp.read_records(shard):
                w.write(record)
        paths.append(path)
    return paths


def check_gzip_bytes(plain: str, gz: str) -> None:
    """The GZIP shards inflate to the uncompressed shards, byte for byte."""
    for a, b in zip(shard_files(plain), shard_files(gz), strict=True):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            if fa.read() != gzip.decompress(fb.read()):
                raise RuntimeError(f"{b} does not inflate to {a}")


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


# ------------------------------------------------------------ timing


def count(batches: Iterator[Any]) -> int:
    n = 0
    for b in batches:
        while isinstance(b, dict):
            b = next(iter(b.values()))
        n += len(b)
    return n


class Best:
    """Per row, the best of the repeats: the lowest latency, the highest rate; or a refusal."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def add(self, row: str, **stats: float) -> None:
        r = self.rows.setdefault(row, {})
        for k, v in stats.items():
            keep = max if k.endswith("per_s") else min
            r[k] = keep(r.get(k, v), v)

    def refuse(self, row: str, why: str) -> None:
        self.rows[row] = {"refused": why}

    def get(self, row: str, stat: str) -> float | None:
        v = self.rows.get(row, {}).get(stat)
        return None if v is None else float(v)

    def refused(self, row: str) -> str | None:
        why: str | None = self.rows.get(row, {}).get("refused")
        return why


def attempt(best: Best, row: str, fn: Callable[[], dict[str, float]]) -> None:
    """Runs one measurement into ``row``; an UnsupportedError makes the row a refusal."""
    if best.refused(row):
        return
    try:
        best.add(row, **fn())
    except UnsupportedError as e:
        best.refuse(row, refusal(e))


# ------------------------------------------------------------ the run


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="bench-compressed-", dir=args.dir)
    try:
        return measure(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(root: str, args: argparse.Namespace) -> dict[str, Any]:
    ds = digits(args.n)
    plain, gz = os.path.join(root, "plain"), os.path.join(root, "gz")
    best = Best()
    save_rows = {
        "superserial save GZIP": lambda p: superserial.save(
            ds, p, compression="GZIP", num_shards=args.num_shards, progress=False
        ),
        "Dataset.save GZIP": lambda p: ds.save(p, compression="GZIP"),
    }
    for rep in range(args.repeats):
        print(f"  save: repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
        for k, (row, save) in enumerate(save_rows.items()):
            p = os.path.join(root, f"save-{k}")
            s = seconds(lambda save=save, p=p: save(p))
            best.add(row, per_s=args.n / s)
            shutil.rmtree(p)
    superserial.save(ds, plain, num_shards=args.num_shards, progress=False)
    superserial.save(ds, gz, compression="GZIP", num_shards=args.num_shards, progress=False)
    check_gzip_bytes(plain, gz)

    sizes = {
        "superserial GZIP": (total(shard_files(gz)), total(other_files(gz))),
        "TF GZIP TFRecordWriter": (total(write_tf_gzip(plain, os.path.join(root, "tf"))), 0),
        "superserial uncompressed": (total(shard_files(plain)), total(other_files(plain))),
    }
    ar_files = {}
    for name, options in ARRAY_RECORD.items():
        files = write_array_record(plain, os.path.join(root, name.rsplit(":", 1)[1]), options)
        ar_files[name] = files
        sizes[name] = (total(files), 0)

    n = len(ssnp.load(plain))
    rng = np.random.default_rng(1)
    singles = rng.integers(0, n, args.reads).tolist()
    order = rng.permutation(n)
    batches = [order[a : a + BATCH] for a in range(0, n - BATCH + 1, BATCH)][: args.batches]
    sequential = [list(range(a, min(a + BATCH, n))) for a in range(0, n, BATCH)]
    reference = ssnp.load(plain)

    def checked(path: str) -> ssnp.NumpyDataset:
        """The numpy dataset at ``path``, its random reads checked against the uncompressed one."""
        d = ssnp.load(path)
        for i in [singles[0], -1, 0]:
            if not same(d[i], reference[i]):
                raise RuntimeError(f"{path}: ds[{i}] differs from the uncompressed dataset")
        if not same(d.get_batch(batches[0]), reference.get_batch(batches[0])):
            raise RuntimeError(f"{path}: get_batch differs from the uncompressed dataset")
        return d

    def superserial_rows(label: str, path: str) -> None:
        # A fresh reader per row, checked first (which also opens its index, untimed).
        attempt(
            best,
            f"{label} ds[i]",
            lambda: stats_us(latencies_us(checked(path).__getitem__, singles)),
        )
        attempt(
            best,
            f"{label} records.read(i)",
            lambda: stats_us(latencies_us(checked(path).records.read, singles)),
        )
        attempt(
            best, f"{label} get_batch({BATCH})", lambda: per_s(checked(path).get_batch, batches)
        )
        attempt(best, f"{label} sequential batches({BATCH})",
                lambda: {"per_s": n / seconds(lambda: count(ssnp.load(path).batches(BATCH)))})  # fmt: skip

    def array_record_rows(name: str) -> None:
        src = ArrayRecordDataSource(ar_files[name])
        try:
            if src[singles[0]] != reference.records.read(singles[0])[0]:
                raise RuntimeError(f"{name}: record {singles[0]} differs")
            best.add(f"{name} ds[i]", **stats_us(latencies_us(src.__getitem__, singles)))
            lists = [b.tolist() for b in batches]
            best.add(f"{name} __getitems__({BATCH})", **per_s(src.__getitems__, lists))
            best.add(
                f"{name} sequential __getitems__({BATCH})", **per_s(src.__getitems__, sequential)
            )
        finally:
            src.__exit__(None, None, None)

    def load_rows(label: str, path: str) -> None:
        def epoch(shuffle: bool, window: int | None = None) -> dict[str, float]:
            d = superserial.load(
                path, shuffle=shuffle, shuffle_window=window, batch_size=LOAD_BATCH
            )
            got = 0
            t0 = time.perf_counter()
            for b in d:
                got += int(b["label"].shape[0])
            dt = time.perf_counter() - t0
            if got != n:
                raise RuntimeError(f"expected {n} elements, got {got}")
            return {"per_s": n / dt}

        attempt(best, f"{label} load(shuffle=True, batch_size={LOAD_BATCH})", lambda: epoch(True))
        # The windowed order (W = 5% of n) reads whole groups of restart blocks: context.
        w = max(1, n // 20)
        attempt(
            best,
            f"{label} load(shuffle=True, shuffle_window={w}, batch_size={LOAD_BATCH})",
            lambda: epoch(True, w),
        )
        attempt(best, f"{label} load(batch_size={LOAD_BATCH})", lambda: epoch(False))

    for rep in range(args.repeats):
        print(f"  reads: repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
        superserial_rows("superserial GZIP", gz)
        for name in ARRAY_RECORD:
            array_record_rows(name)
        superserial_rows("superserial uncompressed", plain)
        if not args.no_load:
            load_rows("superserial GZIP", gz)
            load_rows("superserial uncompressed", plain)
    return {
        "elements": n,
        "shards": len(shard_files(gz)),
        "sizes": sizes,
        "best": best.rows,
        "_best": best,
    }


def stats_us(us: np.ndarray) -> dict[str, float]:
    return {"median_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90))}


def per_s(call: Callable[[Any], Any], batches: list[Any]) -> dict[str, float]:
    t0 = time.perf_counter()
    got = 0
    for b in batches:
        call(b)
        got += len(b)
    return {"per_s": got / (time.perf_counter() - t0)}


# ------------------------------------------------------------ report


def targets(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for each target of the issue."""
    best: Best = res["_best"]
    out: list[tuple[str, str, str]] = []

    def verdict(ok: bool | None, *rows: str) -> str:
        for row in rows:
            if best.refused(row):
                return "refused"
        return "-" if ok is None else ("PASS" if ok else "MISS")

    gz, tfz = res["sizes"]["superserial GZIP"][0], res["sizes"]["TF GZIP TFRecordWriter"][0]
    out.append((f"GZIP shards <= {TARGET_SIZE_X:.2f}x TF's GZIP TFRecordWriter",
                f"{gz / tfz:.3f}x", verdict(gz / tfz <= TARGET_SIZE_X)))  # fmt: skip
    row = "superserial GZIP ds[i]"
    med = best.get(row, "median_us")
    out.append((f"warm ds[i] median <= {TARGET_MEDIAN_US:.0f} us", f"{fmt(med, ',.1f')} us",
                verdict(None if med is None else med <= TARGET_MEDIAN_US, row)))  # fmt: skip

    def ratio(a: str, b: str, target: float, what: str) -> None:
        x, y = best.get(a, "per_s"), best.get(b, "per_s")
        r = x / y if x is not None and y else None
        out.append((what, f"{fmt(r, '.2f')}x", verdict(None if r is None else r >= target, a, b)))

    ratio(f"superserial GZIP get_batch({BATCH})", f"superserial GZIP sequential batches({BATCH})",
          TARGET_RANDOM_X, f"random get_batch({BATCH}) >= {TARGET_RANDOM_X}x sequential batches({BATCH}), GZIP")  # fmt: skip
    ratio(f"superserial GZIP load(shuffle=True, batch_size={LOAD_BATCH})",
          f"superserial GZIP load(batch_size={LOAD_BATCH})", TARGET_SHUFFLE_X,
          f"load(shuffle=True) >= {TARGET_SHUFFLE_X}x sequential load, GZIP")  # fmt: skip
    ratio("superserial save GZIP", "Dataset.save GZIP", TARGET_SAVE_X,
          f"GZIP save >= {TARGET_SAVE_X}x Dataset.save GZIP")  # fmt: skip
    return out


def side_by_side() -> list[tuple[str, str, str, str]]:
    """(format, its single-read row, random-batch row, sequential row) of the summary table."""
    out = []
    for label in ("superserial GZIP", "superserial uncompressed"):
        out.append((f"{label} (decoded elements)", f"{label} ds[i]",
                    f"{label} get_batch({BATCH})", f"{label} sequential batches({BATCH})"))  # fmt: skip
    for name in ARRAY_RECORD:
        out.append((f"{name} (raw records)", f"{name} ds[i]", f"{name} __getitems__({BATCH})",
                    f"{name} sequential __getitems__({BATCH})"))  # fmt: skip
    return out


def report(res: dict[str, Any]) -> None:
    best: Best = res["_best"]
    plain = res["sizes"]["superserial uncompressed"][0]
    tfz = res["sizes"]["TF GZIP TFRecordWriter"][0]
    print(f"\n{res['elements']:,} digits elements in {res['shards']} shard(s)\n")
    print("### Size\n")
    print("| format | data files MB | vs TF GZIP | vs uncompressed | index and header KB |")
    print("|---|---:|---:|---:|---:|")
    for name, (data, side) in res["sizes"].items():
        print(
            f"| {name} | {data / 1e6:.3f} | {data / tfz:.3f}x | {data / plain:.3f} | {side / 1e3:.1f} |"
        )
    print("\n### Side by side (warm)\n")
    print(
        "| format | size vs TF GZIP | single read median us | random batches of 256, /s | "
        "sequential, /s | random / sequential |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for fmt_name, single, batch, seq in side_by_side():
        size = res["sizes"][fmt_name.split(" (")[0]][0] / tfz
        why = best.refused(single) or best.refused(batch)
        if why:
            print(f"| {fmt_name} | {size:.3f}x | {why} | | | |")
            continue
        r, q = best.get(batch, "per_s"), best.get(seq, "per_s")
        x = r / q if r is not None and q else None
        print(
            f"| {fmt_name} | {size:.3f}x | {fmt(best.get(single, 'median_us'), ',.1f')} | "
            f"{fmt(r, ',.0f')} | {fmt(q, ',.0f')} | {fmt(x, '.3f')} |"
        )
    print("\n### Reads and saves\n")
    print("| row | median us | p90 us | per s |")
    print("|---|---:|---:|---:|")
    for row in best.rows:
        why = best.refused(row)
        if why:
            print(f"| {row} | {why} | | |")
            continue
        cells = [fmt(best.get(row, s), ",.1f") for s in ("median_us", "p90_us")]
        print(f"| {row} | {' | '.join(cells)} | {fmt(best.get(row, 'per_s'), ',.0f')} |")
    print("\n### Targets (issue 24)\n")
    print("| target | measured | result |")
    print("|---|---:|---|")
    for what, got, ok in targets(res):
        print(f"| {what} | {got} | {ok} |")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=60_000, help="elements (digits tiled)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reads", type=int, default=5_000, help="random single reads")
    ap.add_argument("--batches", type=int, default=100, help="random batches of 256, at most")
    ap.add_argument("--num-shards", type=int, default=None, help="default: superserial's")
    ap.add_argument("--no-load", action="store_true", help="skip the tf.data load rows")
    ap.add_argument("--dir", default=None, help="where the datasets go (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="a tiny run, to check the script")
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeats, args.reads, args.batches = 3_000, 1, 200, 3
    print(f"machine: {machine()}", flush=True)
    res = run(args)
    report(res)
    out = os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "compressed.json"), "w") as f:
        rows = {k: v for k, v in res.items() if k != "_best"}
        json.dump({"machine": machine(), "argv": sys.argv, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()

"""Random access: superserial's record index side by side with ArrayRecord.

One run, both formats, the same records: each workload (mnist, tabular, as in
bench.py) is saved with superserial, and the very same serialized
``tf.train.Example`` records are written with ``array_record``'s writer
(``group_size:1``, what TFDS writes for random access and what
``ArrayRecordDataSource`` expects) to as many shards. Then, from a warm page
cache and from cold files:

* single random reads, median and p99 latency over the same random indices:
  superserial raw records (``ds.records.read(i)``), ArrayRecord raw records
  (``ArrayRecordDataSource[i]``), superserial decoded elements (``ds[i]``);
* random batches of 256 (the same batches for all): records/s of
  ``ds.records.read_many`` and ``ArrayRecordDataSource.__getitems__``,
  elements/s of ``ds.get_batch``; and sequential ``iter_batches(path, 256)``;
* ``DataLoader(MapDataset, shuffle=True, batch_size=256, num_workers=2)``
  elements/s next to the sequential ``TorchDataset`` with the same settings
  (whole epochs, worker start-up included).

Cold: before each timed read or batch (each whole pass for sequential reads
and DataLoader epochs) every file of the format measured is dropped from the
page cache with ``posix_fadvise(DONTNEED)``; the readers stay open with their
indexes in memory, so a cold read is the record's own I/O. Dropping is checked
with ``mincore`` first; where it does not work, cold rows are skipped.

Each measurement is interleaved with the other systems and the best of
``--repeats`` is kept (per statistic). Prints markdown tables with the targets
of issue 11 and writes benchmarks/out/random_access.json.

    PYTHONPATH=src .venv/bin/python benchmarks/random_access.py     # mnist and tabular
    PYTHONPATH=src .venv/bin/python benchmarks/random_access.py mnist --quick
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from array_record.python.array_record_data_source import ArrayRecordDataSource
from array_record.python.array_record_module import ArrayRecordWriter

import superserial
import superserial.numpy as ssnp
from bench import fmt, machine, workloads

BATCH = 256
TARGET_RAW_X = 1.0  # random raw-record throughput / ArrayRecord's
TARGET_MEDIAN_US = 50.0  # median decoded ds[i] from the page cache
TARGET_RANDOM_X = 0.5  # random get_batch / sequential iter_batches

Readers = tuple[ssnp.NumpyDataset, ArrayRecordDataSource]


# ------------------------------------------------------------ page cache


def _drop(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _sync(paths: list[str]) -> None:
    """Writes the files' dirty pages out: DONTNEED drops clean pages only."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _resident(paths: list[str]) -> float | None:
    """The fraction of the files' pages in the page cache (mincore), None if unknown."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 4
        libc.mmap.argtypes.append(ctypes.c_long)
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    pages = cached = 0
    for p in paths:
        size = os.path.getsize(p)
        if not size:
            continue
        n = -(-size // mmap.PAGESIZE)
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = (ctypes.c_ubyte * n)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
                cached += sum(b & 1 for b in vec)
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        pages += n
    return cached / pages if pages else None


def _warm(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def cold_works(paths: list[str]) -> tuple[bool, str]:
    """Whether dropping ``paths`` from the page cache works here, and what was seen."""
    _sync(paths)
    _warm(paths)
    before = _resident(paths)
    _drop(paths)
    after = _resident(paths)
    _warm(paths)
    if before is None or after is None:
        return False, "mincore unavailable: cannot check that files leave the page cache"
    seen = f"resident {before:.0%} -> {after:.0%} after posix_fadvise(DONTNEED)"
    return before > 0.9 and after < 0.05, seen


# ------------------------------------------------------------ data


def files_under(path: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)


def write_array_record(ss_path: str, out: str, options: str) -> list[str]:
    """The records of each superserial shard, in order, as one ArrayRecord file each."""
    os.makedirs(out)
    shards = ssnp.load(ss_path).files
    paths = []
    for k, shard in enumerate(shards):
        path = os.path.join(out, f"data-{k:05d}-of-{len(shards):05d}.array_record")
        writer = ArrayRecordWriter(path, options)
        for record in ssnp.read_records(shard):
            writer.write(record)
        writer.close()
        paths.append(path)
    return paths


def first_len(batch: Any) -> int:
    while isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return len(batch)


# ------------------------------------------------------------ timing


def latencies(
    call: Callable[[int], Any], indices: list[int], drop: Callable[[], None] | None
) -> np.ndarray:
    out = np.empty(len(indices), dtype=np.int64)
    clock = time.perf_counter_ns
    for j, i in enumerate(indices):
        if drop is not None:
            drop()
        t0 = clock()
        call(i)
        out[j] = clock() - t0
    return out


def batch_seconds(
    call: Callable[[Any], Any], batches: list[Any], drop: Callable[[], None] | None
) -> float:
    total = 0
    clock = time.perf_counter_ns
    for b in batches:
        if drop is not None:
            drop()
        t0 = clock()
        call(b)
        total += clock() - t0
    return total / 1e9


def pass_seconds(run: Callable[[], int], expected: int, drop: Callable[[], None] | None) -> float:
    if drop is not None:
        drop()
    t0 = time.perf_counter()
    got = run()
    dt = time.perf_counter() - t0
    if got != expected:
        raise RuntimeError(f"expected {expected} elements, got {got}")
    return dt


class Best:
    """Per-row best of the repeats: the lowest latency, the highest rate."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, float]] = {}

    def add(self, row: str, mode: str, **stats: float) -> None:
        r = self.rows.setdefault((row, mode), {})
        for k, v in stats.items():
            keep = max if k == "per_s" else min
            r[k] = keep(r.get(k, v), v)

    def get(self, row: str, mode: str, stat: str) -> float | None:
        return self.rows.get((row, mode), {}).get(stat)


# ------------------------------------------------------------ systems


def torch_loaders(path: str) -> tuple[dict[str, Callable[[], Iterator[Any]]], str | None]:
    """The DataLoader epochs to time, and a note for the ones skipped."""
    import torch
    from torch.utils.data import DataLoader

    import superserial.torch as sst

    common = {"batch_size": BATCH, "num_workers": 2, "collate_fn": sst.collate}
    loaders: dict[str, Callable[[], Iterator[Any]]] = {
        "DataLoader(TorchDataset), sequential": lambda: iter(
            DataLoader(sst.TorchDataset(path), **common)
        ),
    }
    if not hasattr(sst, "MapDataset"):
        return loaders, "superserial.torch.MapDataset does not exist yet: its row is skipped"
    torch.manual_seed(0)
    loaders["DataLoader(MapDataset, shuffle=True)"] = lambda: iter(
        DataLoader(sst.MapDataset(path), shuffle=True, **common)
    )
    return loaders, None


def run_workload(name: str, args: argparse.Namespace, cold_ok: bool) -> dict[str, Any]:
    ds = workloads()[name]()
    if args.elements:
        ds = ds.take(args.elements)
    root = tempfile.mkdtemp(prefix=f"bench-random-{name}-")
    try:
        ss = os.path.join(root, "ss")
        superserial.save(ds, ss, progress=False, num_shards=args.num_shards)
        ar_files = write_array_record(ss, os.path.join(root, "ar"), args.array_record_options)
        return measure(name, ss, ar_files, args, cold_ok)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(
    name: str, ss: str, ar_files: list[str], args: argparse.Namespace, cold_ok: bool
) -> dict[str, Any]:
    ss_files = files_under(ss)
    _sync(ss_files + ar_files)
    n = len(ssnp.load(ss))
    rng = np.random.default_rng(1)
    singles = (rng.permutation(n) if args.reads <= n else rng.integers(0, n, args.reads))[
        : args.reads
    ].tolist()
    order = rng.permutation(n)
    batches = [order[a : a + BATCH] for a in range(0, n - BATCH + 1, BATCH)][: args.batches]
    batch_lists = [b.tolist() for b in batches]

    def open_both() -> Readers:
        """Fresh readers of both formats, their files opened and indexes read."""
        d, a = ssnp.load(ss), ArrayRecordDataSource(ar_files)
        if d.records.read_many(batches[0])[0] != list(a.__getitems__(batch_lists[0])):
            raise RuntimeError("superserial and ArrayRecord records differ")
        return d, a

    # (name, files dropped for cold, the call from the readers)
    single_rows: list[tuple[str, list[str], Callable[[Readers], Callable[[int], Any]]]] = [
        ("superserial raw record, records.read(i)", ss_files, lambda r: r[0].records.read),
        ("ArrayRecord raw record, ds[i]", ar_files, lambda r: r[1].__getitem__),
        ("superserial decoded element, ds[i]", ss_files, lambda r: r[0].__getitem__),
    ]
    batch_rows: list[tuple[str, list[str], Callable[[Readers], Callable[[Any], Any]], list[Any]]] = [
        ("superserial raw records, records.read_many", ss_files, lambda r: r[0].records.read_many, batches),
        ("ArrayRecord raw records, __getitems__", ar_files, lambda r: r[1].__getitems__, batch_lists),
        ("superserial elements, get_batch", ss_files, lambda r: r[0].get_batch, batches),
    ]  # fmt: skip
    pass_rows: dict[str, tuple[list[str], Callable[[], Iterator[Any]]]] = {
        f"superserial sequential, iter_batches({BATCH})": (
            ss_files,
            lambda: ssnp.iter_batches(ss, BATCH),
        ),
    }
    loaders, note = torch_loaders(ss) if not args.no_torch else ({}, "--no-torch")
    for row, make in loaders.items():
        pass_rows[row] = (ss_files, make)

    best = Best()
    modes = ["warm", "cold"] if cold_ok and not args.no_cold else ["warm"]
    for rep in range(args.repeats):
        print(f"  {name}: repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
        for mode in modes:
            cold = mode == "cold"
            if not cold:
                _warm(ss_files + ar_files)
            readers = open_both()
            for row, files, make in single_rows:
                call = make(readers)
                idx = singles[: args.cold_reads] if cold else singles
                ns = latencies(call, idx, (lambda f=files: _drop(f)) if cold else None)
                best.add(
                    row,
                    mode,
                    median_us=float(np.median(ns)) / 1e3,
                    p99_us=float(np.percentile(ns, 99)) / 1e3,
                )
            for row, files, make, bs in batch_rows:
                call = make(readers)
                bs = bs[: args.cold_batches] if cold else bs
                s = batch_seconds(call, bs, (lambda f=files: _drop(f)) if cold else None)
                best.add(row, mode, per_s=len(bs) * BATCH / s)
            readers[0].records.close()
            readers[1].__exit__(None, None, None)
            for row, (files, make) in pass_rows.items():

                def run(make: Callable[[], Iterator[Any]] = make) -> int:
                    return sum(first_len(b) for b in make())

                s = pass_seconds(run, n, (lambda f=files: _drop(f)) if cold else None)
                best.add(row, mode, per_s=n / s)
    return {
        "workload": name,
        "elements": n,
        "shards": len(ar_files),
        "mb": {
            "superserial": sum(map(os.path.getsize, ss_files)) / 1e6,
            "ArrayRecord": sum(map(os.path.getsize, ar_files)) / 1e6,
        },
        "single": [r[0] for r in single_rows],
        "batch": [r[0] for r in batch_rows],
        "passes": list(pass_rows),
        "note": note,
        "best": {f"{row}|{mode}": stats for (row, mode), stats in best.rows.items()},
        "_best": best,
    }


# ------------------------------------------------------------ report


def targets(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    best: Best = res["_best"]
    raw_ss, raw_ar, get_batch = res["batch"]
    seq = res["passes"][0]
    out: list[tuple[str, str, str, bool | None]] = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    x = ratio(best.get(raw_ss, "warm", "per_s"), best.get(raw_ar, "warm", "per_s"))
    out.append(
        (
            f"random raw records/s >= {TARGET_RAW_X:.1f}x ArrayRecord (warm)",
            f"{fmt(x, '.2f')}x",
            "",
            None if x is None else x >= TARGET_RAW_X,
        )
    )
    med = best.get(res["single"][2], "warm", "median_us")
    out.append(
        (
            f"median decoded ds[i] <= {TARGET_MEDIAN_US:.0f} us (warm)",
            f"{fmt(med, '.1f')} us",
            "",
            None if med is None else med <= TARGET_MEDIAN_US,
        )
    )
    x = ratio(best.get(get_batch, "warm", "per_s"), best.get(seq, "warm", "per_s"))
    xc = ratio(best.get(get_batch, "cold", "per_s"), best.get(seq, "cold", "per_s"))
    out.append(
        (
            f"random get_batch >= {TARGET_RANDOM_X:.1f}x sequential iter_batches (warm)",
            f"{fmt(x, '.2f')}x",
            f"cold {fmt(xc, '.2f')}x",
            None if x is None else x >= TARGET_RANDOM_X,
        )
    )
    return out


def report(results: list[dict[str, Any]]) -> None:
    print("\n### Single random reads (latency, us)\n")
    print("| workload | read | warm median | warm p99 | cold median | cold p99 |")
    print("|---|---|---:|---:|---:|---:|")
    for res in results:
        b: Best = res["_best"]
        for row in res["single"]:
            cells = [
                fmt(b.get(row, m, s), ",.1f")
                for m in ("warm", "cold")
                for s in ("median_us", "p99_us")
            ]
            print(f"| {res['workload']} | {row} | {' | '.join(cells)} |")
    print("\n### Random batches of 256 and whole passes (per second)\n")
    print("| workload | read | warm /s | cold /s |")
    print("|---|---|---:|---:|")
    for res in results:
        b = res["_best"]
        for row in res["batch"] + res["passes"]:
            unit = "records" if "raw" in row else "elements"
            cells = [fmt(b.get(row, m, "per_s"), ",.0f") for m in ("warm", "cold")]
            print(f"| {res['workload']} | {row} ({unit}) | {' | '.join(cells)} |")
    print("\n### Targets (issue 11)\n")
    print("| workload | target | measured | also | result |")
    print("|---|---|---:|---|---|")
    for res in results:
        for what, got, also, ok in targets(res):
            verdict = "-" if ok is None else ("PASS" if ok else "MISS")
            print(f"| {res['workload']} | {what} | {got} | {also} | {verdict} |")
    print()
    for res in results:
        mb = res["mb"]
        print(
            f"{res['workload']}: {res['elements']:,} elements in {res['shards']} shard(s); "
            f"superserial {mb['superserial']:.1f} MB (with indexes), "
            f"ArrayRecord {mb['ArrayRecord']:.1f} MB"
            + (f"; note: {res['note']}" if res["note"] else "")
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("workloads", nargs="*", default=["mnist", "tabular"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reads", type=int, default=20_000, help="single reads (warm)")
    ap.add_argument("--batches", type=int, default=1_000, help="random batches (warm, at most)")
    ap.add_argument("--cold-reads", type=int, default=2_000, help="single reads (cold)")
    ap.add_argument("--cold-batches", type=int, default=20, help="random batches (cold)")
    ap.add_argument("--elements", type=int, default=None, help="first N elements only")
    ap.add_argument("--num-shards", type=int, default=None, help="default: superserial's")
    ap.add_argument("--array-record-options", default="group_size:1")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a tiny run, to check the script")
    args = ap.parse_args()
    if args.quick:
        args.elements, args.repeats = args.elements or 3_000, 1
        args.reads, args.batches, args.cold_reads, args.cold_batches = 500, 5, 100, 2
    print(f"machine: {machine()}", flush=True)

    with tempfile.NamedTemporaryFile(prefix="bench-random-probe-", delete=False) as probe:
        probe.write(os.urandom(8 << 20))
    try:
        cold_ok, seen = cold_works([probe.name])
    finally:
        os.remove(probe.name)
    print(f"cold files: {'yes' if cold_ok else 'NO, cold rows skipped'} ({seen})", flush=True)

    results = [run_workload(w, args, cold_ok) for w in args.workloads]
    report(results)
    out = os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "random_access.json"), "w") as f:
        rows = [{k: v for k, v in r.items() if k != "_best"} for r in results]
        json.dump({"machine": machine(), "argv": sys.argv, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()

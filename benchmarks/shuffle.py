"""Global shuffle in tf.data: throughput, shuffle quality and resume cost, in one run.

1. Throughput, batches of 1,024: ``superserial.load(batch_size=1024)`` (sequential)
   vs ``load(shuffle=True, batch_size=1024)`` (global shuffle, records read by
   offset), and Grain's global shuffle over ArrayRecord (pickled elements,
   ``MapDataset.shuffle``; as written, and with one ArrayRecord read per batch
   of indices) as the anchor. Interleaved, best of --repeats,
   wall time and process CPU time (on a shared machine CPU time is the steadier).
2. Quality: a dataset written in label order (10 labels); the labels of the first
   1,000 elements against a uniform distribution, chi-square at p = 0.01, for our
   shuffle and for ``ds.shuffle(10_000)``, over several seeds.
3. Resume: time from restoring an iterator checkpoint to its first element, at
   the start, middle and end of a dataset of --resume-n tiny elements, and the
   checkpoint's size. Neither may grow with the position.

    .venv/bin/python benchmarks/shuffle.py
    .venv/bin/python benchmarks/shuffle.py --repeats 1 --resume-n 100000

Prints markdown tables and writes benchmarks/out/shuffle.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from scipy.stats import chisquare

import superserial

BATCH = 1024


def mnist(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = 60_000
    return {
        "image": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        "label": rng.integers(0, 10, n),
    }


def tabular(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = 100_000
    return {
        "x": rng.standard_normal((n, 16)).astype(np.float32),
        "y": rng.integers(0, 1000, n),
        "id": np.array([f"id-{i:08d}".encode() for i in range(n)], dtype=object),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall and process CPU seconds of ``fn()``."""
    c0, t0 = os.times(), time.perf_counter()
    fn()
    c1, t1 = os.times(), time.perf_counter()
    return t1 - t0, (c1.user - c0.user) + (c1.system - c0.system)


def consume(ds: Any) -> int:
    n = 0
    for _ in ds:
        n += 1
    return n


def grain_source(columns: dict[str, np.ndarray], path: str) -> Any:
    """An ArrayRecord file of pickled elements, as a Grain data source (None without Grain)."""
    try:
        import grain
        from array_record.python.array_record_module import ArrayRecordWriter
    except ImportError:
        return None
    n = len(next(iter(columns.values())))
    writer = ArrayRecordWriter(path, "group_size:1")
    for i in range(n):
        writer.write(pickle.dumps({k: v[i] for k, v in columns.items()}, protocol=5))
    writer.close()
    return grain.sources.ArrayRecordDataSource([path])


def throughput(root: str, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name, make in (("mnist", mnist), ("tabular", tabular)):
        columns = make(np.random.default_rng(0))
        n = len(next(iter(columns.values())))
        path = os.path.join(root, name)
        superserial.save(tf.data.Dataset.from_tensor_slices(columns), path)
        source = grain_source(columns, os.path.join(root, f"{name}.array_record"))
        systems: dict[str, Callable[[], Any]] = {
            "superserial sequential": lambda p=path: consume(superserial.load(p, batch_size=BATCH)),
            "superserial shuffled": lambda p=path: consume(
                superserial.load(p, shuffle=True, seed=0, batch_size=BATCH)
            ),
        }
        if source is not None:
            import grain

            def grain_shuffled(src: Any = source) -> int:
                ds = grain.MapDataset.source(src).shuffle(seed=0).map(pickle.loads).batch(BATCH)
                return consume(ds)

            def grain_batched_reads(src: Any = source, n: int = n) -> int:
                # The same order, one ArrayRecord read per batch of indices.
                def read(indices: np.ndarray) -> dict[str, np.ndarray]:
                    elements = [pickle.loads(r) for r in src.__getitems__(indices.tolist())]
                    return {k: np.stack([e[k] for e in elements]) for k in elements[0]}

                ds = grain.MapDataset.range(n).shuffle(seed=0).batch(BATCH).map(read)
                return consume(ds)

            systems["grain ArrayRecord shuffled"] = grain_shuffled
            systems["grain ArrayRecord shuffled, batched reads"] = grain_batched_reads
        for fn in systems.values():
            fn()  # warm-up: traces, page cache
        best: dict[str, tuple[float, float]] = {}
        for _ in range(repeats):
            for label, fn in systems.items():
                wall, cpu = timed(fn)
                if label not in best or wall < best[label][0]:
                    best[label] = (wall, cpu)
        base = best["superserial sequential"][0]
        for label, (wall, cpu) in best.items():
            rows.append(
                {
                    "workload": name,
                    "system": label,
                    "elements_per_s": n / wall,
                    "vs_sequential": base / wall,
                    "wall_s": wall,
                    "cpu_s": cpu,
                }
            )
    return rows


def quality(root: str, seeds: int) -> list[dict[str, Any]]:
    labels = np.repeat(np.arange(10), 6_000)  # written in label order
    path = os.path.join(root, "sorted")
    superserial.save(tf.data.Dataset.from_tensor_slices({"label": labels}), path)
    rows = []
    methods: dict[str, Callable[[int], tf.data.Dataset]] = {
        "superserial global shuffle": lambda s: superserial.load(path, shuffle=True, seed=s),
        "ds.shuffle(10_000)": lambda s: superserial.load(path).shuffle(10_000, seed=s),
    }
    for name, make in methods.items():
        for seed in range(seeds):
            first = np.array([int(e["label"]) for e in make(seed).take(1000)])
            counts = np.bincount(first, minlength=10)
            p = float(chisquare(counts).pvalue)
            rows.append(
                {"method": name, "seed": seed, "p": p, "passes": p >= 0.01, "counts": counts}
            )
    return rows


@tf.function
def _advance(iterator: Any, steps: tf.Tensor) -> None:
    """Consumes ``steps`` elements inside the graph (no Python per element)."""
    for _ in tf.range(steps):
        iterator.get_next()


def resume(root: str, n: int, repeats: int) -> list[dict[str, Any]]:
    path = os.path.join(root, "tiny")
    superserial.save(tf.data.Dataset.range(n).map(lambda i: {"i": i}), path, num_shards=4)

    def make() -> tf.data.Dataset:
        return superserial.load(path, shuffle=True, seed=0)

    rows = []
    for position in (0, n // 2, n - 1):
        it = iter(make())
        _advance(it, tf.constant(position, tf.int64))
        ckpt_dir = tempfile.mkdtemp(dir=root)
        prefix = tf.train.Checkpoint(iterator=it).save(os.path.join(ckpt_dir, "ckpt"))
        size = sum(os.path.getsize(f) for f in glob.glob(prefix + "*"))
        want = int(next(it)["i"])
        best = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            ds = make()
            t1 = time.perf_counter()
            it2 = iter(ds)
            tf.train.Checkpoint(iterator=it2).restore(prefix).assert_consumed()
            got = int(next(it2)["i"])
            t2 = time.perf_counter()
            if got != want:
                raise AssertionError(f"resumed at {got}, expected {want}")
            if best is None or t2 - t1 < best[1]:
                best = (t1 - t0, t2 - t1)
        assert best is not None
        rows.append(
            {
                "position": position,
                "checkpoint_bytes": size,
                "load_s": best[0],
                "restore_s": best[1],
            }
        )
        shutil.rmtree(ckpt_dir)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--resume-n", type=int, default=1_000_000)
    parser.add_argument("--only", choices=["throughput", "quality", "resume"])
    args = parser.parse_args()
    out: dict[str, Any] = {"cpus": os.cpu_count(), "tensorflow": tf.__version__}
    root = tempfile.mkdtemp(prefix="superserial-shuffle-")
    try:
        if args.only in (None, "throughput"):
            out["throughput"] = rows = throughput(root, args.repeats)
            print("\n| workload | system | elements/s | vs sequential | wall s | CPU s |")
            print("|---|---|---:|---:|---:|---:|")
            for r in rows:
                print(
                    f"| {r['workload']} | {r['system']} | {r['elements_per_s']:,.0f} | "
                    f"{r['vs_sequential']:.2f}x | {r['wall_s']:.3f} | {r['cpu_s']:.2f} |"
                )
        if args.only in (None, "quality"):
            out["quality"] = rows = quality(root, args.seeds)
            print("\n| first 1,000 of a label-sorted set | seed | chi-square p | p >= 0.01 |")
            print("|---|---:|---:|---|")
            for r in rows:
                print(f"| {r['method']} | {r['seed']} | {r['p']:.3g} | {r['passes']} |")
            for r in rows:
                r["counts"] = r["counts"].tolist()
        if args.only in (None, "resume"):
            out["resume"] = rows = resume(root, args.resume_n, args.repeats)
            print(f"\n| resume, {args.resume_n:,} elements | checkpoint | load | restore + first |")
            print("|---|---:|---:|---:|")
            for r in rows:
                print(
                    f"| position {r['position']:,} | {r['checkpoint_bytes']:,} B | "
                    f"{r['load_s'] * 1e3:.1f} ms | {r['restore_s'] * 1e3:.1f} ms |"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(os.path.dirname(__file__), "out"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "out", "shuffle.json"), "w") as f:
        json.dump(out, f, indent=1, default=float)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

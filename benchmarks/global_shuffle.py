"""Global shuffle (issue 12): throughput, shuffle quality and resume cost, side by side.

One run, every reader of the global order next to its anchor:

1. Throughput, batches of 1,024, whole passes, elements/s (best of
   --repeats, interleaved, after a warm-up), on the workloads mnist and
   tabular of bench.py: the sequential ``superserial.load(path,
   batch_size=1024)``; the globally shuffled ``load(path, shuffle=True,
   seed=0, batch_size=1024)``, and the same order and batches read 8,192
   positions at a time (``batch_size=8192`` then ``rebatch(1024)``); the
   anchor, Grain's own global shuffle over ArrayRecord (the very same
   serialized records, written ``group_size:1`` as random_access.py writes
   them): ``MapDataset.source(ArrayRecordDataSource).shuffle(seed=0)
   .batch(1024)``, raw records (``batch_fn=list``: no parsing, no stacking),
   and, since Grain 0.2's ``batch`` reads element by element,
   ``ArrayRecordDataSource.__getitems__`` of the same batches of
   ``permutation`` (raw records, no Grain);
   ``superserial.grain.dataset(path, seed=0).batch(1024,
   batch_fn=source.collate)`` (decoded elements); torchdata's
   ``StatefulDataLoader`` and torch's ``DataLoader`` over ``MapDataset`` with
   ``Sampler(n, seed=0)``, 2 workers, ``collate`` (decoded elements, worker
   start-up included). Grain iterates through ``to_iter_dataset()`` (its
   default read threads); after each pass the script waits for reader threads
   to end.
2. Shuffle quality: a dataset written in label order (10 labels, equal
   counts); the labels of the first 1,000 elements against a uniform
   distribution, chi-square statistic against 21.67 (p = 0.01, 9 degrees of
   freedom), for our order (the shuffled ``load``, ``permutation``, the
   PyTorch ``Sampler``, ``superserial.grain.dataset``: each is also checked
   to be the same order) and for a 10,000-element buffer shuffle
   ``load(path).shuffle(10_000)``, at seed 0 and over --seeds seeds.
3. Resume cost: on a dataset of --resume-n elements of one int64, the time
   from restoring a checkpoint to the first element, with the checkpoint
   taken at position 0 and at the last element (best of the repeats): the
   tf.data iterator (``tf.train.Checkpoint(iterator=it)`` restored into a
   fresh iterator, then ``next``) in batches of 1,024, and unbatched on a
   smaller dataset (--resume-unbatched-n: an unbatched shuffled load takes
   tens of microseconds per element, so skipping to the end of 1M takes
   about a minute); ``StatefulDataLoader.load_state_dict`` + first batch
   (workers started); ``Sampler.load_state_dict`` + first index; Grain
   ``set_state`` + ``next``, with its default read threads (which start up
   to 16 batches at once, so the first waits longer where more are left)
   and with ``ReadOptions(num_threads=0)`` (the restore and one batch). Each
   first element is checked against ``permutation``. The checkpoints are
   taken after really iterating there.

Prints markdown tables with the targets of issue 12 and writes
benchmarks/out/global_shuffle.json.

    PYTHONPATH=src .venv/bin/python benchmarks/global_shuffle.py
    PYTHONPATH=src .venv/bin/python benchmarks/global_shuffle.py --quick
"""

from __future__ import annotations

import argparse
import gc
import glob
import itertools
import json
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grain
import numpy as np
import tensorflow as tf
from array_record.python.array_record_data_source import ArrayRecordDataSource
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import superserial
import superserial.grain as ssg
import superserial.torch as sst
from bench import machine, workloads
from random_access import first_len, write_array_record

BATCH = 1024
WORKERS = 2
TARGET_X = 0.5  # shuffled load / sequential load, elements/s
LABELS = 10
HEAD = 1_000  # the first elements whose labels are counted
BUFFER = 10_000  # the buffer shuffle shown next to ours
CHI2_CRIT = 21.666  # chi-square quantile at p = 0.01 for LABELS - 1 = 9 degrees of freedom
TARGET_RESUME_X = 2.0  # restore at the last element / at position 0, at most (noise allowance)

SEQ = "tf.data load(batch_size=1024), sequential"
SHUF = "tf.data load(shuffle=True, seed=0, batch_size=1024)"
GRAIN_AR = "Grain ArrayRecord .shuffle(seed=0).batch(1024), raw records"
WIDE = 8192  # positions per read in the shuffled load's rebatched row

# Python threads alive before any reader ran: settle() waits for the count to come back.
_BASE_THREADS = threading.active_count()


def close(it: Any) -> None:
    """Stops an iterator's background work now (Grain's read threads prefetch until closed)."""
    closer = getattr(it, "close", None)
    if callable(closer):
        closer()


def settle(timeout: float = 10.0) -> None:
    """Waits for the background threads of closed iterators to end.

    Grain's read threads finish the batches they have begun after ``close``:
    left running, they would slow down whatever is timed next.
    """
    gc.collect()  # a DataLoader's workers exit with their iterator
    deadline = time.monotonic() + timeout
    while threading.active_count() > _BASE_THREADS and time.monotonic() < deadline:
        time.sleep(0.005)


def drain(batches: Iterable[Any], limit: int | None = None, *, settled: bool = True) -> int:
    """The elements in the (first ``limit``) batches of ``batches``; then :func:`settle` unless told not to."""
    it = iter(batches)
    try:
        return sum(first_len(b) for b in itertools.islice(it, limit))
    finally:
        close(it)
        del it
        if settled:
            settle()


def save(ds: tf.data.Dataset, path: str) -> str:
    superserial.save(ds, path, progress=False)
    return path


# ------------------------------------------------------------ 1. throughput


def throughput_systems(ss: str, ar_files: list[str]) -> dict[str, Callable[[], Iterable[Any]]]:
    """One epoch's batches of each system, made afresh per call."""
    source = ssg.DataSource(ss)
    records = ArrayRecordDataSource(ar_files)
    n = len(source)

    def loader(cls: Any) -> Any:
        return cls(
            sst.MapDataset(ss),
            sampler=sst.Sampler(n, seed=0),
            batch_size=BATCH,
            num_workers=WORKERS,
            collate_fn=sst.collate,
        )

    def ar_batched() -> Iterable[list[bytes]]:
        order = superserial.permutation(n, 0)
        return (records.__getitems__(order[a : a + BATCH].tolist()) for a in range(0, n, BATCH))

    return {
        SEQ: lambda: superserial.load(ss, batch_size=BATCH),
        SHUF: lambda: superserial.load(ss, shuffle=True, seed=0, batch_size=BATCH),
        # The same order in the same batches, each read WIDE positions at a time.
        f"tf.data load(shuffle=True, seed=0, batch_size={WIDE}).rebatch(1024)": lambda: (
            superserial.load(ss, shuffle=True, seed=0, batch_size=WIDE).rebatch(BATCH)
        ),
        GRAIN_AR: lambda: (
            grain.MapDataset.source(records)
            .shuffle(seed=0)
            .batch(BATCH, batch_fn=list)
            .to_iter_dataset()
        ),
        # Grain 0.2's MapDataset.batch reads element by element: this is
        # ArrayRecord's batched read, without Grain, for the same anchor.
        "ArrayRecordDataSource.__getitems__(permutation batches), raw records": ar_batched,
        "superserial.grain.dataset(seed=0).batch(1024, collate)": lambda: (
            ssg.dataset(source, seed=0).batch(BATCH, batch_fn=source.collate).to_iter_dataset()
        ),
        f"StatefulDataLoader(MapDataset, Sampler(seed=0), {WORKERS} workers)": lambda: loader(
            StatefulDataLoader
        ),
        f"DataLoader(MapDataset, Sampler(seed=0), {WORKERS} workers)": lambda: loader(DataLoader),
    }


def throughput(name: str, root: str, args: argparse.Namespace) -> dict[str, Any]:
    ds = workloads()[name]()
    if args.elements:
        ds = ds.take(args.elements)
    ss = save(ds, os.path.join(root, name))
    ar_files = write_array_record(ss, os.path.join(root, f"{name}-ar"), "group_size:1")
    systems = throughput_systems(ss, ar_files)
    n = len(ssg.DataSource(ss))
    for make in systems.values():  # warm-up: tracing, page cache, the pass-token table
        drain(make(), limit=3)
    best: dict[str, float] = {}
    for rep in range(args.repeats):
        print(f"  throughput {name}: repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
        for label, make in systems.items():
            batches = make()  # building the pipeline is not timed, nor the settling after
            t0 = time.perf_counter()
            got = drain(batches, settled=False)
            dt = time.perf_counter() - t0
            settle()
            if got != n:
                raise RuntimeError(f"{label}: expected {n} elements, got {got}")
            best[label] = min(best.get(label, dt), dt)
    return {"workload": name, "elements": n, "per_s": {k: n / v for k, v in best.items()}}


def report_throughput(results: list[dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    print("\n### 1. Throughput, batches of 1,024 (elements/s, best of repeats)\n")
    print("| workload | reader | elements/s | x sequential load | x Grain ArrayRecord |")
    print("|---|---|---:|---:|---:|")
    targets = []
    for res in results:
        rate = res["per_s"]
        for label, r in rate.items():
            print(
                f"| {res['workload']} | {label} | {r:,.0f} | {r / rate[SEQ]:.2f} | "
                f"{r / rate[GRAIN_AR]:.2f} |"
            )
        x = rate[SHUF] / rate[SEQ]
        targets.append(
            (
                res["workload"],
                f"shuffled load >= {TARGET_X}x sequential load (elements/s)",
                f"{x:.2f}x (Grain ArrayRecord shuffle: {rate[GRAIN_AR] / rate[SEQ]:.2f}x)",
                x >= TARGET_X,
            )
        )
    return targets


# ------------------------------------------------------------ 2. quality


def chi2(labels: np.ndarray) -> tuple[float, list[int]]:
    """The chi-square statistic of label counts against equal counts, and the counts."""
    counts = np.bincount(labels, minlength=LABELS)
    expected = len(labels) / LABELS
    return float(((counts - expected) ** 2 / expected).sum()), counts.tolist()


def quality(root: str, args: argparse.Namespace) -> dict[str, Any]:
    per = args.quality_n // LABELS
    n = per * LABELS
    path = save(
        tf.data.Dataset.from_tensor_slices(
            {"i": np.arange(n), "label": np.repeat(np.arange(LABELS), per)}
        ),
        os.path.join(root, "sorted"),
    )
    source = ssg.DataSource(path)

    def first_ids(batches: Iterable[Any]) -> np.ndarray:
        return np.asarray(next(iter(batches))["i"])[:HEAD]

    # Each gives the indices of the first HEAD elements in its order (label = index // per).
    orders: dict[str, tuple[Callable[[int], np.ndarray], bool]] = {
        "tf.data load(shuffle=True, seed=s)": (
            lambda s: first_ids(superserial.load(path, shuffle=True, seed=s, batch_size=HEAD)),
            True,
        ),
        "superserial.permutation(n, s)": (
            lambda s: superserial.permutation(n, s)[:HEAD],
            True,
        ),
        "torch Sampler(n, seed=s)": (
            lambda s: np.fromiter(itertools.islice(sst.Sampler(n, seed=s), HEAD), np.int64),
            True,
        ),
        "superserial.grain.dataset(seed=s)": (
            lambda s: first_ids([source.collate(list(ssg.dataset(source, seed=s)[:HEAD]))]),
            True,
        ),
        f"tf.data load().shuffle({BUFFER:_}, seed=s)": (
            lambda s: first_ids(superserial.load(path).shuffle(BUFFER, seed=s).batch(HEAD)),
            False,
        ),
    }
    rows = []
    for label, (first, ours) in orders.items():
        stats, same = [], True
        for s in range(args.seeds):
            ids = first(s)
            if ours:
                same = same and np.array_equal(ids, superserial.permutation(n, s)[:HEAD])
            stats.append(chi2(ids // per))
        rows.append(
            {
                "order": label,
                "ours": ours,
                "chi2": stats[0][0],
                "counts": stats[0][1],
                "within": sum(c <= CHI2_CRIT for c, _ in stats),
                "same_as_permutation": same if ours else None,
            }
        )
    return {"elements": n, "seeds": args.seeds, "rows": rows}


def report_quality(res: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    print(
        f"\n### 2. Shuffle quality: the first {HEAD:,} of {res['elements']:,} elements written "
        f"in label order ({LABELS} labels)\n"
    )
    print(
        f"| order | chi-square, seed 0 (p=0.01: <= {CHI2_CRIT:.2f}) | label counts, seed 0 | "
        f"seeds within, of {res['seeds']} | same order as permutation |"
    )
    print("|---|---:|---|---:|---|")
    targets = []
    for r in res["rows"]:
        same = "-" if r["same_as_permutation"] is None else str(r["same_as_permutation"])
        print(
            f"| {r['order']} | {r['chi2']:,.1f} | {' '.join(map(str, r['counts']))} | "
            f"{r['within']} | {same} |"
        )
        within = r["chi2"] <= CHI2_CRIT
        want = "within" if r["ours"] else "outside (the buffer shuffle fails)"
        ok = within == r["ours"] and r["same_as_permutation"] is not False
        targets.append(("label order", f"{r['order']}: chi-square {want}", f"{r['chi2']:,.1f}", ok))
    return targets


# ------------------------------------------------------------ 3. resume


@tf.function
def _skip(iterator: Any, steps: tf.Tensor) -> None:
    """Consumes ``steps`` elements in the graph: no Python per element."""
    for _ in tf.range(steps):
        iterator.get_next()


class Resumable:
    """One reader's checkpoints at two positions, and its restore.

    Subclasses set ``name`` and ``size`` (elements per step: a batch, or 1)
    and implement ``make_states`` (really iterating to the positions) and
    ``restore`` (from a state to the dataset indices of the first step), or
    ``variants`` (several restores of the same states).
    """

    name = ""
    size = 1

    def __init__(self, path: str, n: int, root: str) -> None:
        self.path, self.n, self.root = path, n, root
        self.last = -(-n // self.size) - 1  # the step holding the last element
        self.reach_s = 0.0  # how long getting to the last step took

    def make_states(self) -> dict[int, Any]:
        raise NotImplementedError

    def restore(self, state: Any) -> np.ndarray:
        raise NotImplementedError

    def variants(self) -> dict[str, Callable[[Any], np.ndarray]]:
        return {self.name: self.restore}

    def state_bytes(self, state: Any) -> int:
        return len(pickle.dumps(state))


class TfResume(Resumable):
    def __init__(self, path: str, n: int, root: str, batch: int | None) -> None:
        self.batch = batch
        self.size = batch or 1
        self.name = (
            f"tf.data load(shuffle=True, seed=0, batch_size={batch}), "
            "tf.train.Checkpoint restore + next"
            if batch
            else "tf.data load(shuffle=True, seed=0) unbatched, tf.train.Checkpoint restore + next"
        )
        super().__init__(path, n, root)

    def make(self) -> tf.data.Dataset:
        return superserial.load(self.path, shuffle=True, seed=0, batch_size=self.batch)

    def make_states(self) -> dict[int, Any]:
        it = iter(self.make())
        ckpt = tf.train.Checkpoint(iterator=it)
        prefix = os.path.join(self.root, f"tf-{self.size}")
        states = {0: ckpt.save(f"{prefix}-first")}
        t0 = time.perf_counter()
        _skip(it, tf.constant(self.last, tf.int64))
        self.reach_s = time.perf_counter() - t0
        states[self.last] = ckpt.save(f"{prefix}-last")
        return states

    def restore(self, state: Any) -> np.ndarray:
        it = iter(self.make())
        tf.train.Checkpoint(iterator=it).restore(state).assert_consumed()
        return np.atleast_1d(next(it)["i"].numpy())

    def state_bytes(self, state: Any) -> int:
        return sum(os.path.getsize(f) for f in glob.glob(state + "*"))


class LoaderResume(Resumable):
    name = (
        f"StatefulDataLoader(MapDataset, Sampler(seed=0), {WORKERS} workers), "
        "load_state_dict + first batch"
    )
    size = BATCH

    def make(self) -> StatefulDataLoader:
        return StatefulDataLoader(
            sst.MapDataset(self.path),
            sampler=sst.Sampler(self.n, seed=0),
            batch_size=BATCH,
            num_workers=WORKERS,
            collate_fn=sst.collate,
        )

    def make_states(self) -> dict[int, Any]:
        loader = self.make()
        states = {0: loader.state_dict()}
        t0 = time.perf_counter()
        it = iter(loader)
        for _ in range(self.last):
            next(it)
        self.reach_s = time.perf_counter() - t0
        states[self.last] = loader.state_dict()
        del it
        return states

    def restore(self, state: Any) -> np.ndarray:
        loader = self.make()
        loader.load_state_dict(state)
        it = iter(loader)
        try:
            return np.asarray(next(it)["i"])
        finally:
            del it


class SamplerResume(Resumable):
    name = "torch Sampler(n, seed=0), load_state_dict + first index"

    def make_states(self) -> dict[int, Any]:
        sampler = sst.Sampler(self.n, seed=0)
        states = {0: sampler.state_dict()}
        t0 = time.perf_counter()
        for _ in itertools.islice(iter(sampler), self.last):
            pass
        self.reach_s = time.perf_counter() - t0
        states[self.last] = sampler.state_dict()
        return states

    def restore(self, state: Any) -> np.ndarray:
        sampler = sst.Sampler(self.n, seed=0)
        sampler.load_state_dict(state)
        return np.array([next(iter(sampler))])


class GrainResume(Resumable):
    name = "superserial.grain.dataset(seed=0).batch(1024, collate), set_state + next"
    size = BATCH

    def make(self, options: grain.ReadOptions | None = None) -> Any:
        source = ssg.DataSource(self.path)
        ds = ssg.dataset(source, seed=0).batch(BATCH, batch_fn=source.collate)
        return ds.to_iter_dataset(options) if options else ds.to_iter_dataset()

    def make_states(self) -> dict[int, Any]:
        it = iter(self.make())
        states = {0: it.get_state()}
        t0 = time.perf_counter()
        for _ in range(self.last):
            next(it)
        self.reach_s = time.perf_counter() - t0
        states[self.last] = it.get_state()
        close(it)
        return states

    def restore_with(self, state: Any, options: grain.ReadOptions | None) -> np.ndarray:
        it = iter(self.make(options))
        try:
            it.set_state(state)
            return np.asarray(next(it)["i"])
        finally:
            close(it)

    def variants(self) -> dict[str, Callable[[Any], np.ndarray]]:
        # Grain's default read threads start up to 16 batches at once: the
        # first one then waits for its share of one GIL. Without threads, the
        # time is the restore and one batch.
        return {
            f"{self.name} (default ReadOptions)": lambda s: self.restore_with(s, None),
            f"{self.name} (ReadOptions(num_threads=0))": lambda s: self.restore_with(
                s, grain.ReadOptions(num_threads=0)
            ),
        }


def resume(root: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    n, small = args.resume_n, args.resume_unbatched_n

    def tiny(count: int) -> str:
        ds = tf.data.Dataset.range(count).map(lambda i: {"i": i})
        return save(ds, os.path.join(root, f"tiny-{count}"))

    big = tiny(n)
    readers: list[Resumable] = [
        TfResume(big, n, root, BATCH),
        TfResume(tiny(small), small, root, None),
        LoaderResume(big, n, root),
        SamplerResume(big, n, root),
        GrainResume(big, n, root),
    ]
    rows = []
    for r in readers:
        print(f"  resume: {r.name}", file=sys.stderr, flush=True)
        order = superserial.permutation(r.n, 0)
        states = r.make_states()
        for name, restore in r.variants().items():
            best: dict[int, float] = {}
            for _ in range(args.resume_repeats):
                for step, state in states.items():  # interleaved: first, last, first, ...
                    settle()
                    t0 = time.perf_counter()
                    ids = restore(state)
                    dt = time.perf_counter() - t0
                    want = order[step * r.size : (step + 1) * r.size]
                    if not np.array_equal(ids, want):
                        raise RuntimeError(
                            f"{name}: resumed at step {step} with {ids[:4]}..., "
                            f"expected {want[:4]}..."
                        )
                    best[step] = min(best.get(step, dt), dt)
            rows.append(
                {
                    "reader": name,
                    "elements": r.n,
                    "last_position": r.last * r.size,
                    "first_s": best[0],
                    "last_s": best[r.last],
                    "reach_last_s": r.reach_s,
                    "state_bytes": [r.state_bytes(states[0]), r.state_bytes(states[r.last])],
                }
            )
    return rows


def report_resume(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    print("\n### 3. Resume: restore a checkpoint, time to the first element (best of repeats)\n")
    print(
        "| reader | elements | at position 0, ms | at the last element, ms | last / first | "
        "state bytes (0 / last) | iterating to the last took, s |"
    )
    print("|---|---:|---:|---:|---:|---|---:|")
    targets = []
    for r in rows:
        x = r["last_s"] / r["first_s"]
        print(
            f"| {r['reader']} | {r['elements']:,} | {r['first_s'] * 1e3:,.1f} | "
            f"{r['last_s'] * 1e3:,.1f} (position {r['last_position']:,}) | {x:.2f} | "
            f"{r['state_bytes'][0]:,} / {r['state_bytes'][1]:,} | {r['reach_last_s']:,.1f} |"
        )
        targets.append(
            (
                f"{r['elements']:,} elements",
                f"{r['reader']}: last / first <= {TARGET_RESUME_X}",
                f"{x:.2f}",
                x <= TARGET_RESUME_X,
            )
        )
    return targets


# ------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("workloads", nargs="*", default=["mnist", "tabular"])
    ap.add_argument("--repeats", type=int, default=3, help="throughput passes per reader")
    ap.add_argument("--elements", type=int, default=None, help="first N elements of workloads")
    ap.add_argument("--quality-n", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--resume-n", type=int, default=1_000_000)
    ap.add_argument("--resume-unbatched-n", type=int, default=100_000)
    ap.add_argument("--resume-repeats", type=int, default=5)
    ap.add_argument(
        "--only", action="append", choices=["throughput", "quality", "resume"], default=None
    )
    ap.add_argument("--quick", action="store_true", help="a tiny run, to check the script")
    args = ap.parse_args()
    if args.quick:
        args.elements, args.repeats, args.seeds = args.elements or 3_000, 1, 3
        args.quality_n, args.resume_n, args.resume_unbatched_n = 20_000, 20_000, 3_000
        args.resume_repeats = 2
    parts = args.only or ["throughput", "quality", "resume"]
    print(f"machine: {machine()}", flush=True)
    print(f"command: {' '.join(sys.argv)}", flush=True)

    root = tempfile.mkdtemp(prefix="bench-global-shuffle-")
    out: dict[str, Any] = {"machine": machine(), "argv": sys.argv}
    targets: list[tuple[str, str, str, bool]] = []
    try:
        if "throughput" in parts:
            out["throughput"] = [throughput(w, root, args) for w in args.workloads]
            targets += report_throughput(out["throughput"])
        if "quality" in parts:
            out["quality"] = quality(root, args)
            targets += report_quality(out["quality"])
        if "resume" in parts:
            out["resume"] = resume(root, args)
            targets += report_resume(out["resume"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n### Targets (issue 12)\n")
    print("| on | target | measured | result |")
    print("|---|---|---:|---|")
    for on, what, got, ok in targets:
        print(f"| {on} | {what} | {got} | {'PASS' if ok else 'MISS'} |")
    out["targets"] = [
        dict(zip(("on", "target", "measured", "pass"), t, strict=True)) for t in targets
    ]
    path = os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "global_shuffle.json"), "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

"""superserial's numpy reader against its peers on local files (issue 26, "Anchors").

One mnist-shaped dataset (``--n`` x ``{"image": uint8[28, 28], "label": int64}``,
seed 0) is written by each system's own writer, then read in one run, systems
interleaved (each once per round), best of ``--repeats``:

* single random element: the median of ``--reads`` reads, each timed alone
  (the same indices for every system);
* random batches of 256 (``--batches`` of them, the same indices), elements/s;
* a sequential scan in batches of 1,024, elements/s.

Every read ends in numpy arrays ``image`` ``[B, 28, 28]`` uint8 and ``label``
``[B]`` int64 (one element: ``[28, 28]`` and a scalar), and each system's
first random batch and its scan (count and label sum) are checked against the
arrays written. The systems and their calls:

============  =========================================================================
superserial   ``superserial.numpy.load(p)``: ``ds[i]``, ``ds.get_batch(idx)``,
              ``ds.batches(1024)``
hf            HF ``datasets`` (Arrow, ``Array2D``), ``load_from_disk(p)
              .with_format("numpy")``: ``ds[i]``, ``ds[idx]``, ``ds.iter(1024)``
lance         ``lance.dataset(p)`` (image a fixed-size list of 784 uint8):
              ``take([i])``, ``take(idx)``, ``to_batches(batch_size=1024)``, each
              Arrow table to numpy without a copy
mosaic        mosaicml-streaming ``StreamingDataset(local=p)``: ``ds[i]``,
              ``ds[idx]`` (a list of elements, stacked), iteration (stacked by 1,024)
litdata       litdata ``StreamingDataset(p)``: ``ds[i]``, ``[ds[i] for i in idx]``
              (stacked), iteration (stacked by 1,024)
============  =========================================================================

mosaic and litdata hand out elements, not batches: their batch rows include
the ``np.stack`` a user (or torch's collate) does. superserial and hf run in
this interpreter (the dev venv); lance, mosaic and litdata pin numpy and torch
to other versions, so they run in ``--peer-python`` (the venv of
``make bench-remote-peers``, with benchmarks/requirements-peers.txt). Each
measurement is a child process of this script (``child read``), started the
same way for every system, its imports and dataset opening not timed; a
warm-up pass of each read comes first. The files stay in the page cache
(warm reads).

    .venv/bin/python benchmarks/peers.py --peer-python .venv-peers/bin/python
    .venv/bin/python benchmarks/peers.py --peer-python P --repeats 1 --n 10000   # smoke
    .venv/bin/python benchmarks/bench.py --peers P ...   # the same rows in bench.py's run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

SCAN = 1024
BATCH = 256
SYSTEMS = ("superserial", "hf", "lance", "mosaic", "litdata")
IN_DEV_VENV = ("superserial", "hf")
HERE = os.path.dirname(os.path.abspath(__file__))

Batch = dict[str, np.ndarray]


def make_arrays(n: int) -> Batch:
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        "label": rng.integers(0, 10, n, dtype=np.int64),
    }


def _stack(elements: Iterable[dict[str, Any]]) -> Batch:
    els = list(elements)
    return {
        "image": np.stack([np.asarray(e["image"]) for e in els]),
        "label": np.asarray([e["label"] for e in els], dtype=np.int64),
    }


def _chunked(elements: Iterable[dict[str, Any]], size: int) -> Iterator[Batch]:
    chunk: list[dict[str, Any]] = []
    for e in elements:
        chunk.append(e)
        if len(chunk) == size:
            yield _stack(chunk)
            chunk = []
    if chunk:
        yield _stack(chunk)


# ------------------------------------------------------------ writers (children)


def write(system: str, out: str, arrays: Batch) -> None:
    """Writes ``arrays`` to ``out`` with ``system``'s own writer."""
    n = len(arrays["label"])
    if system == "superserial":
        import tensorflow as tf

        import superserial

        superserial.save(tf.data.Dataset.from_tensor_slices(arrays), out, progress=False)
    elif system == "hf":
        import datasets

        # A fixed-size list: HF's fastest layout here (Array2D((28, 28)) measured about
        # 10x slower for random batches, each row's extension type rebuilt).
        image = datasets.List(datasets.Value("uint8"), length=784)
        features = datasets.Features({"image": image, "label": datasets.Value("int64")})
        datasets.Dataset.from_dict(
            {"image": arrays["image"].reshape(n, 784), "label": arrays["label"]},
            features=features,
        ).save_to_disk(out)
    elif system == "lance":
        import lance
        import pyarrow as pa

        image = pa.FixedSizeListArray.from_arrays(pa.array(arrays["image"].reshape(-1)), 784)
        lance.write_dataset(pa.table({"image": image, "label": arrays["label"]}), out)
    elif system == "mosaic":
        from streaming import MDSWriter

        columns = {"image": "ndarray:uint8:28,28", "label": "int64"}
        with MDSWriter(out=out, columns=columns, size_limit=1 << 26) as w:
            for i in range(n):
                w.write({"image": arrays["image"][i], "label": int(arrays["label"][i])})
    elif system == "litdata":
        from litdata.streaming.writer import BinaryWriter

        # optimize()'s own chunk writer, without its worker processes.
        w = BinaryWriter(out, chunk_bytes=1 << 26)
        for i in range(n):
            w.add_item(i, {"image": arrays["image"][i], "label": int(arrays["label"][i])})
        w.done()
        w.merge(1)
    else:
        raise SystemExit(f"expected one of {SYSTEMS}, got {system!r}")


# ------------------------------------------------------------ readers (children)


def reader(
    system: str, path: str
) -> tuple[Callable[[int], Any], Callable[[Any], Batch], Callable[[], Iterable[Batch]]]:
    """``(one element, a batch of indices, the scan)`` of ``system`` over ``path``."""
    if system == "superserial":
        import superserial.numpy as ssnp

        ds = ssnp.load(path)
        return ds.__getitem__, ds.get_batch, lambda: ds.batches(SCAN)
    if system == "hf":
        import datasets

        ds = datasets.load_from_disk(path).with_format("numpy")

        def shaped(b: dict[str, Any]) -> Batch:
            return {"image": b["image"].reshape(-1, 28, 28), "label": b["label"]}

        def hf_one(i: int) -> Batch:
            e = ds[i]
            return {"image": e["image"].reshape(28, 28), "label": e["label"]}

        return (
            hf_one,
            lambda idx: shaped(ds[idx.tolist()]),
            lambda: map(shaped, ds.iter(batch_size=SCAN)),
        )
    if system == "lance":
        import lance
        import pyarrow as pa

        ds = lance.dataset(path)

        def arrays(t: Any) -> Batch:
            image = t.column("image")
            image = image.combine_chunks() if isinstance(image, pa.ChunkedArray) else image
            return {
                "image": image.values.to_numpy().reshape(-1, 28, 28),
                "label": t.column("label").to_numpy(),
            }

        def one(i: int) -> Batch:
            b = arrays(ds.take([i]))
            return {"image": b["image"][0], "label": b["label"][0]}

        return (
            one,
            lambda idx: arrays(ds.take(idx)),
            lambda: map(arrays, ds.to_batches(batch_size=SCAN)),
        )
    if system == "mosaic":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = StreamingDataset(local=path, shuffle=False, batch_size=SCAN)
        return ds.__getitem__, lambda idx: _stack(ds[list(idx)]), lambda: _chunked(ds, SCAN)
    if system == "litdata":
        from litdata import StreamingDataset

        ds = StreamingDataset(path, shuffle=False)
        return (
            ds.__getitem__,
            lambda idx: _stack(ds[int(i)] for i in idx),
            lambda: _chunked(ds, SCAN),
        )
    raise SystemExit(f"expected one of {SYSTEMS}, got {system!r}")


def read(system: str, path: str, arrays: Batch, plan: dict[str, Any]) -> dict[str, Any]:
    """One measurement of each read of ``system``, after a warm-up of each."""
    one, many, scan = reader(system, path)
    singles = plan["singles"]
    batches = [np.asarray(b, dtype=np.int64) for b in plan["batches"]]
    # Warm-up, and the checks: the values read are the values written.
    for i in singles[:50]:
        e = one(i)
        if not np.array_equal(e["image"], arrays["image"][i]) or int(e["label"]) != int(
            arrays["label"][i]
        ):
            raise SystemExit(f"{system}: element {i} differs from the one written")
    b = many(batches[0])
    for k in ("image", "label"):
        if not np.array_equal(np.asarray(b[k]), arrays[k][batches[0]]):
            raise SystemExit(f"{system}: the first random batch's {k!r} differs")
    count = total = 0
    for b in scan():
        count += len(b["label"])
        total += int(np.asarray(b["label"]).sum())
    if count != len(arrays["label"]) or total != int(arrays["label"].sum()):
        raise SystemExit(f"{system}: the scan read {count} elements, sum {total}")

    times = []
    for i in singles:
        t = time.perf_counter()
        one(i)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    got = 0
    for idx in batches:
        got += len(many(idx)["label"])
    batch_s = time.perf_counter() - t
    t = time.perf_counter()
    count = sum(len(b["label"]) for b in scan())
    scan_s = time.perf_counter() - t
    return {
        "single_us": float(np.median(times)) * 1e6,
        "batch_el_s": got / batch_s,
        "scan_el_s": count / scan_s,
    }


def child(argv: list[str]) -> None:
    cmd, system, path, npz = argv[:4]
    if system == "mosaic":
        from remote_peers import _stub_torchvision

        _stub_torchvision()  # why: remote_peers.py says
    arrays = dict(np.load(npz))
    if cmd == "write":
        t = time.perf_counter()
        write(system, path, arrays)
        out: dict[str, Any] = {"write_s": time.perf_counter() - t}
    else:
        with open(argv[4]) as f:
            out = read(system, path, arrays, json.load(f))
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the peers leave threads and shared memory that slow a clean exit


# ------------------------------------------------------------ the parent


def _run_child(python: str, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(HERE), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, src, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    proc = subprocess.run(
        [python, os.path.join(HERE, "peers.py"), "child", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return dict(json.loads(lines[-1]))


def run(
    peer_python: str | None,
    *,
    n: int = 60_000,
    repeats: int = 3,
    reads: int = 2000,
    batches: int = 40,
    systems: Iterable[str] = SYSTEMS,
    log: Callable[[str], None] = lambda s: print(s, flush=True),
) -> dict[str, dict[str, Any]]:
    """Writes with each system, reads them interleaved; the best figures by system."""
    systems = [s for s in systems if s in IN_DEV_VENV or peer_python]
    root = tempfile.mkdtemp(prefix="bench-peers-")
    best: dict[str, dict[str, Any]] = {}
    try:
        arrays = make_arrays(n)
        npz = os.path.join(root, "arrays.npz")
        np.savez(npz, **arrays)
        rng = np.random.default_rng(1)
        plan = {
            "singles": rng.integers(0, n, reads).tolist(),
            "batches": [rng.integers(0, n, BATCH).tolist() for _ in range(batches)],
        }
        plan_file = os.path.join(root, "plan.json")
        with open(plan_file, "w") as f:
            json.dump(plan, f)

        def python(s: str) -> str:
            return sys.executable if s in IN_DEV_VENV or peer_python is None else peer_python

        for s in systems:
            got = _run_child(python(s), ["write", s, os.path.join(root, s), npz])
            best[s] = dict(got)
            log(f"peers: {s} wrote: {got}")
        for r in range(repeats):
            for s in systems:
                if "error" in best[s]:
                    continue
                got = _run_child(python(s), ["read", s, os.path.join(root, s), npz, plan_file])
                if "error" in got:
                    best[s]["error"] = got["error"]
                    log(f"peers: {s} failed: {got['error']}")
                    continue
                b = best[s]
                b["single_us"] = min(b.get("single_us", got["single_us"]), got["single_us"])
                for k in ("batch_el_s", "scan_el_s"):
                    b[k] = max(b.get(k, 0.0), got[k])
            log(f"peers: round {r + 1} of {repeats} done")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return best


TITLES = {
    "superserial": "superserial numpy",
    "hf": "HF `datasets` (numpy format)",
    "lance": "Lance (`pylance`)",
    "mosaic": "mosaicml-streaming",
    "litdata": "litdata",
}


def table(best: dict[str, dict[str, Any]]) -> list[str]:
    """The peer rows: one column per system, reads as rows."""
    cols = list(best)

    def cell(s: str, key: str, spec: str, unit: str) -> str:
        v = best[s].get(key)
        return "failed" if v is None else format(v, spec) + unit

    lines = [
        "| read | " + " | ".join(TITLES[s] for s in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    rows = (
        ("single random element, median", "single_us", ".1f", " µs"),
        (f"random batches of {BATCH}", "batch_el_s", ",.0f", " el/s"),
        (f"sequential scan, batches of {SCAN}", "scan_el_s", ",.0f", " el/s"),
    )
    for title, key, spec, unit in rows:
        lines.append(f"| {title} | " + " | ".join(cell(s, key, spec, unit) for s in cols) + " |")
    return lines


def main() -> None:
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--peer-python", help="the peers' interpreter (without it: superserial, hf)")
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reads", type=int, default=2000, help="single reads timed")
    ap.add_argument("--batches", type=int, default=40, help="random batches timed")
    ap.add_argument("--only", help=f"comma-separated systems ({','.join(SYSTEMS)})")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    best = run(
        args.peer_python,
        n=args.n,
        repeats=args.repeats,
        reads=args.reads,
        batches=args.batches,
        systems=SYSTEMS if args.only is None else args.only.split(","),
    )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("\n".join(table(best)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "peers": best}, f, indent=2)


if __name__ == "__main__":
    main()

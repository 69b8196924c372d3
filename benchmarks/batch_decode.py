"""The batch decoder's two ways, side by side: records cut by a template, or parsed.

``superserial.codec.numpy_batch_decode.BatchDecoder`` cuts a batch of records of one
length and layout by the offsets of record 0's payloads (``templates=True``, the
default), and parses any other batch field by field in lockstep. Part one times one
``decode`` of the same records both ways (best of 5 runs, each a mean over repeats):

- mnist-shaped: uint8[28, 28] + an int64 label below 10;
- tabular: 20 int64 scalars + 10 float32 scalars, the ints either below 100 (records of
  one length) or random up to 2**40 (lengths differ, so both ways parse).

Part two reads whole epochs of rows of ``benchmarks/remote.py`` from local disk
(60,000 mnist-shaped records, 8 shards; ``--rows``), alternating epoch by epoch with
templates on and off, and gives medians of el/s counted from the first batch. To turn
templates off in DataLoader workers too (forked from this process), it replaces the
class's template step with one that always declines; the values are the same either way.

    PYTHONPATH=src .venv/bin/python benchmarks/batch_decode.py
    PYTHONPATH=src .venv/bin/python benchmarks/batch_decode.py --epochs 8 --rows torch_windowed
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from superserial.codec.numpy_batch_decode import BatchDecoder

ROWS = "numpy_sequential,numpy_get_batch,torch_sequential,torch_windowed"


def _per_batch(decoder: BatchDecoder, batch: tuple[Any, ...], repeats: int) -> float:
    """Seconds per ``decoder.decode(*batch)``: the best of 5 means over ``repeats`` calls."""
    decoder.decode(*batch)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(repeats):
            decoder.decode(*batch)
        best = min(best, (time.perf_counter() - t) / repeats)
    return best


def decoders(work: str) -> None:
    rng = np.random.default_rng(0)
    n = 8192
    datasets = {
        "mnist-shaped": {
            "image": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            "label": rng.integers(0, 10, n).astype(np.int64),
        },
    }
    for name, high in (("tabular, ints < 100", 100), ("tabular, ints < 2**40", 2**40)):
        cols = {f"i{k}": rng.integers(0, high, n).astype(np.int64) for k in range(20)}
        cols.update({f"f{k}": rng.standard_normal(n).astype(np.float32) for k in range(10)})
        datasets[name] = cols
    print("dataset | records per batch | template us | parse us | parse / template")
    print("---|---:|---:|---:|---:")
    for name, cols in datasets.items():
        path = os.path.join(work, name.replace(" ", "_").replace("*", ""))
        superserial.save(tf.data.Dataset.from_tensor_slices(cols), path, progress=False)
        ds = ssnp.load(path)
        cut, parsed = BatchDecoder(ds.header), BatchDecoder(ds.header, templates=False)
        for b in (256, 4096):
            buf, starts, ends = ds.records.read_span(0, b)
            a, p = cut.decode(buf, starts, ends), parsed.decode(buf, starts, ends)
            if (
                a is None
                or p is None
                or any(x.tobytes() != y.tobytes() for x, y in zip(a, p, strict=True))
            ):
                raise SystemExit(f"expected the same values both ways for {name}")
            repeats = 200 if b == 256 else 20
            t_cut = _per_batch(cut, (buf, starts, ends), repeats)
            t_parse = _per_batch(parsed, (buf, starts, ends), repeats)
            print(
                f"{name} | {b} | {t_cut * 1e6:,.0f} | {t_parse * 1e6:,.0f} | {t_parse / t_cut:.2f}"
            )


def rows(work: str, names: list[str], epochs: int) -> None:
    import remote_rows as rr

    path = os.path.join(work, "rows")
    rr.save_mnist(path, 60_000, 8)
    on = BatchDecoder._by_template

    def off(self: BatchDecoder, *args: Any) -> None:
        return None

    print("\nrow, local disk | epochs each | templates on, el/s | off, el/s | on / off")
    print("---|---:|---:|---:|---:")
    for name in names:
        row = getattr(rr, name)
        got: dict[bool, list[float]] = {True: [], False: []}
        for e in range(epochs):
            for templates in (True, False) if e % 2 == 0 else (False, True):
                BatchDecoder._by_template = on if templates else off  # type: ignore[method-assign]
                count = first_count = 0
                t_first = None
                for k in row(path, 60_000, 3000, {}):
                    count += k
                    if t_first is None:
                        t_first, first_count = time.perf_counter(), count
                if t_first is None:
                    raise SystemExit(f"expected batches from {name}, got none")
                got[templates].append((count - first_count) / (time.perf_counter() - t_first))
        BatchDecoder._by_template = on  # type: ignore[method-assign]
        a, b = statistics.median(got[True]), statistics.median(got[False])
        print(f"{name} | {epochs} | {a:,.0f} | {b:,.0f} | {a / b:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rows", default=ROWS, help=f"comma-separated ({ROWS}); '' for none")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ss-batch-decode-")
    try:
        decoders(work)
        if args.rows:
            rows(work, args.rows.split(","), args.epochs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Restart spacing of compressed shards (issue 24): file size against the cost of a random read.

A GZIP/ZLIB shard stays one ordinary deflate stream, cut into chunks that are
each deflated on their own and ended with a sync flush (as
``write/record_file.py`` does, 4 MiB today): every chunk start is a point where
inflating can begin afresh, a restart point. Small chunks make random reads
cheap (less to inflate before a record) and files larger (each chunk starts
with an empty window); this study measures both, on one compressible workload,
to choose the spacing.

Workload: sklearn's digits (1,797 x float64[8, 8] image, values 0-16, and an
int64 label) tiled to --n elements (60,000), saved uncompressed with
``superserial.save`` in one shard; the shard file's bytes are the record
stream (TFRecord framing included), its records the raw record bytes.

For each spacing (16, 32, 64, 128, 256 KiB, 1 and 4 MiB of uncompressed bytes by
default), the stream is cut at exactly that many bytes (not at record
boundaries, as ``record_file.py``) and each chunk deflated with
``zlib.compressobj(6, DEFLATED, -15)`` and a sync flush (the last one finished),
and it reports:

* size: the GZIP stream (10-byte header + chunks + 8-byte trailer) against
  TensorFlow's own ``tf.io.TFRecordWriter(path, options="GZIP")`` over the same
  records, and the restart table it would need (24 bytes a restart point:
  compressed offset, uncompressed offset, first record) beside it;
* warm random read: ``os.pread`` of the compressed bytes from the record's
  chunk start to its end (the file in the page cache), inflated from that
  restart point with ``decompress(..., max_length)`` up to the record's end,
  and the record sliced out: median and p90 over --reads random records. This
  is the raw-record part of a warm ``ds[i]``; decoding adds about 10 us
  (docs/performance.md, Random access);
* random batches of 256: the batch's records grouped by chunk, each chunk
  touched inflated once from its start up to its last wanted record, in
  records/s, against the sequential inflate of the whole stream (records/s):
  what bounds random ``get_batch(256)`` against sequential ``batches(256)``;
* deflate throughput: the whole stream deflated by a pool of
  ``os.cpu_count()`` threads (zlib releases the GIL), uncompressed MB/s, best of
  --repeats.

Beside them, the per-record option, each record deflated alone (raw deflate at
level 6, 16 bytes of framing a record), the record index that locates them
already existing: its size ratio and its warm read (pread + inflate of one
record). It stands for "compression per leaf": the digits record is one image
leaf and a label, so per record and per leaf differ by one small label.

Then a recommended spacing, with the reason, against the issue's targets: size
within 3% of TF's GZIP, warm ``ds[i]`` median <= 300 us. Times are wall clock on
whatever machine this runs on; a shared machine makes them rough.

    PYTHONPATH=src .venv/bin/python benchmarks/compressed_spacing.py
    PYTHONPATH=src .venv/bin/python benchmarks/compressed_spacing.py --quick

Writes benchmarks/out/compressed_spacing.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from bench import fmt, machine

KIB = 1 << 10
SPACINGS = [16 * KIB, 32 * KIB, 64 * KIB, 128 * KIB, 256 * KIB, 1 << 20, 4 << 20]
LEVEL = 6
BATCH = 256
TARGET_SIZE_X = 1.03  # GZIP shards / TF's GZIP TFRecordWriter
TARGET_MEDIAN_US = 300.0  # warm ds[i]
RESTART_ENTRY = 24  # bytes a restart point: compressed offset, uncompressed offset, first record
GZIP_FRAME = 10 + 8  # GZIP header and trailer around the raw deflate chunks


# ------------------------------------------------------------ workload


def digits(n: int) -> tf.data.Dataset:
    """sklearn's digits, images (float64[8, 8]) and labels (int64), tiled to ``n`` elements."""
    from sklearn.datasets import load_digits

    d = load_digits()
    reps = -(-n // len(d.target))
    images = np.tile(d.images, (reps, 1, 1))[:n].astype(np.float64)
    labels = np.tile(d.target, reps)[:n].astype(np.int64)
    return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})


class Stream:
    """One uncompressed shard: its bytes, its records and where each record starts and ends."""

    def __init__(self, path: str) -> None:
        (shard,) = ssnp.load(path).files
        with open(shard, "rb") as f:
            self.data = f.read()
        self.records = list(ssnp.read_records(shard))
        sizes = np.array([len(r) + 16 for r in self.records], dtype=np.int64)
        self.ends = np.cumsum(sizes)
        self.starts = self.ends - sizes
        if int(self.ends[-1]) != len(self.data):
            raise RuntimeError(f"expected records to fill {shard}, got {self.ends[-1]} bytes")


def saved_stream(n: int, root: str) -> Stream:
    path = os.path.join(root, "plain")
    superserial.save(digits(n), path, num_shards=1, progress=False)
    return Stream(path)


def tf_gzip_bytes(records: list[bytes], path: str) -> tuple[int, float]:
    """The size of TensorFlow's own GZIP TFRecord file of ``records``, and its write seconds."""
    t0 = time.perf_counter()
    with tf.io.TFRecordWriter(path, options="GZIP") as w:
        for r in records:
            w.write(r)
    return os.path.getsize(path), time.perf_counter() - t0


# ------------------------------------------------------------ restart chunks


def deflate_chunk(data: memoryview, last: bool) -> bytes:
    """One chunk, as ``record_file.py`` deflates it: raw deflate, sync flush or finish."""
    z = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    out: bytes = z.compress(data) + z.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
    return out


def deflate_stream(
    data: bytes, spacing: int, pool: concurrent.futures.ThreadPoolExecutor
) -> list[bytes]:
    view = memoryview(data)
    cuts = list(range(0, len(data), spacing))
    futures = [
        pool.submit(deflate_chunk, view[a : a + spacing], k == len(cuts) - 1)
        for k, a in enumerate(cuts)
    ]
    return [f.result() for f in futures]


class Chunked:
    """A stream deflated in chunks of ``spacing`` bytes, written to a file for preads."""

    def __init__(self, stream: Stream, spacing: int, chunks: list[bytes], path: str) -> None:
        self.stream, self.spacing = stream, spacing
        lengths = np.array([len(c) for c in chunks], dtype=np.int64)
        # Compressed offset of each chunk in the file, and one past the last.
        self.coffsets = np.concatenate([[0], np.cumsum(lengths)])
        self.compressed = int(self.coffsets[-1])
        with open(path, "wb") as f:
            for c in chunks:
                f.write(c)
        self.fd = os.open(path, os.O_RDONLY)
        self.check_roundtrip()

    def close(self) -> None:
        os.close(self.fd)

    def check_roundtrip(self) -> None:
        raw = os.pread(self.fd, self.compressed, 0)
        if zlib.decompress(raw, -15) != self.stream.data:
            raise RuntimeError(f"chunks of {self.spacing} bytes do not inflate to the stream")

    def span(self, a: int, b: int) -> tuple[int, int, int]:
        """For uncompressed bytes [a, b): (first chunk, compressed start, compressed end)."""
        k0, k1 = a // self.spacing, (b - 1) // self.spacing
        return k0, int(self.coffsets[k0]), int(self.coffsets[k1 + 1])

    def read(self, i: int) -> bytes:
        """Record ``i``'s framed bytes: pread from its restart point, inflate up to its end."""
        a, b = int(self.stream.starts[i]), int(self.stream.ends[i])
        k0, c0, c1 = self.span(a, b)
        u0 = k0 * self.spacing
        raw = os.pread(self.fd, c1 - c0, c0)
        out = zlib.decompressobj(-15).decompress(raw, b - u0)
        return out[a - u0 : b - u0]

    def read_batch(self, indices: np.ndarray) -> list[bytes]:
        """The records at ``indices``, each chunk touched inflated once up to its last wanted record."""
        starts, ends = self.stream.starts[indices], self.stream.ends[indices]
        first = starts // self.spacing
        order = np.argsort(first, kind="stable")
        out: list[bytes] = [b""] * len(indices)
        j = 0
        while j < len(order):
            k = int(first[order[j]])
            g = j
            while g < len(order) and first[order[g]] == k:
                g += 1
            group = order[j:g]
            u0 = k * self.spacing
            end = int(ends[group].max())
            _, c0, c1 = self.span(u0, end)
            buf = zlib.decompressobj(-15).decompress(os.pread(self.fd, c1 - c0, c0), end - u0)
            for q in group:
                out[q] = buf[int(starts[q]) - u0 : int(ends[q]) - u0]
            j = g
        return out

    def read_all(self) -> int:
        """The whole stream inflated sequentially (one decompressor), as a sequential read does."""
        d = zlib.decompressobj(-15)
        total, pos, step = 0, 0, 1 << 20
        while pos < self.compressed:
            total += len(d.decompress(os.pread(self.fd, step, pos)))
            pos += step
        return total


class PerRecord:
    """Each record deflated alone, framed, with the offsets a record index gives."""

    def __init__(self, stream: Stream, path: str) -> None:
        self.stream = stream
        bodies = [deflate_chunk(memoryview(r), True) for r in stream.records]
        sizes = np.array([len(b) + 16 for b in bodies], dtype=np.int64)
        self.ends = np.cumsum(sizes)
        self.starts = self.ends - sizes
        self.compressed = int(self.ends[-1])
        with open(path, "wb") as f:
            for body in bodies:
                f.write(struct.pack("<QI", len(body), 0) + body + b"\0\0\0\0")
        self.fd = os.open(path, os.O_RDONLY)
        if self.read(len(bodies) - 1) != stream.records[-1]:
            raise RuntimeError("per-record deflate does not round-trip")

    def close(self) -> None:
        os.close(self.fd)

    def read(self, i: int) -> bytes:
        a, b = int(self.starts[i]), int(self.ends[i])
        framed = os.pread(self.fd, b - a, a)
        return zlib.decompress(memoryview(framed)[12:-4], -15)


# ------------------------------------------------------------ timing


def latencies_us(call: Callable[[int], Any], indices: list[int]) -> np.ndarray:
    out = np.empty(len(indices), dtype=np.int64)
    clock = time.perf_counter_ns
    for j, i in enumerate(indices):
        t0 = clock()
        call(i)
        out[j] = clock() - t0
    return out / 1e3


def seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def study(args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="bench-spacing-")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    try:
        stream = saved_stream(args.n, root)
        n = len(stream.records)
        tf_size, tf_s = tf_gzip_bytes(stream.records, os.path.join(root, "tf.tfrecord.gz"))
        rng = np.random.default_rng(1)
        singles = rng.integers(0, n, args.reads).tolist()
        batches = [rng.permutation(n)[:BATCH] for _ in range(args.batches)]
        chunked: list[Chunked] = []
        per: PerRecord | None = None
        try:
            for spacing in args.spacings:
                chunks = deflate_stream(stream.data, spacing, pool)
                c = Chunked(stream, spacing, chunks, os.path.join(root, f"c{spacing}"))
                chunked.append(c)
                i = singles[0]
                if c.read(i) != stream.data[stream.starts[i] : stream.ends[i]]:
                    raise RuntimeError(f"{spacing}: a random read gave other bytes")
                got = [r[12:-4] for r in c.read_batch(batches[0])]
                if got != [stream.records[i] for i in batches[0]]:
                    raise RuntimeError(f"{spacing}: a random batch gave other records")
            per = PerRecord(stream, os.path.join(root, "per-record"))
            # Every measurement once per repeat, the spacings interleaved, the best
            # of the repeats kept per statistic: the machine is shared.
            best: dict[int, dict[str, float]] = {}
            for rep in range(args.repeats):
                print(f"  repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
                for c in chunked:
                    lat = latencies_us(c.read, singles)
                    stats = {
                        "deflate_s": seconds(
                            lambda c=c: deflate_stream(stream.data, c.spacing, pool)
                        ),
                        "median_us": float(np.median(lat)),
                        "p90_us": float(np.percentile(lat, 90)),
                        "batch_s": seconds(lambda c=c: [c.read_batch(b) for b in batches]),
                        "sequential_s": seconds(c.read_all),
                    }
                    b = best.setdefault(c.spacing, stats)
                    for k, v in stats.items():
                        b[k] = min(b[k], v)
                lat = latencies_us(per.read, singles)
                stats = {
                    "deflate_s": seconds(
                        lambda: [deflate_chunk(memoryview(r), True) for r in stream.records]
                    ),
                    "median_us": float(np.median(lat)),
                    "p90_us": float(np.percentile(lat, 90)),
                }
                b = best.setdefault(0, stats)
                for k, v in stats.items():
                    b[k] = min(b[k], v)
            rows = []
            for c in chunked:
                b, size = best[c.spacing], c.compressed + GZIP_FRAME
                restarts = len(c.coffsets) - 1
                rows.append(
                    {
                        "spacing": c.spacing,
                        "restarts": restarts,
                        "bytes": size,
                        "size_x": size / tf_size,
                        "restart_table_bytes": restarts * RESTART_ENTRY,
                        "median_us": b["median_us"],
                        "p90_us": b["p90_us"],
                        "random_batch_per_s": len(batches) * BATCH / b["batch_s"],
                        "sequential_per_s": n / b["sequential_s"],
                        "deflate_mb_s": len(stream.data) / b["deflate_s"] / 1e6,
                    }
                )
            b = best[0]
            per_record = {
                "bytes": per.compressed,
                "size_x": per.compressed / tf_size,
                "median_us": b["median_us"],
                "p90_us": b["p90_us"],
                "deflate_mb_s_one_thread": len(stream.data) / b["deflate_s"] / 1e6,
            }
        finally:
            for c in chunked:
                c.close()
            if per is not None:
                per.close()
        return {
            "elements": n,
            "uncompressed_bytes": len(stream.data),
            "tf_gzip_bytes": tf_size,
            "tf_gzip_write_mb_s": len(stream.data) / tf_s / 1e6,
            "rows": rows,
            "per_record": per_record,
            "threads": os.cpu_count(),
        }
    finally:
        pool.shutdown()
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------ report


def recommend(res: dict[str, Any]) -> tuple[int | None, str]:
    """The smallest spacing meeting both targets, and why."""
    ok = [
        r
        for r in res["rows"]
        if r["size_x"] <= TARGET_SIZE_X and r["median_us"] <= TARGET_MEDIAN_US
    ]
    if not ok:
        return None, (
            f"no spacing meets both targets (size <= {TARGET_SIZE_X:.2f}x TF's GZIP, "
            f"warm median <= {TARGET_MEDIAN_US:.0f} us)"
        )
    # Read cost grows with the spacing and size shrinks: the smallest spacing whose
    # size fits reads cheapest.
    pick = min(ok, key=lambda r: r["spacing"])
    return pick["spacing"], (
        f"the cheapest warm random read ({pick['median_us']:.0f} us median, "
        f"{pick['random_batch_per_s']:,.0f} records/s in random batches of {BATCH}) among the "
        f"spacings whose stream is within {TARGET_SIZE_X - 1:.0%} of TF's GZIP "
        f"({pick['size_x']:.3f}x)"
    )


def report(res: dict[str, Any]) -> None:
    print(
        f"\n{res['elements']:,} digits elements, {res['uncompressed_bytes'] / 1e6:.1f} MB "
        f"uncompressed; TF GZIP TFRecordWriter {res['tf_gzip_bytes'] / 1e6:.3f} MB "
        f"({res['tf_gzip_write_mb_s']:.0f} MB/s, one thread); deflate with "
        f"{res['threads']} threads\n"
    )
    print(
        "| restart spacing | restarts | GZIP MB | vs TF GZIP | restart table KB | "
        "warm read median us | p90 us | random batches of 256, records/s | "
        "sequential inflate, records/s | random / sequential | deflate MB/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["rows"]:
        s = r["spacing"]
        name = f"{s // KIB} KiB" if s < 1 << 20 else f"{s >> 20} MiB"
        print(
            f"| {name} | {r['restarts']:,} | {r['bytes'] / 1e6:.3f} | {r['size_x']:.3f}x | "
            f"{r['restart_table_bytes'] / 1e3:.1f} | {r['median_us']:,.1f} | {r['p90_us']:,.1f} | "
            f"{r['random_batch_per_s']:,.0f} | {r['sequential_per_s']:,.0f} | "
            f"{r['random_batch_per_s'] / r['sequential_per_s']:.3f} | {r['deflate_mb_s']:,.0f} |"
        )
    p = res["per_record"]
    print(
        f"| each record alone (per leaf) | {res['elements']:,} | {p['bytes'] / 1e6:.3f} | "
        f"{p['size_x']:.3f}x | - | {p['median_us']:,.1f} | {p['p90_us']:,.1f} | - | - | - | "
        f"{p['deflate_mb_s_one_thread']:,.0f} (1 thread) |"
    )
    spacing, why = recommend(res)
    print(f"\nrecommended spacing: {fmt(spacing and spacing / KIB, '.0f')} KiB: {why}")
    print(
        f"per record: {p['size_x']:.3f}x TF's GZIP "
        f"({'within' if p['size_x'] <= TARGET_SIZE_X else 'outside'} the 3% target), "
        f"{p['median_us']:.1f} us median read"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=60_000, help="elements (digits tiled)")
    ap.add_argument("--reads", type=int, default=5_000, help="random single reads")
    ap.add_argument("--batches", type=int, default=20, help="random batches of 256")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--spacings",
        type=lambda s: [int(x) * KIB for x in s.split(",")],
        default=SPACINGS,
        help="KiB, comma-separated (default 16,32,64,128,256,1024,4096)",
    )
    ap.add_argument("--quick", action="store_true", help="a tiny run, to check the script")
    args = ap.parse_args()
    if args.quick:
        args.n, args.reads, args.batches, args.repeats = 3_000, 200, 2, 1
        args.spacings = [16 * KIB, 256 * KIB]
    print(f"machine: {machine()}", flush=True)
    res = study(args)
    report(res)
    out = os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(out, exist_ok=True)
    spacing, why = recommend(res)
    with open(os.path.join(out, "compressed_spacing.json"), "w") as f:
        json.dump(
            {
                "machine": machine(),
                "argv": sys.argv,
                "results": res,
                "recommended": spacing,
                "why": why,
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()

"""Peak memory of saving and loading a 2 GB dataset generated on the fly.

Each phase runs in a fresh subprocess so its peak RSS (ru_maxrss) is its own:
save, load (tf.data), and stats (``superserial.stats``, without TensorFlow).
Target: under 1 GB for each.

    .venv/bin/python benchmarks/memory.py [--gb 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import superserial
phase, path, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if phase != "stats":  # stats needs no TensorFlow, whose import alone is ~0.6 GB
    import tensorflow as tf
t0 = time.perf_counter()
if phase == "save":
    ds = tf.data.Dataset.range(n).map(
        lambda i: {"blob": tf.random.stateless_uniform([size], seed=tf.stack([i, 7]), maxval=256, dtype=tf.int32),
                   "i": i})
    ds = ds.map(lambda e: {"blob": tf.cast(e["blob"], tf.uint8), "i": e["i"]})
    superserial.save(ds, path, progress=False)
    count = n
elif phase == "stats":
    count = superserial.stats(path).elements
else:
    count = 0
    for b in superserial.load(path, batch_size=256):
        count += int(b["i"].shape[0])
    assert count == n, (count, n)
dt = time.perf_counter() - t0
print(json.dumps({"phase": phase, "elements": count, "seconds": dt,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--element-kb", type=int, default=64)
    args = ap.parse_args()
    size = args.element_kb * 1024
    n = int(args.gb * 1e9 // size)
    root = tempfile.mkdtemp(prefix="superserial-mem-")
    path = os.path.join(root, "ds")
    try:
        for phase in ("save", "load", "stats"):
            out = (
                subprocess.run(
                    [sys.executable, "-c", CHILD, phase, path, str(n), str(size)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            r = json.loads(out)
            gb = n * size / 1e9
            print(
                f"{phase}: {r['elements']:,} elements x {args.element_kb} KiB = {gb:.2f} GB in {r['seconds']:.1f}s "
                f"({gb / r['seconds'] * 1000:,.0f} MB/s), peak RSS {r['peak_rss_mb']:,.0f} MB",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

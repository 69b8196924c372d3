"""Peak memory of saving and reading a 2 GB dataset generated on the fly.

Each phase runs in a fresh subprocess so its peak RSS (ru_maxrss) is its own:
save, load (tf.data), numpy (``iter_batches``), arrow (``iter_arrow``: record
batches), torch (``TorchDataset`` in a DataLoader with 2 workers: the main
process and the largest worker), torch_batched (``TorchDataset(path,
batch_size=256)``, the same) and stats (``superserial.stats``); the last five
without TensorFlow.
Target: under 1 GB for each process.

    .venv/bin/python benchmarks/memory.py [--gb 2] [--phases save,torch_batched]
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
if phase in ("save", "load"):  # the others need no TensorFlow, whose import alone is ~0.6 GB
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
elif phase == "numpy":
    import superserial.numpy as ssnp
    count = sum(len(b["i"]) for b in ssnp.iter_batches(path, 256))
    assert count == n, (count, n)
elif phase == "arrow":  # to_arrow's streaming form: record batches, one at a time
    import superserial.numpy as ssnp
    count = sum(rb.num_rows for rb in ssnp.load(path).iter_arrow(256))
    assert count == n, (count, n)
elif phase == "torch":
    import torch.utils.data
    import superserial.torch as sst
    loader = torch.utils.data.DataLoader(
        sst.TorchDataset(path), batch_size=256, num_workers=2, collate_fn=sst.collate)
    count = sum(int(b["i"].shape[0]) for b in loader)
    assert count == n, (count, n)
elif phase == "torch_batched":  # whole batches decoded in the workers, sent through reused slots
    import torch.utils.data
    import superserial.torch as sst
    loader = torch.utils.data.DataLoader(
        sst.TorchDataset(path, batch_size=256), batch_size=None, num_workers=2)
    count = sum(int(b["i"].shape[0]) for b in loader)
    assert count == n, (count, n)
else:
    count = 0
    for b in superserial.load(path, batch_size=256):
        count += int(b["i"].shape[0])
    assert count == n, (count, n)
dt = time.perf_counter() - t0
# RUSAGE_CHILDREN: the largest DataLoader worker's peak (workers are processes of their own).
print(json.dumps({"phase": phase, "elements": count, "seconds": dt,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "child_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--element-kb", type=int, default=64)
    ap.add_argument(
        "--phases",
        default="save,load,numpy,arrow,torch,torch_batched,stats",
        help="comma-separated, in order (save first: the others read what it saved)",
    )
    args = ap.parse_args()
    size = args.element_kb * 1024
    n = int(args.gb * 1e9 // size)
    root = tempfile.mkdtemp(prefix="superserial-mem-")
    path = os.path.join(root, "ds")
    try:
        for phase in args.phases.split(","):
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
                f"({gb / r['seconds'] * 1000:,.0f} MB/s), peak RSS {r['peak_rss_mb']:,.0f} MB"
                + (
                    f", largest worker {r['child_peak_rss_mb']:,.0f} MB"
                    if phase.startswith("torch")
                    else ""
                ),
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

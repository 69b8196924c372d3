"""glibc's mmap threshold under tf ``load``: TensorFlow's 128 KiB, or lifted (16 MiB).

TensorFlow 2.21 fixes glibc's mmap threshold at 128 KiB when a process makes its
first ``from_generator`` iterator; superserial's tf.data generators lift it again
(``superserial/base/malloc.py``). The setting is per process and made once, so
this compares processes: each reads ``--epochs`` epochs of a row of
``benchmarks/remote.py`` over nginx +50 ms (60,000 mnist-shaped records, 8
shards), alternately with the default and with ``SUPERSERIAL_MMAP_THRESHOLD=0``
(TensorFlow's setting kept), for ``--rounds`` rounds. Per epoch, counted from the
first batch on: el/s, the process's CPU seconds and its minor page faults. It
prints their medians.

With ``--cache``, each epoch reads through a fresh cache directory bounded at 25% of
the dataset, as remote.py's cache rows do.

    PYTHONPATH=src .venv/bin/python benchmarks/mmap_threshold.py
    PYTHONPATH=src .venv/bin/python benchmarks/mmap_threshold.py --cache --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

N, SHARDS, WINDOW = 60_000, 8, 3_000
ENV = "SUPERSERIAL_MMAP_THRESHOLD"


def child(row: str, url: str, epochs: int, limit: int | None) -> None:
    """Reads the epochs in this process; prints a JSON list of (el/s, CPU s, faults)."""
    import remote_rows

    read = getattr(remote_rows, row)
    out = []
    for _ in range(epochs):
        cache_dir = tempfile.mkdtemp() if limit else None
        cache = {"cache_dir": cache_dir, "cache_limit": limit} if limit else {}
        count, first = 0, None
        for k in read(url, N, WINDOW, cache):
            count += k
            if first is None:
                first, counted = time.perf_counter(), count
                cpu, faults = (
                    time.process_time(),
                    resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
                )
        assert first is not None, "no batch"
        n = count - counted
        out.append(
            (
                n / (time.perf_counter() - first),
                (time.process_time() - cpu) * N / n,
                (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) * N / n,
            )
        )
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--row", default="tf_sequential", help="a row of benchmarks/remote_rows.py")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=4, help="epochs per process")
    ap.add_argument("--cache", action="store_true", help="a cache bounded at 25%% of the data")
    ap.add_argument("--child", nargs=2, metavar=("URL", "LIMIT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.row, a.child[0], a.epochs, int(a.child[1]) or None)
        return

    import remote_net
    import remote_rows

    with remote_net.nginx_behind_proxy(0.05, "ss-mmap-") as (proxy, www):
        path = os.path.join(www, "ds")
        remote_rows.save_mnist(path, N, SHARDS)
        data = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        limit = data // 4 if a.cache else 0
        results: dict[str, list[list[float]]] = {"lifted": [], "kept": []}
        for r in range(a.rounds):
            for arm in ("lifted", "kept") if r % 2 == 0 else ("kept", "lifted"):
                env = {k: v for k, v in os.environ.items() if k != ENV}
                if arm == "kept":
                    env[ENV] = "0"
                argv = [sys.executable, __file__, "--row", a.row, "--epochs", str(a.epochs)]
                argv += ["--child", f"{proxy.url}/ds", str(limit)]
                done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
                if done.returncode:
                    raise SystemExit(done.stderr[-3000:])
                results[arm].extend(json.loads(done.stdout.strip().splitlines()[-1]))
        cache = f", cache bounded at {limit:,} B" if limit else ", no cache"
        print(f"{a.row} over nginx +50 ms{cache}: {a.rounds} rounds x {a.epochs} epochs per arm")
        print("| threshold | el/s (median) | CPU s/epoch | minor faults/epoch | epochs (el/s, k) |")
        print("|---|---:|---:|---:|---|")
        for arm, label in (("lifted", "lifted, 16 MiB"), ("kept", "TensorFlow's 128 KiB (=0)")):
            v = results[arm]
            rates = " ".join(f"{x[0] / 1e3:.0f}" for x in v)
            print(
                f"| {label} | {statistics.median(x[0] for x in v):,.0f} "
                f"| {statistics.median(x[1] for x in v):.3f} "
                f"| {statistics.median(x[2] for x in v):,.0f} | {rates} |"
            )


if __name__ == "__main__":
    main()

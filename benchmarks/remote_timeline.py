"""Where one remote epoch's time goes: a row of benchmarks/remote.py, epoch by epoch.

For each epoch of a row (a fresh reader each time) it prints when the first batch
came, when the last one came, how long the loop took to end after it (the
iterator's teardown, which a ``for`` loop waits for), and the el/s, requests and
bytes of the epoch, all as ``benchmarks/remote.py``'s ``measure`` takes them. nginx serves
mnist-shaped data behind the repo's proxy (``tests/netproxy.py``), as in
``benchmarks/remote.py``.

    PYTHONPATH=src .venv/bin/python benchmarks/remote_timeline.py --row tf_windowed
    PYTHONPATH=src .venv/bin/python benchmarks/remote_timeline.py --row tf_sequential \\
        --autotune-off
    PYTHONPATH=src .venv/bin/python benchmarks/remote_timeline.py --row torch_windowed \\
        --share-amplification 2.0

``--local`` reads the same files from local disk instead (requests and bytes then 0):
the rate the reader itself allows on this machine, the ceiling it meets remotely.
``--autotune-off`` sets ``tf.data.Options().autotune.enabled = False`` on the tf
rows' datasets; ``--share-amplification`` replaces
``superserial.read.group_reads.SHARE_AMPLIFICATION`` (DataLoader workers' unit reads),
``--headless-bytes`` its ``HEADLESS_BYTES`` (0: every cold group reads a head first).
``--cache`` reads through a fresh ``cache_dir`` each epoch, ``cache_limit`` 25% of the
dataset's files, as ``benchmarks/remote.py``'s cache rows.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import remote_net as net  # forks the servers before TensorFlow is imported
from remote import dataset_bytes, measure

ROWS = ("tf_sequential", "numpy_sequential", "torch_sequential", "tf_windowed", "torch_windowed")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--row", choices=ROWS, default="tf_windowed")
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--latency", type=float, default=50.0, help="ms")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--autotune-off", action="store_true")
    ap.add_argument("--share-amplification", type=float, default=None)
    ap.add_argument("--headless-bytes", type=int, default=None)
    ap.add_argument(
        "--cache", action="store_true", help="a fresh cache_dir each epoch, limited to 25%%"
    )
    ap.add_argument(
        "--local",
        action="store_true",
        help="read the row's files from local disk, not through nginx and the proxy: "
        "what the same reader does when the network costs nothing",
    )
    args = ap.parse_args()
    with net.nginx_behind_proxy(args.latency / 1000, "ss-timeline-") as (proxy, www):
        _run(args, proxy, www)


def _run(args: argparse.Namespace, proxy: net.Proxy, www: str) -> None:
    import tensorflow as tf

    import remote_rows as rr
    import superserial
    from superserial.read import group_reads

    if args.share_amplification is not None:
        group_reads.SHARE_AMPLIFICATION = args.share_amplification
    if args.headless_bytes is not None:
        group_reads.HEADLESS_BYTES = args.headless_bytes
    if args.autotune_off:
        load = superserial.load

        def without_autotune(*a: Any, **k: Any) -> Any:
            options = tf.data.Options()
            options.autotune.enabled = False
            return load(*a, **k).with_options(options)

        superserial.load = without_autotune  # type: ignore[assignment]
    local = os.path.join(www, "ds")
    rr.save_mnist(local, args.n, 8)
    window = args.n // 20
    rr.warm_up(local, args.n, window)
    row: Callable[..., Iterator[int]] = getattr(rr, args.row)
    where = "local disk" if args.local else f"nginx +{args.latency:g} ms"
    where += ", cache_dir bounded at 25%" if args.cache else ""
    print(f"{args.row}, {args.n} elements, W = {window}, {where}", flush=True)
    print(
        "epoch | first batch s | last batch s | teardown s | el/s after the first | requests | MB"
    )
    url = local if args.local else proxy.url + "/ds"
    limit = dataset_bytes(local) // 4
    cache_dir = os.path.join(os.path.dirname(www), "cache")
    for e in range(args.epochs):
        cache: dict[str, Any] = {}
        if args.cache:
            shutil.rmtree(cache_dir, ignore_errors=True)
            cache = {"cache_dir": cache_dir, "cache_limit": limit}
        r = measure(proxy, lambda cache=cache: row(url, args.n, window, cache), args.n, math.inf)
        if "error" in r or not r["full_epoch"] or r["el_s"] is None:
            raise SystemExit(f"expected a whole epoch of {args.n} elements, got {r}")
        print(
            f"{e} | {r['first_s']:.2f} | {r['last_s']:.2f} | {r['seconds'] - r['last_s']:.2f} | "
            f"{r['el_s']:,.0f} | {r['requests']:,} | {r['bytes'] / 1e6:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""The peers of benchmarks/remote.py, run in their own venv (``make bench-remote-peers``).

mosaicml-streaming and litdata pin numpy and torch to other versions than the dev
venv's, so benchmarks/remote.py runs this script with the peers' interpreter; it
never imports superserial. Its last stdout line is a JSON answer.

    python remote_peers.py write ARRAYS.npz OUT       # OUT/mds (MDSWriter), OUT/litdata (optimize)
    python remote_peers.py read mosaic|litdata s3://BUCKET CACHE LIMIT N SECONDS

``read`` points both at ``AWS_ENDPOINT_URL`` (the proxy in front of moto), reads
with ``shuffle=True`` through a DataLoader with 2 workers (batches of 256) for one
epoch or ``SECONDS``, with the cache bounded at ``LIMIT`` bytes (0: unbounded), and
reports what the peer refused.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any

import numpy as np

BATCH = 256
WORKERS = 2
_ARRAYS: dict[str, np.ndarray] = {}


def _stub_torchvision() -> None:
    """Stands in for torchvision, which ``import streaming`` imports for its vision datasets.

    PyPI's torchvision wheel is built against the CUDA torch and fails to import next to
    the CPU torch wheel (``operator torchvision::nms does not exist``); the CPU build is
    not on the package index here. Nothing measured uses torchvision: only
    ``streaming.vision`` (not used) names ``VisionDataset`` and ``to_tensor``.
    """
    import importlib.machinery
    import types

    from torch.utils.data import Dataset

    def to_tensor(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("torchvision is stubbed in benchmarks/remote_peers.py")

    mods = {
        name: types.ModuleType(name)
        for name in (
            "torchvision",
            "torchvision.datasets",
            "torchvision.transforms",
            "torchvision.transforms.functional",
        )
    }
    for name, mod in mods.items():  # transformers asks find_spec whether it is there
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mods["torchvision.datasets"].VisionDataset = Dataset  # type: ignore[attr-defined]
    mods["torchvision.datasets"].CIFAR10 = Dataset  # type: ignore[attr-defined]
    mods["torchvision.transforms.functional"].to_tensor = to_tensor  # type: ignore[attr-defined]
    mods["torchvision"].datasets = mods["torchvision.datasets"]  # type: ignore[attr-defined]
    mods["torchvision"].transforms = mods["torchvision.transforms"]  # type: ignore[attr-defined]
    mods["torchvision.transforms"].functional = mods["torchvision.transforms.functional"]  # type: ignore[attr-defined]
    sys.modules.update(mods)


def _item(npz: str, i: int) -> dict[str, Any]:
    if not _ARRAYS:  # litdata's workers are spawned: each loads the arrays once
        _ARRAYS.update(np.load(npz))
    return {"image": _ARRAYS["image"][i], "label": int(_ARRAYS["label"][i])}


def write(npz: str, out: str) -> dict[str, Any]:
    from litdata import optimize
    from streaming import MDSWriter

    _ARRAYS.update(np.load(npz))
    n = len(_ARRAYS["label"])
    shard_bytes = (_ARRAYS["image"].nbytes + _ARRAYS["label"].nbytes) // 8 * 11 // 10  # ~8
    times = {}
    t = time.perf_counter()
    columns = {"image": "ndarray:uint8:28,28", "label": "int64"}
    with MDSWriter(out=os.path.join(out, "mds"), columns=columns, size_limit=shard_bytes) as w:
        for i in range(n):
            w.write(_item(npz, i))
    times["mds_s"] = time.perf_counter() - t
    t = time.perf_counter()
    optimize(
        fn=functools.partial(_item, npz),
        inputs=list(range(n)),
        output_dir=os.path.join(out, "litdata"),
        chunk_bytes=shard_bytes,
        num_workers=1,
    )
    times["litdata_s"] = time.perf_counter() - t
    for fmt in ("mds", "litdata"):
        d = os.path.join(out, fmt)
        files = [f for f in os.listdir(d) if not f.endswith(".json")]
        times[f"{fmt}_files"] = len(files)
        times[f"{fmt}_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return times


def _import(peer: str) -> None:
    """Imports the peer before its clock starts (torch and its own modules: seconds)."""
    if peer == "mosaic":
        import streaming  # noqa: F401
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    else:
        # litdata downloads through obstore, whose client refuses a plain http:// endpoint
        # (the proxy's; real S3 is https) with "builder error": litdata never passes
        # allow_http. Its client options get it here, and nothing else changes.
        import litdata.streaming.downloader as dl

        dl._OBSTORE_CLIENT_OPTIONS = {**dl._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}


def _loader(peer: str, bucket: str, cache: str, limit: int | None) -> tuple[Any, str]:
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    if peer == "mosaic":
        from streaming import StreamingDataset
        from torch.utils.data import DataLoader

        os.environ["S3_ENDPOINT_URL"] = endpoint  # mosaic's own name for it
        ds = StreamingDataset(
            remote=f"{bucket}/mds",
            local=cache,
            shuffle=True,
            shuffle_seed=0,
            batch_size=BATCH,
            cache_limit=limit,
        )
        what = "StreamingDataset(shuffle=True), DataLoader 2 workers"
        return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS), what
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(
        f"{bucket}/litdata",
        cache_dir=cache,
        shuffle=True,
        seed=0,
        max_cache_size=limit if limit else "100GB",
        storage_options={"endpoint_url": endpoint},
    )
    what = "StreamingDataset(shuffle=True), StreamingDataLoader 2 workers"
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS), what


def read(peer: str, bucket: str, cache: str, limit: int, n: int, seconds: float) -> dict[str, Any]:
    _import(peer)
    t0 = time.perf_counter()
    try:
        loader, what = _loader(peer, bucket, cache, limit or None)
        count = first_count = 0
        t_first = None
        it = iter(loader)
        for b in it:
            count += len(b["label"])
            now = time.perf_counter()
            if t_first is None:
                t_first, first_count = now, len(b["label"])
            if now - t_first >= seconds and count < n:
                break
        t_end = time.perf_counter()
        del it  # torch's iterator stops its workers when it goes (a partial epoch)
    except Exception as e:  # noqa: BLE001 - a refused setting is the answer
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
        why = lines[0][:220] + ("" if len(lines) == 1 else " ... " + lines[-1][:220])
        return {"error": f"{type(e).__name__}: {why}"}
    steady = count - first_count
    return {
        "what": what,
        "elements": count,
        "full_epoch": count >= n,
        "seconds": t_end - t0,
        "first_s": None if t_first is None else t_first - t0,
        "el_s": steady / (t_end - t_first) if t_first and steady and t_end > t_first else None,
    }


def main() -> None:
    _stub_torchvision()
    cmd, *rest = sys.argv[1:]
    if cmd == "write":
        out = write(*rest)
    else:
        peer, bucket, cache, limit, n, seconds = rest
        out = read(peer, bucket, cache, int(limit), int(n), float(seconds))
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the peers' loaders leave threads and shared memory that slow a clean exit


if __name__ == "__main__":
    main()

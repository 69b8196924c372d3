"""Random-access readers over a cache smaller than the dataset: pinned shards, the rest remote.

Against a real S3 API (moto's server), through the repo's proxy, which counts the
requests and bytes that really cross it. Downloads into the cache are held back
where a test needs it by gating ``fs.copy_file`` (the storage call the cache
downloads with) on an event, so "before" and "after" are states, not timings.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pytest

import superserial
import superserial.numpy as ssnp
from netproxy import NetProxy
from superserial.errors import CorruptDataError
from superserial.format.layout import read_header
from superserial.read.cache.directory import entry_of
from superserial.storage import fs
from test_cache import _disk_bytes, _eight_on_s3

N = 120
BATCH = 16


@pytest.fixture
def proxy(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[NetProxy]:
    """A proxy in front of the S3 server, the S3 client pointed at it."""
    with NetProxy(s3_server) as px:
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": px.url})
        fsspec.filesystem("s3").clear_instance_cache()
        yield px
    fsspec.filesystem("s3").clear_instance_cache()


@pytest.fixture
def eight(s3_bucket: str, tmp_path: Any) -> tuple[str, str, int]:
    """(URL, local path, 30% of the bytes of shards and indexes) of 8 shards on S3."""
    url, local, total = _eight_on_s3(s3_bucket, tmp_path)
    return url, local, total * 3 // 10


class _Gate:
    """Holds every download of the cache (``fs.copy_file``) until opened; counts them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open, self.started, self.done = threading.Event(), [], []
        real = fs.copy_file

        def gated(src: str, dst: str) -> Any:
            self.started.append(src)
            self.open.wait(60)
            out = real(src, dst)
            self.done.append(src)
            return out

        monkeypatch.setattr(fs, "copy_file", gated)


def _pinned(ds: Any) -> int:
    pins = ds.cache_pins
    assert pins is not None
    assert pins.wait(60)
    return len(pins.ready)


def _settled(cdir: Any, entries: int) -> None:
    """Waits (by the cache's state) until ``entries`` entries are stored and no download runs."""
    for _ in range(6000):
        if len(os.listdir(cdir / "entries")) == entries and not os.listdir(cdir / "tmp"):
            return
        threading.Event().wait(0.01)
    raise AssertionError(
        f"expected {entries} entries in {cdir}, got {os.listdir(cdir / 'entries')}"
    )


def _key(e: Any) -> tuple[int, list[float], bytes]:
    """An element of any reader as ``(id, x, s)``."""
    s = e["s"]
    s = s.item() if isinstance(s, np.ndarray) else s
    return int(np.asarray(e["id"])), np.asarray(e["x"]).tolist(), s


def _unbatch(b: Any) -> list[tuple[int, list[float], bytes]]:
    return [_key({k: v[m] for k, v in b.items()}) for m in range(len(b["id"]))]


ORDER = np.random.default_rng(5).permutation(N)


def _open(reader: str, url: str, **kw: Any) -> Any:
    if reader.startswith("numpy"):
        return ssnp.load(url, **kw)
    if reader == "torch_map":
        import superserial.torch as sst

        return sst.MapDataset(url, **kw)
    if reader == "grain":
        import superserial.grain as ssg

        return ssg.DataSource(url, **kw)
    return superserial.load(url, shuffle=True, seed=3, **kw)


def _epoch(reader: str, ds: Any) -> list[tuple[int, list[float], bytes]]:
    """Every element of ``ds`` read in a shuffled order, as ``(id, x, s)``."""
    batches = [ORDER[j : j + BATCH].tolist() for j in range(0, N, BATCH)]
    if reader == "numpy_get_batch":
        return [e for b in batches for e in _unbatch(ds.get_batch(b))]
    if reader == "torch_map":
        return [_key(e) for b in batches for e in ds.__getitems__(b)]
    if reader in ("numpy_getitem", "grain"):
        return [_key(ds[i]) for i in ORDER.tolist()]
    return [_key({k: v.numpy() for k, v in e.items()}) for e in ds]


def _source_of(reader: str, ds: Any) -> Any:
    """The NumpyDataset behind a reader (None for tf.data)."""
    if reader.startswith("numpy"):
        return ds
    return None if reader == "tf_shuffle" else ds.source


def _same(got: list[Any], local: str) -> None:
    want = [_key(e) for e in ssnp.load(local)]
    assert sorted(got) == want


READERS = ["numpy_get_batch", "numpy_getitem", "torch_map", "grain", "tf_shuffle"]


@pytest.mark.parametrize("reader", READERS)
def test_a_cache_smaller_than_the_dataset_pins_what_fits_and_never_holds_more(
    reader: str, eight: tuple[str, str, int], tmp_path: Any, proxy: NetProxy
) -> None:
    url, local, limit = eight
    cdir = tmp_path / "cache"
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _disk_bytes(cdir))
            stop.wait(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(2):  # the second reader finds the first's pins cached
            ds = _open(reader, url, cache_dir=cdir, cache_limit=limit)
            _same(_epoch(reader, ds), local)
            source = _source_of(reader, ds)
            if source is not None:
                assert _pinned(source) == 2  # 8 shards in 30%: two whole ones
            _settled(cdir, 2)
            del ds, source
    finally:
        stop.set()
        watcher.join()
    assert 0 < peak[0] <= limit


def test_the_first_batch_waits_for_no_download(
    eight: tuple[str, str, int], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, limit = eight
    gate = _Gate(monkeypatch)
    ds = ssnp.load(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    batch = ds.get_batch([0, 50, 119, 7])
    np.testing.assert_array_equal(batch["id"], [0, 50, 119, 7])
    assert gate.done == []  # read remotely: no pinned shard was there yet
    assert ds.cache_pins is not None and ds.cache_pins.ready == []
    gate.open.set()
    assert _pinned(ds) == 2
    assert len(gate.done) == 4  # two shards, each with its index
    np.testing.assert_array_equal(ds.get_batch([0, 50, 119, 7])["id"], [0, 50, 119, 7])


@pytest.mark.parametrize("reader", ["numpy_get_batch", "torch_map", "tf_shuffle"])
def test_a_second_epoch_fetches_only_the_shards_not_pinned(
    reader: str,
    eight: tuple[str, str, int],
    tmp_path: Any,
    proxy: NetProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, local, limit = eight
    cdir = tmp_path / "cache"
    gate = _Gate(monkeypatch)  # the first epoch runs before any shard is pinned
    ds = _open(reader, url, cache_dir=cdir, cache_limit=limit)
    _same(_epoch(reader, ds), local)
    first = proxy.requests, proxy.body_bytes
    gate.open.set()
    _settled(cdir, 2)
    source = _source_of(reader, ds)
    if source is not None:
        assert _pinned(source) == 2
    proxy.reset()
    _same(_epoch(reader, ds), local)
    assert 0 < proxy.requests < first[0]
    assert proxy.body_bytes < first[1]


def test_a_corrupt_pinned_shard_is_an_error_naming_it_and_never_cached(
    eight: tuple[str, str, int], tmp_path: Any
) -> None:
    import superserial.torch as sst

    url, local, limit = eight
    bad = read_header(local).shards[1]  # pinned (the first two fit)
    with open(os.path.join(local, bad.file), "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x40  # same size, another CRC
    fsspec.filesystem("s3").pipe(f"{url}/{bad.file}", bytes(data))
    cdir = tmp_path / "cache"
    m = sst.MapDataset(url, cache_dir=cdir, cache_limit=limit)
    assert m.source.cache_pins is not None and m.source.cache_pins.wait(60)
    # Record N - 1 is in shard 7, whose records are sound: the pin of shard 1 is not.
    with pytest.raises(CorruptDataError, match=f"{url}/{bad.file}.*crc32c.*not cached"):
        m[N - 1]
    entries = [os.listdir(cdir / "entries" / n) for n in os.listdir(cdir / "entries")]
    assert all(bad.file not in files for files in entries)
    assert os.listdir(cdir / "tmp") == []


def test_forked_dataloader_workers_read_the_pins_and_hold_no_lock_of_the_parent(
    eight: tuple[str, str, int],
    tmp_path: Any,
    proxy: NetProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    import superserial.torch as sst

    url, local, limit = eight
    cdir = tmp_path / "cache"
    gate = _Gate(monkeypatch)
    m = sst.MapDataset(url, cache_dir=cdir, cache_limit=limit)
    loader = torch.utils.data.DataLoader(
        m,
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
        collate_fn=lambda batch: batch,
        generator=torch.Generator().manual_seed(0),
    )

    def epoch() -> list[Any]:
        return [_key(e) for b in loader for e in b]

    while not gate.started:  # the workers fork while a download holds its fetch lock
        threading.Event().wait(0.01)
    _same(epoch(), local)
    first = proxy.requests
    gate.open.set()
    assert _pinned(m.source) == 2
    # The lock that download held at the fork is free: the workers closed their copies.
    lock = os.path.join(cdir, "fetch", entry_of(url, read_header(local).shards[0]).name + ".lock")
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    proxy.reset()
    _same(epoch(), local)  # the same workers: they find the pinned copies themselves
    assert 0 < proxy.requests < first

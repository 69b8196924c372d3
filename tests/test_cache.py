"""The local cache of remote datasets (``cache_dir=``), against a real S3 API (moto's server).

Datasets are saved locally and uploaded with fsspec, so these tests need only
reading from S3. A cache hit is shown by deleting the remote shards after the
first read: the second read can only come from the cache.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import assert_same_value, canon_np
from superserial.base import sizes
from superserial.errors import CorruptDataError
from superserial.format.layout import index_name, read_header
from superserial.format.record_index import crc32c
from superserial.read.cache import directory as cache

N = 120
SHARDS = 3


def _source(offset: int = 0) -> tf.data.Dataset:
    i = tf.data.Dataset.range(N)
    return i.map(
        lambda k: {
            "id": k + offset,
            "x": tf.fill([k % 5 + 3], tf.cast(k + offset, tf.float32)),
            "s": tf.strings.as_string(k * 7 + offset),
        }
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> dict[int, str]:
    """Two local datasets of the same shapes and shard names, saved once: offset -> path."""
    out = {}
    for offset in (0, 1000):
        out[offset] = str(tmp_path_factory.mktemp("saved") / f"ds{offset}")
        superserial.save(_source(offset), out[offset], num_shards=SHARDS)
    # Saves tag their shard names; give the second the first's names, as an
    # overwrite by another writer (or an older version) might.
    names = [s.file for s in read_header(out[0]).shards]
    hpath = os.path.join(out[1000], "header.json")
    with open(hpath) as f:
        obj = json.load(f)
    for shard, name in zip(obj["shards"], names, strict=True):
        for old, new in ((shard["file"], name), (shard["index"]["file"], name + ".index")):
            os.rename(os.path.join(out[1000], old), os.path.join(out[1000], new))
        shard["file"], shard["index"]["file"] = name, name + ".index"
    with open(hpath, "w") as f:
        json.dump(obj, f)
    return out


def _upload(local: str, url: str) -> str:
    """Uploads the files of the local dataset ``local`` to ``url`` (replacing what is there)."""
    import fsspec

    s3 = fsspec.filesystem("s3")
    if s3.exists(url):
        s3.rm(url, recursive=True)
    s3.put(local + "/", url + "/", recursive=True)
    s3.invalidate_cache()
    return local


def _remove_remote_shards(url: str) -> None:
    """Deletes every remote file but the header: from now on only a cache can serve shards."""
    import fsspec

    s3 = fsspec.filesystem("s3")
    s3.invalidate_cache()
    for f in s3.ls(url):
        if not f.endswith("header.json"):
            s3.rm(f)
    s3.invalidate_cache()


def _entries(cache_dir: Any) -> list[str]:
    return sorted(os.listdir(os.path.join(cache_dir, "entries")))


def _leftovers(cache_dir: Any) -> list[str]:
    return os.listdir(os.path.join(cache_dir, "tmp"))


@pytest.fixture
def remote(s3_bucket: str, saved: dict[int, str]) -> tuple[str, str]:
    """(URL of a dataset on the S3 server, local path of the same dataset)."""
    url = f"{s3_bucket}/ds"
    return url, _upload(saved[0], url)


def _np_elements(ds: Any) -> list[Any]:
    return [canon_np(e) for e in ds]


READERS = ["numpy_iter", "numpy_batch", "torch_map", "torch_iter", "grain", "tf", "tf_shuffle"]


def _read(reader: str, path: str, **kw: Any) -> list[Any]:
    """Every element through one reader, in a comparable form."""
    if reader == "numpy_iter":
        return _np_elements(ssnp.load(path, **kw))
    if reader == "numpy_batch":
        ds = ssnp.load(path, **kw)
        return [canon_np(e) for e in ds.get_elements(list(range(len(ds))))]
    if reader in ("torch_map", "torch_iter"):
        import superserial.torch as sst

        if reader == "torch_map":
            m = sst.MapDataset(path, **kw)
            items = [m[i] for i in range(len(m))]
        else:
            items = list(sst.TorchDataset(path, **kw))
        return [{k: np.asarray(v) if k != "s" else v for k, v in e.items()} for e in items]
    if reader == "grain":
        import superserial.grain as ssg

        src = ssg.DataSource(path, **kw)
        return [canon_np(src[i]) for i in range(len(src))]
    ds = superserial.load(path, shuffle=reader == "tf_shuffle", seed=3, **kw)
    return [{k: v.numpy() for k, v in e.items()} for e in ds]


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, dict) and not isinstance(next(iter(x.values())), tuple):
            assert_same_value(x, y, where=f"element {i}")
        else:
            assert x == y, f"element {i}"


@pytest.mark.parametrize("reader", READERS)
def test_first_read_fetches_then_reads_the_cache_bit_exact(
    reader: str, remote: tuple[str, str], tmp_path: Any
) -> None:
    url, local = remote
    want = _read(reader, local)
    cdir = tmp_path / "cache"
    first = _read(reader, url, cache_dir=cdir, cache_limit="10MB")
    _same(want, first)
    assert len(_entries(cdir)) == SHARDS
    _remove_remote_shards(url)
    second = _read(reader, url, cache_dir=cdir, cache_limit="10MB")
    _same(want, second)
    with pytest.raises(Exception):  # noqa: B017 - without the cache the shards are gone
        _read(reader, url)
    assert not _leftovers(cdir)


def test_hits_do_not_fetch_and_views_go_with_their_reader(
    remote: tuple[str, str], tmp_path: Any
) -> None:
    url, _ = remote
    header = read_header(url)
    cdir = str(tmp_path / "cache")
    one = cache.localize(url, header, range(SHARDS), cdir)
    assert len(one.fetched) == SHARDS
    two = cache.localize(url, header, [2, 0], cdir)
    assert two.fetched == []
    assert [os.path.basename(f) for f in two.files] == [header.shards[k].file for k in (2, 0)]
    assert one.path != two.path and os.path.isdir(two.path)
    assert sorted(os.listdir(os.path.join(cdir, "views"))) == sorted(
        x
        for v in (one.path, two.path)
        for x in (os.path.basename(v), os.path.basename(v) + ".lock")
    )
    # A whole view is an ordinary dataset.
    assert superserial.verify(one.path).ok
    del one, two
    gc.collect()
    assert os.listdir(os.path.join(cdir, "views")) == []
    ds = ssnp.load(url, cache_dir=cdir)
    view = ds.path
    copy = pickle.loads(pickle.dumps(ds))  # as into a DataLoader or Grain worker
    assert _np_elements(copy) == _np_elements(ds)
    del copy
    gc.collect()
    assert os.path.isdir(view)  # a copy holds nothing: the original keeps the view
    del ds
    gc.collect()
    assert not os.path.exists(view)
    with pytest.raises(ValueError, match="expected a cache_dir with cache_limit"):
        ssnp.load(url, cache_limit="1GB")


def test_leftovers_of_dead_processes_go_and_live_downloads_stay(
    remote: tuple[str, str], tmp_path: Any
) -> None:
    import fcntl

    url, _ = remote
    cdir = tmp_path / "cache"
    ssnp.load(url, cache_dir=cdir)
    tmp, entry = cdir / "tmp", _entries(cdir)[0]
    names = [f"1-aa-{entry}", f"2-bb-{entry}", "3-cc-evicted"]
    for name in names:
        (tmp / name).mkdir()
        (tmp / name / "x").write_bytes(b"partial")
    fd = os.open(cdir / "fetch" / f"{entry}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live download of that entry
        ssnp.load(url, cache_dir=cdir)
        assert sorted(os.listdir(tmp)) == names[:2]
    finally:
        os.close(fd)
    ssnp.load(url, cache_dir=cdir)  # the download's lock is free: it died
    assert os.listdir(tmp) == []


@pytest.mark.parametrize("which", ["shard", "index"])
def test_a_bad_download_is_an_error_and_never_cached(
    which: str, remote: tuple[str, str], tmp_path: Any
) -> None:
    import fsspec

    url, local = remote
    header = read_header(local)
    shard = header.shards[1]
    name = shard.file if which == "shard" else shard.index.file  # type: ignore[union-attr]
    with open(os.path.join(local, name), "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x40  # same size, another CRC
    fsspec.filesystem("s3").pipe(f"{url}/{name}", bytes(data))
    cdir = tmp_path / "cache"
    with pytest.raises(CorruptDataError, match=f"{url}/{name}.*crc32c") as e:
        ssnp.load(url, cache_dir=cdir)
    assert "not cached" in str(e.value)
    assert len(_entries(cdir)) == 1  # shard 0, fetched before the bad one; not shard 1
    assert not _leftovers(cdir)
    with pytest.raises(CorruptDataError):  # and it is not taken from the cache next time
        ssnp.load(url, cache_dir=cdir)


def test_lru_evicts_the_least_recently_used_and_open_readers_keep_their_files(
    remote: tuple[str, str], tmp_path: Any
) -> None:
    url, local = remote
    header = read_header(url)
    sizes = [s.bytes + s.index.bytes for s in header.shards]  # type: ignore[union-attr]
    limit = sizes[0] + sizes[1] + sizes[2] - 1  # room for two of the three, never three
    cdir = tmp_path / "cache"
    kw = {"cache_dir": cdir, "cache_limit": limit}
    readers = [ssnp.load(url, shard=(k, SHARDS), **kw) for k in (0, 1)]
    assert len(_entries(cdir)) == 2
    ssnp.load(url, shard=(0, SHARDS), **kw)  # shard 0 used again: shard 1 is now the oldest
    readers.append(ssnp.load(url, shard=(2, SHARDS), **kw))
    kept = cache.localize(url, header, [0, 2], cdir, limit)
    assert kept.fetched == []  # 0 and 2 stayed, 1 went
    assert len(_entries(cdir)) == 2
    assert cache.localize(url, header, [1], cdir, limit).fetched == [header.shards[1].file]
    # The reader of the evicted shard 1 still reads it: its view holds a link.
    want = _np_elements(ssnp.load(local))
    _remove_remote_shards(url)
    got = [e for r in readers for e in _np_elements(r)]
    assert got == want
    with pytest.raises(ValueError, match=f"cache_limit of at least the {sum(sizes)} bytes"):
        cache.localize(url, header, range(SHARDS), cdir, limit)  # readers pin or stream instead


def test_entries_used_within_one_clock_tick_keep_their_order(tmp_path: Any) -> None:
    # Back to back, as a reader opens shards: well within the filesystem clock's tick.
    cdir = cache.CacheDir(str(tmp_path / "cache"))
    entries = []
    for digit in "01":
        name = f"{digit * 32}-3"
        os.mkdir(os.path.join(cdir.entries, name))
        with open(os.path.join(cdir.entries, name, "shard"), "wb") as f:
            f.write(b"abc")
        entries.append(cache.Entry(name, "s3://b/ds", (("shard", 3, ""),), 3))
    with cdir.locked():
        for k in (0, 1, 0):  # entry 0 used again, last: entry 1 is the least recent
            view, fd = cdir.new_view()
            assert cdir.link(entries[k], view)
            os.close(fd)
        cdir.evict(3)  # room for one
    assert os.listdir(cdir.entries) == [entries[0].name]


def test_an_overwritten_dataset_is_never_read_stale(
    s3_bucket: str, saved: dict[int, str], tmp_path: Any
) -> None:
    url = f"{s3_bucket}/ds"
    cdir = tmp_path / "cache"
    old = _upload(saved[0], url)
    assert _np_elements(ssnp.load(url, cache_dir=cdir)) == _np_elements(ssnp.load(old))
    new = _upload(saved[1000], url)  # same shard names, new bytes
    assert read_header(url).shards[0].file == read_header(old).shards[0].file
    got = _np_elements(ssnp.load(url, cache_dir=cdir))
    assert got == _np_elements(ssnp.load(new)) != _np_elements(ssnp.load(old))
    tf_got = [e["id"].numpy() for e in superserial.load(url, cache_dir=cdir)]
    assert tf_got == list(range(1000, 1000 + N))


def test_compressed_shards_cache_with_their_index(s3_bucket: str, tmp_path: Any) -> None:
    local, url = str(tmp_path / "gz"), f"{s3_bucket}/gz"
    superserial.save(_source().take(20), local, num_shards=2, compression="GZIP")
    _upload(local, url)
    cdir = tmp_path / "cache"
    want = [e["id"].numpy() for e in superserial.load(local)]
    assert [e["id"].numpy() for e in superserial.load(url, cache_dir=cdir)] == want
    got = sorted(sorted(os.listdir(cdir / "entries" / e)) for e in _entries(cdir))
    shards = read_header(local).shards
    # Each shard with its index (the restart points): random access from the cache.
    assert got == sorted(sorted([s.file, index_name(s.file)]) for s in shards)
    _remove_remote_shards(url)
    assert [e["id"].numpy() for e in superserial.load(url, cache_dir=cdir)] == want
    cached = ssnp.load(url, cache_dir=cdir)
    assert [int(cached[i]["id"]) for i in (19, 0, 10)] == [want[i] for i in (19, 0, 10)]


def test_local_paths_are_not_cached(remote: tuple[str, str], tmp_path: Any) -> None:
    _, local = remote
    cdir = tmp_path / "cache"
    ds = ssnp.load(local, cache_dir=cdir, cache_limit=1)
    assert ds.path == local and ds.cache_lease is None
    assert not cdir.exists()


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (1234, 1234),
        ("20GB", 20 * 10**9),
        ("500MiB", 500 * 2**20),
        ("1.5 kB", 1500),
        ("7", 7),
        ("2gib", 2 * 2**30),
        ("20 G", 20 * 2**30),
        ("64m", 64 * 2**20),
        (None, None),
    ],
)
def test_parse_size(value: Any, want: int | None) -> None:
    assert sizes.parse_size(value) == want


@pytest.mark.parametrize("value", ["20 X", "GB", "-1", 0, "0.1B", True, 1.5, "1e9", "2GiBB"])
def test_parse_size_rejects(value: Any) -> None:
    with pytest.raises(ValueError, match="expected cache_limit"):
        sizes.parse_size(value, "cache_limit")


def test_cache_limit_names_itself(remote: tuple[str, str], tmp_path: Any) -> None:
    url, _ = remote
    with pytest.raises(ValueError, match=r"expected cache_limit .* got 'lots'"):
        ssnp.load(url, cache_dir=tmp_path / "cache", cache_limit="lots")


def test_threads_share_one_cache(remote: tuple[str, str], tmp_path: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    url, _ = remote
    header, cdir = read_header(url), str(tmp_path / "cache")
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: cache.localize(url, header, range(SHARDS), cdir), range(4)))
    assert sum(len(g.fetched) for g in got) == SHARDS  # each shard downloaded once
    assert len(_entries(cdir)) == SHARDS
    for g in got:
        for file, shard in zip(g.files, header.shards, strict=True):
            with open(file, "rb") as f:
                assert f"{crc32c(f.read()):08x}" == shard.crc32c, file


CHILD = r"""
import hashlib, json, os, sys, time
import superserial.numpy as ssnp
url, cdir, go, mode = sys.argv[1:5]
open(go + ".ready-%d" % os.getpid(), "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
from superserial.read.cache import directory as cache
from superserial.format import layout
got = cache.localize(url, layout.read_header(url), range(3), cdir, "10MB")
ds = ssnp.load(url, cache_dir=cdir, cache_limit="10MB")
h = hashlib.sha256()
for e in ds:
    h.update(e["x"].tobytes() + e["s"].item() + e["id"].tobytes())
print("RESULT " + json.dumps([len(ds), h.hexdigest(), ds.path, len(got.fetched)]), flush=True)
if mode == "crash":
    # Die only once the other process is done, so that its loads see this one's views
    # alive (a view of a dead process is collected by the next load).
    end = time.monotonic() + 60
    while not os.path.exists(go + ".clean-done") and time.monotonic() < end:
        time.sleep(0.01)
    os._exit(0)  # no clean-up: its view is left for the next process to collect
open(go + ".clean-done", "w").close()
"""


def test_processes_share_one_cache(remote: tuple[str, str], tmp_path: Any) -> None:
    url, local = remote
    cdir, go = str(tmp_path / "cache"), str(tmp_path / "go")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, cdir, go, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("crash", "clean")
    ]
    while sum(f.startswith("go.ready-") for f in os.listdir(tmp_path)) < len(procs):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    open(go, "w").close()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        lines = [ln[7:] for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, err[-3000:]
        results.append(json.loads(lines[-1]))
    h = hashlib.sha256()
    for e in ssnp.load(local):
        h.update(e["x"].tobytes() + e["s"].item() + e["id"].tobytes())
    assert {(n, d) for n, d, _, _ in results} == {(N, h.hexdigest())}
    assert len(_entries(cdir)) == SHARDS  # one copy each, whoever fetched it
    assert sum(r[3] for r in results) == SHARDS  # each downloaded once: the other waited
    views = os.listdir(os.path.join(cdir, "views"))
    # The crashed process left its two views (localize's and load's); the clean one none.
    assert len([v for v in views if not v.endswith(".lock")]) == 2
    assert os.path.basename(results[0][2]) in views
    ssnp.load(url, cache_dir=cdir)  # collects the crashed process's view
    assert os.listdir(os.path.join(cdir, "views")) == []
    assert not _leftovers(cdir)


# ------------------------------------------------ streaming: shards that do not all fit the limit


def _disk_bytes(cache_dir: Any) -> int:
    """Bytes of files under entries/, views/ and tmp/, each inode once (as du counts links)."""
    seen, total = set(), 0
    for sub in ("entries", "views", "tmp"):
        for root, _, files in os.walk(os.path.join(cache_dir, sub)):
            for f in files:
                try:
                    st = os.stat(os.path.join(root, f))
                except FileNotFoundError:
                    continue  # removed between the listing and the stat
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def _eight_on_s3(s3_bucket: str, tmp_path: Any) -> tuple[str, str, int]:
    """(URL, local path, bytes of shards and indexes) of a dataset of 8 shards on S3."""
    local, url = str(tmp_path / "eight"), f"{s3_bucket}/eight"
    superserial.save(_source(), local, num_shards=8)
    _upload(local, url)
    header = read_header(local)
    return url, local, sum(s.bytes + s.index.bytes for s in header.shards)  # type: ignore[union-attr]


@pytest.fixture
def eight(s3_bucket: str, tmp_path: Any) -> tuple[str, str, int]:
    """:func:`_eight_on_s3`."""
    return _eight_on_s3(s3_bucket, tmp_path)


@pytest.mark.parametrize("reader", ["numpy_iter", "numpy_batches", "tf", "torch_iter"])
def test_a_cache_smaller_than_the_dataset_streams_it_and_never_holds_more(
    eight: tuple[str, str, int], tmp_path: Any, reader: str
) -> None:
    import threading

    url, local, total = eight
    limit = total * 3 // 10
    cdir = tmp_path / "cache"
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if os.path.exists(cdir / "lock"):
                # Under the cache's lock, where evictions and reservations happen: a count
                # walked while they go on could see an evicted entry beside its successor.
                with cache.CacheDir(str(cdir)).locked():
                    peak[0] = max(peak[0], _disk_bytes(cdir))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(2):  # a second pass streams again, evicting the first's shards
            ds = ssnp.load(url, cache_dir=cdir, cache_limit=limit)
            if reader in ("tf", "torch_iter"):
                got = _read(reader, url, cache_dir=cdir, cache_limit=limit)
                want = _read(reader, local)
            elif reader == "numpy_iter":
                got, want = _np_elements(_slowly(ds)), _np_elements(ssnp.load(local))
            else:
                got = [e for b in _slowly(ds.batches(3), 0.03) for e in _unbatch(b)]
                want = [e for b in ssnp.load(local).batches(3) for e in _unbatch(b)]
            _same(got, want)
    finally:
        stop.set()
        watcher.join()
    assert 0 < peak[0] <= limit
    assert _disk_bytes(cdir) <= limit
    assert os.listdir(cdir / "views") == []  # each pass let go of its view
    # Random access of a streamed dataset pins what fits instead (tests/test_cache_pin.py).
    assert int(ds.get_batch([0])["id"][0]) == 0
    assert ds.cache_pins is not None and ds.cache_pins.wait(60)
    assert _disk_bytes(cdir) <= limit


def _slowly(items: Any, pause: float = 0.004) -> Any:
    """``items``, read slowly: the fetching thread gets the time to run ahead (as far as it may)."""
    for item in items:
        time.sleep(pause)
        yield item


def _unbatch(batch: dict[str, Any]) -> list[Any]:
    ids, xs, ss = batch["id"], batch["x"], batch["s"]
    return [(int(ids[i]), np.asarray(xs[i]).tolist(), ss[i]) for i in range(len(ids))]


@pytest.fixture(scope="module")
def two_big(web_server: Any) -> tuple[str, str, int]:
    """Two shards of about 6 MB under nginx: ``(name, local path, bytes of one with its index)``."""
    pad = np.random.default_rng(9).integers(0, 255, (12_000, 1000), np.uint8)
    data = tf.data.Dataset.from_tensor_slices({"id": np.arange(12_000), "pad": pad})
    name = f"two-big-{os.getpid()}-{time.time_ns()}"
    local = os.path.join(web_server.root, name)
    superserial.save(data, local, num_shards=2)
    entry = max(s.bytes + s.index.bytes for s in read_header(local).shards)  # type: ignore[union-attr]
    return name, local, entry


def test_a_streamed_read_does_not_wait_for_a_shard_to_download(
    two_big: tuple[str, str, int], web_server: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    from netproxy import NetProxy

    name, local, entry = two_big
    monkeypatch.setenv("SUPERSERIAL_READ_AHEAD", "2MiB")  # a little ahead: what came is countable
    cdir, limit = tmp_path / "cache", entry * 3 // 2
    with NetProxy((web_server.host, web_server.port), latency=0.0) as proxy:
        ds = ssnp.load(f"{proxy.url}/{name}", cache_dir=cdir, cache_limit=limit)
        assert ds.cache_stream is not None  # the two shards do not fit: streamed
        proxy.reset()
        it = ds.batches(500)
        first = next(it)
        # The first batch came with at most 3 MiB of the first shard's 6 MB (the budget and
        # the block being read) and the indexes, not after all of it.
        assert proxy.body_bytes < entry * 2 // 3, (proxy.body_bytes, entry)
        rest = list(it)
    ids = np.concatenate([first["id"], *(b["id"] for b in rest)])
    assert ids.tolist() == list(range(12_000))
    want = ssnp.load(local)
    assert (
        b"".join(b["pad"].tobytes() for b in [first, *rest])
        == want.get_batch(range(12_000))["pad"].tobytes()
    )
    # What was read was kept as it was read (one shard fits), checked: read from there next.
    assert len(_entries(cdir)) == 1 and _disk_bytes(cdir) <= limit
    assert not _leftovers(cdir) and os.listdir(cdir / "views") == []
    again = ssnp.load(f"{web_server.url}/{name}", cache_dir=cdir, cache_limit=limit)
    assert np.concatenate([b["id"] for b in again.batches(4000)]).tolist() == list(range(12_000))
    assert len(_entries(cdir)) == 1 and _disk_bytes(cdir) <= limit


def test_a_streamed_read_copies_no_shard_another_process_is_downloading(
    eight: tuple[str, str, int], tmp_path: Any
) -> None:
    import fcntl

    url, local, total = eight
    cdir, shards = tmp_path / "cache", read_header(local).shards
    ds = ssnp.load(url, cache_dir=cdir, cache_limit=total - 1)  # all but one shard fit
    assert ds.cache_stream is not None
    last = cache.entry_of(url, shards[7]).name
    # Another process downloads the last shard: it holds that entry's fetch lock.
    (cdir / "fetch").mkdir(parents=True, exist_ok=True)
    fd = os.open(cdir / "fetch" / f"{last}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        got = [e for b in ds.batches(7) for e in _unbatch(b)]
    finally:
        os.close(fd)
    _same(got, [e for b in ssnp.load(local).batches(7) for e in _unbatch(b)])
    # Read without waiting for it, and not copied; the seven others were (none evicted).
    assert sorted(_entries(cdir)) == sorted(cache.entry_of(url, s).name for s in shards[:7])
    assert not _leftovers(cdir) and _disk_bytes(cdir) <= total - 1


@pytest.mark.parametrize("budget", ["all", "three", "none"])
def test_a_streamed_pass_fetches_the_indexes_it_will_copy_ahead_within_a_budget(
    eight: tuple[str, str, int], tmp_path: Any, monkeypatch: Any, budget: str
) -> None:
    from superserial.read.cache import stream

    url, local, total = eight
    shards = read_header(local).shards
    sizes = np.cumsum([s.index.bytes for s in shards])  # type: ignore[union-attr]
    limit = {"all": int(sizes[-1]), "three": int(sizes[2]), "none": 0}[budget]
    monkeypatch.setattr(stream, "INDEX_AHEAD_BYTES", limit)
    ds = ssnp.load(url, cache_dir=tmp_path / "cache", cache_limit=total * 3 // 10)
    assert ds.cache_stream is not None
    tee = ds.cache_stream.tee()
    try:
        # Each copy's end waits for its index: fetched as the pass starts, as far as the
        # budget goes (always the first), not a fixed few shards ahead of the reader.
        want = {"all": 8, "three": 3, "none": 1}[budget]
        assert sorted(tee._indexes) == sorted(s.file for s in shards[:want])
        # Past the first shard without a copy of it: its index is let go, and the
        # budget goes on to the next.
        tee._index_ahead(1)
        assert sorted(tee._indexes) == sorted(s.file for s in shards[1 : 1 + want])
        assert all(f.result() for f in tee._indexes.values())
    finally:
        tee.close()
    got = [e for b in ds.batches(7) for e in _unbatch(b)]
    _same(got, [e for b in ssnp.load(local).batches(7) for e in _unbatch(b)])
    assert not _leftovers(tmp_path / "cache")


def test_a_shard_larger_than_the_cache_limit_is_a_clear_error(
    eight: tuple[str, str, int], tmp_path: Any
) -> None:
    url, _, _ = eight
    header = read_header(url)
    biggest = max(header.shards, key=lambda s: s.bytes + s.index.bytes)  # type: ignore[union-attr]
    size = biggest.bytes + biggest.index.bytes  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=f"got shard {biggest.file} of {size} bytes") as e:
        ssnp.load(url, cache_dir=tmp_path / "cache", cache_limit=size - 1)
    assert f"cache_limit={size - 1} bytes" in str(e.value)
    assert not os.path.exists(tmp_path / "cache" / "entries") or _entries(tmp_path / "cache") == []


def test_a_bad_download_while_streaming_is_an_error_there_and_never_cached(
    eight: tuple[str, str, int], tmp_path: Any
) -> None:
    import fsspec

    url, local, total = eight
    bad = read_header(local).shards[2]
    with open(os.path.join(local, bad.file), "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x40  # same size, another CRC
    fsspec.filesystem("s3").pipe(f"{url}/{bad.file}", bytes(data))
    cdir = tmp_path / "cache"
    got = []
    with pytest.raises(CorruptDataError, match=f"{url}/{bad.file}.*crc32c.*not cached"):
        for e in ssnp.load(url, cache_dir=cdir, cache_limit=total * 3 // 10):
            got.append(int(e["id"]))
    assert got == list(range(2 * N // 8))  # shards 0 and 1 came, in order, before the error
    gone = [os.listdir(cdir / "entries" / n) for n in _entries(cdir)]
    assert all(bad.file not in files for files in gone)
    assert not _leftovers(cdir)
    assert os.listdir(cdir / "views") == []


# ------------------------------------------------------------------ downloads in pieces


@pytest.fixture(scope="module")
def big_shard(web_server: Any) -> tuple[str, str]:
    """One shard of about 10 MB under nginx (ten pieces of 1 MiB): ``(name, local path)``."""
    pad = np.random.default_rng(8).integers(0, 255, (10_000, 1000), np.uint8)
    data = tf.data.Dataset.from_tensor_slices({"id": np.arange(10_000), "pad": pad})
    name = f"big-{os.getpid()}-{time.time_ns()}"
    local = os.path.join(web_server.root, name)
    superserial.save(data, local)
    return name, local


def test_a_big_shard_downloads_in_parallel_pieces_bit_exact(
    big_shard: tuple[str, str], web_server: Any, tmp_path: Any
) -> None:
    from netproxy import NetProxy

    name, local = big_shard
    size = read_header(local).shards[0].bytes
    with NetProxy((web_server.host, web_server.port), latency=0.05) as proxy:
        got = ssnp.load(f"{proxy.url}/{name}", cache_dir=tmp_path / "c").get_batch(range(10_000))
        # The header, the index, and the shard in ceil(size / 1 MiB) ranges, many at once
        # (one stream of 8 MiB reads would be two requests, one at a time).
        # The header, the small index in one stream (its HEAD and GET) and the pieces:
        # no request for the shard's size, the header gives it (a size other than that
        # shows as a byte more or fewer, test_a_damaged_big_shard_is_never_cached).
        assert proxy.requests == 3 + -(-size // cache.DOWNLOAD_PIECE), proxy.requests
        assert proxy.max_in_flight >= 2, proxy.max_in_flight
    want = ssnp.load(local).get_batch(range(10_000))
    assert got["pad"].tobytes() == want["pad"].tobytes() and got["id"].tolist() == list(
        range(10_000)
    )


@pytest.mark.parametrize("damage", ["flip", "truncate", "short", "extend"])
def test_a_damaged_big_shard_is_never_cached(
    damage: str, web_server: Any, tmp_path: Any, big_shard: tuple[str, str]
) -> None:
    import shutil

    name, local = big_shard
    copy = f"{name}-{damage}"
    shutil.copytree(local, os.path.join(web_server.root, copy))
    shard = os.path.join(web_server.root, copy, read_header(local).shards[0].file)
    with open(shard, "r+b") as f:
        if damage == "flip":
            f.seek(7 << 20)  # in the eighth piece
            byte = f.read(1)
            f.seek(7 << 20)
            f.write(bytes([byte[0] ^ 1]))
        elif damage == "truncate":
            f.truncate((9 << 20) + 5)  # in the tenth piece
        elif damage == "short":
            f.truncate(8 << 20)  # at a piece's start: the ninth piece asks past the end
        else:
            f.seek(0, os.SEEK_END)
            f.write(b"\0")  # one byte longer than its header says
    cdir = tmp_path / "c"
    with pytest.raises(CorruptDataError, match="crc32c") as e:
        ssnp.load(f"{web_server.url}/{copy}", cache_dir=cdir)
    assert "not cached" in str(e.value) and f"{copy}/{read_header(local).shards[0].file}" in str(
        e.value
    )
    assert _entries(cdir) == [] and not _leftovers(cdir)

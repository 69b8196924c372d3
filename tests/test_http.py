"""Reading over http:// from nginx without directory listing, behind a proxy of our own.

The proxy (tests/netproxy.py) holds every request 50 ms, a stand-in for an object
store's time to first byte, and fails requests on purpose (503s, dropped and cut
connections). Nothing of ours is mocked: real nginx, real sockets, real files.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import assert_same_dataset, canon_np, run_without
from netproxy import NetProxy
from superserial.errors import RemoteReadError
from superserial.storage import fs
from superserial.storage.retry import REQUEST_TIMEOUT_ENV, RETRY_SECONDS_ENV

LATENCY = 0.05


def _data(n: int = 24) -> tf.data.Dataset:
    rng = np.random.default_rng(7)
    return tf.data.Dataset.from_tensor_slices(
        {
            "x": rng.standard_normal((n, 3)).astype(np.float32),
            "s": [f"item-{i}".encode() * (i % 3) for i in range(n)],
            "r": tf.ragged.constant([[i] * (i % 4) for i in range(n)], dtype=tf.int64),
        }
    )


@pytest.fixture(scope="module")
def served(web_server: Any) -> tuple[str, superserial.Header]:
    """A dataset of 3 indexed shards under nginx's root; (its name there, its header)."""
    name = f"ds-{uuid.uuid4().hex[:8]}"
    header = superserial.save(_data(), f"{web_server.root}/{name}", num_shards=3)
    return name, header


@pytest.fixture(scope="module")
def want(served: tuple[str, Any], web_server: Any) -> list[Any]:
    """The elements as the numpy reader gives them from the local files."""
    return [canon_np(e) for e in ssnp.load(f"{web_server.root}/{served[0]}")]


@pytest.fixture
def proxy(web_server: Any) -> Iterator[NetProxy]:
    with NetProxy((web_server.host, web_server.port), latency=LATENCY, seed=23) as p:
        yield p


def test_every_reader_reads_by_the_header_alone(
    served: tuple[str, Any], want: list[Any], web_server: Any, proxy: NetProxy
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("grain")
    from superserial.grain import DataSource
    from superserial.torch import MapDataset

    name, _ = served
    url = f"{proxy.url}/{name}"
    with pytest.raises(urllib.error.HTTPError, match="403"):  # no listing, as on a CDN
        urllib.request.urlopen(url + "/")
    assert_same_dataset(superserial.load(f"{web_server.root}/{name}"), superserial.load(url))
    ds = ssnp.load(url)
    assert [canon_np(e) for e in ds] == want
    local = f"{web_server.root}/{name}"
    # Batches (the ragged leaf comes as a list of arrays: compare the dense one).
    for got, exp in zip(ssnp.iter_batches(url, 5), ssnp.iter_batches(local, 5), strict=True):
        np.testing.assert_array_equal(got["x"], exp["x"])
        assert list(got["s"]) == list(exp["s"])
    got, exp = ds.get_batch([20, 2, 2, 11]), ssnp.load(local).get_batch([20, 2, 2, 11])
    np.testing.assert_array_equal(got["x"], exp["x"])
    assert [list(r) for r in got["r"]] == [list(r) for r in exp["r"]]
    m = MapDataset(url)
    assert len(m) == len(want)
    np.testing.assert_array_equal(m[13]["x"].numpy(), ssnp.load(local)[13]["x"])
    src = DataSource(url)
    assert [canon_np(src[i]) for i in (0, 23)] == [want[0], want[23]]
    assert superserial.verify(url).ok
    assert proxy.requests > 0  # it all went through the proxy


def test_a_missing_dataset_or_shard_on_a_web_server(web_server: Any) -> None:
    with pytest.raises(superserial.DatasetNotFoundError, match=r"no header\.json"):
        ssnp.load(f"{web_server.url}/nothing-here")
    # A copy of the dataset without one of its shards: the header names it.
    gone = f"gone-{uuid.uuid4().hex[:8]}"
    header = superserial.save(_data(), f"{web_server.root}/{gone}", num_shards=3)
    fs.remove(f"{web_server.root}/{gone}/{header.shards[1].file}")
    with pytest.raises(superserial.CorruptDataError, match="found no file"):
        ssnp.load(f"{web_server.url}/{gone}")


def test_flaky_server_reads_are_retried_and_exact(
    served: tuple[str, Any], want: list[Any], web_server: Any, proxy: NetProxy
) -> None:
    name, header = served
    shard = header.shards[0]
    with open(f"{web_server.root}/{name}/{shard.file}", "rb") as f:
        local = f.read()
    proxy.fail = 0.05
    # One range request at a time: each 503, drop or cut is retried, never returned.
    url = f"{proxy.url}/{name}/{shard.file}"
    for k in range(60):
        offset = (k * 37) % (shard.bytes - 10)
        assert fs.read_range(url, offset, 10) == local[offset : offset + 10]
    ds_url = f"{proxy.url}/{name}"
    assert [canon_np(e) for e in ssnp.load(ds_url)] == want
    assert_same_dataset(superserial.load(f"{web_server.root}/{name}"), superserial.load(ds_url))
    assert proxy.failed > 0, proxy.stats()


def test_dead_server_fails_naming_the_url_in_bounded_time(
    served: tuple[str, Any], web_server: Any, proxy: NetProxy, monkeypatch: Any
) -> None:
    monkeypatch.setenv(RETRY_SECONDS_ENV, "1")
    name, header = served
    proxy.fail = 1.0
    start = time.monotonic()
    with pytest.raises(RemoteReadError, match=f"{proxy.url}/{name}/header.json") as e:
        ssnp.load(f"{proxy.url}/{name}")
    assert "retry budget of 1 s" in str(e.value)
    url = f"{proxy.url}/{name}/{header.shards[0].file}"
    with pytest.raises(RemoteReadError, match=rf"{url} \(bytes 100-109\)"):
        fs.read_range(url, 100, 10)
    assert time.monotonic() - start < 10
    assert isinstance(e.value, OSError)


def test_a_server_that_hangs_is_timed_out_and_retried(
    served: tuple[str, Any], want: list[Any], web_server: Any, proxy: NetProxy, monkeypatch: Any
) -> None:
    monkeypatch.setenv(REQUEST_TIMEOUT_ENV, "0.5")
    name, header = served
    # Some requests get no answer at all, the connection held open: each is
    # given up after 0.5 s of silence and tried again, never waited on for good.
    proxy.fail, proxy.faults = 0.1, ("stall",)
    start = time.monotonic()
    assert [canon_np(e) for e in ssnp.load(f"{proxy.url}/{name}")] == want
    assert proxy.failed > 0, proxy.stats()
    assert time.monotonic() - start < 30
    # A server that never answers: the error names the range, in bounded time.
    monkeypatch.setenv(RETRY_SECONDS_ENV, "2")
    proxy.fail = 1.0
    url = f"{proxy.url}/{name}/{header.shards[0].file}"
    start = time.monotonic()
    with pytest.raises(RemoteReadError, match=rf"{url} \(bytes 100-109\).*Timeout"):
        fs.read_range(url, 100, 10)
    assert time.monotonic() - start < 10


@pytest.fixture(scope="module")
def spread(web_server: Any) -> str:
    """64 records of 1 KiB in 2 shards under nginx's root (every 4th is a range of its own)."""
    name = f"spread-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(11)
    data = {"b": rng.integers(0, 255, (64, 1024), dtype=np.uint8), "i": np.arange(64)}
    superserial.save(
        tf.data.Dataset.from_tensor_slices(data), f"{web_server.root}/{name}", num_shards=2
    )
    return name


def test_random_reads_are_retried_and_exact(spread: str, web_server: Any, proxy: NetProxy) -> None:
    # A batch's range requests go out together (coroutines on fsspec's loop):
    # each 503, drop or cut among them is retried there, never returned.
    local = ssnp.load(f"{web_server.root}/{spread}")
    ds = ssnp.load(f"{proxy.url}/{spread}")
    proxy.fail = 0.05
    rng = np.random.default_rng(3)
    for _ in range(12):
        idx = rng.choice(64, 16, replace=False)
        got = ds.get_batch(idx)
        np.testing.assert_array_equal(got["i"], idx)
        np.testing.assert_array_equal(got["b"], local.get_batch(idx)["b"])
    assert proxy.failed > 0, proxy.stats()


def test_random_reads_of_a_dead_server_fail_naming_the_range(
    spread: str, proxy: NetProxy, monkeypatch: Any
) -> None:
    monkeypatch.setenv(RETRY_SECONDS_ENV, "1")
    ds = ssnp.load(f"{proxy.url}/{spread}")
    ds.get_batch([0, 63])  # the indexes
    proxy.fail = 1.0
    start = time.monotonic()
    with pytest.raises(RemoteReadError, match=rf"{proxy.url}/{spread}/\S+ \(bytes \d+-\d+\)") as e:
        ds.get_batch(np.arange(0, 64, 4))
    assert "retry budget of 1 s" in str(e.value)
    assert time.monotonic() - start < 10


def test_random_reads_take_no_thread_per_request(
    spread: str, proxy: NetProxy, monkeypatch: Any
) -> None:
    # A thread per request blocked on fsspec's loop cost more CPU than the
    # requests (superserial.storage.fetch): they are coroutines on the loop.
    ds = ssnp.load(f"{proxy.url}/{spread}")
    ds.get_batch([0, 63])  # the indexes
    # Another size than any pool made so far: a pool would be made anew, its
    # threads started as requests come.
    monkeypatch.setenv("SUPERSERIAL_REMOTE_CONCURRENCY", "61")
    before = {t.ident for t in threading.enumerate()}
    proxy.reset()
    idx = np.arange(0, 64, 4)
    np.testing.assert_array_equal(ds.get_batch(idx)["i"], idx)
    assert proxy.requests == len(idx)
    assert 1 < proxy.max_in_flight <= len(idx)  # together, not one after another
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not [t for t in started if t.startswith("superserial-fetch")], started


def _open_and_read(url: str) -> None:
    ssnp.load(url).get_batch([1, 2])  # new filesystems in a new pid: fsspec drops the old


def test_a_forked_child_leaves_the_parents_connections_working(
    served: tuple[str, Any], want: list[Any], web_server: Any
) -> None:
    # fsspec's filesystems of the parent are finalized in a forked child (a
    # DataLoader worker), and used to close the parent's pooled connections
    # in the epoll both share: the parent's next request on one hung.
    name, header = served
    url = f"{web_server.url}/{name}"
    shard = f"{url}/{header.shards[0].file}"
    # Pooled keep-alive connections now, of a filesystem only fsspec's cache holds.
    before = fs.read_range(shard, 0, 64)
    assert [canon_np(ssnp.load(url)[i]) for i in (0, 5)] == [want[0], want[5]]
    child = multiprocessing.get_context("fork").Process(target=_open_and_read, args=(url,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    start = time.monotonic()
    assert fs.read_range(shard, 0, 64) == before
    assert time.monotonic() - start < 5


def _forked_worker_reads(ds: Any, indices: list[int], conn: Any) -> None:
    # What a DataLoader worker does with the MapDataset it was forked with.
    ds.__getitems__(indices)
    conn.send(None)
    conn.recv()
    ds.__getitems__(indices)
    conn.send(None)


def test_a_forked_worker_reads_its_indexes_once_together(
    served: tuple[str, Any], web_server: Any
) -> None:
    pytest.importorskip("torch")
    from superserial.torch import MapDataset

    name, header = served
    shards = len(header.shards)
    starts = np.cumsum([0] + [s.records for s in header.shards[:-1]]).tolist()
    with NetProxy((web_server.host, web_server.port)) as proxy:
        ds = MapDataset(f"{proxy.url}/{name}")  # the parent's session, its loop's thread
        proxy.reset()
        ctx = multiprocessing.get_context("fork")
        here, there = ctx.Pipe()
        child = ctx.Process(target=_forked_worker_reads, args=(ds, starts, there))
        child.start()
        try:
            here.recv()
            first = proxy.requests
            here.send(None)
            here.recv()
            again = proxy.requests - first
        finally:
            child.join(60)
    assert child.exitcode == 0
    # One request per shard's index, beside the records' (the same as a second
    # read's): not an existence check before each, nor read again after open_all
    # (a forked child's first _open dropped what open_all had read).
    assert first - again == shards, (first, again)


_FIRST_READ_IN_A_FORK = """
import gc, multiprocessing, time
from superserial.torch import MapDataset
ds = MapDataset(sys.argv[1])  # the parent's session, on its fsspec loop's thread
def worker(conn):
    start = time.monotonic()
    ds.__getitems__([0, len(ds) // 2, len(ds) - 1])
    # The parent's filesystems are garbage now (fsspec dropped them in a new pid):
    # collected here, not in whichever thread the collector happens to run in.
    gc.collect()
    conn.send(time.monotonic() - start)
ctx = multiprocessing.get_context("fork")
here, there = ctx.Pipe()
child = ctx.Process(target=worker, args=(there,))
child.start()
print(here.recv())
child.join(60)
sys.exit(child.exitcode)
"""


def test_a_forked_worker_does_not_wait_on_the_parents_loop(
    served: tuple[str, Any], web_server: Any
) -> None:
    pytest.importorskip("torch")
    # A fresh interpreter, as a training script: the parent's filesystems, dropped
    # in the child, closed their sessions on the parent's loop, whose thread is not
    # in the child, and fsspec waited a whole second for it (a worker's first batch).
    done = run_without([], _FIRST_READ_IN_A_FORK, f"{web_server.url}/{served[0]}")
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) < 0.7, done.stdout


def test_refused_file_is_not_retried(web_server: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv(RETRY_SECONDS_ENV, "30")
    start = time.monotonic()
    # nginx answers a directory without listing with a 403: no retry mends that.
    with pytest.raises(RemoteReadError, match=rf"{web_server.url}/ .*403.*not retried"):
        fs.read_range(f"{web_server.url}/", 0, 10)
    assert time.monotonic() - start < 5


def test_dead_s3_endpoint_fails_naming_the_url(
    s3_bucket: str, s3_server: str, monkeypatch: Any
) -> None:
    import fsspec

    path = f"{s3_bucket}/ds"
    superserial.save(_data(8), path, num_shards=1)
    host, port = s3_server.removeprefix("http://").split(":")
    with NetProxy((host, int(port)), fail=1.0, faults=("503",)) as dead:
        monkeypatch.setenv("AWS_ENDPOINT_URL", dead.url)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's retries, below s3fs's
        fsspec.get_filesystem_class("s3").clear_instance_cache()
        try:
            start = time.monotonic()
            with pytest.raises(RemoteReadError, match=f"{path}/header.json.*own retries") as e:
                ssnp.load(path)
            assert "Service Unavailable" in str(e.value)
            assert time.monotonic() - start < 30
        finally:
            fsspec.get_filesystem_class("s3").clear_instance_cache()


def test_compressed_dataset_reads_at_random_over_http(web_server: Any, proxy: NetProxy) -> None:
    """GZIP shards by their restart points over range requests, as locally (issue 24)."""
    from superserial.write import record_file

    pytest.importorskip("torch")
    from superserial.torch import MapDataset

    name = f"gz-{uuid.uuid4().hex[:8]}"
    local = f"{web_server.root}/{name}"
    saved = record_file._RESTART
    record_file._RESTART = 256  # many blocks: a batch spans several of every shard
    try:
        superserial.save(_data(200), local, num_shards=3, compression="GZIP")
    finally:
        record_file._RESTART = saved
    url = f"{proxy.url}/{name}"
    want = [canon_np(e) for e in ssnp.load(local)]
    ds = ssnp.load(url)
    before = proxy.requests
    assert [canon_np(ds[i]) for i in (0, 199, -1, 67, 133)] == [
        want[i] for i in (0, 199, -1, 67, 133)
    ]
    idx = np.random.default_rng(2).integers(0, 200, 300)
    got = ds.get_batch(idx)
    np.testing.assert_array_equal(got["x"], ssnp.load(local).get_batch(idx)["x"])
    assert list(got["s"]) == list(ssnp.load(local).get_batch(idx)["s"])
    assert proxy.requests > before  # range requests through the proxy
    shuffled = superserial.load(url, shuffle=True, seed=5, epoch=1)
    from superserial.read.order import permutation

    order = permutation(200, 5, 1)
    assert [e["x"].numpy().tolist() for e in shuffled] == [
        ssnp.load(local)[int(i)]["x"].tolist() for i in order
    ]
    m = MapDataset(url)
    np.testing.assert_array_equal(m[150]["x"].numpy(), ssnp.load(local)[150]["x"])
    assert superserial.verify(url).ok


def test_packed_remote_reads_hand_on_dense_fetches_as_fetched(web_server: Any) -> None:
    # Records that fill their range reads come in the fetched buffer itself (framing
    # and all: no copy per record); records read with gaps between, as their data alone.
    name = f"packed-{uuid.uuid4().hex[:8]}"
    ds = tf.data.Dataset.range(3000).map(lambda i: tf.strings.as_string(i * i * 7919))
    header = superserial.save(ds, f"{web_server.root}/{name}", num_shards=2)
    records = ssnp.load(f"{web_server.url}/{name}").records
    first = header.shards[0]
    dense = np.random.default_rng(4).permutation(first.records)  # all of shard 0, shuffled
    apart = np.array([5, 900, 1400, 2990])  # a range read each: framed records alone
    gaps = np.array([11, 5, 9, 7])  # one range read, every other record unasked for
    for idx, kind in ((dense, "dense"), (apart, "apart"), (gaps, "gaps")):
        buffer, starts, lengths = records.read_packed(idx)
        got = [buffer[a : a + n] for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
        assert got == [records.read(int(i))[0] for i in idx]
        framed = int(lengths.sum()) + 16 * len(idx)
        want = {"dense": first.bytes, "apart": framed, "gaps": int(lengths.sum())}[kind]
        assert len(buffer) == want, kind

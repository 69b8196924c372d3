"""Sequential remote reads with large range requests in flight ahead of the reader.

nginx (no listing) behind our proxy (tests/netproxy.py), which holds each
request and counts what crossed it: requests, the most in flight at once,
the body bytes sent. Nothing of ours is mocked.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import matrix
import superserial
import superserial.numpy as ssnp
from netproxy import NetProxy
from superserial.errors import CorruptDataError, RemoteReadError
from superserial.format import dtypes
from superserial.format.record_index import read_index
from superserial.read import readahead
from superserial.read.readahead import READ_AHEAD_ENV
from superserial.storage.retry import RETRY_SECONDS_ENV
from superserial.tf import streamed

_N, _SHARDS, _SIDE = 800, 4, 64  # 4 shards of 200 records of about 4 KiB: ~820 KB each


def _data() -> tf.data.Dataset:
    rng = np.random.default_rng(5)
    return tf.data.Dataset.from_tensor_slices(
        {
            "image": rng.integers(0, 255, (_N, _SIDE, _SIDE), dtype=np.uint8),
            "label": np.arange(_N, dtype=np.int64),
        }
    )


@pytest.fixture(scope="module")
def served(web_server: Any) -> tuple[str, superserial.Header]:
    name = f"ra-{uuid.uuid4().hex[:8]}"
    header = superserial.save(_data(), f"{web_server.root}/{name}", num_shards=_SHARDS)
    return name, header


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.asarray(next(iter(_data().batch(_N)))["image"])


@pytest.fixture
def proxy(web_server: Any) -> Iterator[NetProxy]:
    with NetProxy((web_server.host, web_server.port), latency=0.05, seed=3) as p:
        yield p


def _shard_bytes(header: superserial.Header) -> int:
    return sum(s.bytes for s in header.shards)


def test_shards_are_requested_ahead_across_their_boundaries(
    served: tuple[str, Any], images: np.ndarray, proxy: NetProxy
) -> None:
    name, header = served
    ds = ssnp.load(f"{proxy.url}/{name}")
    ds.records.open_all()  # the indexes (read at once, before the first block is taken)
    proxy.reset()
    got = list(ds.batches(100))
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in got]), np.arange(_N))
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in got]), images)
    # Each shard is smaller than a block: one request each, all in flight at
    # once (one after another, there would never be two).
    assert proxy.requests == _SHARDS
    assert proxy.max_in_flight == _SHARDS
    assert proxy.body_bytes == _shard_bytes(header)  # every byte once, nothing more


def test_read_ahead_stays_within_its_byte_budget(
    served: tuple[str, Any], images: np.ndarray, proxy: NetProxy, monkeypatch: Any
) -> None:
    name, header = served
    monkeypatch.setenv(READ_AHEAD_ENV, "512KiB")  # blocks of 256 KiB, two ahead
    ds = ssnp.load(f"{proxy.url}/{name}")
    ds.records.open_all()
    # Requests held long enough that the two ahead overlap on a busy machine too.
    proxy.latency = 0.3
    proxy.reset()
    batches = ds.batches(16)
    first = next(batches)
    time.sleep(0.5)  # a slow reader: whatever would be requested ahead is by now
    # The block being read, and the two the budget holds.
    assert proxy.requests <= 3
    rest = list(batches)
    labels = np.concatenate([first["label"], *(b["label"] for b in rest)])
    np.testing.assert_array_equal(labels, np.arange(_N))
    np.testing.assert_array_equal(
        np.concatenate([first["image"], *(b["image"] for b in rest)]), images
    )
    blocks = sum(-(-s.bytes // (256 << 10)) for s in header.shards)
    assert proxy.requests == blocks
    # 512 KiB in flight at most, and more than one request. The proxy counts a request done
    # after its last byte went out, so on a busy machine the client's next request (sent once
    # it has those bytes) can be counted before the proxy's thread gets to count the last one
    # done: 3 then. The budget itself is held by the count after the slow reader's sleep.
    assert 2 <= proxy.max_in_flight <= 3
    assert proxy.body_bytes == _shard_bytes(header)


def test_elements_of_part_of_a_shard_are_read_by_its_index(
    served: tuple[str, Any], images: np.ndarray, proxy: NetProxy, web_server: Any
) -> None:
    name, header = served
    url = f"{proxy.url}/{name}"
    whole = ssnp.load(url)
    # Records 50..149 of shard 1 and 0..9 of shard 2, as a torch worker's part.
    part = ssnp.NumpyDataset(whole.path, whole.header, whole.files[1:3], [100, 10], starts=[50, 0])
    proxy.reset()
    elements = list(part)
    labels = [int(e["label"]) for e in elements]
    assert labels == [*range(250, 350), *range(400, 410)]
    np.testing.assert_array_equal(np.stack([e["image"] for e in elements]), images[labels])
    # The two spans' records and the two indexes, exactly: not the headers of
    # the records before them walked in small requests, nor whole buffers past them.
    local = f"{web_server.root}/{name}"
    one, two = (read_index(local, header.shards[k]) for k in (1, 2))
    indexes = sum(header.shards[k].index.bytes for k in (1, 2))
    assert proxy.body_bytes == (one[150] - one[50]) + (two[10] - two[0]) + indexes
    assert proxy.max_in_flight >= 2


def _read_rest(batches: Iterator[Any], out: Any) -> None:
    out.put(np.concatenate([b["label"] for b in batches]).tolist())


def test_a_pass_started_before_a_fork_reads_on_in_the_child(
    served: tuple[str, Any], proxy: NetProxy
) -> None:
    name, _ = served
    batches = ssnp.load(f"{proxy.url}/{name}").batches(100)
    first = next(batches)  # requests in flight in the parent's pool now
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_read_rest, args=(batches, out))
    child.start()
    try:
        got = out.get(timeout=30)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert [*first["label"].tolist(), *got] == list(range(_N))
    rest = [b["label"] for b in batches]  # the parent's own pass goes on too
    np.testing.assert_array_equal(np.concatenate(rest), np.arange(100, _N))


def test_flaky_server_gives_exact_values_through_read_ahead(
    served: tuple[str, Any], images: np.ndarray, proxy: NetProxy, monkeypatch: Any
) -> None:
    name, _ = served
    monkeypatch.setenv(READ_AHEAD_ENV, "1MiB")  # 512 KiB blocks: more requests to fail
    ds = ssnp.load(f"{proxy.url}/{name}")
    proxy.fail = 0.1
    for _ in range(2):
        got = list(ds.batches(128))
        np.testing.assert_array_equal(np.concatenate([b["label"] for b in got]), np.arange(_N))
        np.testing.assert_array_equal(np.concatenate([b["image"] for b in got]), images)
    assert proxy.failed > 0, proxy.stats()


def test_a_dead_server_names_the_shard_and_the_range(
    served: tuple[str, Any], proxy: NetProxy, monkeypatch: Any
) -> None:
    name, header = served
    monkeypatch.setenv(RETRY_SECONDS_ENV, "1")
    ds = ssnp.load(f"{proxy.url}/{name}")
    ds.records.open_all()
    proxy.fail = 1.0
    start = time.monotonic()
    file = f"{proxy.url}/{name}/{header.shards[0].file}"
    with pytest.raises(RemoteReadError, match=rf"{file} \(bytes 0-{header.shards[0].bytes - 1}\)"):
        list(ds.batches(100))
    assert time.monotonic() - start < 10


def test_a_damaged_shard_is_named_as_a_plain_read_names_it(
    web_server: Any, proxy: NetProxy
) -> None:
    name = f"bad-{uuid.uuid4().hex[:8]}"
    local = f"{web_server.root}/{name}"
    header = superserial.save(_data(), local, num_shards=_SHARDS)
    shard = header.shards[2]
    path = os.path.join(local, shard.file)
    with open(path, "r+b") as f:  # a byte of record 5's data
        f.seek(5 * (_SIDE * _SIDE + 100) + 60)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptDataError) as want:
        list(ssnp.load(local).batches(50))
    expected = str(want.value).replace(local, f"{proxy.url}/{name}")
    with pytest.raises(CorruptDataError) as got:
        list(ssnp.load(f"{proxy.url}/{name}").batches(50))
    assert str(got.value) == expected
    assert f"{shard.file} record " in expected


def test_read_ahead_setting_must_be_a_size(
    served: tuple[str, Any], proxy: NetProxy, monkeypatch: Any
) -> None:
    name, _ = served
    ds = ssnp.load(f"{proxy.url}/{name}")
    monkeypatch.setenv(READ_AHEAD_ENV, "lots")
    with pytest.raises(
        ValueError, match=rf"expected {READ_AHEAD_ENV} as a number of bytes.*'lots'"
    ):
        next(ds.batches(10))
    monkeypatch.setenv(READ_AHEAD_ENV, "0")  # off: one request at a time, as a plain read
    proxy.reset()
    assert len(list(ds.batches(100))) == _N // 100
    # A request may be counted until just after its answer is sent, when the
    # next one comes: 2. All four shards at once, with read-ahead.
    assert proxy.max_in_flight <= 2


def test_http_range_reads_go_past_aiohttps_100_connections(
    web_server: Any, monkeypatch: Any
) -> None:
    # 12,000 records of ~1 KiB: every 90th is more than 64 KiB from the next,
    # so each is a request of its own (the read-amplification bound).
    name = f"wide-{uuid.uuid4().hex[:8]}"
    n = 12_000
    values = np.random.default_rng(9).integers(0, 255, (n, 1024), dtype=np.uint8)
    superserial.save(
        tf.data.Dataset.from_tensor_slices({"v": values}), f"{web_server.root}/{name}", num_shards=1
    )
    monkeypatch.setenv("SUPERSERIAL_REMOTE_CONCURRENCY", "160")
    indices = np.arange(0, n, 90)
    # Each request held 1 s: long enough that all of them overlap even when the
    # machine is busy opening the connections (at 0.3 s, a loaded CI run saw 80).
    with NetProxy((web_server.host, web_server.port), latency=1.0) as proxy:
        ds = ssnp.load(f"{proxy.url}/{name}")
        ds.records.open_all()
        ds.get_batch([0])  # the index, before counting
        proxy.reset()
        np.testing.assert_array_equal(ds.get_batch(indices)["v"], values[indices])
        assert proxy.requests == len(indices)
        assert 100 < proxy.max_in_flight <= 160


def test_tf_load_requests_shards_ahead_where_tensorflow_cannot_read_them(
    served: tuple[str, Any], images: np.ndarray, proxy: NetProxy, web_server: Any
) -> None:
    name, header = served
    ds = superserial.load(f"{proxy.url}/{name}", batch_size=64)  # http://: fsspec, not TF
    proxy.reset()
    got = list(ds)
    labels = np.concatenate([b["label"].numpy() for b in got])
    np.testing.assert_array_equal(labels, np.arange(_N))
    np.testing.assert_array_equal(np.concatenate([b["image"].numpy() for b in got]), images)
    assert [len(b["label"]) for b in got] == [64] * (_N // 64) + [_N % 64]
    # All four shards at once (one shard after another: one at a time, and HEADs),
    # and their indexes, read together as the blocks come (a GET each):
    # records are cut a chunk at a time by their offsets (read record by record, no
    # index would be read).
    assert _SHARDS <= proxy.max_in_flight <= 2 * _SHARDS
    assert proxy.requests == 2 * _SHARDS
    indexes = sum(s.index.bytes for s in header.shards)
    assert proxy.body_bytes == _shard_bytes(header) + indexes


def test_tf_load_with_shuffled_files_reads_each_shard_ahead(
    served: tuple[str, Any], images: np.ndarray, proxy: NetProxy, monkeypatch: Any
) -> None:
    name, header = served
    monkeypatch.setenv(READ_AHEAD_ENV, "512KiB")  # blocks of 256 KiB, two ahead
    ds = superserial.load(f"{proxy.url}/{name}", batch_size=50, shuffle_files=True, seed=4)
    proxy.reset()
    got = list(ds)
    labels = np.concatenate([b["label"].numpy() for b in got])
    # Whole shards in a drawn order, each in its own order.
    firsts = labels[:: _N // _SHARDS].tolist()
    assert sorted(firsts) == list(range(0, _N, _N // _SHARDS)) and firsts != sorted(firsts)
    np.testing.assert_array_equal(np.sort(labels), np.arange(_N))
    np.testing.assert_array_equal(np.concatenate([b["image"].numpy() for b in got]), images[labels])
    blocks = sum(-(-s.bytes // (256 << 10)) for s in header.shards)
    assert proxy.requests == blocks
    assert (
        proxy.max_in_flight == 2
    )  # two blocks of a shard at once, not one 8 MiB read after another
    assert proxy.body_bytes == _shard_bytes(header)


def _tf_read(url: str) -> tuple[list[int], str]:
    """The labels a tf.data pass over ``url`` gives, and the message of the error that ends it."""
    labels: list[int] = []
    try:
        for b in superserial.load(url, batch_size=50):
            labels.extend(b["label"].numpy().tolist())
    except tf.errors.OpError as e:
        lines = [x for x in str(e).splitlines() if "CorruptDataError: " in x]
        return labels, lines[-1].split("CorruptDataError: ", 1)[1] if lines else str(e)
    return labels, ""


@pytest.mark.parametrize(
    "where", [12 + 60, 2, None], ids=["record data", "length field", "index gone"]
)
def test_tf_load_of_damage_gives_what_a_read_record_by_record_gives(
    web_server: Any, proxy: NetProxy, monkeypatch: Any, where: int | None
) -> None:
    """Cut a chunk at a time by the indexes, or read record by record: the same records, errors."""
    name = f"tfbad-{uuid.uuid4().hex[:8]}"
    local = f"{web_server.root}/{name}"
    header = superserial.save(_data(), local, num_shards=_SHARDS)
    shard = header.shards[2]
    if where is None:  # the shard still reads: only the chunked path needs its index
        os.remove(os.path.join(local, shard.index.file))
    else:
        at = int(read_index(local, shard)[5]) + where  # in record 5
        with open(os.path.join(local, shard.file), "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
    url = f"{proxy.url}/{name}"
    got = _tf_read(url)
    monkeypatch.setenv(READ_AHEAD_ENV, "0")  # record by record, shard by shard
    assert got == _tf_read(url)
    if where is None:
        assert got == (list(range(_N)), "")
    else:
        assert got[0] == list(range(400))  # the chunks before the one of the damaged record
        assert f"{shard.file} record 5 " in got[1], got[1]


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batches_across_shard_ends_are_exact(
    served: tuple[str, Any], proxy: NetProxy, web_server: Any, drop_remainder: bool
) -> None:
    # 200 records a shard, batches of 64: most batches hold records of two shards.
    name, _ = served
    kw = {"batch_size": 64, "drop_remainder": drop_remainder}
    remote = superserial.load(f"{proxy.url}/{name}", **kw)
    local = superserial.load(f"{web_server.root}/{name}", **kw)
    assert remote.element_spec == local.element_spec
    got = [b["label"].numpy() for b in remote]
    want = [b["label"].numpy() for b in local]
    assert [len(b) for b in got] == [64] * 12 + ([] if drop_remainder else [32])
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(
    ("n", "size", "most"), [(800, 50, 400), (0, 50, 400), (7, 2, 3), (5, 8, 8)]
)
def test_a_pass_hands_on_one_chunk_first_then_doubling_ones(n: int, size: int, most: int) -> None:
    got = list(readahead.steps(n, size, most))
    bounds = [0, *(b for _, b in got)]
    assert got == list(itertools.pairwise(bounds)) and bounds[-1] == n
    lengths = [b - a for a, b in got]
    want = [min(size * 2**k, most) for k in range(len(got))]
    assert lengths[:-1] == want[:-1] and (not got or 0 < lengths[-1] <= want[-1])
    if (n, size, most) == (800, 50, 400):
        assert lengths == [50, 100, 200, 400, 50]


@pytest.mark.parametrize(
    ("per_batch", "size"), [(30, 1 << 20), (64, 4 << 20), (1, 100), (10**6, 1), (7, 0)]
)
def test_whole_batches_are_the_most_that_fit_the_bytes(
    served: tuple[str, Any], web_server: Any, per_batch: int, size: int
) -> None:
    # At the mean record size; never 0, so a pass over huge records still moves.
    name, _ = served
    header = ssnp.load(f"{web_server.root}/{name}").header
    batch_bytes = per_batch * header.total_bytes / header.element_count
    k = readahead.whole_batches(header, per_batch, size)
    assert k == max(1, int(size // batch_bytes)), (k, size, batch_bytes)
    assert k == 1 or k * batch_bytes <= size < (k + 1) * batch_bytes


def test_numpy_batches_own_their_memory_and_match_a_local_read(
    served: tuple[str, Any], proxy: NetProxy, web_server: Any
) -> None:
    # Decoded a few batches at a time (the chunks grow to several batches here),
    # handed on as copies: no batch holds on to its chunk.
    name, _ = served
    got = list(ssnp.load(f"{proxy.url}/{name}").batches(30, drop_remainder=True))
    want = list(ssnp.load(f"{web_server.root}/{name}").batches(30, drop_remainder=True))
    assert len(got) == len(want) == _N // 30
    for g, w in zip(got, want, strict=True):
        assert g["image"].flags.owndata and g["label"].flags.owndata
        np.testing.assert_array_equal(g["image"], w["image"])
        np.testing.assert_array_equal(g["label"], w["label"])


def _same(got: Any, want: Any) -> None:
    """Bit for bit: the same structure, dtypes, shapes and bytes (NaNs and -0.0 included)."""
    tf.nest.assert_same_structure(got, want)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want), strict=True):
        g, w = g.numpy(), w.numpy()
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tolist() == w.tolist() if g.dtype == object else g.tobytes() == w.tobytes()


@pytest.mark.parametrize("shape", [(), (2, 3)], ids=["scalar", "matrix"])
@pytest.mark.parametrize("entry", dtypes.DTYPES, ids=lambda d: d.name)
def test_tf_load_decodes_remote_fixed_shape_leaves_exactly(
    web_server: Any, proxy: NetProxy, entry: dtypes.DType, shape: tuple[int, ...]
) -> None:
    # Remote fixed-shape data comes decoded by the numpy decoder as read, not by
    # parse_example: the same element_spec and bytes as the local read, batch by batch.
    n = 300
    data = {"x": matrix.values(entry, shape, n), "y": np.arange(n, dtype=np.int64)}
    name = f"dec-{entry.name}-{len(shape)}-{uuid.uuid4().hex[:6]}"
    header = superserial.save(
        tf.data.Dataset.from_tensor_slices(data), f"{web_server.root}/{name}", num_shards=3
    )
    url = f"{proxy.url}/{name}"
    assert streamed.decoder(header, [f"{url}/{s.file}" for s in header.shards]) is not None
    for kw in ({"batch_size": 64}, {"batch_size": 64, "drop_remainder": True}):
        remote = superserial.load(url, **kw)
        local = superserial.load(f"{web_server.root}/{name}", **kw)
        assert remote.element_spec == local.element_spec
        got, want = list(remote), list(local)
        assert len(got) == len(want) == (n // 64 if kw.get("drop_remainder") else -(-n // 64))
        for g, w in zip(got, want, strict=True):
            _same(g, w)


def test_tf_load_decodes_nested_structures_exactly(web_server: Any, proxy: NetProxy) -> None:
    n = 200
    rng = np.random.default_rng(1)
    data = (
        rng.standard_normal((n, 4)).astype(np.float32),
        {"a": np.arange(n, dtype=np.int32), "b": (np.array([b"s%d" % i for i in range(n)]),)},
    )
    name = f"nest-{uuid.uuid4().hex[:8]}"
    superserial.save(tf.data.Dataset.from_tensor_slices(data), f"{web_server.root}/{name}")
    remote = superserial.load(f"{proxy.url}/{name}", batch_size=32)
    local = superserial.load(f"{web_server.root}/{name}", batch_size=32)
    assert remote.element_spec == local.element_spec
    for g, w in zip(list(remote), list(local), strict=True):
        _same(g, w)

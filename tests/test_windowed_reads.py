"""The windowed shuffle read by groups over ``http://``: what crosses the wire, per reader.

nginx (without listing) behind our proxy (:mod:`netproxy`), which counts the
requests and the body bytes really sent. A windowed epoch reads each block of
consecutive records once, a group of five windows at a time: at most ``n / 5``
requests and twice the dataset's bytes, in tf.data, the torch ``MapDataset``
under a windowed ``Sampler`` and Grain; the first batch of a load waits for its
own records, not for the whole group.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from torch.utils.data import DataLoader

import superserial
from netproxy import NetProxy
from superserial.grain import DataSource, dataset
from superserial.read import group_reads
from superserial.read.order import read_unit
from superserial.torch import MapDataset, Sampler, collate

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

_N, _SHARDS, _W, _BATCH, _SEED = 10_000, 4, 300, 64, 11  # runs of 1: blocks of 5 records


@pytest.fixture(scope="module")
def served(web_server: Any) -> tuple[str, int]:
    """A dataset of ``_N`` records of about 60 bytes under nginx: ``(name, its bytes)``."""
    name = f"win-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(5)
    data = tf.data.Dataset.from_tensor_slices(
        {"id": np.arange(_N, dtype=np.int64), "pad": rng.integers(0, 255, (_N, 40), np.uint8)}
    )
    root = os.path.join(web_server.root, name)
    superserial.save(data, root, num_shards=_SHARDS)
    return name, sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))


@pytest.fixture(scope="module")
def large(web_server: Any) -> tuple[str, int]:
    """10,000 records of about 1 KB: two groups of 5,000 for ``W = 1000``."""
    name = f"win-large-{uuid.uuid4().hex[:8]}"
    pad = np.random.default_rng(6).integers(0, 255, (10_000, 1000), np.uint8)
    data = tf.data.Dataset.from_tensor_slices({"id": np.arange(10_000, dtype=np.int64), "pad": pad})
    root = os.path.join(web_server.root, name)
    superserial.save(data, root, num_shards=_SHARDS)
    return name, sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))


@pytest.fixture
def proxy(web_server: Any) -> Iterator[NetProxy]:
    with NetProxy((web_server.host, web_server.port), latency=0.01) as px:
        yield px


def _order(epoch: int = 0) -> list[int]:
    return superserial.permutation(_N, _SEED, epoch, window=_W).tolist()


def _within_bounds(proxy: NetProxy, size: int) -> None:
    # Each reader reads each block once (neighbours coalesce), plus a cold group's
    # head, the indexes and the header: within n / 5 requests. DataLoader workers
    # fetch each unit once between them (superserial.read.unit_exchange), each its
    # head and indexes: the same bounds for all of them together.
    assert proxy.requests <= _N // 5, (proxy.requests, _N // 5)
    assert proxy.body_bytes <= 2 * size, (proxy.body_bytes, size)


def test_windowed_load_reads_blocks_once(served: tuple[str, int], proxy: NetProxy) -> None:
    name, size = served
    ds = superserial.load(
        f"{proxy.url}/{name}", shuffle=True, seed=_SEED, shuffle_window=_W, batch_size=_BATCH
    )
    assert [int(i) for b in ds for i in b["id"]] == _order()
    _within_bounds(proxy, size)


def test_groups_read_together_make_far_fewer_requests(
    served: tuple[str, int], proxy: NetProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, size = served
    group_bytes = read_unit(_N, _W)[0] * size / _N  # a little above its records' bytes
    seen = []
    # One group at a time, two, and all seven (the default bound holds the dataset).
    for unit_bytes in (0, 2 * group_bytes, group_reads.UNIT_BYTES):
        monkeypatch.setattr(group_reads, "UNIT_BYTES", unit_bytes)
        ds = superserial.load(
            f"{proxy.url}/{name}", shuffle=True, seed=_SEED, shuffle_window=_W, batch_size=_BATCH
        )
        proxy.reset()
        assert [int(i) for b in ds for i in b["id"]] == _order()
        _within_bounds(proxy, size)
        seen.append((proxy.requests, proxy.body_bytes))
    (one, _), (two, _), (every, every_bytes) = seen
    # Groups read together lie that many times as dense, so more neighbours coalesce
    # within the same bound (here a pair is 30% of the records: 1,182 requests against
    # 1,671); all of them are the files' records end to end.
    assert two < 0.8 * one, seen
    assert every < 0.5 * two, seen
    assert every_bytes < 1.2 * size, (every_bytes, size)


def test_windowed_load_first_batch_waits_for_its_head_not_the_group(
    large: tuple[str, int], web_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, size = large
    # A group too large to wait for (here: smaller, by the bound).
    monkeypatch.setattr(group_reads, "HEADLESS_BYTES", 0)
    n, window = 10_000, 1000
    group = read_unit(n, window)[0]  # 5,000 records: five windows of 1,000
    # The group's reads (runs of whole windows: megabytes each) are held by the proxy
    # until the first batch is out, so the test does not depend on how the reads
    # race: a first batch that waits for the group never comes, and the test fails.
    # (Timed instead, behind a 0.3 s round trip, a loaded CI saw the group's bytes
    # cross first.) The head's reads are single records and the indexes: kilobytes.
    let_go = threading.Event()

    def hold(request: bytes) -> None:
        shard = request.split(b" ", 2)[1].endswith(b".tfrecord")  # not the header, an index
        asked = re.search(rb"\r\nrange: *bytes=(\d+)-(\d+)", request, re.IGNORECASE)
        if shard and asked and int(asked[2]) - int(asked[1]) >= 256 << 10:
            let_go.wait(120)

    with NetProxy((web_server.host, web_server.port), latency=0.02) as proxy:
        proxy.hold = hold
        ds = superserial.load(
            f"{proxy.url}/{name}",
            shuffle=True,
            seed=_SEED,
            shuffle_window=window,
            batch_size=_BATCH,
        )
        batches = iter(ds)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            coming = pool.submit(next, batches)
            try:
                batch = coming.result(timeout=60)
            except concurrent.futures.TimeoutError:
                pytest.fail("the first batch waited for the group's reads, which were held")
            finally:
                sent = proxy.body_bytes  # before the held reads are let go
                let_go.set()
    first = [int(i) for i in batch["id"]]
    assert first == superserial.permutation(n, _SEED, window=window)[:_BATCH].tolist()
    record = size / n
    # The head's records (scattered: about once over) and the indexes, well below the
    # group's records.
    assert sent < 0.4 * group * record, (sent, group * record)


@pytest.mark.parametrize("headless", [True, False])
def test_a_small_cold_unit_is_read_without_a_head(
    served: tuple[str, int], proxy: NetProxy, monkeypatch: pytest.MonkeyPatch, headless: bool
) -> None:
    name, size = served
    if not headless:
        monkeypatch.setattr(group_reads, "HEADLESS_BYTES", 0)
    ds = superserial.load(
        f"{proxy.url}/{name}", shuffle=True, seed=_SEED, shuffle_window=_W, batch_size=_BATCH
    )
    assert [int(i) for b in ds for i in b["id"]] == _order()
    # The dataset is one unit, its records end to end: the header, the indexes and a
    # few range reads. A head adds its 512 scattered records (runs of 1 here): about
    # one request each.
    if headless:
        assert proxy.requests <= 25, proxy.requests
        assert proxy.body_bytes <= 1.1 * size, (proxy.body_bytes, size)
    else:
        assert proxy.requests > 200, proxy.requests


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_windowed_torch_epoch_reads_by_group(
    served: tuple[str, int], proxy: NetProxy, workers: int
) -> None:
    name, size = served
    sampler = Sampler(_N, seed=_SEED, shuffle_window=_W)
    sampler.set_epoch(1)
    loader = DataLoader(
        MapDataset(f"{proxy.url}/{name}"),
        batch_size=_BATCH,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
    )
    assert [int(i) for b in loader for i in b["id"]] == _order(1)
    _within_bounds(proxy, size)
    # The workers fetch the unit once between them, not each its share of every
    # block (which took 1.9-2.07x the dataset for two). On top, the indexes, and
    # where the unit is larger than HEADLESS_BYTES each worker's head (512 scattered
    # records, a tenth of this dataset: 1.05x for none, 1.20x for two, 1.35x for
    # three when it had them): within 1.1x + 0.15x a worker either way.
    assert proxy.body_bytes <= (1.1 + 0.15 * workers) * size, (proxy.body_bytes, size)


@pytest.mark.parametrize("workers", [0, 2])
def test_windowed_torch_batches_shorter_than_a_mark_read_by_group(
    served: tuple[str, int], proxy: NetProxy, workers: int
) -> None:
    # One index in MARK (8) carries its place: a batch of 5 often carries none, and
    # is read by group as following its worker's previous batch.
    name, size = served
    sampler = Sampler(_N, seed=_SEED, shuffle_window=_W)
    loader = DataLoader(
        MapDataset(f"{proxy.url}/{name}"),
        batch_size=5,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
    )
    assert [int(i) for b in loader for i in b["id"]] == _order(0)
    _within_bounds(proxy, size)  # read index by index: about n requests


def test_windowed_grain_epoch_reads_by_group(served: tuple[str, int], proxy: NetProxy) -> None:
    name, size = served
    source = DataSource(f"{proxy.url}/{name}")
    ds = dataset(source, seed=_SEED, epoch=2, shuffle_window=_W)
    assert [int(i) for b in ds.batch(_BATCH, batch_fn=source.collate) for i in b["id"]] == _order(2)
    _within_bounds(proxy, size)

"""Reading ``hf://`` datasets through huggingface_hub, from a Hub stand-in of our own.

huggingface_hub's real ``HfFileSystem`` talks HTTP to tests/fake_hub.py (the Hub's
routes answered from local directories, as moto answers S3's), through
tests/netproxy.py for latency and faults. Nothing of ours is mocked; only
huggingface_hub's endpoint setting is pointed at 127.0.0.1.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import assert_same_dataset, canon_np
from fake_hub import FakeHub
from netproxy import NetProxy
from superserial.storage import fs

hf = pytest.importorskip("huggingface_hub")

REPO = "someone/data"


def _data(n: int = 40) -> tf.data.Dataset:
    rng = np.random.default_rng(3)
    return tf.data.Dataset.from_tensor_slices(
        {
            "x": rng.integers(0, 255, (n, 4, 2), dtype=np.uint8),
            "s": [f"row-{i}".encode() * (i % 3) for i in range(n)],
            "r": tf.ragged.constant([[i] * (i % 4) for i in range(n)], dtype=tf.int64),
        }
    )


@pytest.fixture(scope="module")
def hub(tmp_path_factory: Any) -> Iterator[tuple[str, NetProxy]]:
    """The stand-in serving ``tmp/<REPO>``, behind a proxy; (the repo's directory, the proxy).

    The endpoint is given as a user would without code: fsspec's configuration of
    the ``hf`` protocol (``FSSPEC_HF_ENDPOINT``, read at fsspec's import into
    ``fsspec.config.conf``), which each new ``HfFileSystem`` takes. fsspec keeps
    the filesystems it made, so those are dropped before and after.
    """
    root = tmp_path_factory.mktemp("hub")
    (root / REPO).mkdir(parents=True)
    with (
        FakeHub(str(root)) as server,
        NetProxy((server.host, server.port), seed=5) as proxy,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setitem(fsspec.config.conf, "hf", {"endpoint": proxy.url})
        hf.HfFileSystem.clear_instance_cache()
        try:
            yield str(root / REPO), proxy
        finally:
            hf.HfFileSystem.clear_instance_cache()


@pytest.fixture
def proxy(hub: tuple[str, NetProxy]) -> Iterator[NetProxy]:
    p = hub[1]
    p.fail, p.latency = 0.0, 0.0
    p.reset()
    hf.HfFileSystem.clear_instance_cache()  # no listing or size kept from another test
    yield p
    p.fail, p.latency = 0.0, 0.0


def _saved(hub: tuple[str, NetProxy], shards: int = 3) -> tuple[str, str, superserial.Header]:
    """A new dataset in the repo: (its local path, its hf:// URL, its header)."""
    name = f"ds-{uuid.uuid4().hex[:8]}"
    local = f"{hub[0]}/{name}"
    header = superserial.save(_data(), local, num_shards=shards)
    return local, f"hf://datasets/{REPO}/{name}", header


def test_every_reader_reads_an_hf_dataset_exactly(
    hub: tuple[str, NetProxy], proxy: NetProxy
) -> None:
    local, url, _ = _saved(hub)
    want = [canon_np(e) for e in ssnp.load(local)]
    ds = ssnp.load(url)
    assert [canon_np(e) for e in ds] == want
    idx = [39, 0, 17, 17, 5]
    got, exp = ds.get_batch(idx), ssnp.load(local).get_batch(idx)
    np.testing.assert_array_equal(got["x"], exp["x"])
    assert [list(r) for r in got["r"]] == [list(r) for r in exp["r"]]
    assert canon_np(ds[21]) == want[21]
    pinned = url.replace(REPO, f"{REPO}@main")  # a branch, tag or commit after the repo
    assert [canon_np(e) for e in ssnp.load(pinned)] == want
    assert_same_dataset(superserial.load(local), superserial.load(url))
    assert_same_dataset(
        superserial.load(local, shuffle=True, seed=4), superserial.load(url, shuffle=True, seed=4)
    )
    assert superserial.verify(url).ok
    assert proxy.requests > 0  # it all went through the Hub's HTTP API


def test_random_reads_of_an_hf_dataset_go_in_parallel(
    hub: tuple[str, NetProxy], proxy: NetProxy
) -> None:
    local, url, header = _saved(hub, shards=8)
    ds = ssnp.load(url)
    proxy.latency = 0.05
    proxy.reset()
    # One record of each shard: eight range requests, each held 50 ms.
    first = np.cumsum([0] + [s.records for s in header.shards[:-1]])
    got = ds.get_batch(first)
    np.testing.assert_array_equal(got["x"], ssnp.load(local).get_batch(first)["x"])
    assert proxy.max_in_flight > 1, proxy.stats()


def test_flaky_hub_reads_are_retried_and_exact(hub: tuple[str, NetProxy], proxy: NetProxy) -> None:
    local, url, _ = _saved(hub)
    want = [canon_np(e) for e in ssnp.load(local)]
    ds = ssnp.load(url)
    proxy.fail = 0.1
    assert [canon_np(e) for e in ds] == want
    got = ds.get_batch(list(range(0, 40, 3)))
    np.testing.assert_array_equal(got["x"], ssnp.load(local).get_batch(list(range(0, 40, 3)))["x"])
    assert proxy.failed > 0, proxy.stats()


def test_a_missing_repo_dataset_or_shard_on_the_hub(
    hub: tuple[str, NetProxy], proxy: NetProxy
) -> None:
    with pytest.raises(superserial.DatasetNotFoundError, match="hf://datasets/nobody/none/ds"):
        ssnp.load("hf://datasets/nobody/none/ds")
    with pytest.raises(superserial.DatasetNotFoundError, match="found no such directory"):
        ssnp.load(f"hf://datasets/{REPO}/nothing-here")
    local, url, header = _saved(hub)
    fs.remove(f"{local}/{header.shards[1].file}")
    with pytest.raises(superserial.CorruptDataError, match=header.shards[1].file):
        ssnp.load(url)

"""Random and shuffled reads on ``s3://``: many range requests in flight, few bytes beyond the records.

Against a real S3 API (moto's server) seen through our proxy
(:mod:`netproxy`) that holds each request for a while and counts what
really crossed the wire: requests in flight at once and the bytes the server
sent. The client is pointed at the proxy through fsspec's own configuration
(``fsspec.config.conf``), as a user would point it at an endpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import fsspec
import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from netproxy import NetProxy
from superserial.format.record_index import read_index

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

# The contract (superserial.storage.fetch): the bytes fetched stay within twice
# the records'; the requests in flight within the setting.
AMPLIFICATION = 2
CONCURRENCY_ENV = "SUPERSERIAL_REMOTE_CONCURRENCY"

_N, _SHARDS, _SIDE = 800, 4, 64  # 4 shards of 200 records of about 4 KiB: ~820 KB each


def _data() -> tf.data.Dataset:
    rng = np.random.default_rng(23)
    return tf.data.Dataset.from_tensor_slices(
        {
            "image": rng.integers(0, 255, (_N, _SIDE, _SIDE), dtype=np.uint8),
            "label": np.arange(_N, dtype=np.int64),
        }
    )


@pytest.fixture(scope="module")
def paths(s3_server: str, tmp_path_factory: Any) -> tuple[str, str]:
    """``(local, remote)``: the same dataset saved locally and on S3."""
    bucket = f"fetch-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    local = str(tmp_path_factory.mktemp("fetch") / "ds")
    remote = f"s3://{bucket}/ds"
    superserial.save(_data(), local, num_shards=_SHARDS)
    superserial.save(_data(), remote, num_shards=_SHARDS)
    return local, remote


@pytest.fixture
def proxy(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[NetProxy]:
    """A proxy holding each request 50 ms, the S3 client pointed at it; at most 4 in flight."""
    monkeypatch.setenv(CONCURRENCY_ENV, "4")
    with NetProxy(s3_server, latency=0.05) as px:
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": px.url})
        yield px


def _framed(local: str, indices: np.ndarray) -> int:
    """The framed bytes (length, CRCs and data) of the distinct records at ``indices``."""
    header = ssnp.load(local).header
    sizes = np.concatenate([np.diff(read_index(local, s)) for s in header.shards])
    return int(sizes[np.unique(np.asarray(indices) % _N)].sum())


def test_get_batch_issues_range_reads_in_parallel_up_to_the_bound(
    paths: tuple[str, str], proxy: NetProxy
) -> None:
    local, remote = paths
    ds = ssnp.load(remote)
    ds.get_batch([0, 200, 400, 600])  # reads the header and every shard's index
    indices = np.random.default_rng(1).choice(_N, 24, replace=False)
    indices[:3] = [indices[5], -1, -_N]  # duplicates and negatives too
    proxy.reset()
    got = ds.get_batch(indices)
    want = ssnp.load(local).get_batch(indices)
    np.testing.assert_array_equal(got["image"], want["image"])
    np.testing.assert_array_equal(got["label"], want["label"])
    assert proxy.requests > 4
    assert 1 < proxy.max_in_flight <= 4


def test_s3_has_more_requests_in_flight_than_botocores_default_pool(
    paths: tuple[str, str], proxy: NetProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, remote = paths
    monkeypatch.setenv(CONCURRENCY_ENV, "32")
    ds = ssnp.load(remote)
    ds.get_batch([0, 200, 400, 600])
    indices = np.arange(0, _N, 25)  # 100 KB apart: one request each
    proxy.reset()
    np.testing.assert_array_equal(ds.get_batch(indices)["label"], indices)
    # botocore's pool holds 10 connections unless told otherwise.
    assert proxy.requests == len(indices)
    assert 10 < proxy.max_in_flight <= 32


def test_get_batch_fetches_within_the_read_amplification_bound(
    paths: tuple[str, str], proxy: NetProxy
) -> None:
    local, remote = paths
    ds = ssnp.load(remote)
    ds.get_batch([0, 200, 400, 600])
    indices = np.random.default_rng(2).choice(_N, 16, replace=False)
    proxy.reset()
    got = ds.get_batch(indices)
    np.testing.assert_array_equal(got["label"], indices)
    useful = _framed(local, indices)
    # What the server sent, not what our plan says: at most twice the
    # records (a 2 MiB gap fetched ~whole shards).
    assert proxy.body_bytes <= AMPLIFICATION * useful


def test_shuffled_load_reads_exactly_the_local_order_within_the_bound(
    paths: tuple[str, str], proxy: NetProxy
) -> None:
    local, remote = paths
    want = [
        b["label"].numpy() for b in superserial.load(local, shuffle=True, seed=7, batch_size=64)
    ]
    ds = superserial.load(remote, shuffle=True, seed=7, batch_size=64)
    proxy.latency = 0.0  # bytes are counted here, not overlap: no need to wait
    proxy.reset()
    got = [b for b in ds]
    labels = [b["label"].numpy() for b in got]
    assert len(labels) == len(want)
    for g, w in zip(labels, want, strict=True):
        np.testing.assert_array_equal(g, w)
    images = next(iter(_data().batch(_N)))["image"].numpy()
    for b in got[:5]:
        np.testing.assert_array_equal(b["image"].numpy(), images[b["label"].numpy()])
    # One epoch reads each record once, besides the header and the indexes
    # (each index is 8 bytes a record and a few of framing).
    useful = _framed(local, np.arange(_N))
    small = 64 << 10
    assert proxy.body_bytes <= AMPLIFICATION * useful + small
    assert proxy.max_in_flight <= 4 * 2  # 4 a process; TF runs at most a few reads at once


def test_forked_torch_workers_read_in_parallel(paths: tuple[str, str], proxy: NetProxy) -> None:
    torch = pytest.importorskip("torch")
    from superserial.torch import MapDataset

    local, remote = paths
    ds = MapDataset(remote)
    ds.source.get_batch(np.arange(0, _N, 50))  # the parent's pool exists before the fork
    order = np.random.default_rng(3).permutation(_N)[:192].tolist()
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=32,
        sampler=order,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=lambda batch: batch,
    )
    proxy.reset()
    got = [e for batch in loader for e in batch]
    assert [int(e["label"]) for e in got] == order
    want = ssnp.load(local).get_batch(order)["image"]
    np.testing.assert_array_equal(np.stack([np.asarray(e["image"]) for e in got]), want)
    # Two workers reading one range at a time would never have more than 2 in flight. Each
    # worker has its pool of 4, and reads a shard's index on first touch outside it (one
    # at a time): at most 2 * (4 + 1).
    assert 2 < proxy.max_in_flight <= 2 * (4 + 1)


def test_concurrency_setting_must_be_a_positive_integer(
    paths: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, remote = paths
    ds = ssnp.load(remote)
    monkeypatch.setenv(CONCURRENCY_ENV, "0")
    with pytest.raises(
        ValueError, match=rf"expected a positive integer in {CONCURRENCY_ENV}, got '0'"
    ):
        ds.get_batch(np.arange(0, _N, 37))

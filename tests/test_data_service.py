"""Distributed loading: a tf.data service with two workers, and ``load(shard=(i, n))``."""

from __future__ import annotations

import collections

import pytest
import tensorflow as tf

import superserial

N, FILES = 90, 7


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("svc") / "ds")

    def element(k: tf.Tensor) -> dict:
        return {
            "id": k,
            "rag": tf.RaggedTensor.from_row_lengths(tf.range(k % 3), [k % 3]),
            "var": tf.strings.as_string(tf.range(k % 4)),
        }

    superserial.save(tf.data.Dataset.range(N).map(element), path, num_shards=FILES)
    return path


@pytest.fixture(scope="module")
def service():
    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [
        tf.data.experimental.service.WorkerServer(
            tf.data.experimental.service.WorkerConfig(dispatcher_address=address)
        )
        for _ in range(2)
    ]
    yield dispatcher
    for w in workers:
        w.stop()
    dispatcher.stop()


def _file_of(path: str) -> dict[int, int]:
    """Which shard file holds each id."""
    out = {}
    for k in range(len(superserial.read_header(path).shards)):
        for el in superserial.load(path, shard=(k, FILES)):
            out[int(el["id"])] = k
    return out


def test_distributed_epoch_sees_every_element_once(saved, service):
    # Each worker reads only the shard files (splits) the dispatcher hands it,
    # so the overall count is not asserted (each shard's own count still is).
    ds = superserial.load(saved, assert_cardinality=False)
    dist = ds.apply(
        tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=service.target, job_name="exactly_once"
        )
    )
    ids = [int(el["id"]) for el in dist]
    assert sorted(ids) == list(range(N)), collections.Counter(ids).most_common(3)
    # A split is a whole file, read in order by one worker: each file's
    # elements arrive in their saved order.
    where = _file_of(saved)
    for k in range(FILES):
        in_file = [i for i in ids if where[i] == k]
        assert in_file == sorted(in_file), (k, in_file)
    # The values are intact, not just the ids.
    by_id = {int(el["id"]): el for el in superserial.load(saved)}
    for el in dist.take(10):
        want = by_id[int(el["id"])]
        assert el["rag"].to_list() == want["rag"].to_list()
        assert el["var"].numpy().tolist() == want["var"].numpy().tolist()


def test_two_workers_really_serve(saved, service):
    # The control: without splitting, each of the two workers serves the
    # whole dataset, so every element comes twice.
    ds = superserial.load(saved, assert_cardinality=False)
    dist = ds.apply(
        tf.data.experimental.service.distribute(
            processing_mode="parallel_epochs", service=service.target, job_name="twice"
        )
    )
    counts = collections.Counter(int(el["id"]) for el in dist)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {2}


@pytest.mark.parametrize("n", [1, 3, FILES, FILES + 2])
def test_load_shard_i_of_n_covers_every_element_once(saved, n):
    header = superserial.read_header(saved)
    seen = []
    for i in range(n):
        if n > FILES:  # hosts FILES..n-1 get no file: every host warns
            with pytest.warns(superserial.errors.IdleReaderWarning, match="read nothing"):
                part = superserial.load(saved, shard=(i, n))
        else:
            part = superserial.load(saved, shard=(i, n))
        want = sum(s.records for s in header.shards[i::n])
        assert len(part) == want
        ids = [int(el["id"]) for el in part]
        assert ids == sorted(ids)  # files i, i+n, ... in order
        seen.extend(ids)
    assert sorted(seen) == list(range(N))
    with pytest.raises(ValueError, match="shard"):
        superserial.load(saved, shard=(n, n))

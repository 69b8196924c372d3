"""Distributed loading: a tf.data service with two workers, and ``load(shard=(i, n))``."""

from __future__ import annotations

import collections
import json
import os
import shutil

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
    # A worker drops a finished task (its input pipeline) on its next heartbeat, 30 s apart by
    # default, and the drop waits for that pipeline's threads; stopping a worker waits for its
    # heartbeat thread, so the teardown took up to ~30 s. Heartbeats every 100 ms drop each
    # task soon after its job ends, while the other tests run. New tasks reach a worker without
    # waiting for a heartbeat either way (the jobs here started at once with 30 s heartbeats).
    config = {"dispatcher_address": address, "heartbeat_interval_ms": 100}
    workers = [
        tf.data.experimental.service.WorkerServer(
            tf.data.experimental.service.WorkerConfig(**config)
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


def _key(el: dict) -> tuple:
    return (int(el["id"]), tuple(el["rag"].to_list()[0]), tuple(el["var"].numpy().tolist()))


@pytest.mark.parametrize("kwargs", [{}, {"assert_cardinality": False}], ids=["default", "flag"])
def test_distributed_epoch_sees_every_element_once(saved, service, kwargs):
    # The natural code, no flag: each worker reads only the shard files
    # (splits) the dispatcher hands it, and its share ends where its files do.
    ds = superserial.load(saved, **kwargs)
    dist = ds.apply(
        tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch",
            service=service.target,
            job_name=f"exactly_once_{len(kwargs)}",
        )
    )
    got = [_key(el) for el in dist]
    ids = [k[0] for k in got]
    assert sorted(ids) == list(range(N)), collections.Counter(ids).most_common(3)
    # The same elements as a plain load, as a multiset (values, not just ids).
    assert collections.Counter(got) == collections.Counter(
        _key(el) for el in superserial.load(saved)
    )
    # A split is a whole file, read in order by one worker: each file's
    # elements arrive in their saved order.
    where = _file_of(saved)
    for k in range(FILES):
        in_file = [i for i in ids if where[i] == k]
        assert in_file == sorted(in_file), (k, in_file)


@pytest.mark.parametrize("kwargs", [{}, {"assert_cardinality": False}], ids=["default", "flag"])
def test_parallel_epochs_each_worker_serves_everything(saved, service, kwargs):
    # The control: without splitting, each of the two workers serves the
    # whole dataset, so every element comes twice.
    ds = superserial.load(saved, **kwargs)
    dist = ds.apply(
        tf.data.experimental.service.distribute(
            processing_mode="parallel_epochs",
            service=service.target,
            job_name=f"twice_{len(kwargs)}",
        )
    )
    counts = collections.Counter(_key(el) for el in dist)
    assert counts == collections.Counter({_key(el): 2 for el in superserial.load(saved)})


def test_distributed_epoch_batched_and_selected(saved, service):
    # (var, of varying length, cannot batch: select leaves it out.)
    dist = superserial.load(saved, batch_size=4, select=["id", "rag"]).apply(
        tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=service.target, job_name="batched"
        )
    )
    batches = list(dist)
    assert all(set(b) == {"id", "rag"} for b in batches)
    ids = [int(i) for b in batches for i in b["id"]]
    assert sorted(ids) == list(range(N))


@pytest.mark.parametrize(
    "kwargs", [{}, {"batch_size": 4}, {"batch_size": 4, "drop_remainder": True}]
)
def test_length_is_known(saved, kwargs):
    ds = superserial.load(saved, select=["id"], **kwargs)
    want = N if not kwargs else (N // 4 if kwargs.get("drop_remainder") else -(-N // 4))
    assert len(ds) == want == len(list(ds))
    assert ds.cardinality() == want


@pytest.mark.parametrize("victim", [0, FILES - 1], ids=["first", "last"])
def test_shard_short_of_records_still_fails(saved, tmp_path, victim):
    # The header promises one record more in one shard than it holds (its
    # bytes are intact): the shard's own count check fails the read.
    path = str(tmp_path / "short")
    shutil.copytree(saved, path)
    with open(os.path.join(path, "header.json")) as f:
        obj = json.load(f)
    obj["shards"][victim]["records"] += 1
    obj["element_count"] += 1
    with open(os.path.join(path, "header.json"), "w") as f:
        json.dump(obj, f)
    ds = superserial.load(path)
    assert len(ds) == N + 1
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain"):
        list(ds)


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

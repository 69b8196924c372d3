"""``load`` builds its pipeline without autograph, and still restores every element exactly.

Autograph converting the decode graph and the pipeline's own functions
(parsing Python source into an AST and transpiling it) was most of a first
``load`` in a process: 1-2 s for sklearn's digits. Each conversion leaves a
``__autograph_generated_file...`` module in ``sys.modules``; none may appear.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
from conftest import assert_same_dataset


def _fixed() -> tf.data.Dataset:
    rng = np.random.default_rng(1)
    return tf.data.Dataset.from_tensor_slices(
        {
            "fixed_image_nag": rng.random((20, 3, 2)).astype(np.float64),
            "fixed_label_nag": rng.integers(0, 10, 20),
        }
    )


def _ragged() -> tf.data.Dataset:
    rng = np.random.default_rng(2)
    lengths = rng.integers(0, 5, 20)
    tokens = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, 99, lengths.sum()).astype(np.int32), lengths
    )
    return tf.data.Dataset.from_tensor_slices({"ragged_tokens_nag": tokens})


def _unknown_dim() -> tf.data.Dataset:
    # A dense leaf with an unknown dimension: rebuilt per element (the join path).
    # Lengths change every 4 elements, so batches of 4 stack.
    def gen():
        for i in range(12):
            yield np.arange(i // 4, dtype=np.int16), np.float32(i)

    return tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            tf.TensorSpec([None], tf.int16),
            tf.TensorSpec([], tf.float32),
        ),
    )


def _generated() -> set[str]:
    return {name for name in sys.modules if "__autograph_generated_file" in name}


@pytest.fixture
def transpiled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions handed to autograph's transpiler during the test, cache hits too.

    Autograph keeps one conversion per code object, so once any test has
    converted a function, no new module shows the next conversion of it.
    """
    from tensorflow.python.autograph.impl import api

    handed: list[str] = []
    transform = api._TRANSPILER.transform

    def spy(fn: Any, ctx: Any) -> Any:
        handed.append(getattr(fn, "__qualname__", repr(fn)))
        return transform(fn, ctx)

    monkeypatch.setattr(api._TRANSPILER, "transform", spy)
    return handed


@pytest.mark.parametrize("make", [_fixed, _ragged, _unknown_dim])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_load_converts_nothing_with_autograph(
    ds_path: str, make: Callable[[], tf.data.Dataset], batch_size: int | None, transpiled: list[str]
) -> None:
    superserial.save(make(), ds_path)
    before = _generated()
    ds = superserial.load(ds_path, batch_size=batch_size)
    loaded = list(ds)
    assert transpiled == []
    assert _generated() - before == set()
    # And the elements are still exactly the saved ones, in order.
    want = make() if batch_size is None else make().batch(batch_size)
    if batch_size is None:
        assert_same_dataset(want, ds)
    else:
        assert len(loaded) == len(list(want))
        for got, exp in zip(loaded, want, strict=True):
            for a, b in zip(tf.nest.flatten(got, True), tf.nest.flatten(exp, True), strict=True):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _shuffled_data(names: str) -> tf.data.Dataset:
    # Leaf names of the test's own: autograph converts a function once per
    # process, so a structure some other test loaded shuffled would not show.
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 5, 20)
    tokens = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, 99, lengths.sum()).astype(np.int32), lengths
    )
    image = rng.random((20, 3, 2)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices({f"image_{names}": image, f"tokens_{names}": tokens})


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_shuffled_load_converts_nothing_with_autograph(
    ds_path: str, window: int | None, batch_size: int | None, transpiled: list[str]
) -> None:
    # The shuffled path maps the parser's Python function (not its tf.function):
    # left to the map, autograph converted it at every load (0.5-0.8 s of a
    # process's first shuffled load, mnist-shaped).
    names = f"shuffled_nag_{window}_{batch_size}"
    superserial.save(_shuffled_data(names), ds_path)
    before = _generated()
    ds = superserial.load(
        ds_path, shuffle=True, shuffle_window=window, seed=3, batch_size=batch_size
    )
    loaded = list(ds if batch_size is None else ds.unbatch())
    assert transpiled == []
    assert _generated() - before == set()
    # And the elements are exactly the saved ones, in the order's positions.
    saved = list(_shuffled_data(names))
    order = superserial.permutation(20, 3, 0, window=window).tolist()
    assert len(loaded) == len(order)
    for got, i in zip(loaded, order, strict=True):
        pairs = zip(tf.nest.flatten(got, True), tf.nest.flatten(saved[i], True), strict=True)
        for a, b in pairs:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_a_remote_load_converts_nothing_with_autograph(
    web_server: Any, tmp_path: Any, cache: bool, batch_size: int | None, transpiled: list[str]
) -> None:
    # Over http the shards come through one stream (superserial.tf.streamed), whose
    # records were cut out of its buffers by a function autograph converted.
    name = f"remote-nag-{uuid.uuid4().hex[:8]}"
    header = superserial.save(_fixed(), f"{web_server.root}/{name}", num_shards=2)
    # A cache for one shard of the two: streamed through it, not fetched whole first.
    largest = max(sum(size for _, size, _ in s.files()) for s in header.shards)
    where = {"cache_dir": str(tmp_path / "cache"), "cache_limit": largest} if cache else {}
    ds = superserial.load(f"{web_server.url}/{name}", batch_size=batch_size, **where)
    loaded = list(ds)
    assert transpiled == []
    want = _fixed() if batch_size is None else _fixed().batch(batch_size)
    assert len(loaded) == len(list(want))
    for got, exp in zip(loaded, want, strict=True):
        for a, b in zip(tf.nest.flatten(got, True), tf.nest.flatten(exp, True), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_super_serial_2_pair_loads_without_autograph(transpiled: list[str]) -> None:
    # (Its values are checked in test_legacy.py.)
    from make_golden import HERE

    ds = superserial.load(os.path.join(HERE, "v2.tfrecord"), os.path.join(HERE, "v2.header"))
    assert len(list(ds)) == 4
    assert transpiled == []


def _ops(ds: tf.data.Dataset) -> list[str]:
    return [n.op for n in tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy()).node]


def test_one_shard_batched_load_states_its_count_once(ds_path: str) -> None:
    # The shard's own assert_cardinality already gives the batches' count:
    # no second statement of it (concatenate + choose_from_datasets + take),
    # which doubled the time to build the pipeline.
    superserial.save(_fixed(), ds_path)
    ds = superserial.load(ds_path, batch_size=8)
    ops = _ops(ds)
    assert ops.count("AssertCardinalityDataset") == 1
    assert "ConcatenateDataset" not in ops and "TakeDataset" not in ops
    assert len(ds) == 3 and sum(int(tf.shape(b["fixed_label_nag"])[0]) for b in ds) == 20


@pytest.mark.parametrize("records", [21, 19])
def test_one_shard_batched_load_with_a_wrong_count_fails(ds_path: str, records: int) -> None:
    # The count check that remains: a shard short (or long) of records is an error.
    superserial.save(_fixed(), ds_path)
    path = f"{ds_path}/header.json"
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    obj["element_count"] = obj["shards"][0]["records"] = records
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    with pytest.raises(tf.errors.FailedPreconditionError, match=f"expected to contain {records}"):
        list(superserial.load(ds_path, batch_size=8))

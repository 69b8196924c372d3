"""``load`` builds its pipeline without autograph, and still restores every element exactly.

Autograph converting the decode graph and the pipeline's own functions
(parsing Python source into an AST and transpiling it) was most of a first
``load`` in a process: 1-2 s for sklearn's digits. Each conversion leaves a
``__autograph_generated_file...`` module in ``sys.modules``; none may appear.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

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


@pytest.mark.parametrize("make", [_fixed, _ragged, _unknown_dim])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_load_converts_nothing_with_autograph(
    ds_path: str, make: Callable[[], tf.data.Dataset], batch_size: int | None
) -> None:
    superserial.save(make(), ds_path)
    before = _generated()
    ds = superserial.load(ds_path, batch_size=batch_size)
    loaded = list(ds)
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

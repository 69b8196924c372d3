"""load works in eager and graph mode: inside tf.function and for Keras fit."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import superserial


def _digits(ds_path: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((64, 8, 8)).astype(np.float64)
    y = rng.integers(0, 10, 64).astype(np.int64)
    superserial.save(tf.data.Dataset.from_tensor_slices((x, y)), ds_path)


def test_iterate_inside_tf_function(ds_path):
    _digits(ds_path)
    ds = superserial.load(ds_path)

    @tf.function
    def total(d):
        acc = tf.constant(0.0, tf.float64)
        n = tf.constant(0, tf.int64)
        for x, _ in d:
            acc += tf.reduce_sum(x)
            n += 1
        return acc, n

    acc, n = total(ds)
    want = sum(float(np.sum(x)) for x, _ in ds.as_numpy_iterator())
    assert int(n) == 64
    np.testing.assert_allclose(float(acc), want, rtol=1e-12)


def test_load_called_inside_tf_function(ds_path):
    _digits(ds_path)

    @tf.function
    def count():
        return superserial.load(ds_path).reduce(tf.constant(0, tf.int64), lambda a, _: a + 1)

    assert int(count()) == 64


def test_keras_fit_on_loaded_dataset(ds_path):
    _digits(ds_path)
    ds = superserial.load(ds_path, batch_size=16).map(
        lambda x, y: (tf.reshape(tf.cast(x, tf.float32), [-1, 64]), y)
    )
    model = tf.keras.Sequential([tf.keras.Input([64]), tf.keras.layers.Dense(10)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["loss"]))

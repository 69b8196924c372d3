"""The round-trip matrix: every leaf kind of every dtype, shared by the save, Writer and Beam tests."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np
import tensorflow as tf

from superserial.format import dtypes

SHAPES = {
    "scalar": (),
    "vector": (3,),
    "matrix": (2, 3),
    "zero_size": (2, 0),
}


def values(entry: dtypes.DType, shape: tuple[int, ...], n: int, seed: int = 0) -> np.ndarray:
    """n random values of a dtype, extremes and special floats included."""
    rng = np.random.default_rng(seed)
    full = (n, *shape)
    size = int(np.prod(full))
    if entry.name == "string":
        pool = [b"", b"a", b"\x00\xff\x00", "é".encode(), b"x" * 300]
        return np.array([pool[i % len(pool)] for i in range(size)], dtype=object).reshape(full)
    if entry.name == "bool":
        return rng.integers(0, 2, size=full).astype(bool)
    np_dtype = entry.numpy
    if entry.is_integer:
        info = np.iinfo(np_dtype)
        special = np.array([info.min, info.max, 0, 1], dtype=np_dtype)
        vals = rng.integers(info.min, info.max, size=size, dtype=np_dtype, endpoint=True)
    else:
        real = np.float32 if entry.name == "bfloat16" else np_dtype
        if np.issubdtype(real, np.complexfloating):
            real = np.float32 if real == np.complex64 else np.float64
        vals = rng.standard_normal(size).astype(real)
        special = np.array([np.nan, -0.0, np.inf, -np.inf], dtype=real)
        vals = vals.astype(np_dtype)
        special = special.astype(np_dtype)
        if np.issubdtype(np_dtype, np.complexfloating):
            vals = vals + 1j * vals[::-1]
    vals[: min(size, len(special))] = special[: min(size, len(special))]
    return vals.reshape(full)


# Row lengths of the ragged leaves: empty rows included.
_LENGTHS = [3, 0, 2, 5, 1, 0]
N = len(_LENGTHS)


def leaf_kinds_dataset(entry: dtypes.DType, seed: int = 0) -> tf.data.Dataset:
    """N elements holding every leaf kind of one dtype, plus an ``id``.

    Dense leaves of each of :data:`SHAPES`; ragged of ``ragged_rank`` 0 (what
    ``from_tensor_slices`` gives a ragged column), 1 and 2 (with int32 row
    splits); dense with unknown dimensions; sparse with a known and an
    unknown dimension.
    """
    dt = tf.as_dtype(entry.name)
    cols = {
        name: tf.constant(values(entry, shape, N, seed + k), dtype=dt)
        for k, (name, shape) in enumerate(SHAPES.items())
    }
    flat = tf.constant(values(entry, (), sum(_LENGTHS), seed + 10), dtype=dt)
    rag0 = tf.RaggedTensor.from_row_lengths(flat, _LENGTHS)
    # [N, None, None]: each element's rows, themselves of varying lengths.
    inner = tf.RaggedTensor.from_row_lengths(flat, [2, 1, 0, 3, 4, 1])
    rag1 = tf.RaggedTensor.from_row_lengths(inner, [1, 0, 2, 1, 1, 1])
    rag2 = tf.RaggedTensor.from_row_lengths(
        tf.RaggedTensor.from_row_lengths(inner, [2, 1, 1, 2], validate=False),
        [1, 1, 0, 1, 0, 1],
    ).with_row_splits_dtype(tf.int32)
    idx = [[k, (3 * k) % 5] for k in range(N) if k != 2]
    sparse = tf.sparse.SparseTensor(
        idx, tf.constant(values(entry, (), len(idx), seed + 20), dtype=dt), [N, 5]
    )
    columns = {
        "id": tf.range(N, dtype=tf.int64),
        "dense": cols,
        "rag0": rag0,
        "rag1": rag1,
        "rag2": rag2,
        "sparse": sparse,
    }
    leaves = {k: tf.data.Dataset.from_tensor_slices(v) for k, v in columns.items()}
    # A map cannot return a ragged_rank 0 leaf, so these come from their own
    # dataset, zipped in.
    rows = leaves["rag0"]
    leaves["unknown"] = rows.map(lambda r: tf.reshape(r, [-1, 1]))  # TensorSpec([None, 1])
    leaves["sparse_unknown"] = rows.map(
        lambda r: tf.sparse.from_dense(tf.reshape(r, [1, -1]))  # SparseTensorSpec([1, None])
    )
    return tf.data.Dataset.zip(leaves)


class SavedOnUse:
    """Datasets saved when first asked for: ``saved[key]`` is ``make(key)``, made once.

    A module's parametrized tests each need one of many saved datasets; saving all
    of them up front (in each xdist worker that runs any of the tests) cost up to a
    minute of a loaded CI run.
    """

    def __init__(self, make: Callable[[Hashable], str]) -> None:
        self._make = make
        self._paths: dict[Hashable, str] = {}

    def __getitem__(self, key: Hashable) -> str:
        if key not in self._paths:
            self._paths[key] = self._make(key)
        return self._paths[key]

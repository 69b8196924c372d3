"""Hypothesis: random nested structures of random dtypes and shapes round-trip."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import superserial
from conftest import assert_same_dataset
from superserial.format import dtypes

N = 3  # elements per dataset


def _values(draw, entry: dtypes.DType, need: int) -> np.ndarray:
    if entry.name == "string":
        out = np.empty(need, dtype=object)  # np.array would make a fixed-width bytes array
        out[:] = draw(st.lists(st.binary(max_size=4), min_size=need, max_size=need))
        return out
    if entry.name == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=need, max_size=need)), dtype=bool)
    raw = draw(st.binary(min_size=need * entry.itemsize, max_size=need * entry.itemsize))
    return np.frombuffer(raw, entry.numpy).copy()  # any bit pattern: NaN payloads too


@st.composite
def leaf_tensor(draw):
    """A batched leaf of N elements: dense, ragged (rank 1 or 2) or sparse."""
    entry = draw(st.sampled_from(dtypes.DTYPES))
    dtype = tf.as_dtype(entry.name)
    kind = draw(st.sampled_from(["dense", "dense", "ragged", "ragged2", "sparse"]))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    if kind == "dense":
        need = N * int(np.prod(shape))
        return tf.reshape(tf.constant(_values(draw, entry, need), dtype=dtype), (N, *shape))
    if kind.startswith("ragged"):
        inner = tuple(d for d in shape if d > 0)[:1]
        outer = draw(st.lists(st.integers(0, 3), min_size=N, max_size=N))
        rows = outer
        if kind == "ragged2":
            rows = draw(st.lists(st.integers(0, 3), min_size=sum(outer), max_size=sum(outer)))
        need = sum(rows) * int(np.prod(inner))
        values = tf.reshape(
            tf.constant(_values(draw, entry, need), dtype=dtype), (sum(rows), *inner)
        )
        rt = tf.RaggedTensor.from_row_lengths(values, rows)
        return tf.RaggedTensor.from_row_lengths(rt, outer) if kind == "ragged2" else rt
    dense_shape = (N, *(d or 2 for d in (shape or (2,))))
    cells = int(np.prod(dense_shape))
    mask = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    idx = np.argwhere(np.array(mask).reshape(dense_shape)).astype(np.int64)
    return tf.sparse.SparseTensor(
        idx, tf.constant(_values(draw, entry, len(idx)), dtype=dtype), dense_shape
    )


keys = st.text(min_size=0, max_size=6)
structures = st.recursive(
    leaf_tensor(),
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.dictionaries(keys, children, min_size=1, max_size=3),
    ),
    max_leaves=5,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(structures)
def test_random_structures_round_trip(struct):
    ds = tf.data.Dataset.from_tensor_slices(struct)
    path = tempfile.mkdtemp()
    try:
        superserial.save(ds, f"{path}/ds")
        assert_same_dataset(ds, superserial.load(f"{path}/ds"))
    finally:
        shutil.rmtree(path)

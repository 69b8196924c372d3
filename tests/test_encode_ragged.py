"""The numpy encoder of ragged, string and unknown-shape leaves writes the graph encoder's bytes.

Each case is a ``tf.data`` dataset; the numpy side gets the same values as the
columns the converters hand it (flat values and row lengths, as Arrow holds lists;
:class:`~superserial.codec.numpy_encode.Shaped` values and shapes), batch by batch.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from superserial.codec import numpy_encode, tf_records
from superserial.codec.numpy_encode import Ragged, Shaped, Strings
from superserial.codec.tf_spec import from_element_spec
from superserial.format.framing import frame_records
from superserial.format.structure import Leaf, iter_leaves

rng = np.random.default_rng(11)
N = 23


def _ragged(dtype: Any, depth: int, inner: tuple[int, ...] = (), empty_every: int = 3) -> Any:
    """N elements of ragged values nested ``depth`` deep, some rows empty."""

    def rows(level: int) -> Any:
        n = int(rng.integers(0, 4))
        if level == depth:
            values = rng.integers(-200, 200, (n, *inner))
            if np.dtype(dtype) == object:
                return [
                    [b"s%d" % v for v in np.ravel(r)] if inner else b"x" * abs(int(r))
                    for r in values
                ]
            return values.astype(dtype).tolist()
        return [rows(level + 1) for _ in range(n)]

    elements = [rows(1) if i % empty_every else [] for i in range(N)]
    tf_dtype = tf.string if np.dtype(dtype) == object else tf.as_dtype(dtype)
    return tf.ragged.constant(
        elements, tf_dtype, ragged_rank=depth, inner_shape=inner if inner else None
    )


CASES: dict[str, Any] = {
    "ints": lambda: {"r": _ragged(np.int64, 1), "s": _ragged(np.int16, 1)},
    "floats": lambda: {"f32": _ragged(np.float32, 1), "f64": _ragged(np.float64, 1)},
    "raw": lambda: {"u8": _ragged(np.uint8, 1), "f16": _ragged(np.float16, 1)},
    "inner": lambda: {"p": _ragged(np.float32, 1, (3,)), "q": _ragged(np.int32, 1, (2, 2))},
    "nested": lambda: {"n2": _ragged(np.int64, 2), "n3": _ragged(np.float64, 3, (2,))},
    "strings": lambda: {"t": _ragged(object, 1), "tt": _ragged(object, 2)},
    "all_empty": lambda: {"e": _ragged(np.int32, 1, empty_every=1), "x": np.arange(N)},
    "mixed": lambda: {
        "tok": _ragged(np.int32, 1),
        "img": rng.integers(0, 255, (N, 2, 3), dtype=np.uint8),
        "id": np.array([b"id%d" % i for i in range(N)], object),
        "bf": rng.standard_normal(N).astype(ml_dtypes.bfloat16),
    },
}


def _column(leaf: Leaf, t: Any) -> numpy_encode.Column:
    """A batch of one leaf as a converter hands it to the encoder."""
    if isinstance(t, tf.RaggedTensor):
        lengths = [x.numpy() for x in t.nested_row_lengths()]
        flat = t.flat_values.numpy()
        values = Strings.of(flat) if flat.dtype == object else flat
        return Ragged(values, tuple(lengths))
    if leaf.kind == "dense" and not leaf.fixed:
        return Shaped(t[1], t[0])
    return t.numpy()


def _graph_bytes(ds: tf.data.Dataset, leaves: tuple[Leaf, ...]) -> bytes:
    return b"".join(frame_records(r, s) for r, s in tf_records.record_batches(ds, leaves))


@pytest.mark.parametrize("case", sorted(CASES))
def test_ragged_columns_give_the_graph_encoders_bytes(case: str) -> None:
    ds = tf.data.Dataset.from_tensor_slices(CASES[case]())
    leaves = tuple(iter_leaves(from_element_spec(ds.element_spec)))
    assert all(numpy_encode.can_frame(leaf) for leaf in leaves)
    parts = []
    for batch in ds.batch(9):  # 9, 9, 5
        cols = [_column(leaf, t) for leaf, t in zip(leaves, tf.nest.flatten(batch), strict=True)]
        framed, sizes = numpy_encode.frame_batch(leaves, cols)
        assert len(sizes) == int(tf.shape(tf.nest.flatten(batch)[0])[0])
        parts.append(framed.tobytes())
    assert b"".join(parts) == _graph_bytes(ds, leaves)


def test_unknown_dims_give_the_graph_encoders_bytes() -> None:
    shapes = np.array([[i % 3, 2] for i in range(N)])
    base = tf.data.Dataset.range(N)
    ds = base.map(
        lambda i: {
            "v": tf.fill(tf.stack([tf.cast(i % 3, tf.int32), 2]), tf.cast(i, tf.float16)),
            "w": tf.fill(tf.stack([tf.cast(i % 3, tf.int32), 2]), tf.strings.as_string(i)),
        }
    )
    leaves = tuple(iter_leaves(from_element_spec(ds.element_spec)))
    assert [leaf.shape for leaf in leaves] == [(None, 2)] * 2
    v = np.concatenate([np.full((s[0], 2), i, np.float16).ravel() for i, s in enumerate(shapes)])
    w = [str(i).encode() for i, s in enumerate(shapes) for _ in range(s[0] * 2)]
    framed, _ = numpy_encode.frame_batch(
        leaves, [Shaped(v, shapes), Shaped(np.array(w, object), shapes)]
    )
    assert framed.tobytes() == _graph_bytes(ds, leaves)


def test_columns_that_do_not_fit_their_leaf_are_refused() -> None:
    leaf = Leaf("r", "ragged", "int64", (None,), 0, "int64")
    with pytest.raises(ValueError, match="expected int64 values for r, got int32"):
        numpy_encode.frame_batch([leaf], [Ragged(np.zeros(3, np.int32), (np.array([1, 2]),))])
    with pytest.raises(ValueError, match="expected 3 values for r, got 2"):
        numpy_encode.frame_batch([leaf], [Ragged(np.zeros(2, np.int64), (np.array([1, 2]),))])
    with pytest.raises(ValueError, match="expected 1 row lengths"):
        numpy_encode.frame_batch([leaf], [Ragged(np.zeros(2, np.int64), ())], count=2)

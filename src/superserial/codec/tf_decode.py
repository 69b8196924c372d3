"""In-graph decoding of ``tf.io.parse_example`` batches back to leaves, checked.

The batch is decoded inside the ``tf.data`` graph: no Python runs per
element. Every value is checked as it is restored (int64-stored values fit
their dtype, raw byte sizes, row lengths, fixed dimensions); a failed check
names the leaf (:func:`superserial.codec.tf_leaves.require`). Split leaves come back
as the components described in :mod:`superserial.codec.tf_leaves`, for
:func:`superserial.codec.tf_leaves.join_element` after unbatching.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from superserial.codec.tf_leaves import assert_same, require, zero_size
from superserial.format.structure import Leaf

__all__ = ["decode_batch", "parse_spec"]

# decode_raw lacks the unsigned 32/64-bit types; they are read as their
# signed twins and bitcast.
_RAW_AS = {"uint32": tf.int32, "uint64": tf.int64}


def _value_feature(leaf: Leaf, count: int | None) -> Any:
    """The parse spec of a values feature holding ``count`` values (None: varies)."""
    kind = leaf.encoding
    if kind == "raw":
        return tf.io.FixedLenFeature([], tf.string)
    dtype = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}[kind]
    # TF 2.21 crashes (SIGSEGV) parsing a FixedLenFeature of shape [0].
    if count is None or count == 0:
        return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
    # The leaf's own shape: the parser gives [B, *shape], with no reshape after
    # it (every op of the map costs at each iterator's creation).
    return tf.io.FixedLenFeature(list(leaf.shape) if leaf.fixed else [count], dtype)


def parse_spec(leaves: tuple[Leaf, ...]) -> dict[str, Any]:
    """The ``tf.io.parse_example`` feature description of all leaves."""
    spec: dict[str, Any] = {}
    for leaf in leaves:
        f = leaf.features
        spec[f["values"]] = _value_feature(leaf, leaf.num_values if leaf.fixed else None)
        if "shape" in f:
            spec[f["shape"]] = tf.io.FixedLenFeature([len(leaf.shape)], tf.int64)
        for name in f.get("row_lengths", []):
            spec[name] = tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64)
        if "indices" in f:
            spec[f["indices"]] = tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64)
    return spec


def _cast_values(leaf: Leaf, x: tf.Tensor) -> tf.Tensor:
    """Casts parsed int64/float32/string values to the leaf dtype, checking range."""
    dtype = tf.as_dtype(leaf.dtype)
    if x.dtype == dtype:
        return x
    y = tf.cast(x, dtype)
    bounds = leaf.entry.int64_range
    if bounds is None:
        return y
    # In range exactly when the cast goes back to the same int64 (a narrower
    # integer wraps; bool turns any non-zero into 1): three ops, where min,
    # max and their compares took eight (each op costs at every iterator's start).
    lo, hi = bounds
    ok = tf.reduce_all(tf.equal(tf.cast(y, tf.int64), x))
    check = require(leaf, ok, f"expected {leaf.dtype} values in [{lo}, {hi}], got one outside")
    with tf.control_dependencies([check]):
        return tf.identity(y)


def _decode_raw(leaf: Leaf, strings: tf.Tensor) -> tf.Tensor:
    dtype = tf.as_dtype(leaf.dtype)
    out = tf.io.decode_raw(strings, _RAW_AS.get(leaf.dtype, dtype))
    return tf.bitcast(out, dtype) if leaf.dtype in _RAW_AS else out


def _fixed_values(leaf: Leaf, x: tf.Tensor) -> tf.Tensor:
    """[B, *shape] values of a fixed-shape dense leaf."""
    n = leaf.num_values
    if n == 0:
        # Nothing is stored; -1 cannot be inferred for an empty reshape.
        b = x.nrows() if isinstance(x, tf.RaggedTensor) else tf.shape(x, out_type=tf.int64)[0]
        return tf.zeros(
            tf.concat([[b], tf.constant(leaf.shape, tf.int64)], 0), tf.as_dtype(leaf.dtype)
        )
    if leaf.encoding != "raw":
        # Parsed as [B, *shape] already (see _value_feature).
        return _cast_values(leaf, x)
    want = n * leaf.entry.itemsize
    ok = tf.reduce_all(tf.equal(tf.strings.length(x), want))
    check = require(leaf, ok, f"expected {want} bytes per element, got another size")
    with tf.control_dependencies([check]):
        # One reshape, [B, n] -> [B, *shape]. tf.shape(x)[0] rather than -1:
        # the call's shape inference then carries a static batch size
        # (drop_remainder) through a parser traced for any batch size.
        return tf.reshape(_decode_raw(leaf, x), [tf.shape(x)[0], *leaf.shape])


def _var_values(leaf: Leaf, x: Any) -> tf.RaggedTensor:
    """[B, None] values of a leaf whose value count varies per element."""
    if leaf.encoding != "raw":
        return tf.RaggedTensor.from_row_splits(
            _cast_values(leaf, x.values), x.row_splits, validate=False
        )
    itemsize = leaf.entry.itemsize
    lengths = tf.cast(tf.strings.length(x), tf.int64)
    check = require(
        leaf,
        tf.reduce_all(tf.equal(lengths % itemsize, 0)),
        f"expected a whole number of {itemsize}-byte values, got a partial one",
    )
    with tf.control_dependencies([check]):
        flat = _decode_raw(leaf, tf.strings.reduce_join(x))
    flat = tf.reshape(flat, [-1])
    return tf.RaggedTensor.from_row_lengths(flat, lengths // itemsize, validate=False)


def _partition(
    values: Any, lengths: tf.Tensor, dim: int | None, dtype: tf.DType
) -> tf.RaggedTensor:
    lengths = tf.cast(lengths, dtype)
    if dim is not None:
        return tf.RaggedTensor.from_uniform_row_length(
            values, tf.constant(dim, dtype), validate=False
        )
    return tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)


def _ragged_leaf(leaf: Leaf, parsed: dict[str, Any]) -> tf.RaggedTensor:
    f = leaf.features
    rank = leaf.ragged_rank or 0
    inner = leaf.num_values
    values = _var_values(leaf, parsed[f["values"]])
    splits = tf.as_dtype(leaf.row_splits_dtype or "int64")
    if not rank and not leaf.inner_shape and leaf.shape[0] is None:
        # A list of scalars per element: the parsed values' rows are the leaf's
        # rows; nothing to check or rebuild.
        return values if splits == tf.int64 else values.with_row_splits_dtype(splits)
    per_elem = [parsed[name] for name in f.get("row_lengths", [])]
    checks = []
    # Element row counts: len(row_lengths 1) for ragged_rank >= 1, else
    # values / inner size.
    if rank:
        counts = per_elem[0].row_lengths()
    else:
        counts = values.row_lengths() // inner
        checks.append(
            assert_same(leaf, counts * inner, values.row_lengths(), f"a multiple of {inner} values")
        )
    for j in range(rank):
        checks.append(
            require(leaf, tf.reduce_all(per_elem[j].values >= 0), "expected row lengths >= 0")
        )
        total = tf.reduce_sum(per_elem[j], axis=1)
        if j + 1 < rank:
            checks.append(
                assert_same(
                    leaf,
                    total,
                    per_elem[j + 1].row_lengths(),
                    "row lengths that add up to the rows inside them",
                )
            )
        else:
            checks.append(
                assert_same(
                    leaf,
                    total * inner,
                    values.row_lengths(),
                    "row lengths that add up to the values",
                )
            )
    dims = list(leaf.shape)
    for d in range(rank + 1):
        if dims[d] is not None:
            got = per_elem[d - 1].values if d else counts
            checks.append(assert_same(leaf, got, dims[d], f"dimension {d} of size {dims[d]}"))
    # An explicit row count, not -1: inner shapes may hold no values ([None, None, 0]).
    rows = tf.reduce_sum(per_elem[-1].values) if rank else tf.reduce_sum(counts)
    with tf.control_dependencies(checks):
        rt = tf.reshape(
            values.values, tf.concat([[rows], tf.constant(leaf.inner_shape, tf.int64)], 0)
        )
    for j in range(rank, 0, -1):
        rt = _partition(rt, per_elem[j - 1].values, dims[j], splits)
    return _partition(rt, counts, dims[0], splits)


def decode_batch(leaves: tuple[Leaf, ...], parsed: dict[str, Any]) -> list[Any]:
    """Rebuilds batched leaves from ``tf.io.parse_example`` output.

    Fixed-shape dense and ragged leaves come back as their batched tensors;
    the others as components for :func:`superserial.codec.tf_leaves.join_element`
    after unbatching.
    """
    out: list[Any] = []
    for leaf in leaves:
        f = leaf.features
        if zero_size(leaf):
            x = parsed[f["values"]]
            b = x.nrows() if isinstance(x, tf.RaggedTensor) else tf.shape(x, out_type=tf.int64)[0]
            out.append(tf.zeros([b], tf.int8))
        elif leaf.kind == "dense" and leaf.fixed:
            out.append(_fixed_values(leaf, parsed[f["values"]]))
        elif leaf.kind == "ragged":
            out.append(_ragged_leaf(leaf, parsed))
        elif leaf.kind == "dense":
            out.append((_var_values(leaf, parsed[f["values"]]), parsed[f["shape"]]))
        else:
            out.append(
                (_var_values(leaf, parsed[f["values"]]), parsed[f["indices"]], parsed[f["shape"]])
            )
    return out

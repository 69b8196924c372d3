"""How leaves travel through ``tf.data`` batching, on the way out and back in.

A batch is encoded to records by :mod:`superserial.codec.tf_encode` and decoded
by :mod:`superserial.codec.tf_decode`; both see each leaf as one or more
*components*:

* dense, fixed shape: the batched tensor ``[B, *shape]``;
* dense with unknown dimensions: ``(values, shape)``, made per element by
  :func:`split_element` before batching, since ``batch`` cannot stack them
  and a ragged batch forgets the inner size of an empty row;
* ragged: the batched ``tf.RaggedTensor``;
* sparse: ``(values, indices, dense_shape)``, also made by
  :func:`split_element`, since a batched ``SparseTensor`` keeps only the
  largest dense shape of its elements;
* fixed shape of zero size: a ``[B]`` placeholder, rebuilt per element.

After unbatching, :func:`join_element` rebuilds the split leaves of each
element and :func:`expand_leaf` gives it a batch dimension of one to slice.
The per-element checks of :func:`join_element` and the batch decoder's share
one form of message, ``superserial: <what> at <leaf>`` (:func:`require`),
which :mod:`superserial.inspect.verify` reads back.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from superserial.format.structure import Leaf

__all__ = [
    "assert_same",
    "expand_leaf",
    "join_arity",
    "join_element",
    "needs_join",
    "needs_premap",
    "needs_split",
    "require",
    "split_element",
    "zero_size",
]


def needs_split(leaf: Leaf) -> bool:
    """True if the leaf is split into components per element before batching."""
    return leaf.kind == "sparse" or (leaf.kind == "dense" and not leaf.fixed)


def zero_size(leaf: Leaf) -> bool:
    """True if the leaf has a fixed shape holding no values."""
    return leaf.fixed and 0 in leaf.shape


def _zero_inner(leaf: Leaf) -> bool:
    return leaf.kind == "ragged" and 0 in leaf.inner_shape


def needs_join(leaf: Leaf) -> bool:
    """True if the leaf is rebuilt per element after unbatching.

    Besides split leaves, fixed-shape leaves of zero size: TF 2.21 crashes
    (SIGSEGV) unbatching a [B, 0] tensor, so they travel as a [B] placeholder.
    """
    return needs_split(leaf) or zero_size(leaf) or _zero_inner(leaf)


def join_arity(leaf: Leaf) -> int:
    """How many components a joined leaf has in an unbatched element."""
    return 3 if leaf.kind == "sparse" else 2 if needs_split(leaf) else 1


def needs_premap(leaf: Leaf) -> bool:
    """True if the leaf goes through a per-element map before batching.

    Split leaves do; so do ragged leaves of ragged_rank >= 1, which may arrive
    as slices of an earlier batch, a form ``batch`` cannot stack: a map boxes
    them anew.
    """
    return needs_split(leaf) or (leaf.kind == "ragged" and bool(leaf.ragged_rank))


def _row(v: tf.Tensor) -> tf.RaggedTensor:
    # One ragged row [1, None], so that plain ``batch`` (fast) can stack rows
    # of different lengths; ``ragged_batch`` is ~6x slower. One row of all the values
    # is valid by construction: validating it added assertion ops that cost more to
    # trace than the rest of the map.
    return tf.RaggedTensor.from_row_lengths(v, tf.size(v, out_type=tf.int64)[None], validate=False)


def split_element(leaves: tuple[Leaf, ...], flat: list[Any]) -> tuple[Any, ...]:
    """Per element: replaces leaves that cannot be batched by their components."""
    out: list[Any] = []
    for leaf, x in zip(leaves, flat, strict=True):
        if leaf.kind == "sparse":
            out.append((_row(x.values), _row(tf.reshape(x.indices, [-1])), x.dense_shape))
        elif needs_split(leaf):
            out.append((_row(tf.reshape(x, [-1])), tf.shape(x, out_type=tf.int64)))
        elif leaf.kind == "ragged" and not isinstance(x, tf.RaggedTensor):
            # ragged_rank 0: inside map it is a plain tensor; keep it a row.
            out.append(
                tf.RaggedTensor.from_tensor(x[None], ragged_rank=1, row_splits_dtype=tf.int64)
            )
        else:
            out.append(x)  # a ragged leaf comes out of map boxed anew
    return tuple(out)


def expand_leaf(leaf: Leaf, x: Any) -> Any:
    """Adds a leading dimension of 1, so that slicing it gives back ``leaf``'s spec.

    A ``map`` cannot return a ragged_rank 0 ``RaggedTensorSpec`` value (it
    becomes a plain tensor); slicing a batch of one restores it.
    """
    if leaf.kind == "sparse":
        y = tf.sparse.expand_dims(x, 0)
        y.set_shape([1, *leaf.shape])
        return y
    if leaf.kind == "ragged" and not isinstance(x, tf.RaggedTensor):
        splits = tf.as_dtype(leaf.row_splits_dtype or "int64")
        return tf.RaggedTensor.from_tensor(x[None], ragged_rank=1, row_splits_dtype=splits)
    if leaf.kind == "ragged":
        return tf.expand_dims(x, 0)
    return x[None]


def _msg(leaf: Leaf, text: str) -> str:
    return f"superserial: {text} at {leaf.name}"


def require(leaf: Leaf, cond: tf.Tensor, text: str) -> Any:
    """An assertion op: fails with a message naming the leaf unless ``cond``.

    ``tf.debugging.Assert`` with a constant message is several times cheaper
    per batch than ``assert_equal``, which also formats both operands.
    """
    return tf.debugging.Assert(cond, [_msg(leaf, text)], summarize=1)


def assert_same(leaf: Leaf, a: tf.Tensor, b: tf.Tensor, what: str) -> Any:
    """An assertion op: fails unless ``a`` equals ``b`` everywhere, expecting ``what``."""
    return require(leaf, tf.reduce_all(tf.equal(a, b)), f"expected {what}, found a mismatch")


def _check_shape(leaf: Leaf, shape: tf.Tensor) -> list[Any]:
    checks = [require(leaf, tf.reduce_all(shape >= 0), "expected dimensions >= 0")]
    for i, d in enumerate(leaf.shape):
        if d is not None:
            checks.append(assert_same(leaf, shape[i], d, f"dimension {i} of size {d}"))
    return checks


def join_element(leaves: tuple[Leaf, ...], comps: list[Any]) -> list[Any]:
    """Per element: rebuilds split leaves from their components."""
    out: list[Any] = []
    for leaf, comp in zip(leaves, comps, strict=True):
        if zero_size(leaf):
            out.append(tf.zeros(leaf.shape, tf.as_dtype(leaf.dtype)))
            continue
        if not needs_split(leaf):
            out.append(comp)
            continue
        rank = len(leaf.shape)
        if leaf.kind == "dense":
            values, shape = comp
            checks = [
                *_check_shape(leaf, shape),
                assert_same(
                    leaf,
                    tf.size(values, out_type=tf.int64),
                    tf.reduce_prod(shape),
                    "as many values as the shape holds",
                ),
            ]
            with tf.control_dependencies(checks):
                x = tf.reshape(values, shape)
            out.append(tf.ensure_shape(x, leaf.shape))
            continue
        values, indices, shape = comp
        nnz = tf.size(values, out_type=tf.int64)
        checks = [
            *_check_shape(leaf, shape),
            assert_same(
                leaf, tf.size(indices, out_type=tf.int64), nnz * rank, f"{rank} indices per value"
            ),
        ]
        with tf.control_dependencies(checks):
            idx = tf.reshape(indices, [-1, rank])
        in_range = tf.reduce_all(tf.logical_and(idx >= 0, idx < shape[None, :]))
        check = require(leaf, in_range, "expected indices inside the dense shape")
        with tf.control_dependencies([check]):
            sp = tf.sparse.SparseTensor(tf.identity(idx), values, shape)
        sp.set_shape(leaf.shape)
        out.append(sp)
    return out

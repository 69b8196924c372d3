"""Conversion between ``tf.data`` element specs and header structures."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from superserial.errors import UnsupportedError
from superserial.format import dtypes
from superserial.format.structure import (
    DictNode,
    Leaf,
    NamedTupleNode,
    Node,
    TupleNode,
    leaf_name,
    namedtuple_type,
    pack,
)

__all__ = [
    "from_element_spec",
    "leaf_spec",
    "namedtuple_type",
    "not_a_dataset",
    "pack",
    "to_element_spec",
]


def not_a_dataset(obj: Any) -> UnsupportedError:
    """The error for something given where a ``tf.data.Dataset`` is expected, with the fix.

    A ``TypeError``, as plain code expects, and a ``SuperserialError``, so that
    ``except SuperserialError`` around a save catches it as it does the rest.
    """
    got = f"{type(obj).__module__}.{type(obj).__qualname__}"
    return UnsupportedError(
        f"expected a tf.data.Dataset, got {got}; to save arrays, lists or dicts of them "
        "with one element per row, wrap them: tf.data.Dataset.from_tensor_slices(x)"
    )


def _path_str(path: tuple[str | int, ...]) -> str:
    return leaf_name(path) if path else "<element>"


def _leaf(spec: Any, path: tuple[str | int, ...]) -> Leaf:
    where = _path_str(path)
    dtype = getattr(spec, "dtype", None)
    try:
        entry = dtypes.by_name(dtype.name) if dtype is not None else None
    except KeyError:
        entry = None
    if entry is None:
        raise UnsupportedError(
            f"expected a leaf of a supported dtype, got {type(spec).__name__} "
            f"{getattr(dtype, 'name', '')!s} at {where}"
        )
    shape = spec.shape
    if shape.rank is None:
        raise UnsupportedError(
            f"expected a leaf of known rank, got unknown rank at {where}; give it a rank with "
            "tf.ensure_shape in a map, e.g. ds.map(lambda x: tf.ensure_shape(x, [None, None])) "
            "for rank 2"
        )
    dims = tuple(shape.as_list())
    if isinstance(spec, tf.TensorSpec):
        return Leaf(leaf_name(path), "dense", entry.name, dims)
    if isinstance(spec, tf.RaggedTensorSpec):
        rank = spec.ragged_rank
        if not dims:
            raise UnsupportedError(f"expected a ragged leaf of rank >= 1, got a scalar at {where}")
        if None in dims[rank + 1 :]:
            raise UnsupportedError(
                f"expected known uniform dimensions inside the ragged ones, got shape {list(dims)} "
                f"with ragged_rank {rank} at {where}"
            )
        if rank == 0 and 0 in dims[1:]:
            raise UnsupportedError(
                f"expected a ragged_rank 0 leaf with non-empty rows, got shape {list(dims)} at {where}"
            )
        if getattr(spec, "flat_values_spec", None) is not None:
            raise UnsupportedError(f"expected no flat_values_spec on a ragged leaf at {where}")
        return Leaf(leaf_name(path), "ragged", entry.name, dims, rank, spec.row_splits_dtype.name)
    if isinstance(spec, tf.SparseTensorSpec):
        if not dims:
            raise UnsupportedError(f"expected a sparse leaf of rank >= 1, got a scalar at {where}")
        return Leaf(leaf_name(path), "sparse", entry.name, dims)
    raise UnsupportedError(
        f"expected a tensor, ragged or sparse leaf, got {type(spec).__name__} at {where}"
    )


def from_element_spec(spec: Any, path: tuple[str | int, ...] = ()) -> Node:
    """Builds the header structure of an ``element_spec``.

    Raises:
        UnsupportedError: A leaf or container cannot be stored; the message
            names its path.
    """
    if isinstance(spec, dict):
        for k in spec:
            if not isinstance(k, str):
                raise UnsupportedError(
                    f"expected string dict keys, got {type(k).__name__} {k!r} at {_path_str(path)}"
                )
        return DictNode({k: from_element_spec(spec[k], (*path, k)) for k in sorted(spec)})
    if isinstance(spec, tuple) and hasattr(spec, "_fields"):
        return NamedTupleNode(
            type(spec).__name__,
            tuple(spec._fields),
            tuple(from_element_spec(v, (*path, i)) for i, v in enumerate(spec)),
        )
    if isinstance(spec, tuple):
        return TupleNode(tuple(from_element_spec(v, (*path, i)) for i, v in enumerate(spec)))
    if isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec, tf.SparseTensorSpec)):
        return _leaf(spec, path)
    raise UnsupportedError(
        f"expected a tensor, ragged or sparse leaf, got {type(spec).__name__} at {_path_str(path)}"
    )


def leaf_spec(leaf: Leaf) -> Any:
    """Returns the ``tf.TypeSpec`` of one leaf."""
    dtype = tf.as_dtype(leaf.dtype)
    if leaf.kind == "dense":
        return tf.TensorSpec(leaf.shape, dtype)
    if leaf.kind == "ragged":
        return tf.RaggedTensorSpec(
            leaf.shape, dtype, leaf.ragged_rank, tf.as_dtype(leaf.row_splits_dtype)
        )
    return tf.SparseTensorSpec(leaf.shape, dtype)


def to_element_spec(node: Node) -> Any:
    """Returns the ``element_spec`` that ``node`` describes."""
    from superserial.format.structure import iter_leaves

    return pack(node, [leaf_spec(leaf) for leaf in iter_leaves(node)])

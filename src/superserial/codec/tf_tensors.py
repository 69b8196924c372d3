"""User values -> tensors of an element spec, checked leaf by leaf.

What the distributed :class:`~superserial.Writer` and Beam accept as elements:
numpy arrays and scalars, Python values, ``bytes``, tensors, and the ragged and
sparse forms that ``as_numpy_iterator()`` and :mod:`superserial.numpy` yield.
A value that does not match its spec is an
:class:`~superserial.errors.UnsupportedError` naming the leaf.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from superserial.errors import UnsupportedError
from superserial.format.structure import leaf_name

__all__ = ["to_tensors"]


def _where(path: tuple[Any, ...]) -> str:
    return leaf_name(path) if path else "<element>"


def _dense(spec: tf.TensorSpec, x: Any, where: str) -> tf.Tensor:
    if isinstance(x, tf.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        want = spec.dtype.as_numpy_dtype
        if spec.dtype == tf.string:
            if arr.dtype.kind not in ("O", "S", "U"):
                raise UnsupportedError(f"expected strings, got {arr.dtype} at {where}")
            if not isinstance(x, np.ndarray):
                # bytes and lists of bytes: numpy's "S" dtype drops trailing NULs.
                arr = np.asarray(x, dtype=object)
        elif arr.dtype != np.dtype(want):
            # Python scalars and lists are cast; numpy arrays must match exactly.
            if isinstance(x, np.ndarray | np.generic):
                raise UnsupportedError(f"expected {spec.dtype.name}, got {arr.dtype} at {where}")
            try:
                arr = np.asarray(x, dtype=want)
            except (OverflowError, TypeError, ValueError) as e:
                raise UnsupportedError(
                    f"expected {spec.dtype.name} values, got {x!r} ({e}) at {where}"
                ) from e
        t = tf.constant(arr, dtype=spec.dtype)
    if t.dtype != spec.dtype:
        raise UnsupportedError(f"expected {spec.dtype.name}, got {t.dtype.name} at {where}")
    if not spec.shape.is_compatible_with(t.shape):
        raise UnsupportedError(f"expected shape {spec.shape}, got {t.shape} at {where}")
    return t


def _nested_to_ragged(spec: tf.RaggedTensorSpec, x: Any, where: str) -> tf.RaggedTensor:
    """A ragged tensor from nested sequences (lists, object arrays of arrays)."""
    rank = spec.ragged_rank
    inner = tuple(spec.shape[rank + 1 :].as_list())
    np_dtype = spec.dtype.as_numpy_dtype
    rows = list(x)
    lengths = []
    for _ in range(rank - 1):
        lengths.append(np.array([len(r) for r in rows], np.int64))
        rows = [item for r in rows for item in r]
    lengths.append(np.array([len(r) for r in rows], np.int64))
    # The last level's rows are concatenated as arrays: numpy values keep
    # their exact bits (no round trip through Python floats).
    parts = []
    for r in rows:
        arr = np.asarray(r) if spec.dtype != tf.string else np.asarray(r, dtype=object)
        if (
            spec.dtype != tf.string
            and isinstance(r, np.ndarray)
            and arr.dtype != np.dtype(np_dtype)
        ):
            raise UnsupportedError(f"expected {spec.dtype.name}, got {arr.dtype} at {where}")
        parts.append(arr.astype(np_dtype, copy=False).reshape((-1, *inner)))
    flat = np.concatenate(parts) if parts else np.zeros((0, *inner), np_dtype)
    splits_dtype = spec.row_splits_dtype
    return tf.RaggedTensor.from_nested_row_lengths(
        tf.constant(flat, spec.dtype), [tf.constant(n, splits_dtype) for n in lengths]
    )


def _ragged(spec: tf.RaggedTensorSpec, x: Any, where: str) -> Any:
    if spec.ragged_rank == 0:
        return _dense(tf.TensorSpec(spec.shape, spec.dtype), x, where)
    if isinstance(x, tf.RaggedTensor):
        rt = x
    elif hasattr(x, "flat_values") and hasattr(x, "nested_row_splits"):
        # superserial.numpy.Ragged, tf RaggedTensorValue
        rt = tf.RaggedTensor.from_nested_row_splits(
            _dense(tf.TensorSpec(None, spec.dtype), x.flat_values, where),
            [tf.constant(np.asarray(s), spec.row_splits_dtype) for s in x.nested_row_splits],
            validate=True,
        )
    else:
        try:
            rt = _nested_to_ragged(spec, x, where)
        except (TypeError, ValueError) as e:
            raise UnsupportedError(
                f"expected a ragged value for {spec}, got {type(x).__name__} ({e}) at {where}"
            ) from e
    if rt.row_splits.dtype != spec.row_splits_dtype:
        rt = rt.with_row_splits_dtype(spec.row_splits_dtype)
    if not spec.is_compatible_with(rt):
        raise UnsupportedError(f"expected {spec}, got {tf.type_spec_from_value(rt)} at {where}")
    return rt


def _sparse(spec: tf.SparseTensorSpec, x: Any, where: str) -> tf.SparseTensor:
    if isinstance(x, tf.SparseTensor):
        st = x
    elif hasattr(x, "indices") and hasattr(x, "values") and hasattr(x, "dense_shape"):
        # superserial.numpy.Sparse, tf SparseTensorValue
        st = tf.SparseTensor(
            tf.constant(
                np.asarray(x.indices, np.int64).reshape(-1, spec.shape.rank or 0), tf.int64
            ),
            _dense(tf.TensorSpec([None], spec.dtype), x.values, where),
            tf.constant(np.asarray(x.dense_shape, np.int64), tf.int64),
        )
    elif isinstance(x, np.ndarray | tf.Tensor):
        # What as_numpy_iterator() yields for a sparse leaf: the dense array.
        st = tf.sparse.from_dense(_dense(tf.TensorSpec(spec.shape, spec.dtype), x, where))
    else:
        raise UnsupportedError(
            f"expected a sparse value (indices, values, dense_shape), got {type(x).__name__} at {where}"
        )
    if not spec.is_compatible_with(st):
        raise UnsupportedError(f"expected {spec}, got {tf.type_spec_from_value(st)} at {where}")
    return st


def to_tensors(element: Any, element_spec: Any) -> Any:
    """Converts one element of numpy values to tensors matching ``element_spec``.

    Dense leaves take numpy arrays and scalars (dtype must match exactly),
    Python values (cast to the leaf dtype), ``bytes`` for strings, or tensors.
    Ragged leaves of ``ragged_rank`` 0 (a ragged column of
    ``from_tensor_slices``) take the same, of any length. Other ragged leaves
    take ``tf.RaggedTensor``, :class:`superserial.numpy.Ragged`
    (what the numpy reader yields), ``RaggedTensorValue``, or nested
    sequences (lists, numpy object arrays of arrays, as
    ``as_numpy_iterator()`` yields). Sparse leaves take ``tf.SparseTensor``,
    :class:`superserial.numpy.Sparse`, ``SparseTensorValue``, or a dense
    array (as ``as_numpy_iterator()`` yields; explicit zeros are lost).

    Raises:
        UnsupportedError: A value does not match its spec; the message names it.
    """
    return _convert(element_spec, element, ())


def _convert(spec: Any, x: Any, path: tuple[Any, ...]) -> Any:
    where = _where(path)
    if isinstance(spec, dict):
        if not isinstance(x, dict) or set(x) != set(spec):
            got = sorted(x) if isinstance(x, dict) else type(x).__name__
            raise UnsupportedError(
                f"expected a dict with keys {sorted(spec)}, got {got} at {where}"
            )
        return {k: _convert(spec[k], x[k], (*path, k)) for k in spec}
    if isinstance(spec, tuple):
        if not isinstance(x, tuple | list) or len(x) != len(spec):
            got = f"{len(x)} items" if isinstance(x, tuple | list) else type(x).__name__
            raise UnsupportedError(f"expected a tuple of {len(spec)} items, got {got} at {where}")
        items = [_convert(s, v, (*path, i)) for i, (s, v) in enumerate(zip(spec, x, strict=True))]
        return type(spec)(*items) if hasattr(spec, "_fields") else tuple(items)
    if isinstance(spec, tf.TensorSpec):
        return _dense(spec, x, where)
    if isinstance(spec, tf.RaggedTensorSpec):
        return _ragged(spec, x, where)
    if isinstance(spec, tf.SparseTensorSpec):
        return _sparse(spec, x, where)
    raise UnsupportedError(
        f"expected a tensor, ragged or sparse spec, got {type(spec).__name__} at {where}"
    )

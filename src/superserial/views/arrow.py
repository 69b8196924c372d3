"""Decoded batches as Apache Arrow: :meth:`superserial.numpy.NumpyDataset.to_arrow`.

One row per element. The element's structure gives the columns: a top-level dict
one column per key, a top-level tuple or namedtuple one per item (named ``"0"``,
``"1"``... or by the field names), a single tensor one column named ``value`` (the
name ``superserial inspect`` gives that leaf). Below the top, dicts, tuples and
namedtuples become ``struct`` columns with fields named the same way. Each leaf
becomes, with the Arrow type :attr:`superserial.format.dtypes.DType.arrow` names for
its values (strings as ``binary``):

* dense of known shape: the values themselves for a scalar, else nested
  ``fixed_size_list`` (outermost dimension outside); a dimension of size 0 is a
  ``list`` (Arrow's fixed-size lists of size 0 are not reliably supported);
* dense with unknown dimensions: nested ``list`` where a dimension is unknown,
  ``fixed_size_list`` where it is known;
* ragged: nested ``list`` for the outer and the ragged dimensions,
  ``fixed_size_list`` for the uniform dimensions inside them;
* sparse, bfloat16 and complex leaves: an :class:`~superserial.errors.UnsupportedError`
  naming the leaf, never a silent cast.

Offsets are Arrow's 32-bit ones: a batch holding over 2**31 - 1 values of one leaf
is an error that says to read smaller batches.

Where the header's ``metadata["arrow_schema"]`` (base64 of
``pyarrow.Schema.serialize()``, written by the converters from Arrow sources) names
every column, each batch is cast to that schema, so a table that came in through
``superserial.convert`` comes out with its own types (``string`` rather than
``binary``, ``large_list``...) and schema metadata. Garbage there, or a column it
cannot be cast to, is a :class:`~superserial.errors.HeaderError` naming the key.

Arrays are built from the batch's flat values and shapes or row splits, in numpy,
never element by element in Python. pyarrow is the ``arrow`` extra.

This module does not import TensorFlow.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from superserial.errors import HeaderError, UnsupportedError, require
from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, NamedTupleNode, Node, iter_leaves

__all__ = ["arrow_schema", "pyarrow", "record_batches", "stored_schema", "table_schema"]

SCHEMA_KEY = "arrow_schema"
_MAX_OFFSET = (1 << 31) - 1


def pyarrow(needed_for: str = "to_arrow()") -> Any:
    """The ``pyarrow`` module, or an error saying which extra installs it.

    Raises:
        MissingDependencyError: pyarrow cannot be imported.
    """
    return require("pyarrow", extra="arrow", needed_for=needed_for)


def _children(node: Node) -> list[tuple[str, Node]]:
    """A node's named children, in flattening order (dict keys sorted, as tf.nest does)."""
    if isinstance(node, DictNode):
        return [(k, node.items[k]) for k in sorted(node.items)]
    if isinstance(node, NamedTupleNode):
        return list(zip(node.fields, node.items, strict=True))
    if isinstance(node, Leaf):
        return [("value", node)]
    return [(str(i), item) for i, item in enumerate(node.items)]


def _check_leaf(leaf: Leaf) -> Any:
    """The Arrow type of the leaf's values, or why the leaf has none."""
    pa = pyarrow()
    if leaf.kind == "sparse":
        raise UnsupportedError(
            f"expected a dense or ragged leaf for Arrow, found sparse leaf {leaf.name!r} "
            "(read it with select= leaving it out, or densify it before saving)"
        )
    if leaf.entry.arrow is None:
        raise UnsupportedError(
            f"expected a dtype Arrow holds exactly for leaf {leaf.name!r}, found {leaf.dtype} "
            "(Arrow has no such type; superserial does not cast it silently)"
        )
    return getattr(pa, leaf.entry.arrow)()


def _leaf_type(leaf: Leaf) -> Any:
    pa = pyarrow()
    typ = _check_leaf(leaf)
    if leaf.kind == "ragged" and leaf.ragged_rank:
        rr = leaf.ragged_rank
        for inner in reversed(leaf.inner_shape):
            typ = pa.list_(typ, inner) if inner else pa.list_(typ)
        for _ in range(rr + 1):
            typ = pa.list_(typ)
        return typ
    for d in reversed(leaf.shape):
        typ = pa.list_(typ, d) if d else pa.list_(typ)
    return typ


def _node_type(node: Node) -> Any:
    pa = pyarrow()
    if isinstance(node, Leaf):
        return _leaf_type(node)
    return pa.struct([pa.field(name, _node_type(child)) for name, child in _children(node)])


def arrow_schema(header: Header) -> Any:
    """The Arrow schema the leaves of ``header`` map to, before any stored schema.

    Raises:
        UnsupportedError: A leaf is sparse, or of a dtype Arrow has not (named).
    """
    pa = pyarrow()
    return pa.schema(
        [pa.field(name, _node_type(child)) for name, child in _children(header.structure)]
    )


def stored_schema(header: Header, derived: Any) -> Any | None:
    """The schema kept in ``metadata["arrow_schema"]``, for ``derived``'s columns; None if absent.

    Raises:
        HeaderError: The key holds no serialized Arrow schema, or lacks a column.
    """
    if SCHEMA_KEY not in header.metadata:
        return None
    pa = pyarrow()
    raw = header.metadata[SCHEMA_KEY]
    where = f"metadata.{SCHEMA_KEY} of the header"
    if not isinstance(raw, str):
        raise HeaderError(f"expected base64 text in {where}, found {type(raw).__name__}")
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw, validate=True)))
    except (binascii.Error, ValueError, pa.ArrowException) as e:
        raise HeaderError(
            f"expected a serialized Arrow schema (base64) in {where}, found garbage: {e}"
        ) from e
    names = set(schema.names)
    missing = [n for n in derived.names if n not in names]
    if missing:
        raise HeaderError(
            f"expected a field for every column in {where}, found none for {missing} "
            f"(it has {schema.names})"
        )
    # The source's column order (ours is sorted, as tf.nest sorts dict keys); select=
    # may have read fewer columns than were kept: their fields.
    wanted = set(derived.names)
    fields = [schema.field(n) for n in schema.names if n in wanted]
    return pa.schema(fields, metadata=schema.metadata)


# ------------------------------------------------------------------ arrays


def _offsets(lengths: np.ndarray, leaf: Leaf) -> Any:
    pa = pyarrow()
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    if out[-1] > _MAX_OFFSET:
        raise UnsupportedError(
            f"expected at most {_MAX_OFFSET} values of leaf {leaf.name!r} in one Arrow batch, "
            f"found {int(out[-1])} (read smaller batches: iter_arrow(batch_size=...))"
        )
    return pa.array(out.astype(np.int32))


def _wrap(child: Any, dim: int | None, lengths: np.ndarray | None, leaf: Leaf) -> Any:
    """``child`` grouped into lists of ``dim`` (fixed) or of ``lengths`` (variable)."""
    pa = pyarrow()
    if lengths is not None:
        return pa.ListArray.from_arrays(_offsets(lengths, leaf), child)
    return pa.FixedSizeListArray.from_arrays(child, dim)


def _values(leaf: Leaf, flat: np.ndarray) -> Any:
    pa = pyarrow()
    return pa.array(flat.reshape(-1), type=_check_leaf(leaf))


def _dims_array(leaf: Leaf, child: Any, shapes: np.ndarray) -> Any:
    """Wraps flat ``child`` values in one level per dimension; ``shapes`` is ``[B, rank]``."""
    rank = shapes.shape[1]
    # rows[k]: how many lists there are at level k (one per element at level 0).
    counts = np.ones((len(shapes), rank + 1), np.int64)
    if rank:
        np.cumprod(shapes, axis=1, out=counts[:, 1:])
    for k in reversed(range(rank)):
        d = leaf.shape[k] if k < len(leaf.shape) else None
        if d:
            child = _wrap(child, d, None, leaf)
        else:
            child = _wrap(child, None, np.repeat(shapes[:, k], counts[:, k]), leaf)
    return child


def _dense(leaf: Leaf, value: Any) -> Any:
    if isinstance(value, np.ndarray):  # stacked [B, *shape]
        shapes = np.broadcast_to(
            np.asarray(value.shape[1:], np.int64), (len(value), value.ndim - 1)
        )
        return _dims_array(leaf, _values(leaf, value), shapes)
    arrays = [np.asarray(v) for v in value]
    rank = len(leaf.shape)
    shapes = np.array([a.shape for a in arrays], np.int64).reshape(len(arrays), rank)
    flat = (
        np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, leaf.entry.numpy)
    )
    return _dims_array(leaf, _values(leaf, flat), shapes)


def _ragged(leaf: Leaf, value: Sequence[Any]) -> Any:
    """Ragged values (``Ragged`` per element): lists from their row splits, joined."""
    inner = leaf.inner_shape
    rr = leaf.ragged_rank or 0
    if value:
        flat = np.concatenate([np.asarray(r.flat_values).reshape(-1) for r in value])
    else:
        flat = np.zeros(0, leaf.entry.numpy)
    child = _values(leaf, flat)
    rows = np.fromiter((len(r.flat_values) for r in value), np.int64, len(value))
    inner_shapes = np.broadcast_to(np.asarray(inner, np.int64), (int(rows.sum()), len(inner)))
    child = _dims_array(Leaf(leaf.name, "dense", leaf.dtype, inner), child, inner_shapes)
    for k in reversed(range(rr)):
        splits = [np.asarray(r.nested_row_splits[k], np.int64) for r in value]
        sizes = np.fromiter((len(s) for s in splits), np.int64, len(splits))
        joined = np.concatenate(splits) if splits else np.zeros(0, np.int64)
        # Row lengths of every element's rows, without the steps between elements.
        diffs = np.diff(joined)
        between = np.cumsum(sizes)[:-1] - 1
        child = _wrap(child, None, np.delete(diffs, between), leaf)
        if k == 0:
            child = _wrap(child, None, sizes - 1, leaf)
    return child


def _leaf_array(leaf: Leaf, value: Any) -> Any:
    _check_leaf(leaf)
    if leaf.kind == "ragged" and leaf.ragged_rank:
        return _ragged(leaf, value)
    return _dense(leaf, value)


def _node_array(node: Node, arrays: Iterator[Any]) -> Any:
    pa = pyarrow()
    if isinstance(node, Leaf):
        return next(arrays)
    names, children = [], []
    for name, child in _children(node):
        names.append(name)
        children.append(_node_array(child, arrays))
    return pa.StructArray.from_arrays(children, names=names)


def record_batches(header: Header, batches: Iterable[Sequence[Any]]) -> Iterator[Any]:
    """Arrow record batches of decoded flat batches, with :func:`table_schema`'s types.

    Args:
        header: The header whose structure the batches hold.
        batches: Flat decoded batches, one value per leaf (a stacked array or a list
            of per-element values), as
            :meth:`superserial.codec.numpy_decode.RecordDecoder.decode` gives them.

    Raises:
        UnsupportedError: A leaf has no Arrow form (named).
        HeaderError: The stored schema is garbage or does not fit.
    """
    pa = pyarrow()
    derived = arrow_schema(header)
    stored = stored_schema(header, derived)
    target = None if stored is None or stored.equals(derived, check_metadata=True) else stored
    leaves = list(iter_leaves(header.structure))
    top = _children(header.structure)
    for batch in batches:
        arrays = iter([_leaf_array(leaf, v) for leaf, v in zip(leaves, batch, strict=True)])
        columns = [_node_array(child, arrays) for _, child in top]
        rb = pa.RecordBatch.from_arrays(columns, schema=derived)
        yield rb if target is None else _cast(rb.select(target.names), target)


def table_schema(header: Header) -> Any:
    """The schema :func:`record_batches` gives: the stored one where kept, else the derived.

    Raises:
        UnsupportedError: A leaf has no Arrow form (named).
        HeaderError: The stored schema is garbage or lacks a column.
    """
    derived = arrow_schema(header)
    stored = stored_schema(header, derived)
    return derived if stored is None else stored


def _to_dictionary(array: Any, target: Any) -> Any:
    """``array`` as the dictionary type ``target``: encoded, then cast.

    Arrow casts only strings to a dictionary type; a dictionary of numbers is encoded
    from its values here, then its indices cast to the target's.
    """
    if target.value_type != array.type:
        array = array.cast(target.value_type)
    return array.dictionary_encode().cast(target)


def _cast(rb: Any, schema: Any) -> Any:
    pa = pyarrow()
    try:
        if any(pa.types.is_dictionary(f.type) for f in schema):
            columns = [
                _to_dictionary(c, f.type) if pa.types.is_dictionary(f.type) else c
                for c, f in zip(rb.columns, schema, strict=True)
            ]
            rb = pa.RecordBatch.from_arrays(columns, names=rb.schema.names)
        return rb.cast(schema)
    except (ValueError, TypeError, pa.ArrowNotImplementedError) as e:
        raise HeaderError(
            f"expected the columns to fit metadata.{SCHEMA_KEY} of the header, found a "
            f"cast from {rb.schema} to {schema} fails: {e}"
        ) from e

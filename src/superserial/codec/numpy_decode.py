"""The numpy decoders of superserial records: ``tf.train.Example`` -> numpy values.

They mirror the TensorFlow decoder (``superserial.codec.tf_leaves``) without
TensorFlow: every check ``superserial.load`` makes on a record (feature
presence and list kind, value counts and ranges, byte sizes, shapes, row
lengths, sparse indices) is made here too, and anything that disagrees is a
:class:`~superserial.errors.CorruptDataError` naming the place, the reason and
the leaf.

How leaves come out:

* dense: an ``np.ndarray`` of the leaf's dtype and the element's shape;
  scalars are 0-d arrays (never numpy scalars). Strings are ``object``
  arrays holding ``bytes``; bfloat16 is ``ml_dtypes.bfloat16``.
* ragged with ``ragged_rank`` 0: a plain ``np.ndarray``.
* ragged with ``ragged_rank`` >= 1: a :class:`Ragged`.
* sparse: a :class:`Sparse`.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from superserial.errors import CorruptDataError
from superserial.format.header import Header
from superserial.format.structure import Leaf
from superserial.format.wire import EMPTY_FEATURE, parse_features

__all__ = ["Ragged", "RecordDecoder", "Sparse"]

# ------------------------------------------------------------ value types


@dataclass(frozen=True, eq=False)
class Ragged:
    """A ragged array, stored as ``tf.RaggedTensor`` stores it.

    Attributes:
        flat_values: The values, ``[n, *inner_shape]``, of the leaf's dtype.
        nested_row_splits: One row-splits vector per ragged dimension,
            outermost first, of the leaf's ``row_splits_dtype``; rows of
            dimension ``k`` are ``splits[k][i]:splits[k][i + 1]`` of the next
            level (of ``flat_values`` for the last one).
    """

    flat_values: Any
    nested_row_splits: tuple[Any, ...]

    @property
    def ragged_rank(self) -> int:
        """The number of ragged dimensions."""
        return len(self.nested_row_splits)

    def __len__(self) -> int:
        return len(self.nested_row_splits[0]) - 1

    def to_list(self) -> list[Any]:
        """Nested lists, innermost a slice of ``flat_values`` per ragged row."""

        def rows(level: int, lo: int, hi: int) -> list[Any]:
            splits = self.nested_row_splits[level]
            out = []
            for i in range(lo, hi):
                a, b = int(splits[i]), int(splits[i + 1])
                out.append(
                    self.flat_values[a:b]
                    if level + 1 == self.ragged_rank
                    else rows(level + 1, a, b)
                )
            return out

        return rows(0, 0, len(self))


@dataclass(frozen=True, eq=False)
class Sparse:
    """A sparse array, stored as ``tf.sparse.SparseTensor`` stores it.

    Attributes:
        indices: int64 ``[nnz, rank]``, the positions of the values.
        values: ``[nnz]`` values of the leaf's dtype.
        dense_shape: int64 ``[rank]``.
    """

    indices: Any
    values: Any
    dense_shape: Any

    def to_dense(self) -> np.ndarray:
        """The dense numpy array (zeros, or ``b""`` for strings, elsewhere)."""
        values = np.asarray(self.values)
        fill: Any = b"" if values.dtype == object else 0
        out = np.full(tuple(int(d) for d in self.dense_shape), fill, dtype=values.dtype)
        if len(values):
            out[tuple(np.asarray(self.indices).T)] = values
        return out


# ------------------------------------------------------------------ decoding

_FIELD = {"int64": "int64_list", "float": "float_list", "bytes": "bytes_list", "raw": "bytes_list"}
_LITTLE = sys.byteorder == "little"


def _feature(fmap: Any, name: str, kind: str, leaf: Leaf, where: str, optional: bool) -> Any:
    """The values container of one feature, checked for presence and list kind.

    ``optional``: a feature the TF loader parses as a ``tf.io.RaggedFeature``,
    which reads an absent feature as empty (records of ``superserial infer``
    datasets lack features); others are required, as ``FixedLenFeature``.
    """
    if name not in fmap:
        if optional:
            return EMPTY_FEATURE
        text = f"expected a feature {name!r}, got none"
        raise CorruptDataError(f"{text} at {where}, leaf {leaf.name}", reason=text, leaf=leaf.name)
    feat = fmap[name]
    got = feat.WhichOneof("kind")
    field = _FIELD[kind]
    if got is not None and got != field:
        text = f"expected {field} in feature {name!r}, got {got}"
        raise CorruptDataError(f"{text} at {where}, leaf {leaf.name}", reason=text, leaf=leaf.name)
    return feat


def _float_bytes(feat: Any) -> bytes:
    """The little-endian float32 bytes of a FloatList, exactly (NaN payloads kept).

    The float values are taken from the list's wire form: Python floats would
    pass each through a double, which quiets signalling NaNs.
    """
    data: bytes = feat.float_list.SerializeToString()
    if not data:
        return b""
    if data[0] != 0x0A:  # not one packed field: re-pack value by value
        return np.array(list(feat.float_list.value), np.float32).astype("<f4").tobytes()
    pos, size, shift = 1, 0, 0
    while True:
        byte = data[pos]
        size |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            break
    if pos + size != len(data):
        return np.array(list(feat.float_list.value), np.float32).astype("<f4").tobytes()
    return data[pos:]


def _from_le(buf: Any, dtype: np.dtype) -> np.ndarray:
    out = np.frombuffer(buf, dtype)
    return out if _LITTLE else out.byteswap()


class _LeafDecoder:
    """Decodes one leaf from parsed records, checking it as ``codec.decode_batch`` does."""

    def __init__(self, leaf: Leaf) -> None:
        self.leaf = leaf
        self.dtype = leaf.entry.numpy
        self.kind = leaf.encoding
        self.itemsize = leaf.entry.itemsize
        f = leaf.features
        self.values_name = f["values"]
        self.shape_name = f.get("shape")
        self.indices_name = f.get("indices")
        self.rl_names = f.get("row_lengths", [])
        self.count = leaf.num_values if leaf.fixed else None
        # A fixed leaf's dimensions are all known.
        self.fixed_shape = tuple(d for d in leaf.shape if d is not None) if leaf.fixed else ()
        self.range = leaf.entry.int64_range

    def _fail(self, where: str, text: str) -> CorruptDataError:
        name = self.leaf.name
        return CorruptDataError(f"{text} at {where}, leaf {name}", reason=text, leaf=name)

    def _cast(self, x: np.ndarray, where: str) -> np.ndarray:
        if self.range is not None and x.size:
            lo, hi = self.range
            if x.min() < lo or x.max() > hi:
                bad = x[(x < lo) | (x > hi)][0]
                raise self._fail(
                    where, f"expected {self.leaf.dtype} values in [{lo}, {hi}], got {bad}"
                )
        return x.astype(self.dtype) if x.dtype != self.dtype else x

    def _int64s(self, fmap: Any, name: str, where: str, optional: bool = True) -> np.ndarray:
        c = _feature(fmap, name, "int64", self.leaf, where, optional).int64_list.value
        return np.fromiter(c, np.int64, len(c))

    # -- the values feature of one record, flat, of the leaf dtype

    def values(self, fmap: Any, where: str) -> np.ndarray:
        optional = self.kind != "raw"  # raw values are one required bytes value
        feat = _feature(fmap, self.values_name, self.kind, self.leaf, where, optional)
        if self.kind == "raw":
            c = feat.bytes_list.value
            if len(c) != 1:
                raise self._fail(
                    where, f"expected 1 bytes value in feature {self.values_name!r}, got {len(c)}"
                )
            data = c[0]
            if len(data) % self.itemsize:
                raise self._fail(
                    where,
                    f"expected a whole number of {self.itemsize}-byte values, got {len(data)} bytes",
                )
            return _from_le(bytearray(data), self.dtype)
        if self.kind == "int64":
            c = feat.int64_list.value
            return self._cast(np.fromiter(c, np.int64, len(c)), where)
        if self.kind == "float":
            return _from_le(bytearray(_float_bytes(feat)), np.dtype(np.float32))
        out = np.empty(len(feat.bytes_list.value), object)
        out[:] = list(feat.bytes_list.value)
        return out

    # -- fixed-shape dense leaves, many records at once

    def fixed_rows(self, fmaps: list[Any], wheres: list[str]) -> np.ndarray:
        """``[B, *shape]`` values of a fixed-shape dense leaf from B records."""
        n, b = self.count, len(fmaps)
        assert n is not None
        shape = (b, *self.fixed_shape)
        name, kind = self.values_name, self.kind
        optional = n == 0 and kind != "raw"  # parsed as RaggedFeature, as in codec
        feats = [
            _feature(fm, name, kind, self.leaf, w, optional)
            for fm, w in zip(fmaps, wheres, strict=True)
        ]
        if kind == "raw":
            parts = []
            want = n * self.itemsize
            for feat, w in zip(feats, wheres, strict=True):
                c = feat.bytes_list.value
                if len(c) != 1:
                    raise self._fail(w, f"expected 1 bytes value in feature {name!r}, got {len(c)}")
                if len(c[0]) != want:
                    raise self._fail(w, f"expected {want} bytes per element, got {len(c[0])}")
                parts.append(c[0])
            if n == 0:
                return np.zeros(shape, self.dtype)
            return _from_le(bytearray().join(parts), self.dtype).reshape(shape)
        if kind == "float":
            parts = [_float_bytes(feat) for feat in feats]
            for p, w in zip(parts, wheres, strict=True):
                if len(p) != 4 * n:
                    raise self._fail(
                        w, f"expected {n} values in feature {name!r}, got {len(p) // 4}"
                    )
            return _from_le(bytearray().join(parts), np.dtype(np.float32)).reshape(shape)
        lists = [
            feat.int64_list.value if kind == "int64" else feat.bytes_list.value for feat in feats
        ]
        for c, w in zip(lists, wheres, strict=True):
            if len(c) != n:
                raise self._fail(w, f"expected {n} values in feature {name!r}, got {len(c)}")
        if n == 0:
            return np.zeros(shape, self.dtype) if kind == "int64" else np.full(shape, b"", object)
        if kind == "bytes":
            out = np.empty(b * n, object)
            out[:] = list(itertools.chain.from_iterable(lists))
            return out.reshape(shape)
        flat = np.fromiter(itertools.chain.from_iterable(lists), np.int64, b * n)
        if self.range is not None:
            try:
                return self._cast(flat, "").reshape(shape)
            except CorruptDataError:
                for c, w in zip(lists, wheres, strict=True):  # find the record at fault
                    self._cast(np.fromiter(c, np.int64, len(c)), w)
                raise
        return flat.reshape(shape)

    # -- one element

    def fixed_one(self, fmap: Any, where: str) -> np.ndarray:
        """One element of a fixed-shape dense leaf (``fixed_rows`` for one record, faster)."""
        n, shape, kind = self.count, self.fixed_shape, self.kind
        if not n or kind == "bytes":
            return self.fixed_rows([fmap], [where]).reshape(shape)
        feat = _feature(fmap, self.values_name, kind, self.leaf, where, False)
        if kind == "raw":
            c = feat.bytes_list.value
            if len(c) != 1 or len(c[0]) != n * self.itemsize:
                return self.fixed_rows([fmap], [where]).reshape(shape)  # raises, with the message
            return _from_le(bytearray(c[0]), self.dtype).reshape(shape)
        if kind == "float":
            data = _float_bytes(feat)
            if len(data) != 4 * n:
                return self.fixed_rows([fmap], [where]).reshape(shape)
            return _from_le(bytearray(data), np.dtype(np.float32)).reshape(shape)
        c = feat.int64_list.value
        if len(c) != n:
            return self.fixed_rows([fmap], [where]).reshape(shape)
        return self._cast(np.fromiter(c, np.int64, n), where).reshape(shape)

    def element(self, fmap: Any, where: str) -> Any:
        leaf = self.leaf
        if leaf.fixed:
            return self.fixed_one(fmap, where)
        if leaf.kind == "dense":
            values = self.values(fmap, where)
            shape = self._shape(fmap, where)
            if math.prod(shape) != values.size:
                raise self._fail(
                    where,
                    f"expected {math.prod(shape)} values for shape {shape}, got {values.size}",
                )
            return values.reshape(shape)
        if leaf.kind == "sparse":
            return self._sparse(fmap, where)
        return self._ragged(fmap, where)

    def _shape(self, fmap: Any, where: str) -> tuple[int, ...]:
        assert self.shape_name is not None
        shape = self._int64s(fmap, self.shape_name, where, optional=False)
        rank = len(self.leaf.shape)
        if len(shape) != rank:
            raise self._fail(where, f"expected a shape of rank {rank}, got {shape.tolist()}")
        if (shape < 0).any():
            raise self._fail(where, f"expected dimensions >= 0, got {shape.tolist()}")
        for i, d in enumerate(self.leaf.shape):
            if d is not None and shape[i] != d:
                raise self._fail(where, f"expected dimension {i} of size {d}, got {int(shape[i])}")
        return tuple(int(d) for d in shape)

    def _sparse(self, fmap: Any, where: str) -> Sparse:
        assert self.indices_name is not None
        values = self.values(fmap, where)
        shape = self._shape(fmap, where)
        rank = len(shape)
        indices = self._int64s(fmap, self.indices_name, where)
        if indices.size != values.size * rank:
            raise self._fail(
                where,
                f"expected {rank} indices per value ({values.size * rank}), got {indices.size}",
            )
        indices = indices.reshape(values.size, rank)
        if values.size and ((indices < 0).any() or (indices >= np.asarray(shape, np.int64)).any()):
            raise self._fail(
                where, f"expected indices inside the dense shape {list(shape)}, got one outside"
            )
        return Sparse(indices, values, np.asarray(shape, np.int64))

    def _ragged(self, fmap: Any, where: str) -> Any:
        leaf = self.leaf
        rank = leaf.ragged_rank or 0
        inner_shape = leaf.inner_shape
        inner = self.leaf.num_values
        values = self.values(fmap, where)
        lengths = [self._int64s(fmap, name, where) for name in self.rl_names]
        if rank:
            rows = len(lengths[0])
        elif inner:
            rows = values.size // inner
            if rows * inner != values.size:
                raise self._fail(where, f"expected a multiple of {inner} values, got {values.size}")
        else:
            rows = leaf.shape[0] if leaf.shape[0] is not None else 0
        for j, lj in enumerate(lengths):
            if (lj < 0).any():
                raise self._fail(where, f"expected row lengths >= 0, got {int(lj.min())}")
            total = int(lj.sum())
            if j + 1 < rank and total != len(lengths[j + 1]):
                raise self._fail(
                    where,
                    f"expected row lengths in {self.rl_names[j]!r} adding up to "
                    f"{len(lengths[j + 1])} rows, got {total}",
                )
            if j + 1 == rank and total * inner != values.size:
                raise self._fail(
                    where,
                    f"expected row lengths in {self.rl_names[j]!r} adding up to "
                    f"{values.size // max(inner, 1)} values, got {total}",
                )
        dims = leaf.shape
        if dims[0] is not None and rows != dims[0]:
            raise self._fail(where, f"expected dimension 0 of size {dims[0]}, got {rows}")
        for d in range(1, rank + 1):
            if dims[d] is not None and (lengths[d - 1] != dims[d]).any():
                raise self._fail(where, f"expected dimension {d} of size {dims[d]}, got another")
        if inner:
            flat = values.reshape(-1, *inner_shape)
        else:  # rows of zero-size values: as many as the innermost row lengths say
            count = int(lengths[-1].sum()) if rank else rows
            flat = np.zeros((count, *inner_shape), self.dtype)
        if not rank:
            return flat
        splits_dtype = np.dtype(leaf.row_splits_dtype or "int64")
        splits = []
        for lj in lengths:
            s = np.zeros(len(lj) + 1, np.int64)
            np.cumsum(lj, out=s[1:])
            splits.append(s.astype(splits_dtype, copy=False))
        return Ragged(flat, tuple(splits))


class RecordDecoder:
    """Decodes serialized records of a dataset (read by any means) into numpy values.

    :class:`superserial.numpy.NumpyDataset` decodes with it, and so do tools
    that read the record files themselves (``superserial verify`` and
    ``head``): the values and checks are the same.
    A :class:`~superserial.errors.CorruptDataError` it raises carries
    ``reason`` (what is wrong) and ``leaf`` (where known) apart from the
    place, which is the ``where`` given.

    Args:
        header: The dataset's header.
    """

    def __init__(self, header: Header) -> None:
        self.header = header
        self._decoders = [_LeafDecoder(leaf) for leaf in header.leaves]

    def decode(self, records: list[bytes], wheres: list[str]) -> list[Any]:
        """The flat leaves of a batch of records, in header order.

        Fixed-shape dense leaves come as stacked ``[B, *shape]`` arrays
        (decoded for the whole batch at once), others as lists of B values.
        """
        fmaps = [parse_features(r, w) for r, w in zip(records, wheres, strict=True)]
        out: list[Any] = []
        for d in self._decoders:
            if d.leaf.fixed:
                out.append(d.fixed_rows(fmaps, wheres))
            else:
                out.append([d.element(fm, w) for fm, w in zip(fmaps, wheres, strict=True)])
        return out

    def element(self, record: bytes, where: str) -> list[Any]:
        """The flat leaves of one record, in header order."""
        fmap = parse_features(record, where)
        return [d.element(fmap, where) for d in self._decoders]

"""Reads superserial datasets into numpy arrays, without TensorFlow.

    import superserial.numpy as ssnp

    for element in ssnp.load("/data/digits"):              # one element at a time
        image, label = element["image"], element["label"]  # np.uint8[28, 28], np.int64[]
    for batch in ssnp.iter_batches("/data/digits", 256):   # stacked [256, ...] arrays
        ...

This module reads the TFRecord framing itself (both masked CRC-32C checks,
uncompressed, GZIP or ZLIB) and parses ``tf.train.Example`` records with
``protobuf`` message classes built here from a private descriptor pool, so it
needs neither TensorFlow nor its generated code, and it works in a process
that has TensorFlow imported too. It checks what it reads against the header
exactly as :func:`superserial.load` does; anything that disagrees is a
:class:`~superserial.errors.CorruptDataError` naming the file, the record and
the leaf. Paths are local, or any URL ``fsspec`` opens when it is installed
(``memory://``, ``gs://``, ``s3://``...).

How leaves come out (the structure, dicts, tuples and namedtuples, is rebuilt
from the header; namedtuple classes are made with ``collections.namedtuple``):

* dense: an ``np.ndarray`` of the leaf's dtype and the element's shape;
  scalars are 0-d arrays (never numpy scalars), so every dense leaf has
  ``.dtype``, ``.shape`` and ``.tobytes()``. Strings are ``object`` arrays
  holding ``bytes``; bfloat16 is ``ml_dtypes.bfloat16``.
* ragged with ``ragged_rank`` 0: a plain ``np.ndarray``, as TensorFlow
  yields a dense tensor for it too.
* ragged with ``ragged_rank`` >= 1: a :class:`Ragged` (``flat_values`` and
  ``nested_row_splits``, as ``tf.RaggedTensor`` holds them).
* sparse: a :class:`Sparse` (``indices``, ``values``, ``dense_shape``, as
  ``tf.sparse.SparseTensor`` holds them).

Arrays are freshly allocated and writable.
"""

from __future__ import annotations

import gzip
import io
import itertools
import logging
import math
import os
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import google_crc32c
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from superserial import layout
from superserial.errors import CorruptDataError, DatasetNotFoundError
from superserial.header import LIMITS, Header
from superserial.layout import HEADER_FILE
from superserial.structure import DictNode, Leaf, Node, namedtuple_type, pack

__all__ = [
    "NumpyDataset",
    "Ragged",
    "RecordDecoder",
    "Sparse",
    "iter_batches",
    "load",
    "read_records",
]

log = logging.getLogger("superserial")

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


# ------------------------------------------------------- tf.train.Example


def _example_class() -> type:
    """``tensorflow.Example`` from a private pool (never TensorFlow's generated code).

    A private pool keeps these definitions apart from the default pool, where
    TensorFlow registers its own ``tensorflow.Example``: either may be
    imported first without a "duplicate symbol" error.
    """
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="superserial/tf_example.proto", package="tensorflow", syntax="proto3"
    )
    for name, typ in (
        ("BytesList", f.TYPE_BYTES),
        ("FloatList", f.TYPE_FLOAT),
        ("Int64List", f.TYPE_INT64),
    ):
        field = fdp.message_type.add(name=name).field.add(
            name="value", number=1, label=f.LABEL_REPEATED, type=typ
        )
        if typ != f.TYPE_BYTES:
            field.options.packed = True
    feature = fdp.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, typ) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), 1
    ):
        feature.field.add(
            name=name, number=number, label=f.LABEL_OPTIONAL, type=f.TYPE_MESSAGE,
            type_name=f".tensorflow.{typ}", oneof_index=0,
        )  # fmt: skip
    features = fdp.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=f.LABEL_OPTIONAL, type=f.TYPE_STRING)
    entry.field.add(
        name="value",
        number=2,
        label=f.LABEL_OPTIONAL,
        type=f.TYPE_MESSAGE,
        type_name=".tensorflow.Feature",
    )
    features.field.add(
        name="feature", number=1, label=f.LABEL_REPEATED, type=f.TYPE_MESSAGE,
        type_name=".tensorflow.Features.FeatureEntry",
    )  # fmt: skip
    example = fdp.message_type.add(name="Example")
    example.field.add(
        name="features",
        number=1,
        label=f.LABEL_OPTIONAL,
        type=f.TYPE_MESSAGE,
        type_name=".tensorflow.Features",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


_Example = _example_class()

# ---------------------------------------------------------- TFRecord framing

_MASK_DELTA = 0xA282EAD8
_HEAD = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_CHUNK = 16 << 20
_BUFFER = 1 << 20


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class _ZlibReader(io.RawIOBase):
    """A raw stream inflating one zlib stream (TensorFlow's ``ZLIB`` option)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._z = zlib.decompressobj()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = len(b)
        while True:
            if self._z.unconsumed_tail:
                out = self._z.decompress(self._z.unconsumed_tail, n)
            elif self._z.eof:
                if self._z.unused_data or self._raw.read(1):
                    raise zlib.error("data after the end of the zlib stream")
                return 0
            else:
                chunk = self._raw.read(1 << 16)
                if not chunk:
                    raise EOFError("the zlib stream ended before its end marker")
                out = self._z.decompress(chunk, n)
            if out:
                b[: len(out)] = out
                return len(out)


def _decompressed(raw: BinaryIO, compression: str | None) -> BinaryIO:
    if not compression:
        return raw
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if compression == "ZLIB":
        return io.BufferedReader(_ZlibReader(raw), _BUFFER)  # type: ignore[return-value]
    raise ValueError(f"expected compression None, 'GZIP' or 'ZLIB', got {compression!r}")


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    """Reads ``n`` bytes, or fewer at the end; allocates no more than the stream holds."""
    data = stream.read(min(n, _CHUNK))
    if len(data) == n or not data:
        return data
    parts, left = [data], n - len(data)
    while left:
        part = stream.read(min(left, _CHUNK))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _frames(stream: BinaryIO, name: str, first: int = 0, first_offset: int = 0) -> Iterator[bytes]:
    """Yields the records of a TFRecord stream, checking lengths and both CRCs.

    Reads in chunks of ``_BUFFER`` bytes and cuts records out of them, so
    that a record costs a few slices, not several read calls. ``first`` and
    ``first_offset`` are the index and byte offset in its file of the
    stream's first record, for messages.
    """
    # offset: the current record's first byte in the file
    buf, pos, index, offset = b"", 0, first, first_offset
    read = stream.read

    def fail(text: str, in_data: bool = False) -> CorruptDataError:
        # The byte offset TensorFlow's "corrupted record at N" gives: of the
        # record's 12-byte header, or of its data for a fault there.
        at = offset + 12 if in_data else offset
        return CorruptDataError(
            f"{text} at {name} record {index} (byte offset {at})",
            reason=f"{text} at byte offset {at}",
        )

    try:
        while True:
            if len(buf) - pos < 12:
                buf, pos = buf[pos:] + read(_BUFFER), 0
                if not buf:
                    return
                if len(buf) < 12:
                    raise fail(
                        f"expected a 12-byte record header, got {len(buf)} bytes (truncated file)"
                    )
            length, length_crc = _HEAD.unpack_from(buf, pos)
            if _masked_crc(buf[pos : pos + 8]) != length_crc:
                raise fail(
                    f"expected the length CRC {length_crc:08x}, got another (corrupted length)"
                )
            end = pos + 12 + length
            if len(buf) < end + 4:
                rest = buf[pos:]
                buf, pos = rest + _read_exact(stream, max(16 + length - len(rest), _BUFFER)), 0
                end = 12 + length
                if len(buf) < end + 4:
                    got = max(len(buf) - 12, 0)
                    what = f"{length} record bytes and a 4-byte CRC"
                    raise fail(f"expected {what}, got {got} bytes (truncated file)", True)
            data = buf[pos + 12 : end]
            (data_crc,) = _CRC.unpack_from(buf, end)
            if _masked_crc(data) != data_crc:
                raise fail(
                    f"expected the data CRC {data_crc:08x}, got another (corrupted record)", True
                )
            pos = end + 4
            yield data
            index += 1
            offset += 16 + length
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise fail(f"expected a well-formed compressed stream, got {e}") from e


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(
            "expected fsspec installed to read URLs (pip install fsspec), got none"
        ) from e
    return fsspec


def _open(path: str, buffer: int = _BUFFER) -> BinaryIO:
    if _is_url(path):
        return _fsspec().open(path, "rb", block_size=buffer).open()  # type: ignore[no-any-return]
    path = path[len("file://") :] if path.startswith("file://") else path
    return open(path, "rb", buffering=buffer)


def read_records(
    file: str | os.PathLike[str] | BinaryIO, compression: str | None = None
) -> Iterator[bytes]:
    """Yields the records of one TFRecord file, checking its framing.

    Args:
        file: A local path, an fsspec URL, or a binary file object.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``, as written.

    Yields:
        Each record's bytes, in order.

    Raises:
        CorruptDataError: A record is truncated, a length or data CRC does not
            match, or the compressed stream is damaged; the message names the
            file and the record index.
    """
    compression = compression.upper() if compression else None
    if compression not in (None, "GZIP", "ZLIB"):
        raise ValueError(f"expected compression None, 'GZIP' or 'ZLIB', got {compression!r}")
    if hasattr(file, "read"):
        yield from _frames(_decompressed(file, compression), getattr(file, "name", "<stream>"))  # type: ignore[arg-type]
        return
    name = os.fspath(file)
    with _open(name) as raw:
        yield from _frames(_decompressed(raw, compression), name)


def _shard_records(
    file: str, compression: str | None, expected: int
) -> Iterator[tuple[bytes, str]]:
    """Records of one shard with their error location; exactly ``expected`` of them."""
    n = 0
    for record in read_records(file, compression):
        if n == expected:
            raise CorruptDataError(f"expected {expected} records, got more at {file} record {n}")
        yield record, f"{file} record {n}"
        n += 1
    if n != expected:
        raise CorruptDataError(f"expected {expected} records, got {n} (truncated shard) at {file}")


_SCAN_BUFFER = 1 << 16


def _record_offset(file: str, index: int) -> int:
    """The byte offset of record ``index`` of an uncompressed TFRecord file.

    Walks the framing: reads each record's 12-byte header (length and its
    CRC, checked) and seeks past the payload and its 4-byte CRC, so it reads
    about 12 bytes per record skipped, not the records. A small buffer keeps
    short records cheap without reading long ones.
    """
    with _open(file, _SCAN_BUFFER) as f:
        pos = 0
        for i in range(index):
            f.seek(pos)
            head = f.read(12)
            if len(head) < 12:
                raise CorruptDataError(
                    f"expected a 12-byte record header, got {len(head)} bytes (truncated file) at {file} record {i}"
                )
            length, length_crc = _HEAD.unpack(head)
            if _masked_crc(head[:8]) != length_crc:
                raise CorruptDataError(
                    f"expected the length CRC {length_crc:08x}, got another (corrupted length) at {file} record {i}"
                )
            pos += 16 + length
    return pos


def _range_records(
    file: str, start: int, count: int, total: int | None
) -> Iterator[tuple[bytes, str]]:
    """Records ``start .. start+count-1`` of an uncompressed shard of ``total`` records.

    The range that ends the shard also checks that no record follows.
    """
    offset = _record_offset(file, start)
    with _open(file) as raw:
        raw.seek(offset)
        frames = _frames(raw, file, start, offset)
        for n in range(start, start + count):
            record = next(frames, None)
            if record is None:
                raise CorruptDataError(
                    f"expected {total or start + count} records, got {n} (truncated shard) at {file}"
                )
            yield record, f"{file} record {n}"
        # Only the range that ends the shard reads on: the others stop at their last record.
        if start + count == total and next(frames, None) is not None:
            raise CorruptDataError(f"expected {total} records, got more at {file} record {total}")


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
            return _NO_FEATURE
        text = f"expected a feature {name!r}, got none"
        raise CorruptDataError(f"{text} at {where}, leaf {leaf.name}", reason=text, leaf=leaf.name)
    feat = fmap[name]
    got = feat.WhichOneof("kind")
    field = _FIELD[kind]
    if got is not None and got != field:
        text = f"expected {field} in feature {name!r}, got {got}"
        raise CorruptDataError(f"{text} at {where}, leaf {leaf.name}", reason=text, leaf=leaf.name)
    return feat


_NO_FEATURE = message_factory.GetMessageClass(
    _Example.DESCRIPTOR.fields_by_name["features"]
    .message_type.fields_by_name["feature"]
    .message_type.fields_by_name["value"]
    .message_type
)()


def _float_bytes(feat: Any) -> bytes:
    """The little-endian float32 bytes of a FloatList, exactly (NaN payloads kept).

    The float values are taken from the list's wire form: Python floats would
    pass each through a double, which quiets signalling NaNs.
    """
    data = feat.float_list.SerializeToString()
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
        shape = (b, *self.leaf.shape)
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
        n, shape, kind = self.count, self.leaf.shape, self.kind
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


# -------------------------------------------------------------- structure

# Shared with the TF loader, so both rebuild the same namedtuple classes.
_namedtuple = namedtuple_type
_pack = pack


def _packer(node: Node) -> Any:
    """A function packing flat leaves into ``node``'s structure; fast for flat dicts."""
    if isinstance(node, Leaf):
        return lambda flat: flat[0]
    if isinstance(node, DictNode) and all(isinstance(v, Leaf) for v in node.items.values()):
        keys = sorted(node.items)
        return lambda flat: dict(zip(keys, flat, strict=True))
    return lambda flat: _pack(node, flat)


def _parse(record: bytes, where: str) -> Any:
    try:
        return _Example.FromString(record).features.feature
    except DecodeError as e:
        text = f"expected a tf.train.Example, got unparsable bytes ({e})"
        raise CorruptDataError(f"{text} at {where}", reason=text) from e


# ------------------------------------------------------------------ dataset


def _read_header_url(url: str) -> tuple[Header, list[str]]:
    fs, root = _fsspec().core.url_to_fs(url)
    root = root.rstrip("/")
    hpath = f"{root}/{HEADER_FILE}"
    if not fs.exists(hpath):
        what = "no such directory" if not fs.exists(root) else f"no {HEADER_FILE}"
        raise DatasetNotFoundError(f"expected a superserial dataset at {url}, found {what}")
    with fs.open(hpath, "rb") as f:
        text = f.read(LIMITS.header_bytes + 1)
    header = Header.from_json(text, source=url.rstrip("/") + "/" + HEADER_FILE)
    present = {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)}
    listed = {s.file for s in header.shards}
    extra = sorted(
        n for n in present if n.startswith("data-") and n.endswith(".tfrecord") and n not in listed
    )
    if extra:
        raise CorruptDataError(
            f"expected only the header's shards in {url}, found extra file {extra[0]}"
        )
    base = url.rstrip("/")
    files = []
    for shard in header.shards:
        file = f"{base}/{shard.file}"
        if shard.file not in present:
            raise CorruptDataError(
                f"expected shard {file} ({shard.records} records), found no file"
            )
        got = fs.size(f"{root}/{shard.file}")
        if got != shard.bytes:
            raise CorruptDataError(f"expected {shard.bytes} bytes in {file}, found {got}")
        files.append(file)
    return header, files


def _batch_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected batch_size >= 1, got {value!r}")
    return value


class NumpyDataset:
    """The elements of a saved dataset (or of some of its shards) as numpy values.

    Iterable any number of times, in the saved order; ``len()`` is the
    element count from the header. Made by :func:`load`.

    Attributes:
        path: The dataset directory or URL.
        header: The dataset's header.
        files: The shard files read, in order.
        counts: The number of records read from each of ``files``.
        starts: The index of the first record read from each of ``files``:
            ``counts[i]`` records are read from record ``starts[i]`` on, which
            splits a shard between readers. All 0 (whole shards) by default;
            other starts need uncompressed shards, whose records are found by
            walking the framing (about 12 bytes read per record skipped).

    Raises:
        ValueError: ``starts`` past 0 in a compressed dataset, or lists of
            different lengths.
    """

    def __init__(
        self,
        path: str,
        header: Header,
        files: list[str],
        counts: list[int],
        *,
        starts: list[int] | None = None,
    ) -> None:
        self.path = path
        self.header = header
        self.files = files
        self.counts = counts
        self.starts = [0] * len(files) if starts is None else list(starts)
        if not len(files) == len(counts) == len(self.starts):
            raise ValueError(
                f"expected as many counts and starts as files ({len(files)}), "
                f"got {len(counts)} and {len(self.starts)}"
            )
        if header.compression and any(self.starts):
            raise ValueError(
                f"expected record starts of 0 for a {header.compression} dataset (its records "
                f"cannot be found without decompressing), got {self.starts}"
            )
        self._decoders = [_LeafDecoder(leaf) for leaf in header.leaves]

    def __len__(self) -> int:
        return sum(self.counts)

    def __repr__(self) -> str:
        return f"NumpyDataset({self.path!r}, {len(self)} elements in {len(self.files)} shard(s))"

    def _records(self) -> Iterator[tuple[bytes, str]]:
        totals = {s.file: s.records for s in self.header.shards}
        for file, count, start in zip(self.files, self.counts, self.starts, strict=True):
            total = totals.get(file.replace("\\", "/").rpartition("/")[2])
            if start == 0 and (count == total or total is None or self.header.compression):
                yield from _shard_records(file, self.header.compression, count)
            elif count:
                yield from _range_records(file, start, count, total)

    def __iter__(self) -> Iterator[Any]:
        pack, decoders = _packer(self.header.structure), self._decoders
        for record, where in self._records():
            fmap = _parse(record, where)
            yield pack([d.element(fmap, where) for d in decoders])

    def batches(self, batch_size: int, *, drop_remainder: bool = False) -> Iterator[Any]:
        """Yields batches of ``batch_size`` elements (the last may be smaller).

        Fixed-shape dense leaves come as stacked ``[B, *shape]`` arrays,
        decoded for the whole batch at once; every other leaf (unknown
        dimensions, ragged, sparse) as a list of its B per-element values.

        Args:
            batch_size: Elements per batch.
            drop_remainder: Drop a last batch of fewer than ``batch_size``.
        """
        batch_size = _batch_size(batch_size)
        records: list[bytes] = []
        wheres: list[str] = []
        for record, where in self._records():
            records.append(record)
            wheres.append(where)
            if len(records) == batch_size:
                yield self._batch(records, wheres)
                records, wheres = [], []
        if records and not drop_remainder:
            yield self._batch(records, wheres)

    def _batch(self, records: list[bytes], wheres: list[str]) -> Any:
        fmaps = [_parse(r, w) for r, w in zip(records, wheres, strict=True)]
        out: list[Any] = []
        for d in self._decoders:
            if d.leaf.fixed:
                out.append(d.fixed_rows(fmaps, wheres))
            else:
                out.append([d.element(fm, w) for fm, w in zip(fmaps, wheres, strict=True)])
        return _pack(self.header.structure, out)


class RecordDecoder:
    """Decodes serialized records of a dataset (read by any means) into numpy values.

    For tools that read the record files themselves (``superserial verify``
    and ``head``): the values and checks are those of :class:`NumpyDataset`.
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
        fmaps = [_parse(r, w) for r, w in zip(records, wheres, strict=True)]
        out: list[Any] = []
        for d in self._decoders:
            if d.leaf.fixed:
                out.append(d.fixed_rows(fmaps, wheres))
            else:
                out.append([d.element(fm, w) for fm, w in zip(fmaps, wheres, strict=True)])
        return out


def load(path: str | os.PathLike[str], *, shard: tuple[int, int] | None = None) -> NumpyDataset:
    """Opens a dataset saved by :func:`superserial.save`, for reading as numpy values.

    Args:
        path: The dataset directory: a local path, or an fsspec URL
            (``memory://``, ``gs://``...; needs ``fsspec``).
        shard: ``(i, n)``: read only shard files ``i, i+n, i+2n, ...``, as
            :func:`superserial.load` does (and warns as it does when there
            are fewer shard files than ``n``).

    Returns:
        A :class:`NumpyDataset`: iterate it for elements, or call its
        ``batches(batch_size)``.

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        HeaderError: The header is malformed or of an unknown version.
        CorruptDataError: Shard files are missing or of the wrong size (found
            here), or their records disagree with the header (found while
            reading).
    """
    path = os.fspath(path)
    if _is_url(path):
        header, files = _read_header_url(path)
    else:
        header = layout.read_header(path)
        files = layout.shard_paths(path, header)
    counts = [s.records for s in header.shards]
    if shard is not None:
        picked = layout.host_shards(path, len(files), shard)
        files, counts = [files[k] for k in picked], [counts[k] for k in picked]
    log.debug("numpy reader: %s, %d shard(s)", path, len(files))
    return NumpyDataset(path, header, files, counts)


def iter_batches(
    path: str | os.PathLike[str],
    batch_size: int,
    *,
    drop_remainder: bool = False,
    shard: tuple[int, int] | None = None,
) -> Iterator[Any]:
    """Yields batches of a saved dataset: ``load(path, shard=shard).batches(...)``.

    Fixed-shape dense leaves come as stacked ``[B, *shape]`` arrays; every
    other leaf as a list of its B per-element values. See
    :meth:`NumpyDataset.batches`.
    """
    _batch_size(batch_size)
    return load(path, shard=shard).batches(batch_size, drop_remainder=drop_remainder)

"""In-graph encoding of element batches to ``tf.train.Example`` bytes.

The batch is encoded inside the ``tf.data`` graph: no Python runs per
element. The ``tf.train.Example`` records are assembled from protobuf
wire-format pieces (constant prefixes where lengths are fixed, varint lengths
computed in-graph where they vary) and joined once per record; only
varint-packed Int64Lists and BytesLists of strings come from
``tf.io.encode_proto``. Raw little-endian bytes (and float32 FloatLists) come
from one ``tf.io.serialize_tensor`` of the batch, whose tensor content is cut
into per-element strings with ``tf.strings.substr``. The components of each
leaf are those described in :mod:`superserial.codec.tf_leaves`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from superserial.format.structure import Leaf
from superserial.format.wire import TAG_ENTRY_VALUE, TAG_FEATURE, TAG_VALUE, varint

__all__ = ["encode_batch"]


def _unrow(x: Any) -> Any:
    """[B, 1, None] batched rows (see :func:`superserial.codec.tf_leaves.split_element`) -> [B, None]."""
    return x.values if isinstance(x, tf.RaggedTensor) and x.ragged_rank == 2 else x


def _as_rows(x: tf.Tensor, n: int) -> tf.Tensor:
    """Flattens a batched [B, *shape] tensor of n values each to rows [B, n]."""
    # A static n keeps zero-size shapes working, where -1 cannot be inferred.
    return tf.reshape(x, [tf.shape(x)[0], n])


def _raw_rows(rows: tf.RaggedTensor | tf.Tensor, itemsize: int) -> tf.Tensor:
    """Per element, the little-endian bytes of its values, as a [B] string."""
    if isinstance(rows, tf.RaggedTensor):
        flat, starts, counts = rows.values, rows.row_starts(), rows.row_lengths()
    else:
        b = tf.shape(rows, out_type=tf.int64)[0]
        n = tf.shape(rows, out_type=tf.int64)[1]
        flat, starts, counts = tf.reshape(rows, [-1]), tf.range(b) * n, tf.fill([b], n)
    # The tensor content is the last field of the serialized TensorProto, so
    # the raw bytes of ``flat`` are the final ``size * itemsize`` bytes.
    blob = tf.io.serialize_tensor(flat)
    size = tf.size(flat, out_type=tf.int64) * itemsize
    offset = tf.cast(tf.strings.length(blob), tf.int64) - size
    return tf.strings.substr(blob, offset + starts * itemsize, counts * itemsize)


# The 256 one-byte strings, as a list: a tf.constant made at import would cost
# every process that imports the writer ~0.1 s (the eager context starts).
_BYTES = [bytes([i]) for i in range(256)]
_MAX_VARINT = 5  # lengths < 2**35: far beyond a record's 2 GiB proto limit


def _varint_size(n: int) -> int:
    return len(varint(n))


class _Bytes:
    """Pieces of a [B] string batch: constants and tensors, with length bounds.

    Nothing is joined until the whole record is built, so every byte is copied
    once; lengths of sub-messages come from static bounds where they are exact
    and from tf.strings.length otherwise.
    """

    def __init__(self, parts: list[Any], lo: int, hi: int | None):
        self.parts, self.lo, self.hi = parts, lo, hi

    @classmethod
    def const(cls, b: bytes) -> _Bytes:
        return cls([b], len(b), len(b))

    @classmethod
    def tensor(cls, t: tf.Tensor, lo: int = 0, hi: int | None = None) -> _Bytes:
        return cls([t], lo, hi)

    def __add__(self, other: _Bytes) -> _Bytes:
        hi = None if self.hi is None or other.hi is None else self.hi + other.hi
        return _Bytes(self.parts + other.parts, self.lo + other.lo, hi)

    def length(self) -> tf.Tensor | int:
        if self.lo == self.hi:
            return self.lo
        const = sum(len(p) for p in self.parts if isinstance(p, bytes))
        lens = [
            tf.cast(tf.strings.length(p), tf.int64) for p in self.parts if not isinstance(p, bytes)
        ]
        return tf.add_n(lens) + const if lens else const

    def delimited(self, tag: bytes) -> _Bytes:
        """tag + varint(length) + self: a length-delimited protobuf field."""
        n = self.length()
        if isinstance(n, int):
            return _Bytes.const(tag + varint(n)) + self
        k = _MAX_VARINT if self.hi is None else _varint_size(self.hi)
        pieces: list[Any] = [tag]
        for i in range(k):
            byte = tf.bitwise.bitwise_and(tf.bitwise.right_shift(n, 7 * i), 0x7F)
            more = n >= (1 << (7 * (i + 1)))
            piece = tf.gather(
                tf.constant(_BYTES), byte + tf.where(more, tf.constant(0x80, tf.int64), 0)
            )
            # Byte i exists only if the value needs it (the first always does).
            pieces.append(
                piece if i < _varint_size(self.lo) else tf.where(n >= (1 << (7 * i)), piece, "")
            )
        return _Bytes(pieces, len(tag) + _varint_size(self.lo), len(tag) + k) + self

    def join(self) -> tf.Tensor:
        merged: list[Any] = []
        for p in self.parts:  # merge neighbouring constants
            if isinstance(p, bytes) and merged and isinstance(merged[-1], bytes):
                merged[-1] += p
            else:
                merged.append(p)
        return tf.strings.join([tf.constant(p) if isinstance(p, bytes) else p for p in merged])


def _feature(
    rows: tf.RaggedTensor | tf.Tensor, kind: str, itemsize: int, count: int | None
) -> _Bytes:
    """One serialized ``tf.train.Feature`` per element.

    Args:
        rows: [B, n] values, or ragged [B, None].
        kind: The stored kind.
        itemsize: Bytes per value for ``raw``.
        count: Values per element if the same for all, else None.
    """
    if kind in ("raw", "float"):
        size = itemsize if kind == "raw" else 4
        payload = _raw_rows(rows, size)
        exact = None if count is None else count * size
        data = _Bytes.tensor(payload, exact or 0, exact)
        # raw: a BytesList of one value; float: a FloatList whose packed
        # values are exactly the float32 bytes (NaN payloads untouched).
        lst = data.delimited(TAG_VALUE)
    else:
        if isinstance(rows, tf.RaggedTensor):
            sizes = tf.cast(rows.row_lengths(), tf.int32)[:, None]
            values = rows.to_tensor()
        else:
            b, n = tf.shape(rows)[0], tf.shape(rows)[1]
            sizes, values = tf.fill([b, 1], n), rows
        if kind == "int64":
            values = tf.cast(values, tf.int64)
        msg_type = "tensorflow.Int64List" if kind == "int64" else "tensorflow.BytesList"
        msg = tf.io.encode_proto(sizes, [values], ["value"], msg_type)
        if kind == "int64" and count is not None:
            # Packed varints take 1 to 10 bytes each, plus the field's tag and length.
            hi = 0 if count == 0 else 1 + _varint_size(10 * count) + 10 * count
            lst = _Bytes.tensor(msg, 0, hi)
        else:
            lst = _Bytes.tensor(msg)
    return lst.delimited(TAG_FEATURE[kind])


def _leaf_features(leaf: Leaf, comp: Any) -> list[tuple[str, Any, str, int]]:
    """(feature name, per-element rows, stored kind, itemsize) of one batched leaf."""
    f = leaf.features
    kind, itemsize = leaf.encoding, leaf.entry.itemsize
    if leaf.kind == "dense" and leaf.fixed:
        return [(f["values"], _as_rows(comp, leaf.num_values), kind, itemsize)]
    if leaf.kind == "dense":
        values, shape = comp
        return [(f["values"], _unrow(values), kind, itemsize), (f["shape"], shape, "int64", 8)]
    if leaf.kind == "sparse":
        values, indices, shape = comp
        return [
            (f["values"], _unrow(values), kind, itemsize),
            (f["indices"], _unrow(indices), "int64", 8),
            (f["shape"], shape, "int64", 8),
        ]
    # Ragged: the batch has one more ragged dimension (the batch) than each
    # element. Walk its row lengths outermost first, regrouping each level by
    # element, so every element gets its own row lengths.
    rank = leaf.ragged_rank or 0
    if rank == 0 and isinstance(comp, tf.RaggedTensor) and comp.ragged_rank == 2:
        comp = comp.values  # rows made by split_element: [B, 1, None] -> [B, None]
    if isinstance(comp, tf.RaggedTensor):
        lengths = [tf.cast(t, tf.int64) for t in comp.nested_row_lengths()]
        flat = comp.flat_values
    else:  # a batch of uniform rows can come back dense
        b = tf.shape(comp, out_type=tf.int64)[0]
        lengths, flat = (
            [tf.fill([b], tf.shape(comp, out_type=tf.int64)[1])],
            tf.reshape(comp, [-1, *leaf.inner_shape]),
        )
    counts = lengths[0]
    out = []
    for j in range(1, rank + 1):
        per_elem = tf.RaggedTensor.from_row_lengths(lengths[j], counts, validate=False)
        out.append((f["row_lengths"][j - 1], per_elem, "int64", 8))
        counts = tf.reduce_sum(per_elem, axis=1)
    inner = leaf.num_values
    values = tf.RaggedTensor.from_row_lengths(
        tf.reshape(flat, [-1]), counts * inner, validate=False
    )
    return [(f["values"], values, kind, itemsize), *out]


def encode_batch(leaves: tuple[Leaf, ...], comps: list[Any]) -> tuple[tf.Tensor, tf.Tensor]:
    """Encodes one batch to serialized ``tf.train.Example`` records.

    Args:
        leaves: The header leaves, in flattening order.
        comps: One batched component (or tuple of components) per leaf.

    Returns:
        The records as a [B] string tensor, and their sizes in bytes as [B] int64.
    """
    features = _Bytes([], 0, 0)
    for leaf, comp in zip(leaves, comps, strict=True):
        for name, rows, kind, itemsize in _leaf_features(leaf, comp):
            count = None if isinstance(rows, tf.RaggedTensor) else rows.shape[1]
            key = name.encode("utf-8")
            entry = _Bytes.const(TAG_VALUE + varint(len(key)) + key) + _feature(
                rows, kind, itemsize, count
            ).delimited(TAG_ENTRY_VALUE)
            features = features + entry.delimited(TAG_VALUE)
    records = features.delimited(TAG_VALUE).join()
    return records, tf.cast(tf.strings.length(records), tf.int64)

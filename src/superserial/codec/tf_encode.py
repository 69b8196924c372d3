"""In-graph encoding of element batches to ``tf.train.Example`` bytes.

The batch is encoded inside the ``tf.data`` graph: no Python runs per
element. The ``tf.train.Example`` records are assembled from protobuf
wire-format pieces (constant prefixes where lengths are fixed, varint lengths
computed in-graph where they vary) and joined once per record. The lengths are
summed arithmetically and all the varints of a batch are made by one handful
of ops: a graph of thousands of small ops took seconds to trace, for every
save of a dataset with many leaves, and its iterator as long to build. Only
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
        # One op for both dimensions: indexing makes a slice and three constants each.
        b, n = tf.unstack(tf.shape(rows, out_type=tf.int64), num=2)
        flat, starts, counts = tf.reshape(rows, [-1]), tf.range(b) * n, tf.fill([b], n)
    # The tensor content is the last field of the serialized TensorProto, so
    # the raw bytes of ``flat`` are the final ``size * itemsize`` bytes.
    blob = tf.io.serialize_tensor(flat)
    size = tf.size(flat, out_type=tf.int64) * itemsize
    offset = tf.cast(tf.strings.length(blob), tf.int64) - size
    return tf.strings.substr(blob, offset + starts * itemsize, counts * itemsize)


# The 256 one-byte strings and "" (index 256: a varint byte that is not there), as a list:
# a tf.constant made at import would cost every process that imports the writer ~0.1 s (the
# eager context starts).
_BYTES = [bytes([i]) for i in range(256)] + [b""]
_MAX_VARINT = 5  # lengths < 2**35: far beyond a record's 2 GiB proto limit


class _Varint:
    """A varint of a [B] int64 length, made with all the others of its record (see join)."""

    def __init__(self, n: tf.Tensor):
        self.n = n


def _varint_sizes(n: tf.Tensor) -> tf.Tensor:
    """The bytes of the varints of [B, P] int64 lengths, worked out, not encoded."""
    limits = tf.constant([1 << (7 * i) for i in range(1, _MAX_VARINT)], tf.int64)
    return 1 + tf.reduce_sum(tf.cast(tf.expand_dims(n, 2) >= limits, tf.int64), axis=2)


def _varints(ns: list[tf.Tensor]) -> list[tf.Tensor]:
    """The varints of V [B] int64 lengths, as V [B] strings, in a handful of ops for them all."""
    n = tf.expand_dims(tf.stack(ns, axis=1), 2)  # [B, V, 1]
    shifts = tf.constant([7 * i for i in range(_MAX_VARINT)], tf.int64)
    byte = tf.bitwise.bitwise_and(tf.bitwise.right_shift(n, shifts), 0x7F)
    more = n >= tf.bitwise.left_shift(tf.constant(1, tf.int64), shifts + 7)
    byte = tf.where(more, byte + 0x80, byte)
    # Byte i is there if the value needs it; the first always is.
    present = tf.logical_or(
        n >= tf.bitwise.left_shift(tf.constant(1, tf.int64), shifts), shifts == 0
    )
    pieces = tf.gather(tf.constant(_BYTES), tf.where(present, byte, len(_BYTES) - 1))
    return list(tf.unstack(tf.strings.reduce_join(pieces, axis=2), num=len(ns), axis=1))


class _Bytes:
    """Pieces of a [B] string batch: constants, tensors and varints, with their length.

    Nothing is joined until the whole record is built, so every byte is copied
    once, and every varint of the record is made at once. The length is kept
    as a constant plus [B] int64 tensors: static where it is exact (``lo ==
    hi``), else from one tf.strings.length per tensor piece and the sizes of
    the varints, worked out arithmetically; a sub-message's length is summed
    once, where it is delimited (:func:`_delimited`).
    """

    def __init__(self, parts: list[Any], lo: int, hi: int | None, known: int, lens: list[Any]):
        self.parts, self.lo, self.hi = parts, lo, hi
        self.known, self.lens = known, lens

    @classmethod
    def const(cls, b: bytes) -> _Bytes:
        return cls([b], len(b), len(b), len(b), [])

    @classmethod
    def tensor(cls, t: tf.Tensor, lo: int = 0, hi: int | None = None) -> _Bytes:
        if lo == hi:
            return cls([t], lo, hi, lo, [])
        return cls([t], lo, hi, 0, [tf.cast(tf.strings.length(t), tf.int64)])

    def __add__(self, other: _Bytes) -> _Bytes:
        hi = None if self.hi is None or other.hi is None else self.hi + other.hi
        return _Bytes(
            self.parts + other.parts,
            self.lo + other.lo,
            hi,
            self.known + other.known,
            self.lens + other.lens,
        )

    def join(self) -> tf.Tensor:
        marks = [p for p in self.parts if isinstance(p, _Varint)]
        made = (
            dict(zip(map(id, marks), _varints([m.n for m in marks]), strict=True)) if marks else {}
        )
        merged: list[Any] = []
        for p in self.parts:  # merge neighbouring constants
            if isinstance(p, bytes) and merged and isinstance(merged[-1], bytes):
                merged[-1] += p
            else:
                merged.append(made[id(p)] if isinstance(p, _Varint) else p)
        return tf.strings.join([tf.constant(p) if isinstance(p, bytes) else p for p in merged])


def _delimited(items: list[tuple[bytes, _Bytes]]) -> list[_Bytes]:
    """tag + varint(length) + bytes of each (tag, bytes): length-delimited protobuf fields.

    The fields of one level of the message (all the features, say) are
    delimited together: their varints' sizes come from one set of ops for all.
    """
    out: list[_Bytes | None] = [None] * len(items)
    varying: list[int] = []
    for i, (tag, b) in enumerate(items):
        if b.lo == b.hi:
            out[i] = _Bytes.const(tag + varint(b.lo)) + b
        else:
            varying.append(i)  # lens are there: lo < hi
    if varying:
        ns = tf.stack([tf.add_n(items[i][1].lens) for i in varying], axis=1)
        ns += tf.constant([items[i][1].known for i in varying], tf.int64)
        sizes = tf.unstack(_varint_sizes(ns), num=len(varying), axis=1)
        for i, n, size in zip(
            varying, tf.unstack(ns, num=len(varying), axis=1), sizes, strict=True
        ):
            tag, b = items[i]
            hi = None if b.hi is None else len(tag) + len(varint(b.hi)) + b.hi
            lo = len(tag) + len(varint(b.lo)) + b.lo
            out[i] = _Bytes([tag, _Varint(n), *b.parts], lo, hi, len(tag), [size, n])
    return [b for b in out if b is not None]


def _feature_list(
    rows: tf.RaggedTensor | tf.Tensor, kind: str, itemsize: int, count: int | None
) -> tuple[_Bytes, bool]:
    """The list message of one ``tf.train.Feature`` per element, and if it is yet to be wrapped.

    Raw and float values come back as their payload, for :func:`encode_batch`
    to wrap in the list's value field (delimited with the others of that level).

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
        # raw: a BytesList of one value; float: a FloatList whose packed
        # values are exactly the float32 bytes (NaN payloads untouched).
        return _Bytes.tensor(payload, exact or 0, exact), True
    if isinstance(rows, tf.RaggedTensor):
        sizes = tf.cast(rows.row_lengths(), tf.int32)[:, None]
        values = rows.to_tensor()
    else:
        b, n = tf.unstack(tf.shape(rows), num=2)
        sizes, values = tf.fill([b, 1], n), rows
    if kind == "int64":
        values = tf.cast(values, tf.int64)
    msg_type = "tensorflow.Int64List" if kind == "int64" else "tensorflow.BytesList"
    msg = tf.io.encode_proto(sizes, [values], ["value"], msg_type)
    if kind == "int64" and count is not None:
        # Packed varints take 1 to 10 bytes each, plus the field's tag and length.
        hi = 0 if count == 0 else 1 + len(varint(10 * count)) + 10 * count
        return _Bytes.tensor(msg, 0, hi), False
    return _Bytes.tensor(msg), False


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
    # The message, level by level: each level's fields are delimited together.
    keys, lists = [], []
    for leaf, comp in zip(leaves, comps, strict=True):
        for name, rows, kind, itemsize in _leaf_features(leaf, comp):
            count = None if isinstance(rows, tf.RaggedTensor) else rows.shape[1]
            key = name.encode("utf-8")
            keys.append(_Bytes.const(TAG_VALUE + varint(len(key)) + key))
            lists.append((kind, *_feature_list(rows, kind, itemsize, count)))
    wrapped = iter(_delimited([(TAG_VALUE, b) for _, b, wrap in lists if wrap]))
    feats = _delimited(
        [(TAG_FEATURE[kind], next(wrapped) if wrap else b) for kind, b, wrap in lists]
    )
    values = _delimited([(TAG_ENTRY_VALUE, f) for f in feats])
    entries = _delimited([(TAG_VALUE, k + v) for k, v in zip(keys, values, strict=True)])
    features = sum(entries[1:], entries[0]) if entries else _Bytes([], 0, 0, 0, [])
    records = _delimited([(TAG_VALUE, features)])[0].join()
    return records, tf.cast(tf.strings.length(records), tf.int64)

"""Batches of fixed-shape leaves -> framed ``tf.train.Example`` records, in numpy.

When every leaf is dense with a fully known shape, the records of a batch
share one layout: the same keys and tags, payloads of the same size, and
only the varint-encoded integers, the strings (and the lengths that count
them) varying. So the
records are assembled here column by column over the whole batch, with
vectorized numpy, straight into their TFRecord framing (length, masked
CRC-32C, data, masked CRC-32C) in one buffer: each payload byte is copied
once, and there is no traced function to build (the graph encoder,
:mod:`superserial.codec.tf_encode`, costs a trace on the first save in a
process). The bytes are exactly those of the graph encoder plus
:func:`superserial.format.framing.frame_records`; the tests compare them.

This module does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

from superserial.format.framing import length_crcs, masked_crc_array, range_crc32cs
from superserial.format.structure import Leaf
from superserial.format.wire import TAG_ENTRY_VALUE, TAG_FEATURE, TAG_VALUE, varint

__all__ = ["encodable", "frame_batch"]

# Fixed-width columns up to this many bytes are placed by one fancy-indexed
# assignment; wider ones (payloads) by a slice per record, which copies them once.
_SCATTER_MAX = 64
# Records of varying size are laid out padded to the batch's widest, then
# compacted, when the padding is at most the batch's size plus this.
_PAD_SLACK = 1 << 20

# A column of a batch of records: constant bytes, a [B, w] uint8 array, or
# variable-length pieces (their concatenation, and one length per record).
_Column: TypeAlias = bytes | np.ndarray | tuple[np.ndarray, np.ndarray]


def encodable(leaves: Sequence[Leaf]) -> bool:
    """True if :func:`frame_batch` encodes these leaves (dense, of a fully known shape)."""
    return bool(leaves) and all(leaf.fixed and leaf.encoding in TAG_FEATURE for leaf in leaves)


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of a [B, n] uint64 array: (the bytes, row after row; bytes per row)."""
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = values[..., None] >> shifts  # [B, n, 10]
    count = np.maximum((groups != 0).sum(axis=-1), 1)  # bytes per value, 1 to 10
    index = np.arange(10)
    more = index < (count[..., None] - 1)
    pieces = ((groups & np.uint64(0x7F)) | (more.astype(np.uint64) << np.uint64(7))).astype(
        np.uint8
    )
    return pieces[index < count[..., None]], count.sum(axis=1, dtype=np.int64)


def _width(col: _Column) -> int | np.ndarray:
    if isinstance(col, bytes):
        return len(col)
    if isinstance(col, np.ndarray):
        return int(col.shape[1])
    return col[1]


def _length(cols: list[_Column]) -> int | np.ndarray:
    total: int | np.ndarray = 0
    for col in cols:
        total = total + _width(col)
    return total


def _delimited(tag: bytes, cols: list[_Column]) -> list[_Column]:
    """tag + varint(length) + cols: a length-delimited protobuf field."""
    n = _length(cols)
    if isinstance(n, int):
        return [tag + varint(n), *cols]
    if np.all(n == n[0]):
        return [tag + varint(int(n[0])), *cols]
    data, counts = _varints(n.astype(np.uint64)[:, None])
    return [tag, (data, counts), *cols]


def _values(leaf: Leaf, array: np.ndarray) -> list[_Column]:
    """The Int64List / FloatList / BytesList message of one leaf, per element."""
    b, n = array.shape[0], leaf.num_values
    if leaf.encoding == "bytes":
        return _strings(array.reshape(b * n), b, n)
    if leaf.encoding == "int64":
        if n == 0:
            return []  # an empty Int64List serializes to nothing
        wide = np.ascontiguousarray(array).reshape(b, n).astype(np.int64).view(np.uint64)
        data, counts = _varints(wide)
        if np.all(counts == counts[0]):
            return _delimited(TAG_VALUE, [data.reshape(b, int(counts[0]))])
        return _delimited(TAG_VALUE, [(data, counts)])
    # raw and float: the values' little-endian bytes (float32's are a packed FloatList).
    payload = np.ascontiguousarray(array).reshape(b, n).view(np.uint8)
    return _delimited(TAG_VALUE, [payload])


def _strings(flat: np.ndarray, b: int, n: int) -> list[_Column]:
    """A BytesList of ``n`` strings per element: per string, tag, varint(length), bytes."""
    if n == 0:
        return []  # an empty BytesList serializes to nothing
    lengths = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
    heads, head_sizes = _varints(lengths.astype(np.uint64)[:, None])
    sizes = 1 + head_sizes + lengths  # per string
    ends = np.cumsum(sizes)
    starts = ends - sizes
    data = np.empty(int(ends[-1]) if len(ends) else 0, np.uint8)
    data[starts] = TAG_VALUE[0]
    _place(data, starts + 1, (heads, head_sizes))
    _place(data, starts + 1 + head_sizes, (np.frombuffer(b"".join(flat), np.uint8), lengths))
    return [(data, sizes.reshape(b, n).sum(axis=1))]


def _record_columns(leaves: Sequence[Leaf], arrays: Sequence[np.ndarray]) -> list[_Column]:
    features: list[_Column] = []
    for leaf, array in zip(leaves, arrays, strict=True):
        key = leaf.features["values"].encode("utf-8")
        feature = _delimited(TAG_FEATURE[leaf.encoding], _values(leaf, array))
        entry = [TAG_VALUE + varint(len(key)) + key, *_delimited(TAG_ENTRY_VALUE, feature)]
        features += _delimited(TAG_VALUE, entry)
    return _delimited(TAG_VALUE, features)


def _place(out: np.ndarray, at: np.ndarray, col: _Column) -> None:
    """Writes a column into ``out`` at byte offsets ``at`` (one per record)."""
    if isinstance(col, bytes):
        if col:
            out[at[:, None] + np.arange(len(col))] = np.frombuffer(col, np.uint8)
    elif isinstance(col, np.ndarray):
        w = col.shape[1]
        if w <= _SCATTER_MAX:
            if w:
                out[at[:, None] + np.arange(w)] = col
        else:
            for i, start in enumerate(at.tolist()):
                out[start : start + w] = col[i]
    else:
        data, counts = col
        if len(data):
            ends = np.cumsum(counts)
            out[np.repeat(at - (ends - counts), counts) + np.arange(len(data))] = data


def _padded(
    cols: list[_Column], widths: list[int | np.ndarray], widest: list[int], b: int
) -> np.ndarray:
    """The records laid out as a [B, max size] array by column slices, then the padding dropped."""
    rows = np.empty((b, sum(widest)), np.uint8)
    keep = np.ones(rows.shape, bool)
    at = 0
    for col, w, wmax in zip(cols, widths, widest, strict=True):
        block = rows[:, at : at + wmax]
        if isinstance(col, bytes):
            block[:] = np.frombuffer(col, np.uint8)
        elif isinstance(col, np.ndarray):
            block[:] = col
        else:
            valid = np.arange(wmax) < np.asarray(w)[:, None]
            block[valid] = col[0]
            keep[:, at : at + wmax] = valid
        at += wmax
    return rows[keep]


def frame_batch(
    leaves: Sequence[Leaf], arrays: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The framed records of one batch.

    Args:
        leaves: The header leaves (all :func:`encodable`).
        arrays: One ``[B, *leaf.shape]`` array per leaf, of the leaf's dtype.

    Returns:
        (the framed records as one uint8 array, each record's data size as int64).
    """
    b = int(arrays[0].shape[0])
    cols = _record_columns(leaves, arrays)
    size = _length(cols)
    sizes = np.full(b, size, np.int64) if isinstance(size, int) else size.astype(np.int64)
    head = np.empty(b, dtype=[("length", "<u8"), ("crc", "<u4")])
    head["length"] = sizes
    head["crc"] = length_crcs(sizes)
    framed = [head.view(np.uint8).reshape(b, 12), *cols]
    widths = [_width(c) for c in framed]
    if all(isinstance(w, int) for w in widths):
        # One layout for every record: columns are slices of a [B, size + 16] array.
        rows = np.empty((b, int(size) + 16), np.uint8)
        at = 0
        for col, w in zip(framed, widths, strict=True):
            rows[:, at : at + int(w)] = (
                np.frombuffer(col, np.uint8) if isinstance(col, bytes) else col
            )
            at += int(w)
        out = rows.reshape(-1)
        starts = np.arange(b, dtype=np.int64) * (int(size) + 16)
    else:
        starts = np.zeros(b, np.int64)
        np.cumsum(sizes[:-1] + 16, out=starts[1:])
        total = int(sizes.sum()) + 16 * b
        widest = [w if isinstance(w, int) else int(w.max(initial=0)) for w in widths]
        if b * (sum(widest) + 4) <= 2 * total + _PAD_SLACK:
            # The data CRC's 4 bytes, filled below.
            crc_space = np.zeros((b, 4), np.uint8)
            out = _padded([*framed, crc_space], [*widths, 4], [*widest, 4], b)
        else:
            out = np.empty(total, np.uint8)
            at_col = starts.copy()
            for col, w in zip(framed, widths, strict=True):
                _place(out, at_col, col)
                at_col = at_col + w
    crcs = range_crc32cs(out, starts + 12, sizes)
    _place(out, starts + 12 + sizes, masked_crc_array(crcs).view(np.uint8).reshape(b, 4))
    return out, sizes

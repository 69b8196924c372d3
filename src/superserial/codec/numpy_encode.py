"""Batches of leaves -> framed ``tf.train.Example`` records, in numpy.

The records of a batch are assembled column by column over the whole batch,
with vectorized numpy, straight into their TFRecord framing (length, masked
CRC-32C, data, masked CRC-32C) in one buffer: each payload byte is copied
once, and there is no traced function to build (the graph encoder,
:mod:`superserial.codec.tf_encode`, costs a trace on the first save in a
process). When every leaf is dense with a fully known shape, the records
share one layout (the same keys and tags, payloads of the same size; only
varints, strings and the lengths that count them vary). Ragged leaves
(:class:`Ragged`: flat values and row lengths, as Arrow holds lists) and dense
leaves with unknown dimensions (:class:`Shaped`) are encoded the same way,
their values counted per element. The bytes are exactly those of the graph
encoder plus :func:`superserial.format.framing.frame_records`; the tests
compare them.

This module does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from superserial.format.framing import length_crcs, masked_crc_array, range_crc32cs
from superserial.format.structure import Leaf
from superserial.format.wire import TAG_ENTRY_VALUE, TAG_FEATURE, TAG_VALUE, varint

__all__ = ["Column", "Ragged", "Shaped", "Strings", "can_frame", "encodable", "frame_batch"]

# Fixed-width columns up to this many bytes are placed by one fancy-indexed
# assignment; wider ones (payloads) by a slice per record, which copies them once.
_SCATTER_MAX = 64
# Records of varying size are laid out padded to the batch's widest, then
# compacted, when the padding is at most the batch's size plus this.
_PAD_SLACK = 1 << 20

# A column of a batch of records: constant bytes, a [B, w] uint8 array, or
# variable-length pieces (their concatenation, and one length per record).
_Column: TypeAlias = bytes | np.ndarray | tuple[np.ndarray, np.ndarray]


# Variable-length pieces longer than this on average are copied a slice each (a
# fancy-indexed copy costs an 8-byte index per byte).
_SLICE_MIN = 64


@dataclass(frozen=True)
class Strings:
    """Strings as Arrow holds them: their bytes one after another, and each one's length.

    Attributes:
        data: uint8, the strings' bytes concatenated.
        lengths: int64, one per string.
    """

    data: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, values: Any) -> Strings:
        """The strings of an array of ``bytes`` (any shape, C order; ``str`` as UTF-8)."""
        flat = [v.encode("utf-8") if isinstance(v, str) else v for v in np.asarray(values).flat]
        lengths = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
        return cls(np.frombuffer(b"".join(flat), np.uint8), lengths)


@dataclass(frozen=True)
class Ragged:
    """The batch's values of a ragged leaf, as Arrow holds nested lists.

    Attributes:
        values: All the batch's values, ``[N, *inner]`` (or flat) of the leaf's
            dtype, or :class:`Strings` (or an object array of bytes) for string leaves.
        row_lengths: ``ragged_rank + 1`` int arrays, outermost first: the first
            holds each element's dimension 0 (B values), each next one the
            lengths of the rows the one before counts (``len(row_lengths[j]) ==
            sum(row_lengths[j - 1])``); ``N == sum(row_lengths[-1])``.
    """

    values: Any
    row_lengths: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class Shaped:
    """The batch's values of a dense leaf with an unknown dimension.

    Attributes:
        values: Every element's values in C order, one element after another
            (flat; :class:`Strings` or an object array for strings).
        shapes: ``[B, rank]`` ints: each element's full shape.
    """

    values: Any
    shapes: np.ndarray


# One leaf's column of a batch: ``[B, *shape]`` values of a fixed leaf (an object
# array of bytes or :class:`Strings` for strings), or one of the classes above.
Column: TypeAlias = np.ndarray | Strings | Ragged | Shaped


def encodable(leaves: Sequence[Leaf]) -> bool:
    """True if every leaf is dense of a fully known shape (its column: one ``[B, *shape]`` array)."""
    return bool(leaves) and all(leaf.fixed and leaf.encoding in TAG_FEATURE for leaf in leaves)


def can_frame(leaf: Leaf) -> bool:
    """True if :func:`frame_batch` encodes this leaf (dense or ragged: anything but sparse)."""
    return leaf.kind in ("dense", "ragged") and leaf.encoding in TAG_FEATURE


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
    """The Int64List / FloatList / BytesList message of a fixed leaf, per element."""
    b, n = array.shape[0], leaf.num_values
    if leaf.encoding == "bytes":
        return _strings(Strings.of(array), np.full(b, n, np.int64), b)
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


def _segment_sums(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Sums of ``x`` over consecutive segments of ``counts`` items (empty ones included)."""
    sums = np.zeros(len(x) + 1, np.int64)
    np.cumsum(x, out=sums[1:])
    ends = np.cumsum(counts, dtype=np.int64)
    out: np.ndarray = sums[ends] - sums[ends - counts]
    return out


def _tidy(col: tuple[np.ndarray, np.ndarray], b: int) -> _Column:
    """A variable column whose records all have one width, as a [B, w] array (faster to place)."""
    data, counts = col
    if b and len(counts) == b and np.all(counts == counts[0]):
        return data.reshape(b, int(counts[0]))
    return col


def _join(cols: list[_Column], b: int) -> tuple[np.ndarray, np.ndarray]:
    """The columns laid out one record after another: (their bytes, each record's width)."""
    size = _length(cols)
    widths = np.full(b, size, np.int64) if isinstance(size, int) else size.astype(np.int64)
    out = np.empty(int(widths.sum()), np.uint8)
    at = np.zeros(b, np.int64)
    np.cumsum(widths[:-1], out=at[1:])
    for col in cols:
        _place(out, at, col)
        at = at + _width(col)
    return out, widths


def _list_message(
    encoding: str, values: np.ndarray | Strings, counts: np.ndarray, b: int
) -> list[_Column]:
    """The list message of one feature whose elements hold ``counts`` values each."""
    if encoding == "bytes":
        return _strings(values, counts, b)  # type: ignore[arg-type]  # bytes: always Strings
    flat = np.ascontiguousarray(values).reshape(-1)
    if encoding == "int64":
        if not len(flat):
            return []  # every Int64List empty
        data, per_value = _varints(flat.astype(np.int64).view(np.uint64)[:, None])
        msg = _delimited(TAG_VALUE, [_tidy((data, _segment_sums(per_value, counts)), b)])
        present = counts > 0
        if np.all(present):
            return msg
        # An empty Int64List serializes to nothing: no tag, no length.
        joined, widths = _join(msg, b)
        return [(joined[np.repeat(present, widths)], widths * present)]
    # raw and float: one BytesList value / one packed FloatList, present even when empty.
    payload = flat.view(np.uint8)
    return _delimited(TAG_VALUE, [_tidy((payload, counts * flat.itemsize), b)])


def _strings(values: Strings, counts: np.ndarray, b: int) -> list[_Column]:
    """A BytesList of ``counts`` strings per element: per string, tag, varint(length), bytes."""
    lengths = values.lengths
    if not len(lengths):
        return []  # an empty BytesList serializes to nothing
    heads, head_sizes = _varints(lengths.astype(np.uint64)[:, None])
    sizes = 1 + head_sizes + lengths  # per string
    ends = np.cumsum(sizes)
    starts = ends - sizes
    data = np.empty(int(ends[-1]), np.uint8)
    data[starts] = TAG_VALUE[0]
    _place(data, starts + 1, (heads, head_sizes))
    _place(data, starts + 1 + head_sizes, (values.data, lengths))
    return [_tidy((data, _segment_sums(sizes, counts)), b)]


def _leaf_lists(leaf: Leaf, col: Column, b: int) -> list[tuple[str, str, Any, np.ndarray]]:
    """(feature name, stored kind, flat values, values per element) of each feature of a leaf."""
    f, inner = leaf.features, leaf.num_values
    if leaf.kind == "dense" and leaf.fixed:
        values = _checked(leaf, col, b * inner)
        return [(f["values"], leaf.encoding, values, np.full(b, inner, np.int64))]
    if leaf.kind == "dense":
        if not isinstance(col, Shaped):
            raise ValueError(f"expected a Shaped column for {leaf.name}, got {type(col).__name__}")
        shapes = np.asarray(col.shapes, np.int64).reshape(b, len(leaf.shape))
        counts = np.prod(shapes, axis=1, dtype=np.int64)
        values = _checked(leaf, col.values, int(counts.sum()))
        ranks = np.full(b, len(leaf.shape), np.int64)
        return [
            (f["values"], leaf.encoding, values, counts),
            (f["shape"], "int64", shapes.reshape(-1), ranks),
        ]
    if not isinstance(col, Ragged) or leaf.kind != "ragged":
        raise ValueError(
            f"expected a Ragged column for the {leaf.kind} leaf {leaf.name}, got {type(col).__name__}"
        )
    rank = leaf.ragged_rank or 0
    if len(col.row_lengths) != rank + 1 or len(col.row_lengths[0]) != b:
        raise ValueError(
            f"expected {rank + 1} row lengths, the first of {b}, for {leaf.name}; "
            f"got {[len(x) for x in col.row_lengths]}"
        )
    counts = np.asarray(col.row_lengths[0], np.int64)
    out = []
    for j in range(1, rank + 1):
        lengths = np.asarray(col.row_lengths[j], np.int64)
        if len(lengths) != int(counts.sum()):
            raise ValueError(
                f"expected {int(counts.sum())} row lengths at level {j} of {leaf.name}, "
                f"got {len(lengths)}"
            )
        out.append((f["row_lengths"][j - 1], "int64", lengths, counts))
        counts = _segment_sums(lengths, counts)
    values = _checked(leaf, col.values, int(counts.sum()) * inner)
    return [(f["values"], leaf.encoding, values, counts * inner), *out]


def _checked(leaf: Leaf, values: Any, n: int) -> np.ndarray | Strings:
    """A leaf's flat values, checked: ``n`` of them, of the leaf's dtype (strings as Strings)."""
    if leaf.encoding == "bytes":
        strings = values if isinstance(values, Strings) else Strings.of(values)
        got = len(strings.lengths)
    else:
        if not isinstance(values, np.ndarray) or values.dtype != leaf.entry.numpy:
            got_type = getattr(values, "dtype", type(values).__name__)
            raise ValueError(f"expected {leaf.dtype} values for {leaf.name}, got {got_type}")
        strings, got = None, values.size
    if got != n:
        raise ValueError(f"expected {n} values for {leaf.name}, got {got}")
    return values if strings is None else strings


def _record_columns(leaves: Sequence[Leaf], columns: Sequence[Column], b: int) -> list[_Column]:
    features: list[_Column] = []
    for leaf, col in zip(leaves, columns, strict=True):
        if leaf.fixed and isinstance(col, np.ndarray) and leaf.encoding != "bytes":
            lists = [(leaf.features["values"], leaf.encoding, _values(leaf, col))]
        else:
            lists = [
                (name, encoding, _list_message(encoding, values, counts, b))
                for name, encoding, values, counts in _leaf_lists(leaf, col, b)
            ]
        for name, encoding, message in lists:
            key = name.encode("utf-8")
            feature = _delimited(TAG_FEATURE[encoding], message)
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
        if len(data) > _SLICE_MIN * len(counts):
            src = 0
            for start, n in zip(at.tolist(), counts.tolist(), strict=True):
                out[start : start + n] = data[src : src + n]
                src += n
        elif len(data):
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


def _batch_size(leaves: Sequence[Leaf], columns: Sequence[Column]) -> int:
    for leaf, col in zip(leaves, columns, strict=True):
        if isinstance(col, Ragged) and col.row_lengths:
            return len(col.row_lengths[0])
        if isinstance(col, Shaped):
            return int(np.asarray(col.shapes).shape[0])
        if isinstance(col, np.ndarray):
            return int(col.shape[0])
        if isinstance(col, Strings) and leaf.num_values:
            return len(col.lengths) // leaf.num_values
    raise ValueError("expected count= with only zero-size string columns, got none")


def frame_batch(
    leaves: Sequence[Leaf], columns: Sequence[Column], *, count: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The framed records of one batch, the bytes ``save`` writes for the same elements.

    Args:
        leaves: The header leaves (each :func:`can_frame`).
        columns: One :data:`Column` per leaf: a ``[B, *leaf.shape]`` array of the
            leaf's dtype for a fixed leaf (an object array of ``bytes``, or
            :class:`Strings`, for strings), :class:`Ragged` for a ragged leaf,
            :class:`Shaped` for a dense leaf with an unknown dimension.
        count: The batch size B, if no column says it (only zero-size string leaves).

    Returns:
        (the framed records as one uint8 array, each record's data size as int64).

    Raises:
        ValueError: A column does not fit its leaf (kind, dtype, value counts).
    """
    b = _batch_size(leaves, columns) if count is None else count
    if b == 0:
        return np.empty(0, np.uint8), np.empty(0, np.int64)
    cols = _record_columns(leaves, columns, b)
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

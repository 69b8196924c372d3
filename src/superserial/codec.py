"""In-graph encoding of element batches to ``tf.train.Example`` bytes, and back.

Both directions work on whole batches inside the ``tf.data`` graph: no Python
runs per element. The ``tf.train.Example`` records are assembled from
protobuf wire-format pieces (constant prefixes where lengths are fixed, varint
lengths computed in-graph where they vary) and joined once per record; only
varint-packed Int64Lists and BytesLists of strings come from
``tf.io.encode_proto``. Raw little-endian bytes (and float32 FloatLists) come
from one ``tf.io.serialize_tensor`` of the batch, whose tensor content is cut
into per-element strings with ``tf.strings.substr``.

Each leaf occupies one or more *components* in a batch:

* dense, fixed shape: the batched tensor ``[B, *shape]``;
* dense with unknown dimensions: ``(values, shape)``, made per element by
  :func:`split_element` before batching, since ``batch`` cannot stack them
  and a ragged batch forgets the inner size of an empty row;
* ragged: the batched ``tf.RaggedTensor``;
* sparse: ``(values, indices, dense_shape)``, also made by
  :func:`split_element`, since a batched ``SparseTensor`` keeps only the
  largest dense shape of its elements.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from superserial.structure import Leaf

__all__ = [
    "decode_batch",
    "encode_batch",
    "expand_leaf",
    "join_arity",
    "join_element",
    "needs_join",
    "needs_premap",
    "needs_split",
    "parse_spec",
    "split_element",
]

# decode_raw lacks the unsigned 32/64-bit types; they are read as their
# signed twins and bitcast.
_RAW_AS = {"uint32": tf.int32, "uint64": tf.int64}


def needs_split(leaf: Leaf) -> bool:
    """True if the leaf is split into components per element before batching."""
    return leaf.kind == "sparse" or (leaf.kind == "dense" and not leaf.fixed)


def _zero_size(leaf: Leaf) -> bool:
    return leaf.fixed and 0 in leaf.shape


def _zero_inner(leaf: Leaf) -> bool:
    return leaf.kind == "ragged" and 0 in leaf.inner_shape


def needs_join(leaf: Leaf) -> bool:
    """True if the leaf is rebuilt per element after unbatching.

    Besides split leaves, fixed-shape leaves of zero size: TF 2.21 crashes
    (SIGSEGV) unbatching a [B, 0] tensor, so they travel as a [B] placeholder.
    """
    return needs_split(leaf) or _zero_size(leaf) or _zero_inner(leaf)


def join_arity(leaf: Leaf) -> int:
    """How many components a joined leaf has in an unbatched element."""
    return 3 if leaf.kind == "sparse" else 2 if needs_split(leaf) else 1


# ------------------------------------------------------------------ encode


def needs_premap(leaf: Leaf) -> bool:
    """True if the leaf goes through a per-element map before batching.

    Split leaves do; so do ragged leaves of ragged_rank >= 1, which may arrive
    as slices of an earlier batch, a form ``batch`` cannot stack: a map boxes
    them anew.
    """
    return needs_split(leaf) or (leaf.kind == "ragged" and bool(leaf.ragged_rank))


def _row(v: tf.Tensor) -> tf.RaggedTensor:
    # One ragged row [1, None], so that plain ``batch`` (fast) can stack rows
    # of different lengths; ``ragged_batch`` is ~6x slower.
    return tf.RaggedTensor.from_row_lengths(v, tf.size(v, out_type=tf.int64)[None])


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


def _unrow(x: Any) -> Any:
    """[B, 1, None] batched rows made by :func:`_row` -> [B, None]."""
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


# Protobuf wire-format tags (field number << 3 | 2, length-delimited) of the
# tf.train messages; the records are assembled from byte pieces directly.
_TAG_VALUE = (
    b"\x0a"  # Int64List/FloatList/BytesList.value, Features.feature, Example.features, Entry.key
)
_TAG_ENTRY_VALUE = b"\x12"  # Features.FeatureEntry.value
_TAG_FEATURE = {"bytes": b"\x0a", "raw": b"\x0a", "float": b"\x12", "int64": b"\x1a"}
_BYTE = tf.constant([bytes([i]) for i in range(256)])
_MAX_VARINT = 5  # lengths < 2**35: far beyond a record's 2 GiB proto limit


def _varint_py(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _varint_size(n: int) -> int:
    return len(_varint_py(n))


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
            return _Bytes.const(tag + _varint_py(n)) + self
        k = _MAX_VARINT if self.hi is None else _varint_size(self.hi)
        pieces: list[Any] = [tag]
        for i in range(k):
            byte = tf.bitwise.bitwise_and(tf.bitwise.right_shift(n, 7 * i), 0x7F)
            more = n >= (1 << (7 * (i + 1)))
            piece = tf.gather(_BYTE, byte + tf.where(more, tf.constant(0x80, tf.int64), 0))
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
        lst = data.delimited(_TAG_VALUE)
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
    return lst.delimited(_TAG_FEATURE[kind])


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
            entry = _Bytes.const(_TAG_VALUE + _varint_py(len(key)) + key) + _feature(
                rows, kind, itemsize, count
            ).delimited(_TAG_ENTRY_VALUE)
            features = features + entry.delimited(_TAG_VALUE)
    records = features.delimited(_TAG_VALUE).join()
    return records, tf.cast(tf.strings.length(records), tf.int64)


# ------------------------------------------------------------------ decode


def _value_feature(leaf: Leaf, count: int | None) -> Any:
    """The parse spec of a values feature holding ``count`` values (None: varies)."""
    kind = leaf.encoding
    if kind == "raw":
        return tf.io.FixedLenFeature([], tf.string)
    dtype = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}[kind]
    # TF 2.21 crashes (SIGSEGV) parsing a FixedLenFeature of shape [0].
    if count is None or count == 0:
        return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
    return tf.io.FixedLenFeature([count], dtype)


def parse_spec(leaves: tuple[Leaf, ...]) -> dict[str, Any]:
    """The ``tf.io.parse_example`` feature description of all leaves."""
    spec: dict[str, Any] = {}
    for leaf in leaves:
        f = leaf.features
        spec[f["values"]] = _value_feature(leaf, leaf.num_values if leaf.fixed else None)
        if "shape" in f:
            spec[f["shape"]] = tf.io.FixedLenFeature([len(leaf.shape)], tf.int64)
        for name in f.get("row_lengths", []):
            spec[name] = tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64)
        if "indices" in f:
            spec[f["indices"]] = tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64)
    return spec


def _msg(leaf: Leaf, text: str) -> str:
    return f"superserial: {text} at {leaf.name}"


def _require(leaf: Leaf, cond: tf.Tensor, text: str) -> Any:
    """An assertion op: fails with a message naming the leaf unless ``cond``.

    ``tf.debugging.Assert`` with a constant message is several times cheaper
    per batch than ``assert_equal``, which also formats both operands.
    """
    return tf.debugging.Assert(cond, [_msg(leaf, text)], summarize=1)


def _check_range(leaf: Leaf, x: tf.Tensor) -> list[Any]:
    """Asserts that int64-stored values fit the leaf's dtype."""
    bounds = leaf.entry.int64_range
    if bounds is None:
        return []
    lo, hi = bounds
    ok = tf.logical_and(tf.reduce_min(x) >= lo, tf.reduce_max(x) <= hi)
    # reduce_min/max of no values are the extremes of int64: an empty batch is fine.
    ok = tf.logical_or(ok, tf.equal(tf.size(x), 0))
    return [_require(leaf, ok, f"expected {leaf.dtype} values in [{lo}, {hi}], got one outside")]


def _cast_values(leaf: Leaf, x: tf.Tensor) -> tf.Tensor:
    """Casts parsed int64/float32/string values to the leaf dtype, checking range."""
    dtype = tf.as_dtype(leaf.dtype)
    with tf.control_dependencies(_check_range(leaf, x)):
        return tf.identity(tf.cast(x, dtype)) if x.dtype != dtype else tf.identity(x)


def _decode_raw(leaf: Leaf, strings: tf.Tensor) -> tf.Tensor:
    dtype = tf.as_dtype(leaf.dtype)
    out = tf.io.decode_raw(strings, _RAW_AS.get(leaf.dtype, dtype))
    return tf.bitcast(out, dtype) if leaf.dtype in _RAW_AS else out


def _fixed_values(leaf: Leaf, x: tf.Tensor) -> tf.Tensor:
    """[B, *shape] values of a fixed-shape dense leaf."""
    n = leaf.num_values
    if n == 0:
        # Nothing is stored; -1 cannot be inferred for an empty reshape.
        b = x.nrows() if isinstance(x, tf.RaggedTensor) else tf.shape(x, out_type=tf.int64)[0]
        return tf.zeros(
            tf.concat([[b], tf.constant(leaf.shape, tf.int64)], 0), tf.as_dtype(leaf.dtype)
        )
    if leaf.encoding == "raw":
        want = n * leaf.entry.itemsize
        ok = tf.reduce_all(tf.equal(tf.strings.length(x), want))
        check = _require(leaf, ok, f"expected {want} bytes per element, got another size")
        with tf.control_dependencies([check]):
            x = _decode_raw(leaf, x)
            x = tf.reshape(x, [tf.shape(x)[0], n])
    else:
        x = _cast_values(leaf, x)
    # tf.shape(x)[0] rather than -1 keeps a static batch size (drop_remainder).
    return tf.reshape(x, [tf.shape(x)[0], *leaf.shape])


def _var_values(leaf: Leaf, x: Any) -> tf.RaggedTensor:
    """[B, None] values of a leaf whose value count varies per element."""
    if leaf.encoding != "raw":
        return tf.RaggedTensor.from_row_splits(
            _cast_values(leaf, x.values), x.row_splits, validate=False
        )
    itemsize = leaf.entry.itemsize
    lengths = tf.cast(tf.strings.length(x), tf.int64)
    check = _require(
        leaf,
        tf.reduce_all(tf.equal(lengths % itemsize, 0)),
        f"expected a whole number of {itemsize}-byte values, got a partial one",
    )
    with tf.control_dependencies([check]):
        flat = _decode_raw(leaf, tf.strings.reduce_join(x))
    flat = tf.reshape(flat, [-1])
    return tf.RaggedTensor.from_row_lengths(flat, lengths // itemsize, validate=False)


def _assert_same(leaf: Leaf, a: tf.Tensor, b: tf.Tensor, what: str) -> Any:
    return _require(leaf, tf.reduce_all(tf.equal(a, b)), f"expected {what}, found a mismatch")


def _partition(
    values: Any, lengths: tf.Tensor, dim: int | None, dtype: tf.DType
) -> tf.RaggedTensor:
    lengths = tf.cast(lengths, dtype)
    if dim is not None:
        return tf.RaggedTensor.from_uniform_row_length(
            values, tf.constant(dim, dtype), validate=False
        )
    return tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)


def _ragged_leaf(leaf: Leaf, parsed: dict[str, Any]) -> tf.RaggedTensor:
    f = leaf.features
    rank = leaf.ragged_rank or 0
    inner = leaf.num_values
    values = _var_values(leaf, parsed[f["values"]])
    per_elem = [parsed[name] for name in f.get("row_lengths", [])]
    checks = []
    # Element row counts: len(row_lengths 1) for ragged_rank >= 1, else
    # values / inner size.
    if rank:
        counts = per_elem[0].row_lengths()
    else:
        counts = values.row_lengths() // inner
        checks.append(
            _assert_same(
                leaf, counts * inner, values.row_lengths(), f"a multiple of {inner} values"
            )
        )
    for j in range(rank):
        checks.append(
            _require(leaf, tf.reduce_all(per_elem[j].values >= 0), "expected row lengths >= 0")
        )
        total = tf.reduce_sum(per_elem[j], axis=1)
        if j + 1 < rank:
            checks.append(
                _assert_same(
                    leaf,
                    total,
                    per_elem[j + 1].row_lengths(),
                    "row lengths that add up to the rows inside them",
                )
            )
        else:
            checks.append(
                _assert_same(
                    leaf,
                    total * inner,
                    values.row_lengths(),
                    "row lengths that add up to the values",
                )
            )
    dims = list(leaf.shape)
    for d in range(rank + 1):
        if dims[d] is not None:
            got = per_elem[d - 1].values if d else counts
            checks.append(_assert_same(leaf, got, dims[d], f"dimension {d} of size {dims[d]}"))
    splits = tf.as_dtype(leaf.row_splits_dtype or "int64")
    # An explicit row count, not -1: inner shapes may hold no values ([None, None, 0]).
    rows = tf.reduce_sum(per_elem[-1].values) if rank else tf.reduce_sum(counts)
    with tf.control_dependencies(checks):
        rt = tf.reshape(
            values.values, tf.concat([[rows], tf.constant(leaf.inner_shape, tf.int64)], 0)
        )
    for j in range(rank, 0, -1):
        rt = _partition(rt, per_elem[j - 1].values, dims[j], splits)
    return _partition(rt, counts, dims[0], splits)


def decode_batch(leaves: tuple[Leaf, ...], parsed: dict[str, Any]) -> list[Any]:
    """Rebuilds batched leaves from ``tf.io.parse_example`` output.

    Fixed-shape dense and ragged leaves come back as their batched tensors;
    the others as components for :func:`join_element` after unbatching.
    """
    out: list[Any] = []
    for leaf in leaves:
        f = leaf.features
        if _zero_size(leaf):
            x = parsed[f["values"]]
            b = x.nrows() if isinstance(x, tf.RaggedTensor) else tf.shape(x, out_type=tf.int64)[0]
            out.append(tf.zeros([b], tf.int8))
        elif leaf.kind == "dense" and leaf.fixed:
            out.append(_fixed_values(leaf, parsed[f["values"]]))
        elif leaf.kind == "ragged":
            out.append(_ragged_leaf(leaf, parsed))
        elif leaf.kind == "dense":
            out.append((_var_values(leaf, parsed[f["values"]]), parsed[f["shape"]]))
        else:
            out.append(
                (_var_values(leaf, parsed[f["values"]]), parsed[f["indices"]], parsed[f["shape"]])
            )
    return out


def _check_shape(leaf: Leaf, shape: tf.Tensor) -> list[Any]:
    checks = [_require(leaf, tf.reduce_all(shape >= 0), "expected dimensions >= 0")]
    for i, d in enumerate(leaf.shape):
        if d is not None:
            checks.append(_assert_same(leaf, shape[i], d, f"dimension {i} of size {d}"))
    return checks


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


def join_element(leaves: tuple[Leaf, ...], comps: list[Any]) -> list[Any]:
    """Per element: rebuilds split leaves from their components."""
    out: list[Any] = []
    for leaf, comp in zip(leaves, comps, strict=True):
        if _zero_size(leaf):
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
                _assert_same(
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
            _assert_same(
                leaf, tf.size(indices, out_type=tf.int64), nnz * rank, f"{rank} indices per value"
            ),
        ]
        with tf.control_dependencies(checks):
            idx = tf.reshape(indices, [-1, rank])
        in_range = tf.reduce_all(tf.logical_and(idx >= 0, idx < shape[None, :]))
        check = _require(leaf, in_range, "expected indices inside the dense shape")
        with tf.control_dependencies([check]):
            sp = tf.sparse.SparseTensor(tf.identity(idx), values, shape)
        sp.set_shape(leaf.shape)
        out.append(sp)
    return out

"""Batches of records -> numpy, vectorized over the records' wire layout (TF-free).

:func:`superserial.codec.tf_encode.encode_batch` writes every record of a
dataset in one canonical wire form: one ``Features`` field holding one map
entry per feature, in header order (a leaf's values, then its extra
features), each entry ``key, Feature``, each ``Feature`` one list, each
numeric list one packed field. Records of such a dataset differ only in the
lengths (varints) and the payloads, so a batch of them is parsed in lockstep:
numpy reads the same field of every record at once (tags compared, varint
lengths decoded, nested lengths checked to add up exactly), and cuts the
payloads out of the joined bytes, instead of one protobuf parse per record.

Where every leaf is of a fixed shape and every record of a batch has the same
length, the records usually share one layout: the same bytes everywhere but
in the payloads. Record 0 is then parsed alone (once, while later batches
share its layout) into a template of where each payload lies; a batch whose
records all hold the template's bytes outside the payloads parses as record
0 did, field for field, so each payload is cut out as a column of the
records, with the value checks of the parse (varints, integer ranges). A
parse costs some 100 numpy calls whatever the batch's size; this, about 15
(mnist-shaped, 256 records: 43 us against 231, ``benchmarks/batch_decode.py``).
A batch that does not fit the template is parsed.

A batch is decoded here only if every record is in that canonical form and
every value passes the checks :mod:`superserial.codec.numpy_decode` makes (counts,
integer ranges, sizes). Anything else (a record written by another writer,
an unknown field, a corrupt or hostile record) makes :meth:`BatchDecoder.decode`
return None, and the caller decodes the batch with
:class:`superserial.codec.numpy_decode.RecordDecoder`, whose per-record parse gives
the values or the :class:`~superserial.errors.CorruptDataError` naming the
record and leaf. So this module never raises for bad data and never decides
a value the per-record parser would decide differently: the canonical form is
a strict subset of what protobuf parses, and on it both give the same values.

Leaves handled: dense leaves of fixed shape (every dtype), and ragged leaves
of ``ragged_rank`` 0 with numeric values; a header with any other leaf kind
is not handled (:attr:`BatchDecoder.supported` is False).
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from superserial.format.header import Header
from superserial.format.structure import Leaf
from superserial.format.wire import TAG_ENTRY_VALUE, TAG_FEATURE, TAG_VALUE, varint

__all__ = ["BatchDecoder"]

_LITTLE = sys.byteorder == "little"
_TAG_LIST = {kind: tag[0] for kind, tag in TAG_FEATURE.items()}
_VALUE = TAG_VALUE[0]  # the tag of every length-delimited field but the entry value
# Lengths of sub-messages: at most 5 varint bytes (records are < 2 GiB).
_MAX_LEN_BYTES = 5


class _Mismatch(Exception):
    """The batch is not in the canonical form (or a value fails a check): decode per record."""


class _Cursor:
    """One position per record in a padded uint8 buffer, advanced in lockstep."""

    def __init__(self, u8: np.ndarray, pos: np.ndarray) -> None:
        self.u8 = u8
        self.pos = pos

    def expect(self, const: bytes) -> None:
        """Checks that every record has ``const`` at its position, and steps over it."""
        k = len(const)
        if int(self.pos.max()) + k > len(self.u8):
            raise _Mismatch  # a length sent the cursor past the buffer
        if k == 1:
            ok = bool((self.u8[self.pos] == const[0]).all())
        else:
            got = self.u8[self.pos[:, None] + np.arange(k)]
            ok = bool((got == np.frombuffer(const, np.uint8)).all())
        if not ok:
            raise _Mismatch
        self.pos = self.pos + k

    def length(self) -> np.ndarray:
        """Reads one varint length per record (at most 5 bytes, below 2**31), as int64."""
        if int(self.pos.max()) >= len(self.u8):
            raise _Mismatch
        first: np.ndarray = self.u8[self.pos].astype(np.int64)
        if not (first >= 0x80).any():  # one byte each: the usual case
            self.pos = self.pos + 1
            return first
        if (first == first[0]).all() and (same := self._same_length()) is not None:
            return same
        # Clipped at the buffer's end: a varint cut there reads on into copies
        # of the last byte, and the lengths then fail to add up.
        g = self.u8[np.minimum(self.pos[:, None] + np.arange(_MAX_LEN_BYTES), len(self.u8) - 1)]
        more = g >= 0x80
        size = np.argmin(more, axis=1) + 1
        if more.all(axis=1).any():
            raise _Mismatch
        keep = np.arange(_MAX_LEN_BYTES) < size[:, None]
        value = ((g & 0x7F).astype(np.int64) << (7 * np.arange(_MAX_LEN_BYTES))) * keep
        out: np.ndarray = value.sum(axis=1)
        if (out >= 1 << 31).any():
            raise _Mismatch
        self.pos = self.pos + size
        return out

    def _same_length(self) -> np.ndarray | None:
        """Every record's length when all have record 0's varint bytes, else None.

        Fixed-shape leaves of 128 bytes or more give every record the same
        multi-byte lengths: one varint decoded in Python and a compare of the
        bytes after the first (which the caller compared) cost a fraction of
        the general decode below. None sends the caller there.
        """
        u8, p0 = self.u8, int(self.pos[0])
        value = size = 0
        while True:
            if size == _MAX_LEN_BYTES or p0 + size >= len(u8):
                return None
            byte = int(u8[p0 + size])
            value |= (byte & 0x7F) << (7 * size)
            size += 1
            if byte < 0x80:
                break
        if value >= 1 << 31 or int(self.pos.max()) + size > len(u8):
            return None
        tail = u8[self.pos[:, None] + np.arange(1, size)]
        if not (tail == u8[p0 + 1 : p0 + size]).all():
            return None
        self.pos = self.pos + size
        return np.full(len(self.pos), value, np.int64)

    def delimited(self, tag: int) -> np.ndarray:
        """Steps over ``tag`` and a length; returns where each field ends."""
        self.expect(bytes([tag]))
        n = self.length()
        end: np.ndarray = self.pos + n
        return end


def _rows(buf: bytes, u8: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray:
    """``[B, n]`` uint8: the ``n`` bytes at each of ``pos``, copied."""
    b = len(pos)
    if b == 0 or n == 0:
        return np.zeros((b, n), np.uint8)
    if b > 1:
        steps = np.diff(pos)
        step = int(steps[0])
        if step >= n and int(steps.min()) == int(steps.max()) == step:
            # Records of one size, packed: a strided view of the buffer.
            return as_strided(u8[int(pos[0]) :], (b, n), (step, 1)).copy()
    joined = b"".join([buf[p : p + n] for p in pos.tolist()])
    return np.frombuffer(joined, np.uint8).reshape(b, n).copy()


def _spans(u8: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The bytes ``[lo[i], hi[i])`` of every record, concatenated, as uint8."""
    lens = hi - lo
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.uint8)
    firsts = np.zeros(len(lo), np.int64)
    np.cumsum(lens[:-1], out=firsts[1:])
    idx = np.repeat(lo - firsts, lens) + np.arange(total)
    out: np.ndarray = u8[idx]
    return out


def _varints(stream: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed varints of each record's bytes (``lens[i]`` bytes each, concatenated).

    Returns:
        The int64 values (two's complement, as protobuf reads int64), and the
        count of values of each record.

    Raises:
        _Mismatch: A varint runs past its record's bytes or over 10 bytes,
            or its tenth byte holds more than the 64th bit.
    """
    last = stream < 0x80
    bounds = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=bounds[1:])
    nonempty = lens > 0
    if not last[bounds[1:][nonempty] - 1].all():
        raise _Mismatch  # a varint continues past the end of its record
    ends = np.zeros(len(stream) + 1, np.int64)
    np.cumsum(last, out=ends[1:])
    counts = np.diff(ends[bounds])
    if last.all():  # every value below 128: one byte each
        return stream.astype(np.int64), counts
    tails = np.flatnonzero(last)
    heads = np.zeros(len(tails), np.int64)
    heads[1:] = tails[:-1] + 1
    sizes = tails - heads + 1
    if int(sizes.max()) > 10 or (stream[tails[sizes == 10]] > 1).any():
        raise _Mismatch
    longest = int(sizes.max())
    # Padded so that byte k of every value can be read (0 past a value's end).
    low = np.zeros(len(stream) + longest, np.uint64)
    low[: len(stream)] = stream & 0x7F
    values = low[heads]
    for k in range(1, longest):  # byte k of the values that have one
        values |= np.where(sizes > k, low[heads + k], 0).astype(np.uint64) << np.uint64(7 * k)
    return values.view(np.int64), counts


class _Leaf:
    """The fast decoding of one leaf's values feature."""

    def __init__(self, leaf: Leaf) -> None:
        self.leaf = leaf
        self.kind = leaf.encoding
        self.dtype = leaf.entry.numpy
        self.itemsize = leaf.entry.itemsize if self.kind == "raw" else 4
        # What a raw or float payload's bytes are read as (little-endian).
        self.packed_dtype = self.dtype if self.kind == "raw" else np.dtype(np.float32)
        self.count = leaf.num_values if leaf.fixed else None
        self.shape = tuple(d for d in leaf.shape if d is not None) if leaf.fixed else ()
        self.inner = leaf.num_values
        self.inner_shape = leaf.inner_shape if leaf.kind == "ragged" else ()
        self.range = leaf.entry.int64_range
        key = leaf.features["values"].encode("utf-8")
        # An entry's key field and the tag of its value (a Feature).
        self.key = TAG_VALUE + varint(len(key)) + key + TAG_ENTRY_VALUE
        self.tag = _TAG_LIST[self.kind]

    @staticmethod
    def handles(leaf: Leaf) -> bool:
        if leaf.fixed:
            return True
        return (
            leaf.kind == "ragged"
            and not leaf.ragged_rank
            and leaf.encoding != "bytes"
            and leaf.num_values > 0
        )

    def _cast(self, x: np.ndarray) -> np.ndarray:
        if self.range is not None and x.size:
            lo, hi = self.range
            if x.min() < lo or x.max() > hi:
                raise _Mismatch
        return x.astype(self.dtype) if x.dtype != self.dtype else x

    def _from_le(self, raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
        out = raw.view(dtype)
        return out if _LITTLE else out.byteswap()

    def decode(
        self, c: _Cursor, buf: bytes, ends: np.ndarray, spans: list[tuple[int, int]] | None = None
    ) -> Any:
        """Reads the leaf's entry at the cursor (records end at ``ends``); returns its value.

        ``spans`` (of a batch of one record): the ``[lo, hi)`` in ``buf`` of each of
        the leaf's payloads (the bytes of its values) are appended to it.
        """
        c.expect(TAG_VALUE)
        entry_end = c.length() + c.pos
        if (entry_end > ends).any():
            raise _Mismatch
        c.expect(self.key)
        feature_end = c.length() + c.pos
        list_end = c.delimited(self.tag)
        if not ((list_end == feature_end).all() and (feature_end == entry_end).all()):
            raise _Mismatch
        if self.kind == "bytes":
            out = self._strings(c, buf, list_end, spans)
        elif self.kind == "int64":
            out = self._int64s(c, list_end, spans)
        else:
            out = self._packed(c, buf, list_end, spans)
        c.pos = list_end
        return out

    def _packed(
        self, c: _Cursor, buf: bytes, list_end: np.ndarray, spans: list[tuple[int, int]] | None
    ) -> Any:
        """raw (one bytes value) or float (one packed field): the payload's bytes."""
        end = c.delimited(_VALUE)
        if not (end == list_end).all():
            raise _Mismatch
        if spans is not None:
            spans.append((int(c.pos[0]), int(end[0])))
        n = self.count
        if n is not None:
            size = n * self.itemsize
            if not (end - c.pos == size).all():
                raise _Mismatch
            return self._dense(_rows(buf, c.u8, c.pos, size))
        lens = end - c.pos
        if (lens % (self.itemsize * self.inner)).any():
            raise _Mismatch
        flat = _spans(c.u8, c.pos, end)
        return self._split(self._from_le(flat, self.packed_dtype), lens // self.itemsize)

    def _int64s(self, c: _Cursor, list_end: np.ndarray, spans: list[tuple[int, int]] | None) -> Any:
        """An Int64List: empty, or one packed field."""
        empty = list_end == c.pos
        start, end = c.pos.copy(), list_end.copy()
        if not empty.all():
            sub = _Cursor(c.u8, c.pos[~empty])
            sub_end = sub.delimited(_VALUE)
            if not (sub_end == list_end[~empty]).all():
                raise _Mismatch
            start[~empty] = sub.pos
        else:
            end = start
        if spans is not None:
            spans.append((int(start[0]), int(end[0])))
        values, counts = _varints(_spans(c.u8, start, end), end - start)
        if self.count is not None:
            return self._fixed_ints(values, len(counts), counts)
        return self._split(self._cast(values), counts)

    def _strings(
        self, c: _Cursor, buf: bytes, list_end: np.ndarray, spans: list[tuple[int, int]] | None
    ) -> Any:
        """A BytesList of exactly ``count`` values (fixed leaves only)."""
        n, b = self.count, len(list_end)
        assert n is not None  # handles(): bytes leaves are fixed
        lo = np.empty((b, n), np.int64)
        hi = np.empty((b, n), np.int64)
        for j in range(n):
            hi[:, j] = c.delimited(_VALUE)
            lo[:, j] = c.pos
            c.pos = hi[:, j]
        if not (c.pos == list_end).all():
            raise _Mismatch
        if spans is not None:
            spans += zip(lo[0].tolist(), hi[0].tolist(), strict=True)
        return self._strings_at(buf, lo.ravel().tolist(), hi.ravel().tolist(), b)

    def _dense(self, rows: np.ndarray) -> np.ndarray:
        """A fixed raw or float leaf's values from each record's payload bytes, ``[B, size]``."""
        return self._from_le(rows, self.packed_dtype).reshape(len(rows), *self.shape)

    def _fixed_ints(
        self, values: np.ndarray, b: int, counts: np.ndarray | None = None
    ) -> np.ndarray:
        """A fixed int64 leaf's ``values`` of ``b`` records, ``counts[i]`` from record ``i``
        (None: ``count`` from each, known)."""
        if counts is not None and not (counts == self.count).all():
            raise _Mismatch
        return self._cast(values).reshape(b, *self.shape)

    def _strings_at(self, buf: bytes, lo: list[int], hi: list[int], b: int) -> np.ndarray:
        """A fixed bytes leaf's values ``buf[lo[i]:hi[i]]``, record by record, of ``b`` records."""
        out = np.empty(len(lo), object)
        out[:] = [buf[x:y] for x, y in zip(lo, hi, strict=True)]
        return out.reshape(b, *self.shape)

    def cut(
        self, buf: bytes, rows: np.ndarray, starts: np.ndarray, payloads: list[tuple[int, int]]
    ) -> Any:
        """The values of a fixed leaf of records at ``starts``, cut at a template's ``payloads``.

        ``rows[s]`` is the bytes of a record at ``s`` (see ``BatchDecoder._by_template``).
        """
        if self.kind == "bytes":
            lo = (starts[:, None] + np.array([a for a, _ in payloads], np.int64)).ravel()
            hi = (starts[:, None] + np.array([z for _, z in payloads], np.int64)).ravel()
            return self._strings_at(buf, lo.tolist(), hi.tolist(), len(starts))
        ((a, z),) = payloads
        cols = rows[starts, a:z]  # a copy: [B, z - a]
        if self.kind != "int64":
            return self._dense(cols)
        b, w = cols.shape
        if w == self.count and not (cols >= 0x80).any():  # one byte each: the usual case
            return self._fixed_ints(cols.astype(np.int64).ravel(), b)
        values, counts = _varints(cols.ravel(), np.full(b, w, np.int64))
        return self._fixed_ints(values, b, counts)

    def _split(self, values: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
        """Per record, its values as a ragged_rank 0 element: ``[n, *inner_shape]``."""
        if (counts % self.inner).any():
            raise _Mismatch
        dim0 = self.leaf.shape[0]
        rows = counts // self.inner
        if dim0 is not None and not (rows == dim0).all():
            raise _Mismatch
        flat = values.reshape(-1, *self.inner_shape)
        bounds = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(rows, out=bounds[1:])
        b = bounds.tolist()
        return [flat[x:y] for x, y in itertools.pairwise(b)]


class _Template(NamedTuple):
    """The layout of records of one length whose fields all sit at the same offsets.

    Records of fixed-shape leaves whose lengths (varints) are the same differ
    only in their payloads: a batch of them that has ``expected`` at the
    offsets ``layout`` (every byte outside the payloads) parses as the record
    the template was made from did, so each payload is a column of the records.
    """

    length: int
    layout: np.ndarray  # offsets in a record of every byte outside the payloads
    expected: np.ndarray  # those bytes, as in the record the template was made from
    payloads: list[list[tuple[int, int]]]  # per leaf, its payloads' [lo, hi) in a record


def _fits(t: _Template, u8: np.ndarray, starts: np.ndarray) -> bool:
    """Whether every record (at ``starts`` in ``u8``) has ``t``'s bytes outside the payloads."""
    # A flat gather: about 1.3x faster than indexing the rows by (starts, layout).
    return bool((u8[starts[:, None] + t.layout] == t.expected).all())


class BatchDecoder:
    """Decodes batches of canonical records of a dataset, vectorized.

    Args:
        header: The dataset's header. Only its leaves are expected in a
            record: a header pruned by ``select=`` (whose records hold more
            features) makes every batch fall back.
        templates: Cut batches of records of one layout by a template (see the
            module docstring); False parses every batch field by field (the
            same values: for comparison).
    """

    def __init__(self, header: Header, *, templates: bool = True) -> None:
        self.supported = all(_Leaf.handles(leaf) for leaf in header.leaves)
        self._leaves = [_Leaf(leaf) for leaf in header.leaves] if self.supported else []
        # Fixed-shape leaves only: records of other leaves differ in their layouts.
        self._fixed = (
            templates and self.supported and all(leaf.count is not None for leaf in self._leaves)
        )
        # The last layout seen: one assignment, so threads sharing the decoder see
        # either template whole (each is checked against the batch before use).
        self._template: _Template | None = None

    def decode(self, buf: bytes, starts: np.ndarray, ends: np.ndarray) -> list[Any] | None:
        """The flat leaves of the records ``buf[starts[i]:ends[i]]``, as ``RecordDecoder.decode``.

        Returns:
            Fixed-shape dense leaves as ``[B, *shape]`` arrays, ragged ones as
            lists of B arrays, in header order; or None if a record is not in
            the canonical form or a value fails a check (decode the batch per
            record then, which names what is wrong).
        """
        if not self.supported or not len(starts):
            return None
        u8 = np.frombuffer(buf, np.uint8)
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        try:
            if self._fixed and len(starts) > 1:
                out = self._by_template(buf, u8, starts, ends)
                if out is not None:
                    return out
            return self._parse(buf, u8, starts, ends)
        except _Mismatch:
            return None

    def _parse(
        self,
        buf: bytes,
        u8: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        spans: list[tuple[int, int]] | None = None,
    ) -> list[Any]:
        """Every record parsed field by field, in lockstep (raises :class:`_Mismatch`)."""
        c = _Cursor(u8, starts)
        if not (c.delimited(_VALUE) == ends).all():
            raise _Mismatch
        out = [leaf.decode(c, buf, ends, spans) for leaf in self._leaves]
        if not (c.pos == ends).all():
            raise _Mismatch
        return out

    def _by_template(
        self, buf: bytes, u8: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> list[Any] | None:
        """The batch cut by a :class:`_Template`, or None where its records do not share one.

        Raises :class:`_Mismatch` for a payload the parse would refuse (an int64
        out of range, a bad varint), as the parse would.
        """
        length = int(ends[0] - starts[0])
        if not ((ends - starts) == length).all() or starts.min() < 0 or ends.max() > len(u8):
            return None
        # Row r of ``rows`` is the ``length`` bytes from offset r: a record at any start.
        rows = as_strided(u8, (len(u8) - length + 1, length), (u8.strides[0], u8.strides[0]))
        t = self._template
        if t is None or t.length != length or not _fits(t, u8, starts):
            t = self._template = self._made(buf, u8, int(starts[0]), length)
            if t is None or not _fits(t, u8, starts):
                return None
        return [
            leaf.cut(buf, rows, starts, payloads)
            for leaf, payloads in zip(self._leaves, t.payloads, strict=True)
        ]

    def _made(self, buf: bytes, u8: np.ndarray, start: int, length: int) -> _Template | None:
        """The template of the record at ``start``, from its parse; None if it is not canonical."""
        spans: list[tuple[int, int]] = []
        try:
            self._parse(buf, u8, np.array([start]), np.array([start + length]), spans)
        except _Mismatch:
            return None
        mask = np.ones(length, bool)
        payloads: list[list[tuple[int, int]]] = []
        it = iter(spans)
        for leaf in self._leaves:
            k = int(leaf.count or 0) if leaf.kind == "bytes" else 1
            mine = [(lo - start, hi - start) for lo, hi in itertools.islice(it, k)]
            for lo, hi in mine:
                mask[lo:hi] = False
            payloads.append(mine)
        layout = np.flatnonzero(mask)
        return _Template(length, layout, u8[start + layout].copy(), payloads)

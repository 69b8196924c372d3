"""Reads superserial datasets into numpy arrays, without TensorFlow.

    import superserial.numpy as ssnp

    for element in ssnp.load("/data/digits"):              # one element at a time
        image, label = element["image"], element["label"]  # np.uint8[28, 28], np.int64[]
    for batch in ssnp.iter_batches("/data/digits", 256):   # stacked [256, ...] arrays
        ...
    ds = ssnp.load("/data/digits")                         # random access, by the index
    ds[7], ds[-1], ds[10:20], ds.get_batch([5, 3, 5])

Framing (both CRCs; uncompressed, GZIP or ZLIB) is read by
:mod:`superserial.format.framing`, ``tf.train.Example`` parsed by
:mod:`superserial.format.wire` and decoded by :mod:`superserial.codec.numpy_decode`:
no TensorFlow needed, and it works beside it. What it reads is checked against the
header as :func:`superserial.load` checks it: a disagreement is a
:class:`~superserial.errors.CorruptDataError` naming the file, record and leaf. Paths
are local or any URL :mod:`superserial.storage.fs` reaches.

How leaves come out (the structure, dicts, tuples and namedtuples, rebuilt from the header;
namedtuple classes made with ``collections.namedtuple``); arrays are fresh and writable:

* dense: an ``np.ndarray`` of the leaf's dtype and the element's shape; scalars are
  0-d arrays, never numpy scalars. Strings are ``object`` arrays holding ``bytes``;
  bfloat16 is ``ml_dtypes.bfloat16``. Ragged with ``ragged_rank`` 0 too, as
  TensorFlow yields a dense tensor for it.
* ragged with ``ragged_rank`` >= 1: a :class:`Ragged` (``flat_values`` and
  ``nested_row_splits``, as ``tf.RaggedTensor`` holds them).
* sparse: a :class:`Sparse` (``indices``, ``values``, ``dense_shape``).

Random access (``ds[i]``, ``ds[a:b:c]``, ``ds.get_batch(indices)``) reads only the records
asked for, through each shard's record index (:mod:`superserial.read.random_access`). A
dataset object is safe to share between threads and to pickle into worker processes.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from superserial.codec.numpy_batch_decode import BatchDecoder
from superserial.codec.numpy_decode import Ragged, RecordDecoder, Sparse
from superserial.errors import CorruptDataError
from superserial.format.framing import range_records, read_records, shard_records
from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, Node, pack
from superserial.read import blocks, readahead
from superserial.read.cache import pins
from superserial.read.cache.directory import Lease
from superserial.read.cache.stream import Stream
from superserial.read.conversions import Conversions
from superserial.read.opening import OpenedDataset, open_dataset
from superserial.read.random_access import RecordReader, check_indices
from superserial.storage import fs

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

# Records decoded together: iterating elements, at most _CHUNK and about
# _CHUNK_BYTES of them (records over _LARGE bytes one by one); batches(), whole
# batches in about _CHUNK_BYTES (the cost per chunk, some 70 numpy calls, was most
# of a batch's; 1 MiB beat 4 MiB there: docs/performance.md, "Smaller chunks").
_CHUNK = 256
_CHUNK_BYTES = 1 << 20
_LARGE = 16 << 10
_Chunk = tuple[list[Any] | None, Iterator[tuple[bytes, str]]]  # leaves, or None and the records
# Chunks the fast decoder may decline in a row, from the start, before it is no longer tried.
_GIVE_UP = 4


def _then_raise(pairs: list[tuple[bytes, str]], error: Exception) -> Iterator[tuple[bytes, str]]:
    yield from pairs
    raise error


def _slices(buffer: bytes, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    return [buffer[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def _packer(node: Node) -> Any:
    """A function packing flat leaves into ``node``'s structure; fast for flat dicts."""
    if isinstance(node, Leaf):
        return lambda flat: flat[0]
    if isinstance(node, DictNode) and all(isinstance(v, Leaf) for v in node.items.values()):
        keys = sorted(node.items)
        return lambda flat: dict(zip(keys, flat, strict=True))
    return lambda flat: pack(node, flat)


def _batch_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected batch_size >= 1, got {value!r}")
    return value


class NumpyDataset(Conversions):
    """The elements of a saved dataset (or of some of its shards) as numpy values.

    Iterable any number of times, in the saved order; ``len()`` is the
    element count from the header. Made by :func:`load`. Indexable:
    ``ds[i]`` (negative ``i`` from the end), ``ds[a:b:c]`` (a list of
    elements), :meth:`get_batch` and :meth:`get_elements` read only the
    records asked for (see :mod:`superserial.read.random_access`).

    Attributes:
        path: The dataset directory or URL (with ``load(cache_dir=...)``, the
            cache's local copy).
        header: The dataset's header (its structure pruned by ``select=``:
            the leaves read).
        files: The shard files read, in order.
        counts: The number of records read from each of ``files``.
        starts: The index of the first record read from each of ``files``:
            ``counts[i]`` records are read from record ``starts[i]`` on, which
            splits a shard between readers. All 0 (whole shards) by default;
            other starts find their record by walking the framing of an
            uncompressed shard (about 12 bytes read per record skipped), and
            in a compressed one by its index, inflating from the restart block
            that holds the record.
        cache_lease: With ``load(cache_dir=...)``, what keeps the cached
            copies of ``files`` (until this dataset is garbage collected);
            else None.
        cache_stream: With ``load(cache_dir=..., cache_limit=...)`` when the
            shards do not all fit the limit: the
            :class:`~superserial.read.cache.stream.Stream` each pass over
            the elements fetches them through (``files`` are then remote);
            else None.
        cache_pins: When the shards do not all fit the limit and are read by
            position: the :class:`~superserial.read.cache.pins.Pins` that hold
            as many whole shards as fit locally (made by the first random
            access of a streamed dataset, or by a random-access reader's
            opening); the other shards are read remotely. Else None.

    Raises:
        ValueError: Lists of different lengths.
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
        self.path, self.header, self.files, self.counts = path, header, files, counts
        self.starts = [0] * len(files) if starts is None else list(starts)
        if not len(files) == len(counts) == len(self.starts):
            raise ValueError(
                f"expected as many counts and starts as files ({len(files)}), "
                f"got {len(counts)} and {len(self.starts)}"
            )
        self._decoder = RecordDecoder(header)
        self._fast = BatchDecoder(header)
        self._packer = _packer(header.structure)
        self._lock = threading.Lock()
        self._reader: RecordReader | None = None
        self._len = sum(self.counts)
        # get_batch's batches the fast decoder took and declined (no lock: a count off by
        # one between threads only moves when it stops trying).
        self._batch_hits = self._batch_misses = 0
        # Keeps the cached copies of ``files`` while this dataset lives (load's cache_dir).
        self.cache_lease: Lease | None = None
        # Fetches ``files`` (remote) through the cache as they are read (load's cache_limit).
        self.cache_stream: Stream | None = None
        # Pins what fits of ``files`` (remote) for random access (load's cache_limit).
        self.cache_pins: pins.Pins | None = None

    @classmethod
    def from_opened(cls, opened: OpenedDataset) -> NumpyDataset:
        """The dataset of the shards :func:`~superserial.read.opening.open_dataset` picked.

        Whole shards, read from where they were opened (the cache view for a
        cached URL), decoded as the selected header says; it keeps the
        cache lease of their files.
        """
        ds = cls(opened.root, opened.selected, list(opened.files), list(opened.counts))
        ds.cache_lease = opened.lease
        ds.cache_stream = opened.stream
        ds.cache_pins = opened.pins
        return ds

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Rebuilt in the process that unpickles: decoders and locks do not travel.
        for k in ("_decoder", "_fast", "_packer", "_lock"):
            del state[k]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decoder = RecordDecoder(self.header)
        self._fast = BatchDecoder(self.header)
        self._packer = _packer(self.header.structure)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._len

    @property
    def records(self) -> RecordReader:
        """The :class:`~superserial.read.random_access.RecordReader` behind random access.

        The first one of a dataset streamed through a cache smaller than
        its shards starts pinning what fits (:mod:`superserial.read.cache.pins`).

        Raises:
            UnsupportedError: A shard has no index.
        """
        reader = self._reader
        if reader is None:
            with self._lock:
                if self._reader is None:
                    by_name = {s.file: s for s in self.header.shards}
                    shards = [by_name[fs.basename(f)] for f in self.files]
                    stream = self.cache_stream
                    if self.cache_pins is None and stream is not None:
                        planned = pins.plan(
                            stream.path,
                            stream.header,
                            stream.shards,
                            stream.cache_dir,
                            stream.limit,
                        )
                        self.cache_pins = None if planned is None else planned.start()
                    held = self.cache_pins
                    self._reader = RecordReader(
                        self.path,
                        self.header,
                        shards,
                        self.starts,
                        self.counts,
                        local=None if held is None else held.local,
                    )
                reader = self._reader
        return reader

    def __getitem__(self, key: int | slice) -> Any:
        """Element ``key`` (negative from the end), or a list of elements for a slice.

        Raises:
            IndexError: ``key`` is out of range.
            UnsupportedError: A shard has no index.
            CorruptDataError: The record or its shard's index is damaged.
        """
        if isinstance(key, slice):
            return self.get_elements(range(self._len)[key])
        try:
            i = operator.index(key)
        except TypeError:
            raise TypeError(
                f"expected an integer or a slice as index, got {type(key).__name__}"
            ) from None
        n = self._len
        if not -n <= i < n:
            raise IndexError(f"expected an index in [-{n}, {n}), got {i}")
        record, where = self.records.read(i + n if i < 0 else i)
        return self._packer(self._decoder.element(record, where))

    def get_elements(self, indices: Sequence[int] | Any) -> list[Any]:
        """The elements at ``indices``, in that order, as a list (duplicates allowed).

        The records are read together (see :meth:`get_batch`), each element
        decoded on its own.
        """
        return self.decode(*self.records.read_many(check_indices(indices, self._len)))

    def decode(self, records: Sequence[bytes], wheres: Sequence[str]) -> list[Any]:
        """The elements of serialized ``records`` of this dataset (found at ``wheres``, for errors)."""
        packer, element = self._packer, self._decoder.element
        return [packer(element(r, w)) for r, w in zip(records, wheres, strict=True)]

    def get_batch(self, indices: Sequence[int] | Any) -> Any:
        """The elements at ``indices`` as one batch, in the layout :meth:`batches` yields.

        Fixed-shape dense leaves come stacked ``[len(indices), ...]``, every
        other leaf as a list. Order as given, duplicates allowed; the records
        are read in file order, neighbours with one range read.

        Raises:
            IndexError: An index is out of range.
            UnsupportedError: A shard has no index.
            CorruptDataError: A record or a shard's index is damaged.
        """
        checked = check_indices(indices, self._len)
        return self.decode_packed(*self.records.read_packed(checked), checked)

    def decode_packed(
        self, buffer: bytes, starts: np.ndarray, lengths: np.ndarray, indices: np.ndarray
    ) -> Any:
        """Records ``buffer[starts[i] : starts[i] + lengths[i]]`` (elements ``indices[i]``) as
        one batch (:meth:`get_batch`'s layout): vectorized (1.5x the per-record parse on
        mnist), or, where the fast decoder declines, record by record, naming what is wrong."""
        if len(indices) and self._fast.supported and not self._batch_given_up():
            leaves = self._fast.decode(buffer, starts, starts + lengths)
            if leaves is not None:
                self._batch_hits += 1
                return self._packer(leaves)
            self._batch_misses += 1
        view, where, ends = memoryview(buffer), self.records.where, (starts + lengths).tolist()
        records = [bytes(view[a:b]) for a, b in zip(starts.tolist(), ends, strict=True)]
        return self._batch(records, [where(i) for i in np.asarray(indices).tolist()])

    def _batch_given_up(self) -> bool:
        """Whether the fast decoder declined get_batch's first batches and no other (as _chunks)."""
        return self._batch_misses >= _GIVE_UP and not self._batch_hits

    def __repr__(self) -> str:
        return f"NumpyDataset({self.path!r}, {len(self)} elements in {len(self.files)} shard(s))"

    def _records(self, ahead: bool = True) -> Iterator[tuple[bytes, str]]:
        """The records in order; remote ones requested ahead unless ``ahead`` is False."""
        shards = {s.file: s for s in self.header.shards}
        files: Iterable[str] = self.files
        comp = self.header.compression
        if (held := self.cache_pins) is not None:
            # Pinned shards from their copies, the others remotely: a stream beside
            # the pins would find no room in the limit they fill.
            files = [held.local(fs.basename(f)) or f for f in self.files]
        elif self.cache_stream is not None:
            spans = readahead.spans(self.path, self.header, self.files, self.counts, self.starts)
            if spans is None:  # read-ahead off: each path fetched ahead, dropped once read past
                files = self.cache_stream.files()
            else:
                # Read ahead as without a cache; the cache keeps copies of what is read.
                tee = self.cache_stream.tee()
                try:
                    spans = [
                        s._replace(file=tee.local(fs.basename(s.file)) or s.file) for s in spans
                    ]
                    yield from readahead.records(spans, comp, on_block=tee.feed)
                finally:
                    tee.close()
                return
        elif ahead:
            spans = readahead.spans(self.path, self.header, self.files, self.counts, self.starts)
            if spans is not None:
                yield from readahead.records(spans, self.header.compression)
                return
        for file, count, start in zip(files, self.counts, self.starts, strict=True):
            shard = shards.get(fs.basename(file))
            total = None if shard is None else shard.records
            if start == 0 and (count == total or total is None):
                yield from shard_records(file, comp, count)
            elif count and comp and shard is not None:
                yield from blocks.range_records(self.path, shard, file, start, count, comp)
            elif count:
                yield from range_records(file, start, count, total)

    def __iter__(self) -> Iterator[Any]:
        packer, element = self._packer, self._decoder.element
        size = self.header.total_bytes // max(self.header.element_count, 1)
        # Small records are decoded a chunk at a time (vectorized) and handed
        # out one by one. Large ones are not: parsing is a small part of their
        # cost, and in a DataLoader worker, elements viewing chunk buffers
        # (turned into tensors, stacked, sent) fragment glibc's heap, which
        # grew to the size of the data read (64 KiB records: 1.1 GB, not 0.4).
        if self._fast.supported and size <= _LARGE:
            for leaves, records in self._chunks(max(1, min(_CHUNK, _CHUNK_BYTES // max(size, 1)))):
                if leaves is None:  # a chunk the fast decoder left: per record, lazily
                    for record, where in records:
                        yield packer(element(record, where))
                    continue
                for i in range(len(leaves[0]) if leaves else 0):
                    yield packer([v[i, ...] if isinstance(v, np.ndarray) else v[i] for v in leaves])
            return
        for record, where in self._records():
            yield packer(element(record, where))

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
        if self._fast.supported:
            most = batch_size * readahead.whole_batches(self.header, batch_size, _CHUNK_BYTES)
            for leaves, pairs in self._chunks(batch_size, most):
                # Declined: per record, a batch at a time (batches before a damage come first).
                while leaves is None and (got := list(itertools.islice(pairs, batch_size))):
                    if drop_remainder and len(got) < batch_size:
                        return
                    yield self._batch([r for r, _ in got], [w for _, w in got])
                for a in range(0, 0 if leaves is None else len(leaves[0]), batch_size):
                    part = [v[a : a + batch_size] for v in leaves or ()]
                    if drop_remainder and len(part[0]) < batch_size:
                        return
                    # Copies, not views: a batch owns its memory, not the whole chunk's.
                    yield self._packer([p.copy() if isinstance(p, np.ndarray) else p for p in part])
            return
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

    def _spannable(self) -> bool:
        """Whether records can be read a chunk at a time through the shards' indexes."""
        return readahead.indexed(self.header, self.files) and (
            fs.is_local(self.path) or (bool(self.files) and readahead.applies(self.files[0]))
        )

    def _records_between(self, a: int, b: int) -> Iterator[tuple[bytes, str]]:
        """Records ``a .. b-1`` streamed (framing read record by record, as ``_records``)."""
        totals = {s.file: s.records for s in self.header.shards}
        begin = 0
        for file, count, start in zip(self.files, self.counts, self.starts, strict=True):
            lo, hi = max(a, begin), min(b, begin + count)
            if lo < hi:
                yield from range_records(
                    file, start + lo - begin, hi - lo, totals.get(fs.basename(file))
                )
            begin += count

    def _chunks(self, size: int, most: int | None = None) -> Iterator[_Chunk]:
        """Chunks of ``size`` records, in order: ``(leaves, records)``.

        With ``most``, chunks read by the shards' indexes grow from ``size`` to
        ``most`` records (:func:`superserial.read.readahead.steps`).

        ``leaves`` are the chunk's flat leaves decoded by the vectorized
        :class:`~superserial.codec.numpy_batch_decode.BatchDecoder`, or None where it
        declines a chunk (records not in its form, a value failing a check,
        damaged framing): then ``records`` yields the chunk's ``(record,
        where)`` pairs read record by record, for :class:`RecordDecoder` to
        decode or name what is wrong, exactly as without the fast path.
        """
        n = self._len
        hits = misses = 0

        def decode(buffer: bytes, starts: np.ndarray, ends: np.ndarray) -> list[Any] | None:
            # Records of another writer (``superserial infer``) or a ``select=``
            # header never fit: after a few chunks declined, and none taken, stop trying.
            nonlocal hits, misses
            if misses >= _GIVE_UP and not hits:
                return None
            leaves = self._fast.decode(buffer, starts, ends)
            hits, misses = (hits, misses + 1) if leaves is None else (hits + 1, misses)
            return leaves

        if self._spannable():
            stream, tee = self.cache_stream, None
            if stream is None or fs.is_local(self.path):
                reader = self.records
            else:
                # Read ahead as without a cache; the cache keeps copies of what is read
                # (and the shards it holds are read from it). Not self.records: random
                # access of a streamed dataset pins shards, which a pass must not.
                tee = stream.tee()
                by_name = {s.file: s for s in self.header.shards}
                shards = [by_name[fs.basename(f)] for f in self.files]
                reader = RecordReader(self.path, self.header, shards, self.starts, self.counts)
            extents = reader.extents()
            if tee is not None:
                extents = [(tee.local(fs.basename(f)) or f, lo, hi) for f, lo, hi in extents]
            # Remote: the shards' bytes come through requests in flight ahead.
            ahead = (
                None
                if fs.is_local(self.path)
                else readahead.Stream(extents, on_block=None if tee is None else tee.feed)
            )
            take = None if ahead is None else ahead.take
            reader.open_all()
            try:
                for a, b in readahead.steps(n, size, most or size):
                    try:
                        buffer, starts, ends = reader.read_span(a, b, take)
                    except CorruptDataError:
                        if ahead is not None and ahead.error is not None:
                            raise  # the pass failed (a cached copy's check): no record to blame
                        yield None, self._records_between(a, b)
                        continue
                    leaves = decode(buffer, starts, ends)
                    if leaves is None:
                        wheres = [reader.where(i) for i in range(a, b)]
                        yield None, iter(zip(_slices(buffer, starts, ends), wheres, strict=True))
                    else:
                        yield leaves, iter(())
            finally:
                if ahead is not None:
                    ahead.close()
                if tee is not None:
                    tee.close()
            return
        records = self._records()
        while True:
            chunk: list[tuple[bytes, str]] = []
            try:
                chunk.extend(itertools.islice(records, size))
            except CorruptDataError as e:
                # The records before the damaged one still come, one by one, as
                # from _records; then the error.
                yield None, _then_raise(chunk, e)
                return
            if not chunk:
                return
            lengths = np.fromiter((len(r) for r, _ in chunk), np.int64, len(chunk))
            ends = np.cumsum(lengths)
            leaves = decode(b"".join(r for r, _ in chunk), ends - lengths, ends)
            yield leaves, iter(chunk if leaves is None else ())

    def _batch(self, records: list[bytes], wheres: list[str]) -> Any:
        return pack(self.header.structure, self._decoder.decode(records, wheres))


def load(
    path: str | os.PathLike[str],
    *,
    shard: tuple[int, int] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    select: Iterable[str] | None = None,
) -> NumpyDataset:
    """Opens a dataset saved by :func:`superserial.save`, for reading as numpy values.

    Args:
        path: The dataset directory: a local path, or a URL
            (``memory://``, ``gs://``...; through ``fsspec`` when installed).
        shard: ``(i, n)``: read only shard files ``i, i+n, i+2n, ...``, as
            :func:`superserial.load` does (and warns as it does when there
            are fewer shard files than ``n``).
        cache_dir: For a URL: fetch the shards read into this local cache
            directory first (once; checked against the header's CRC-32C),
            and read them there, as :func:`superserial.load` does. Ignored
            for local paths.
        cache_limit: The most bytes ``cache_dir`` keeps: an int, or a string
            such as ``"20GB"`` or ``"500MiB"``; None: no bound. Shards that
            do not all fit are streamed: each pass over the elements fetches
            them ahead in order and lets go of each once read (see
            :mod:`superserial.read.cache.stream`); random access then raises
            ``ValueError``.
        select: Read only these leaves (names as ``superserial inspect``
            prints them, or inner nodes), as :func:`superserial.load` takes
            it: the structure is pruned to them and only they are decoded.

    Returns:
        A :class:`NumpyDataset`: iterate it for elements, or call its
        ``batches(batch_size)``.

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        HeaderError: The header is malformed or of an unknown version.
        CorruptDataError: Shard files are missing or of the wrong size (found
            here), or their records disagree with the header (found while
            reading).
        ValueError: ``select`` names no leaf of the dataset (the message
            lists them), a bad ``cache_limit``, or one shard larger than it.
    """
    opened = open_dataset(
        path, select=select, shard=shard, cache_dir=cache_dir, cache_limit=cache_limit, stream=True
    )
    log.debug("numpy reader: %s, %d shard(s)", opened.path, len(opened.files))
    return NumpyDataset.from_opened(opened)


def iter_batches(
    path: str | os.PathLike[str],
    batch_size: int,
    *,
    drop_remainder: bool = False,
    shard: tuple[int, int] | None = None,
    select: Iterable[str] | None = None,
) -> Iterator[Any]:
    """Yields batches of a saved dataset: ``load(path, shard=shard, select=select).batches(...)``.

    Fixed-shape dense leaves come as stacked ``[B, *shape]`` arrays; every
    other leaf as a list of its B per-element values. See
    :meth:`NumpyDataset.batches`.
    """
    _batch_size(batch_size)
    return load(path, shard=shard, select=select).batches(batch_size, drop_remainder=drop_remainder)

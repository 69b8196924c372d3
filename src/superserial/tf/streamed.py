"""Shard records read through :mod:`superserial.storage.fs` into tf.data, where TensorFlow cannot.

``tf.data.TFRecordDataset`` reads only what TensorFlow's filesystems reach;
TensorFlow 2.21 has no ``s3://``. For such paths (those :mod:`superserial.storage.fs`
serves with fsspec), :func:`shard_batches` streams each shard through the
filesystem layer, checks its framing and record count with
:mod:`superserial.format.framing` (as ``TFRecordDataset`` and ``assert_cardinality``
would), and hands the records to the graph in batches. Memory stays bounded:
one read block (8 MiB) of the open shard, and a few batches read ahead.
:func:`files_batches` reads every shard in order through one read-ahead
stream (:mod:`superserial.read.readahead`): range requests in flight across
shard boundaries, within ``SUPERSERIAL_READ_AHEAD`` (64 MiB), for ``load``
without ``shuffle_files``; with it, :func:`shard_batches` reads each shard
ahead the same way, within the shard. Where TensorFlow's own filesystems reach the path
(``gs://`` with TensorFlow's GCS client, ``hdfs://``), ``TFRecordDataset``
reads it with TensorFlow's own buffering, and none of this applies.

Uncompressed shards with indexes are cut a chunk at a time, as the numpy
reader cuts them: :meth:`~superserial.read.random_access.RecordReader.read_span`
checks a chunk's records together over the read-ahead stream and gives one
buffer and the records' offsets, which the graph slices with one
``tf.strings.substr``; Python then runs per chunk, not per record (but for
each record's data CRC). A chunk holds whole batches (up to about 4 MiB, the
first ones smaller for an early first batch), rebatched in the graph: each
element ``from_generator`` gives costs about a millisecond. Where that read
raises, the chunk and the rest are read record by record as elsewhere, so
records and errors are exactly those. Where every leaf is dense of a fixed
shape, the chunks come decoded by the numpy decoder (:mod:`superserial.tf.decoded`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from superserial.codec import tf_generator
from superserial.codec.tf_spec import pack
from superserial.errors import CorruptDataError
from superserial.format import framing
from superserial.format.header import Header
from superserial.read import readahead
from superserial.read.cache.stream import Stream
from superserial.read.random_access import RecordReader
from superserial.storage import fs
from superserial.tf import decoded as numpy_decoded

__all__ = ["decoder", "files_batches", "reads_ahead", "shard_batches"]

# Batches read ahead of the parser per open shard: network reads overlap
# parsing, and memory stays a few batches.
_READ_AHEAD = 2
# files_batches reads ahead up to this many batches, as their bytes allow: the
# parser then waits less on Python's turns at the GIL (an mnist epoch over
# http +50 ms, 114-127k el/s with 2, 152k with 8), and memory stays bounded.
_MOST_AHEAD = 8
_AHEAD_BYTES = 16 << 20
# files_batches hands records from Python to the graph in chunks of about this
# many bytes (whole batches; the first chunks one batch, doubling, for an early
# first batch), cut and rebatched in the graph: each element from_generator
# gives costs about a millisecond in TF 2.21, as much as the reads and checks
# of a 256-record batch, so one element per batch halved an epoch's rate.
_CHUNK_BYTES = 4 << 20
# Bytes one request fetches from the object store: large enough that a
# request's latency (tens of ms on S3) costs little next to its transfer.
_BLOCK = 8 << 20


def _removed(file: str) -> CorruptDataError:
    # Listed when the dataset was loaded: an overwrite removed it since.
    return CorruptDataError(
        f"expected shard {file}, found no file (removed while loading: was the dataset "
        "overwritten?)"
    )


def _records(file: str, compression: str | None, expected: int | None) -> Iterator[bytes]:
    try:
        if expected is None:
            yield from framing.read_records(file, compression, buffering=_BLOCK)
            return
        for record, _ in framing.shard_records(file, compression, expected, buffering=_BLOCK):
            yield record
    except FileNotFoundError as e:
        raise _removed(file) from e


def reads_ahead(file: str) -> bool:
    """Whether :func:`files_batches` reads ``file`` ahead (a remote file it serves)."""
    return readahead.applies(file)


def decoder(header: Header, files: list[str]) -> numpy_decoded.ChunkDecoder | None:
    """The decoder :func:`files_batches` can give ``files``' elements decoded with, or None:
    uncompressed shards with indexes, of leaves :func:`superserial.tf.decoded.decoder` serves."""
    if not files or not readahead.indexed(header, files):
        return None
    return numpy_decoded.decoder(header)


def files_batches(
    header: Header,
    files: list[str],
    *,
    per_batch: int,
    stream: Stream | None = None,
    decoder: numpy_decoded.ChunkDecoder | None = None,
) -> tf.data.Dataset:
    """The records of whole shards, in order, as tf.string vectors of ``per_batch``.

    With a ``decoder`` (from :func:`decoder`), the elements instead, in chunks of
    whole batches of ``per_batch`` (the last may be short), each a batch of the
    header's structure: decoded as they are read by the numpy decoder, whose
    chunks cost a fraction of ``tf.io.parse_example``'s CPU (records it
    declines are decoded one by one, naming the record a value of which is wrong).

    Read as :func:`shard_batches` reads one shard, checked alike, but with
    range requests in flight ahead of the reader across the shards'
    boundaries (:mod:`superserial.read.readahead`); shard by shard where
    read-ahead does not apply. Uncompressed shards with indexes are cut a
    chunk of whole batches at a time (about ``_CHUNK_BYTES``; see the module
    docstring) and rebatched in the graph.
    With ``stream`` (the shards streamed through a
    cache), each iteration is a :meth:`~superserial.read.cache.stream.Stream.tee`
    pass: the shards the cache holds are read from it, and copies of the others
    are kept as they are read. Errors surface as the dataset is iterated.
    """
    counts = {s.file: s.records for s in header.shards}
    per_file = [counts[fs.basename(f)] for f in files]
    ahead = _batches_ahead(header, per_batch)
    compression = header.compression or None
    root = files[0].rpartition("/")[0] if files else ""

    def plain() -> Iterator[bytes]:
        # Read-ahead off or not served: shard by shard, as a plain read.
        return itertools.chain.from_iterable(
            _records(f, compression, n) for f, n in zip(files, per_file, strict=True)
        )

    # Uncompressed, indexed shards are cut a chunk at a time (the module docstring).
    spannable = bool(files) and readahead.indexed(header, files)
    chunk = _chunk_records(header, per_batch)

    def generate() -> Iterator[Any]:
        # Decided per pass: SUPERSERIAL_READ_AHEAD is read when a pass starts.
        spans = readahead.spans(root, header, files, per_file, [0] * len(files))
        if spans is None:
            batches = _batches(plain(), per_batch)
            yield from map(_packed, batches) if spannable else batches
            return
        tee = None if stream is None else stream.tee()
        try:
            if tee is not None:
                spans = [s._replace(file=tee.local(fs.basename(s.file)) or s.file) for s in spans]
            feed = None if tee is None else tee.feed
            if spannable:
                yield from _span_batches(root, header, spans, per_batch, feed, most=chunk)
            else:
                read = readahead.records(spans, compression, missing=_removed, on_block=feed)
                yield from _batches((r for r, _ in read), per_batch)
        finally:
            if tee is not None:
                tee.close()

    if decoder is not None:
        if not spannable:
            raise ValueError("internal: a decoder for shards that are not cut in chunks")
        structure, dec = header.structure, decoder
        return (
            tf_generator.from_generator(
                lambda: _decoded(generate(), dec, files, per_file),
                output_signature=dec.batched(None),
            )
            .prefetch(2)  # the next chunk decoded while this one is rebatched
            .map(tf.autograph.experimental.do_not_convert(lambda *xs: pack(structure, list(xs))))
        )
    if not spannable:
        return tf_generator.from_generator(
            generate, output_signature=tf.TensorSpec([None], tf.string)
        ).prefetch(ahead)

    @tf.autograph.experimental.do_not_convert  # else converted at every load
    def cut(buffer: tf.Tensor, starts: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
        # A scalar input broadcasts: each record is copied out once, the buffer never.
        return tf.strings.substr(buffer, starts, lengths)

    return (
        tf_generator.from_generator(
            generate,
            output_signature=(
                tf.TensorSpec([], tf.string),
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.int64),
            ),
        )
        .map(cut)
        # Chunks are whole batches but the last: rebatch cuts them into exactly the
        # batches of per_batch records one element per batch would have given.
        .rebatch(per_batch)
        .prefetch(ahead)
    )


def _batches_ahead(header: Header, per_batch: int) -> int:
    """How many batches :func:`files_batches` reads ahead: 2 to 8, in about 16 MiB."""
    fits = readahead.whole_batches(header, per_batch, _AHEAD_BYTES)
    return min(max(fits, _READ_AHEAD), _MOST_AHEAD)


def _chunk_records(header: Header, per_batch: int) -> int:
    """The most records of one chunk :func:`files_batches` hands to the graph: whole batches."""
    return per_batch * readahead.whole_batches(header, per_batch, _CHUNK_BYTES)


def _span_batches(
    root: str,
    header: Header,
    spans: list[readahead.Span],
    per_batch: int,
    feed: Callable[[str, int, bytes], None] | None,
    *,
    most: int | None = None,
) -> Iterator[tuple[bytes, np.ndarray, np.ndarray]]:
    """Chunks of records of whole uncompressed shards: ``(buffer, starts, lengths)``.

    Record ``m`` of a chunk is ``buffer[starts[m] : starts[m] + lengths[m]]``.
    Every chunk but the last holds a whole number of batches of ``per_batch``
    records: the first one batch, each next twice the one before, up to
    ``most`` records (None: ``per_batch``).
    The bytes come through one read-ahead stream over ``spans`` (a cached
    copy's path where the cache holds the shard), ``feed`` given each block
    as it is reached; the records' offsets from the shards' indexes at
    ``root``.

    Raises:
        CorruptDataError: As :func:`superserial.read.readahead.records` raises
            (a chunk :meth:`~superserial.read.random_access.RecordReader.read_span`
            refuses is read again record by record from its shard's start, which
            names what is wrong as a read without the indexes names it).
    """
    by_name = {s.file: s for s in header.shards}
    shards = [by_name[fs.basename(s.file)] for s in spans]
    reader = RecordReader(root, header, shards, [0] * len(spans), [s.records for s in spans])
    ahead = readahead.Stream([(s.file, s.lo, s.hi) for s in spans], on_block=feed)
    n = sum(s.records for s in spans)
    a = 0  # the first record not yet handed on
    try:
        reader.open_all()  # after the stream's first requests went out: they overlap
        for a, b in readahead.steps(n, per_batch, max(per_batch, most or per_batch)):
            buffer, starts, ends = reader.read_span(a, b, ahead.take)
            yield buffer, starts, ends - starts
        a = n
        return
    except (CorruptDataError, FileNotFoundError):
        failed = ahead.error
        if failed is not None and not isinstance(failed, FileNotFoundError):
            raise  # the pass failed (a cached copy's check): a read again fails alike
        # A damaged record or index, or a shard gone (the index, or a block): read
        # below as a read without the indexes reads, for its records or its error.
    finally:
        ahead.close()
        reader.close()
    k, begin = 0, 0
    while begin + spans[k].records <= a:
        begin += spans[k].records
        k += 1
    read = readahead.records(spans[k:], None, missing=_removed, on_block=feed)
    rest = itertools.islice((r for r, _ in read), a - begin, None)
    yield from map(_packed, _batches(rest, per_batch))


def _decoded(
    chunks: Iterator[tuple[bytes, np.ndarray, np.ndarray]],
    decoder: numpy_decoded.ChunkDecoder,
    files: list[str],
    per_file: list[int],
) -> Iterator[tuple[Any, ...]]:
    """The flat leaves of each chunk of records ``(buffer, starts, lengths)``, decoded."""
    ends = np.cumsum(per_file)
    a = 0  # the first record of the chunk, in the order of ``files``

    def where(m: int) -> str:
        f = int(np.searchsorted(ends, a + m, side="right"))
        return f"{files[f]} record {a + m - int(ends[f] - per_file[f])}"

    for buffer, starts, lengths in chunks:
        yield tuple(decoder.decode(buffer, starts, lengths, where))
        a += len(starts)


def _packed(batch: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Records as :func:`_span_batches` gives them: one buffer, their starts and lengths."""
    lengths = np.fromiter((len(r) for r in batch), np.int64, len(batch))
    starts = np.zeros(len(batch), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return b"".join(batch), starts, lengths


def _batches(records: Iterator[bytes], per_batch: int) -> Iterator[np.ndarray]:
    while batch := list(itertools.islice(records, per_batch)):
        yield np.array(batch, dtype=object)


@tf.autograph.experimental.do_not_convert  # it builds a generator dataset: nothing to convert
def shard_batches(
    file: tf.Tensor,
    count: tf.Tensor,
    *,
    compression: str | None,
    checked: bool,
    per_batch: int,
    drop_remainder: bool = False,
    header: Header | None = None,
) -> tf.data.Dataset:
    """The records of one shard as tf.string vectors of ``per_batch`` (the last may be short).

    Args:
        file: A scalar tf.string: the shard's path.
        count: A scalar tf.int64: its record count (with ``checked``).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        checked: Check that the shard holds exactly ``count`` records.
        per_batch: Records per batch.
        drop_remainder: Drop a last short batch.
        header: The dataset's header, with ``checked``: the shard is read
            with range requests in flight ahead of the reader
            (:mod:`superserial.read.readahead`) where that applies, as
            :func:`files_batches` reads every shard (``load(shuffle_files=True)``
            reads shard by shard, in an order the graph draws).

    Errors surface as the dataset is iterated: a damaged shard or a wrong
    record count, or a shard removed since ``load`` (an overwrite), is a
    :class:`~superserial.errors.CorruptDataError` raised inside tf.data (so it
    reaches the caller as a ``tf.errors.OpError`` carrying its message).
    """

    def generate(name: bytes, n: np.int64) -> Iterator[np.ndarray]:
        batch: list[bytes] = []
        path = name.decode("utf-8")
        spans = None
        if header is not None and checked:
            spans = readahead.spans(path.rpartition("/")[0], header, [path], [int(n)], [0])
        records: Iterator[bytes]
        if spans is None:
            records = _records(path, compression, int(n) if checked else None)
        else:
            records = (r for r, _ in readahead.records(spans, compression, missing=_removed))
        for record in records:
            batch.append(record)
            if len(batch) == per_batch:
                yield np.array(batch, dtype=object)
                batch = []
        if batch and not drop_remainder:
            yield np.array(batch, dtype=object)

    return tf_generator.from_generator(
        generate,
        output_signature=tf.TensorSpec([None], tf.string),
        args=(file, count),
    ).prefetch(_READ_AHEAD)

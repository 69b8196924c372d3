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
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from superserial.errors import CorruptDataError
from superserial.format import framing
from superserial.format.header import Header
from superserial.read import readahead
from superserial.read.cache.stream import Stream

__all__ = ["files_batches", "reads_ahead", "shard_batches"]

# Batches read ahead of the parser per open shard: network reads overlap
# parsing, and memory stays a few batches.
_READ_AHEAD = 2
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


def files_batches(
    header: Header, files: list[str], *, per_batch: int, stream: Stream | None = None
) -> tf.data.Dataset:
    """The records of whole shards, in order, as tf.string vectors of ``per_batch``.

    Read as :func:`shard_batches` reads one shard, checked alike, but with
    range requests in flight ahead of the reader across the shards'
    boundaries (:mod:`superserial.read.readahead`); shard by shard where
    read-ahead does not apply. With ``stream`` (the shards streamed through a
    cache), each iteration is a :meth:`~superserial.read.cache.stream.Stream.tee`
    pass: the shards the cache holds are read from it, and copies of the others
    are kept as they are read. Errors surface as the dataset is iterated.
    """
    counts = {s.file: s.records for s in header.shards}
    per_file = [counts[f.replace("\\", "/").rpartition("/")[2]] for f in files]
    compression = header.compression or None

    def generate() -> Iterator[np.ndarray]:
        root = files[0].rpartition("/")[0]  # for parts of shards only: none here
        spans = readahead.spans(root, header, files, per_file, [0] * len(files))
        if spans is None:
            records: Iterator[bytes] = itertools.chain.from_iterable(
                _records(f, compression, n) for f, n in zip(files, per_file, strict=True)
            )
            yield from _batches(records, per_batch)
            return
        tee = None if stream is None else stream.tee()
        try:
            if tee is not None:
                spans = [s._replace(file=tee.local(_base(s.file)) or s.file) for s in spans]
            feed = None if tee is None else tee.feed
            read = readahead.records(spans, compression, missing=_removed, on_block=feed)
            yield from _batches((r for r, _ in read), per_batch)
        finally:
            if tee is not None:
                tee.close()

    return tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec([None], tf.string)
    ).prefetch(_READ_AHEAD)


def _batches(records: Iterator[bytes], per_batch: int) -> Iterator[np.ndarray]:
    while batch := list(itertools.islice(records, per_batch)):
        yield np.array(batch, dtype=object)


def _base(file: str) -> str:
    return file.replace("\\", "/").rpartition("/")[2]


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

    return tf.data.Dataset.from_generator(
        generate,
        output_signature=tf.TensorSpec([None], tf.string),
        args=(file, count),
    ).prefetch(_READ_AHEAD)

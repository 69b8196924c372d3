"""Shard records read through :mod:`superserial.storage.fs` into tf.data, where TensorFlow cannot.

``tf.data.TFRecordDataset`` reads only what TensorFlow's filesystems reach;
TensorFlow 2.21 has no ``s3://``. For such paths (those :mod:`superserial.storage.fs`
serves with fsspec), :func:`shard_batches` streams each shard through the
filesystem layer, checks its framing and record count with
:mod:`superserial.format.framing` (as ``TFRecordDataset`` and ``assert_cardinality``
would), and hands the records to the graph in batches. Memory stays bounded:
one read block (8 MiB) of the open shard, and a few batches read ahead.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from superserial.errors import CorruptDataError
from superserial.format import framing

__all__ = ["shard_batches"]

# Batches read ahead of the parser per open shard: network reads overlap
# parsing, and memory stays a few batches.
_READ_AHEAD = 2
# Bytes one request fetches from the object store: large enough that a
# request's latency (tens of ms on S3) costs little next to its transfer.
_BLOCK = 8 << 20


def _records(file: str, compression: str | None, expected: int | None) -> Iterator[bytes]:
    try:
        if expected is None:
            yield from framing.read_records(file, compression, buffering=_BLOCK)
            return
        for record, _ in framing.shard_records(file, compression, expected, buffering=_BLOCK):
            yield record
    except FileNotFoundError as e:
        # Listed when the dataset was loaded: an overwrite removed it since.
        raise CorruptDataError(
            f"expected shard {file}, found no file (removed while loading: was the dataset "
            "overwritten?)"
        ) from e


@tf.autograph.experimental.do_not_convert  # it builds a generator dataset: nothing to convert
def shard_batches(
    file: tf.Tensor,
    count: tf.Tensor,
    *,
    compression: str | None,
    checked: bool,
    per_batch: int,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
    """The records of one shard as tf.string vectors of ``per_batch`` (the last may be short).

    Args:
        file: A scalar tf.string: the shard's path.
        count: A scalar tf.int64: its record count (with ``checked``).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        checked: Check that the shard holds exactly ``count`` records.
        per_batch: Records per batch.
        drop_remainder: Drop a last short batch.

    Errors surface as the dataset is iterated: a damaged shard or a wrong
    record count, or a shard removed since ``load`` (an overwrite), is a
    :class:`~superserial.errors.CorruptDataError` raised inside tf.data (so it
    reaches the caller as a ``tf.errors.OpError`` carrying its message).
    """

    def generate(name: bytes, n: np.int64) -> Iterator[np.ndarray]:
        batch: list[bytes] = []
        path = name.decode("utf-8")
        for record in _records(path, compression, int(n) if checked else None):
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

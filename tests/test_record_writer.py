"""superserial's own TFRecord writer (for filesystems TensorFlow lacks) writes TensorFlow's bytes."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import google_crc32c
import numpy as np
import pytest
import tensorflow as tf

from superserial.format.framing import (
    frame_records,
    length_crcs,
    masked_crc,
    range_crc32cs,
    read_records,
)
from superserial.write import record_file
from superserial.write.record_file import RecordFileWriter

RECORDS = [b"", b"a", b"\x00" * 3000, bytes(range(256)) * 9000]  # the last > 1 MiB: a flush


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_same_records_as_tensorflow(tmp_path: Any, compression: str | None) -> None:
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    w = RecordFileWriter(ours, compression)
    for r in RECORDS:  # a batch of one record at a time
        w.write_framed(frame_records([r], np.array([len(r)], np.int64)))
    w.close()
    w.close()  # twice is fine
    with tf.io.TFRecordWriter(
        theirs, tf.io.TFRecordOptions(compression_type=compression or "")
    ) as t:
        for r in RECORDS:
            t.write(r)
    with open(ours, "rb") as f:
        data = f.read()
    assert (w.bytes, w.crc32c) == (len(data), google_crc32c.value(data))
    with open(theirs, "rb") as f:
        tf_data = f.read()
    plain = {None: lambda b: b, "GZIP": gzip.decompress, "ZLIB": zlib.decompress}[compression]
    assert plain(data) == plain(tf_data)  # the framing, byte for byte
    if compression is None:
        assert data == tf_data
    got = [bytes(x.numpy()) for x in tf.data.TFRecordDataset(ours, compression or "")]
    assert got == RECORDS
    assert list(read_records(ours, compression)) == RECORDS


def test_bad_compression() -> None:
    with pytest.raises(ValueError, match="LZMA"):
        RecordFileWriter("unused", "LZMA")


# More than one deflate chunk (4 MiB), records of every size class, a zero-length one.
BATCH = [b"", b"x" * 5, bytes(range(256)) * 20_000, b"\x00" * 3_000_000, b"abc" * 1_000_001]


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_framed_batches_as_tensorflow_writes_them(tmp_path: Any, compression: str | None) -> None:
    """Batch framing, one write per batch, parallel deflate: TensorFlow's records, readable by all."""
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    sizes = np.array([len(r) for r in BATCH], np.int64)
    framed = frame_records(BATCH, sizes)
    w = RecordFileWriter(ours, compression)
    w.write_framed(np.frombuffer(framed, np.uint8)[: len(framed) // 2])  # cut mid-record
    w.write_framed(framed[len(framed) // 2 :])
    w.close()
    with tf.io.TFRecordWriter(
        theirs, tf.io.TFRecordOptions(compression_type=compression or "")
    ) as t:
        for r in BATCH:
            t.write(r)
    with open(ours, "rb") as f:
        data = f.read()
    with open(theirs, "rb") as f:
        tf_data = f.read()
    assert (w.bytes, w.crc32c) == (len(data), google_crc32c.value(data))
    # gzip and zlib check the stream's CRC-32 / Adler-32 and size trailers.
    plain = {None: lambda b: b, "GZIP": gzip.decompress, "ZLIB": zlib.decompress}[compression]
    assert plain(data) == plain(tf_data) == framed
    if compression is None:
        assert data == tf_data
    got = [bytes(x.numpy()) for x in tf.data.TFRecordDataset(ours, compression or "")]
    assert got == BATCH
    assert list(read_records(ours, compression)) == BATCH
    # The chunk size is fixed: the same records give the same file, however batched.
    again = RecordFileWriter(str(tmp_path / "again"), compression)
    again.write_framed(framed)
    again.close()
    with open(tmp_path / "again", "rb") as f:
        assert f.read() == data
    if compression is not None:
        # zlib's level 6, as TensorFlow's; each restart block (a compressor of its own,
        # for random access) costs its own Huffman tables and warm-up: bytes, not %,
        # except on data this repetitive (BATCH compresses 400:1).
        blocks = -(-len(framed) // record_file._RESTART)
        assert len(data) <= len(tf_data) * 1.01 + 200 * blocks, (len(data), len(tf_data))


def test_length_crcs_and_range_crcs() -> None:
    sizes = np.array([0, 5, 5, 1 << 40, 300], np.int64)
    want = [masked_crc(int(n).to_bytes(8, "little")) for n in sizes]
    assert length_crcs(sizes).tolist() == want
    buf = np.frombuffer(bytes(range(256)) * 4, np.uint8)
    starts, lengths = np.array([0, 7, 1000, 1024]), np.array([10, 300, 24, 0])
    got = range_crc32cs(buf, starts, lengths).tolist()
    assert got == [
        google_crc32c.value(buf[s : s + n].tobytes()) for s, n in zip(starts, lengths, strict=True)
    ]

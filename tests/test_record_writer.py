"""superserial's own TFRecord writer (for filesystems TensorFlow lacks) writes TensorFlow's bytes."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import google_crc32c
import pytest
import tensorflow as tf

from superserial.framing import read_records
from superserial.record_writer import RecordFileWriter

RECORDS = [b"", b"a", b"\x00" * 3000, bytes(range(256)) * 9000]  # the last > 1 MiB: a flush


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_same_records_as_tensorflow(tmp_path: Any, compression: str | None) -> None:
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    w = RecordFileWriter(ours, compression)
    for r in RECORDS:
        w.write(r)
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

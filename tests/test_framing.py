"""TFRecord framing without TensorFlow (superserial.format.framing): record walks agree with
what TensorFlow wrote and with the record reader, and damage names the record."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from superserial.errors import CorruptDataError
from superserial.format import framing


def _write(path: str, records: list[bytes]) -> None:
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)


RECORDS = [b"", b"a", b"x" * 70_000, b"tail"]


def test_walks_agree_with_the_records_tensorflow_wrote(tmp_path: Any) -> None:
    path = str(tmp_path / "r.tfrecord")
    _write(path, RECORDS)
    assert list(framing.read_records(path)) == RECORDS
    assert framing.count_records(path) == len(RECORDS)
    offsets = [0]
    for r in RECORDS:
        offsets.append(offsets[-1] + 16 + len(r))
    assert [framing.record_offset(path, i) for i in range(len(RECORDS) + 1)] == offsets
    assert offsets[-1] == os.path.getsize(path)
    got = [r for r, _ in framing.range_records(path, 2, 2, len(RECORDS))]
    assert got == RECORDS[2:]


def test_masked_crc_is_what_tensorflow_writes(tmp_path: Any) -> None:
    path = str(tmp_path / "r.tfrecord")
    _write(path, [b"hello"])
    data = Path(path).read_bytes()
    assert framing.masked_crc(data[:8]) == int.from_bytes(data[8:12], "little")
    assert framing.masked_crc(b"hello") == int.from_bytes(data[-4:], "little")


@pytest.mark.parametrize("walk", ["count", "offset"])
def test_damaged_length_names_the_record_and_offset(tmp_path: Any, walk: str) -> None:
    path = str(tmp_path / "r.tfrecord")
    _write(path, RECORDS)
    data = bytearray(Path(path).read_bytes())
    data[16] ^= 0x01  # the length of record 1, which starts at byte 16 (record 0 is empty)
    Path(path).write_bytes(bytes(data))
    with pytest.raises(
        CorruptDataError, match=r"corrupted length\) at .*r\.tfrecord record 1 \(byte offset 16\)"
    ):
        framing.count_records(path) if walk == "count" else framing.record_offset(path, 3)


def test_count_refuses_a_truncated_last_record(tmp_path: Any) -> None:
    path = str(tmp_path / "r.tfrecord")
    _write(path, RECORDS)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-3])
    with pytest.raises(CorruptDataError, match=r"truncated file\) at .*record 3 "):
        framing.count_records(path)
    assert framing.record_offset(path, 3) == len(data) - 16 - len(RECORDS[3])


def test_unknown_compression_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="expected compression None, 'GZIP' or 'ZLIB'"):
        list(framing.read_records(str(tmp_path / "x"), "BZIP2"))

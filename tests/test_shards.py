"""The one shard writer: rotation by quota and by size, the close hook, abort."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest
import tensorflow as tf

from superserial.errors import UnsupportedError
from superserial.format.framing import frame_batches
from superserial.format.header import Shard
from superserial.write.shard_writer import ShardWriter, quotas


def _records(n: int, size: int = 10) -> tuple[np.ndarray, np.ndarray]:
    recs = np.array([bytes([i % 256]) * size for i in range(n)], dtype=object)
    return recs, np.full(n, size, np.int64)


def _framed(recs: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    (batch,) = frame_batches([(recs, sizes)])
    return batch


def _read(path: str, compression: str = "") -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(path, compression)]


def test_quotas_split_evenly_and_refuse_unknown_counts() -> None:
    assert quotas(3, 10) == [4, 3, 3]
    assert quotas(None, 10) is None
    assert quotas(4, 0) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="known cardinality"):
        quotas(2, -2)
    with pytest.raises(ValueError, match="num_shards >= 1"):
        quotas(0, 5)


def test_quota_rotation_writes_exact_counts_and_pads_empty_shards(tmp_path) -> None:
    w = ShardWriter(str(tmp_path), name=lambda i: f"s{i}", compression=None, quotas=[2, 2, 0])
    recs, sizes = _records(3)
    w.write(*_framed(recs[:1], sizes[:1]))
    w.write(*_framed(recs[1:], sizes[1:]))
    with pytest.raises(UnsupportedError, match="expected 4 elements"):
        w.finish()  # 3 records for quotas summing to 4
    w = ShardWriter(str(tmp_path), name=lambda i: f"t{i}", compression=None, quotas=[2, 1, 0])
    w.write(*_framed(recs, sizes))
    shards = w.finish()
    assert [s.records for s in shards] == [2, 1, 0]
    assert _read(str(tmp_path / "t0")) == list(recs[:2])
    assert _read(str(tmp_path / "t1")) == list(recs[2:])
    for s in shards:
        data = (tmp_path / s.file).read_bytes()
        assert s.bytes == len(data)
        assert s.crc32c == f"{google_crc32c.value(data):08x}"


def test_more_records_than_quotas_is_a_clear_error(tmp_path) -> None:
    w = ShardWriter(str(tmp_path), name=lambda i: f"s{i}", compression=None, quotas=[1, 1])
    recs, sizes = _records(3)
    with pytest.raises(UnsupportedError, match=r"expected 2 elements .* got more"):
        w.write(*_framed(recs, sizes))


def test_size_rotation_and_close_hook(tmp_path) -> None:
    seen: list[tuple[int, str]] = []

    def on_close(i: int, path: str, shard: Shard) -> Shard:
        seen.append((i, path))
        return Shard(f"renamed-{i}", shard.records, shard.bytes, shard.crc32c)

    w = ShardWriter(
        str(tmp_path), name=lambda i: f"s{i}", compression="GZIP", shard_size=25, on_close=on_close
    )
    recs, sizes = _records(7)
    w.write(*_framed(recs, sizes))  # 10-byte records, 25 bytes a shard: 3, 3, 1
    shards = w.finish()
    assert [s.records for s in shards] == [3, 3, 1]
    assert [s.file for s in shards] == ["renamed-0", "renamed-1", "renamed-2"]
    assert seen == [(i, str(tmp_path / f"s{i}")) for i in range(3)]
    assert [r for i in range(3) for r in _read(str(tmp_path / f"s{i}"), "GZIP")] == list(recs)


def test_abort_removes_the_open_file_and_keeps_closed_ones(tmp_path) -> None:
    w = ShardWriter(str(tmp_path), name=lambda i: f"s{i}", compression=None, quotas=[1, 2])
    recs, sizes = _records(2)
    w.write(*_framed(recs, sizes))
    w.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0", "s0.index"]
    assert [s.records for s in w.shards] == [1]


def test_resume_continues_after_done_shards(tmp_path) -> None:
    done = [Shard("s0", 2, 0, "00000000")]
    w = ShardWriter(
        str(tmp_path), name=lambda i: f"s{i}", compression=None, quotas=[2, 1], done=done
    )
    recs, sizes = _records(1)
    w.write(*_framed(recs, sizes))
    shards = w.finish()
    assert shards[0] == done[0]
    assert shards[1].file == "s1" and shards[1].records == 1

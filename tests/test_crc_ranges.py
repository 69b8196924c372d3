"""The records' CRC-32Cs computed in one C call (format/_crc_ranges.c), and without it.

Both ways give google-crc32c's values for any ranges of a buffer, refuse ranges
outside it, and catch a damaged record, named, in a reader's checks.
"""

from __future__ import annotations

import os
from typing import Any

import google_crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superserial.errors import CorruptDataError
from superserial.format import framing
from superserial.read.record_checks import RecordChecks

MODES = ["native", "python"]


@pytest.fixture(params=MODES)
def mode(request: Any, monkeypatch: Any) -> str:
    """Each test once with the extension and once as where it could not be built."""
    if request.param == "python":
        monkeypatch.setattr(framing, "NATIVE_RANGES", False)
    return str(request.param)


def test_the_extension_is_built_where_a_compiler_is() -> None:
    # This machine (and CI) has gcc and Python's headers: `pip install -e .` builds it,
    # so a build that silently fell back shows here.
    assert framing.NATIVE_RANGES, "superserial.format._crc_ranges was not built"


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=3000),
    cuts=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), max_size=40),
)
@pytest.mark.parametrize("native", [True, False], ids=MODES)
def test_each_range_has_google_crc32cs_value(data: bytes, cuts: Any, native: bool) -> None:
    ranges = [(min(a, len(data)), min(n, len(data) - min(a, len(data)))) for a, n in cuts]
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    lengths = np.array([n for _, n in ranges], dtype=np.int64)
    buf = np.frombuffer(data, dtype=np.uint8)
    with pytest.MonkeyPatch.context() as patch:
        if not native:
            patch.setattr(framing, "NATIVE_RANGES", False)
        got = framing.range_crc32cs(buf, starts, lengths)
    assert got.dtype == np.uint64
    assert got.tolist() == [google_crc32c.value(data[a : a + n]) for a, n in ranges]


@pytest.mark.parametrize(
    ("start", "length"), [(95, 6), (-1, 2), (3, -1), (101, 0)], ids=["past", "before", "neg", "far"]
)
def test_a_range_outside_the_buffer_is_refused(mode: str, start: int, length: int) -> None:
    buf = np.frombuffer(os.urandom(100), dtype=np.uint8)
    with pytest.raises(ValueError, match="within the 100 bytes"):
        framing.range_crc32cs(buf, np.array([0, start]), np.array([10, length]))


def _framed(n: int) -> tuple[bytes, list[bytes], np.ndarray]:
    rng = np.random.default_rng(n)
    records = [rng.bytes(int(rng.integers(0, 300))) for _ in range(n)]
    sizes = np.array([len(r) for r in records], dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(sizes + 16)[:-1]]).astype(np.int64)
    return framing.frame_records(records, sizes), records, at


def _checks() -> RecordChecks:
    return RecordChecks("ds", ["shard-0"], lambda k, off: f"byte offset {off}")


@pytest.mark.parametrize("keep", [True, False])
def test_checked_records_come_back_as_framed(mode: str, keep: bool) -> None:
    buffer, records, at = _framed(50)
    framed = np.array([len(r) + 16 for r in records], dtype=np.int64)
    got = _checks().all(buffer, at, framed, 0, np.arange(50), at, keep=keep)
    assert got == (records if keep else [])


@pytest.mark.parametrize("where", ["data", "data_crc"])
def test_a_damaged_record_is_named(mode: str, where: str) -> None:
    buffer, records, at = _framed(50)
    framed = np.array([len(r) + 16 for r in records], dtype=np.int64)
    j = next(i for i, r in enumerate(records) if i > 20 and len(r) > 0)
    pos = int(at[j]) + 12 + (len(records[j]) // 2 if where == "data" else len(records[j]) + 1)
    damaged = bytearray(buffer)
    damaged[pos] ^= 0x10
    with pytest.raises(CorruptDataError, match=rf"shard-0 record {j} \(byte offset"):
        _checks().all(bytes(damaged), at, framed, 0, np.arange(50), at, keep=False)

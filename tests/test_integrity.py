"""Integrity: damaged record files are refused or fail loudly, never misread.

A corrupted variant is "caught" when iterating the loaded dataset raises
(``tf.errors.DataLossError`` from TFRecord framing CRCs, ``InvalidArgumentError``
from the decoder's checks, ``FailedPreconditionError`` from the element-count
assertion, or ``CorruptDataError`` from ``load``'s size checks) and every
element produced before the error was the right one. Run with ``-s`` to see
the counts (lines starting ``CENSUS``).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
from superserial.errors import CorruptDataError

CAUGHT = (
    tf.errors.DataLossError,
    tf.errors.InvalidArgumentError,
    tf.errors.FailedPreconditionError,
    CorruptDataError,
)


def _source(ragged: bool = True) -> tf.data.Dataset:
    """Five elements with a dense, a string and (optionally) a ragged leaf."""
    if not ragged:
        return tf.data.Dataset.range(5).map(
            lambda i: {
                "x": tf.cast(tf.fill([3], i), tf.float32) + 0.5,
                "s": tf.strings.as_string(i * 1001),
            }
        )
    return tf.data.Dataset.range(5).map(
        lambda i: {
            "x": tf.cast(tf.fill([3], i), tf.float32) + 0.5,
            "s": tf.strings.as_string(i * 1001),
            "r": tf.RaggedTensor.from_tensor(tf.reshape(tf.range(i + 1), [1, -1])),
        }
    )


def _flat(el: Any) -> list[Any]:
    out: list[Any] = []
    for x in tf.nest.flatten(el, expand_composites=True):
        a = np.asarray(x)
        out.append(a.tolist() if a.dtype == object else (str(a.dtype), a.shape, a.tobytes()))
    return out


def _drain(ds: tf.data.Dataset) -> tuple[list[list[Any]], BaseException | None]:
    """All elements until the end or an error; the error (or None)."""
    out: list[list[Any]] = []
    try:
        for el in ds:
            out.append(_flat(el))
    except CAUGHT as e:
        return out, e
    return out, None


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> tuple[str, list[list[Any]]]:
    path = str(tmp_path_factory.mktemp("integrity") / "ds")
    superserial.save(_source(), path, num_shards=2)
    return path, [_flat(e) for e in _source()]


@pytest.fixture(scope="module")
def saved_dense(tmp_path_factory: Any) -> tuple[str, list[list[Any]]]:
    """Dense leaves only, so that ``load(batch_size=...)`` reads a shard in one batch (fast)."""
    path = str(tmp_path_factory.mktemp("integrity") / "ds")
    superserial.save(_source(ragged=False), path, num_shards=2)
    return path, [_flat(e) for e in _source(ragged=False).batch(8)]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _copy(path: str, tmp_path: Any, name: str = "copy") -> str:
    dst = str(tmp_path / name)
    shutil.copytree(path, dst)
    return dst


def _shard_file(path: str, i: int = 0) -> str:
    return os.path.join(path, superserial.read_header(path).shards[i].file)


# ------------------------------------------------------------ file-set checks


def test_missing_shard_is_named(saved, tmp_path):
    path = _copy(saved[0], tmp_path)
    victim = _shard_file(path, 1)
    os.unlink(victim)
    with pytest.raises(CorruptDataError, match=os.path.basename(victim)):
        superserial.load(path)


def test_extra_shard_is_named(saved, tmp_path):
    path = _copy(saved[0], tmp_path)
    extra = os.path.join(path, "data-00002-of-00002.tfrecord")
    shutil.copy(_shard_file(path, 0), extra)
    with pytest.raises(CorruptDataError, match=r"data-00002-of-00002\.tfrecord"):
        superserial.load(path)


def test_short_shard_is_named(saved, tmp_path):
    path = _copy(saved[0], tmp_path)
    victim = _shard_file(path, 0)
    os.truncate(victim, os.path.getsize(victim) - 1)
    with pytest.raises(CorruptDataError, match=os.path.basename(victim)):
        superserial.load(path)


def test_longer_shard_is_named(saved, tmp_path):
    path = _copy(saved[0], tmp_path)
    victim = _shard_file(path, 1)
    with open(victim, "ab") as f:
        f.write(b"\0")
    with pytest.raises(CorruptDataError, match=os.path.basename(victim)):
        superserial.load(path)


def test_shard_replaced_by_directory(saved, tmp_path):
    path = _copy(saved[0], tmp_path)
    victim = _shard_file(path, 0)
    os.unlink(victim)
    os.mkdir(victim)
    with pytest.raises((*CAUGHT, IsADirectoryError)):
        _drain(superserial.load(path))


# --------------------------------------------------------- record framing


def _record_layout(data: bytes) -> list[tuple[int, int]]:
    """(offset, payload length) of each TFRecord record."""
    out, off = [], 0
    while off < len(data):
        (n,) = struct.unpack("<Q", data[off : off + 8])
        out.append((off, n))
        off += 16 + n
    assert off == len(data)
    return out


def _check_caught(
    got: list[list[Any]], err: BaseException | None, want: list[list[Any]], what: str
) -> None:
    assert err is not None, f"{what}: no error, {len(got)} elements returned"
    assert got == want[: len(got)], f"{what}: wrong values before the error"


def test_every_single_byte_flip_is_caught(saved_dense, tmp_path):
    """Flip each byte of a shard (two masks): every variant must fail, none misread."""
    path = _copy(saved_dense[0], tmp_path)
    want = saved_dense[1]
    victim = _shard_file(path, 1)
    orig = _read(victim)
    layout = _record_layout(orig)
    assert len(layout) >= 2
    # Loaded once: files are opened anew on each iteration.
    ds = superserial.load(path, batch_size=8)
    assert _drain(ds) == (want, None)
    kinds = {"length": 0, "length_crc": 0, "payload": 0, "data_crc": 0}
    tried = 0
    for pos in range(len(orig)):
        for mask in (0x01, 0xFF):
            data = bytearray(orig)
            data[pos] ^= mask
            with open(victim, "wb") as f:
                f.write(data)
            got, err = _drain(ds)
            assert err is not None, f"flip 0x{mask:02x} at byte {pos}: no error"
            assert got == [], f"flip 0x{mask:02x} at byte {pos}: values returned"
            tried += 1
            off, n = max((r for r in layout if r[0] <= pos), key=lambda r: r[0])
            rel = pos - off
            kind = (
                "length"
                if rel < 8
                else "length_crc"
                if rel < 12
                else "payload"
                if rel < 12 + n
                else "data_crc"
            )
            kinds[kind] += 1
    assert all(kinds.values()), kinds
    print(f"CENSUS flips: {tried} variants tried, {tried} caught; by field {kinds}")


def _boundary_cuts(data: bytes) -> dict[str, list[int]]:
    """Cut offsets of each kind: inside/after each field of each record."""
    kinds: dict[str, list[int]] = {
        k: []
        for k in ("record_boundary", "in_length", "in_length_crc", "in_payload", "in_data_crc")
    }
    for off, n in _record_layout(data):
        kinds["record_boundary"].append(off)
        kinds["in_length"] += [off + 1, off + 7]
        kinds["in_length_crc"] += [off + 8, off + 11]
        kinds["in_payload"] += [off + 12, off + 12 + n // 2, off + 11 + n]
        kinds["in_data_crc"] += [off + 12 + n, off + 15 + n]
    return kinds


def test_every_truncation_is_caught_by_the_record_layer(saved_dense, tmp_path):
    """Cut a shard at every byte after ``load``'s size check passed.

    Framing CRCs catch cuts inside a record's payload or CRC; a cut at a record
    boundary or inside the 12-byte record header reads as a clean end of file
    to TFRecordDataset, and is caught by the per-shard record-count assertion.
    """
    path = _copy(saved_dense[0], tmp_path)
    tried, by_error = 0, {}
    for shard in (0, 1):
        victim = _shard_file(path, shard)
        orig = _read(victim)
        ds = superserial.load(path, batch_size=8)  # size check passes; cuts come after
        for cut in range(len(orig)):
            with open(victim, "wb") as f:
                f.write(orig[:cut])
            got, err = _drain(ds)
            assert err is not None, f"shard {shard} cut at {cut}: no error, {got}"
            assert got == [], f"shard {shard} cut at {cut}: values returned"
            tried += 1
            by_error[type(err).__name__] = by_error.get(type(err).__name__, 0) + 1
        with open(victim, "wb") as f:
            f.write(orig)
    print(f"CENSUS truncations (record layer): {tried} tried, {tried} caught: {by_error}")
    assert by_error.get("DataLossError") and by_error.get("FailedPreconditionError"), by_error


def test_truncation_kinds_with_patched_header(saved, tmp_path):
    """Each kind of cut, with the header's byte count patched so ``load`` opens it."""
    path = _copy(saved[0], tmp_path)
    want = saved[1]
    victim = _shard_file(path, 0)
    orig = _read(victim)
    hpath = os.path.join(path, "header.json")
    header = json.loads(_read(hpath))
    tried = 0
    for kind, cuts in _boundary_cuts(orig).items():
        for cut in cuts[:2]:
            with open(victim, "wb") as f:
                f.write(orig[:cut])
            header["shards"][0]["bytes"] = cut
            with open(hpath, "w") as f:
                json.dump(header, f)
            got, err = _drain(superserial.load(path))
            # Elements before the error are right; none of the next shard comes early.
            _check_caught(got, err, want, f"{kind} cut at {cut} (header patched)")
            assert len(got) < len(want) - 2
            tried += 1
    print(f"CENSUS truncations (header patched, each kind): {tried} tried, {tried} caught")


def test_every_truncation_is_refused_at_open(saved, tmp_path):
    path = _copy(saved[0], tmp_path)
    victim = _shard_file(path, 1)
    orig = _read(victim)
    bounds = [off for off, _ in _record_layout(orig)] + [len(orig) - 1]
    for cut in sorted({0, 1, 8, 12, *bounds, *(b + 13 for b in bounds[:-1])}):
        with open(victim, "wb") as f:
            f.write(orig[:cut])
        with pytest.raises(CorruptDataError, match=os.path.basename(victim)):
            superserial.load(path)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_flips_never_misread(compression, tmp_path):
    """In compressed shards a flip must fail or (in unchecked gzip header bytes) change nothing."""
    path = str(tmp_path / "ds")
    superserial.save(_source(ragged=False), path, compression=compression)
    want = [_flat(e) for e in _source(ragged=False).batch(8)]
    victim = _shard_file(path, 0)
    orig = _read(victim)
    ds = superserial.load(path, batch_size=8)
    caught = harmless = 0
    for pos in range(len(orig)):
        data = bytearray(orig)
        data[pos] ^= 0x01
        with open(victim, "wb") as f:
            f.write(data)
        got, err = _drain(ds)
        if err is None:
            assert got == want, f"flip at byte {pos}: wrong values, no error"
            harmless += 1
        else:
            assert got == want[: len(got)], f"flip at byte {pos}: wrong values before the error"
            caught += 1
    print(
        f"CENSUS {compression} flips: {caught + harmless} tried, {caught} caught, {harmless} harmless (identical data)"
    )
    assert caught > 0.8 * len(orig)


# ------------------------------------------------------------- superserial.verify


def test_verify_reports_every_byte_flip(saved_dense, tmp_path):
    """``verify`` (whole-file CRC, framing, decoding) reports each flip, naming the file."""
    path = _copy(saved_dense[0], tmp_path)
    assert superserial.verify(path, progress=False).ok
    victim = _shard_file(path, 0)
    orig = _read(victim)
    tried = 0
    for pos in range(0, len(orig), 3):
        data = bytearray(orig)
        data[pos] ^= 0x10
        with open(victim, "wb") as f:
            f.write(data)
        report = superserial.verify(path, progress=False)
        assert not report.ok, f"flip at byte {pos} not reported"
        assert any(p.file and os.path.basename(victim) in p.file for p in report.problems), (
            report.problems
        )
        tried += 1
    print(f"CENSUS verify flips: {tried} tried, {tried} reported")


def test_verify_catches_what_load_cannot(tmp_path):
    """A shard replaced by another valid shard of the same size and record count:
    ``load`` reads it (framing and counts hold); ``verify``'s whole-file CRC does not."""
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.range(4).map(lambda i: tf.fill([3], i)), path, num_shards=2)
    a, b = _shard_file(path, 0), _shard_file(path, 1)
    shutil.copy(a, b)  # same size, same record count, valid framing: other values
    assert [int(x[0]) for x in superserial.load(path)] == [0, 1, 0, 1]
    report = superserial.verify(path, progress=False)
    assert not report.ok
    assert any(p.file and os.path.basename(b) in p.file for p in report.problems), report.problems

"""The vectorized batch decoder (codec_batch) against the per-record parser and TensorFlow.

Every dtype of the dtype table, in every fixed shape and as ragged leaves,
decodes through the fast path to the same values, bit for bit, as the
per-record parser (``codec_numpy``) and the TensorFlow reader. Any altered
byte of a record either makes the fast path decline the batch or gives what
the per-record parser gives; never another value, and never a value where
the parser raises. Damaged records in files are named, and batches that mix
canonical records with others fall back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from matrix import SHAPES, values
from superserial.codec.numpy_batch_decode import BatchDecoder
from superserial.codec.numpy_decode import RecordDecoder
from superserial.errors import CorruptDataError
from superserial.format import dtypes
from superserial.format.framing import masked_crc, record_offsets
from superserial.format.wire import varint

N = 7
BATCH = 4  # two batches: 4 + 3
NUMERIC = [e for e in dtypes.DTYPES if e.name != "string"]
# [3] is stored as [2, 3] is (n values of one list): the matrix stands for both.
FIXED_SHAPES = {k: v for k, v in SHAPES.items() if k != "vector"}
# Ragged leaves with inner dimensions, one dtype per stored kind (int64, float, raw).
PAIRS = ["int32", "float32", "float64"]
LENGTHS = [3, 0, 2, 5, 1, 0, 4]


def _key(a: Any) -> tuple[Any, ...]:
    a = np.asarray(a)
    if a.dtype == object:
        return ("bytes", a.shape, a.tolist())
    return (a.dtype.name, a.shape, a.tobytes())


@pytest.fixture(scope="module")
def fixed_path(tmp_path_factory: Any) -> str:
    """N elements: one fixed-shape leaf per dtype and shape, ``DTYPE/SHAPE``."""
    path = str(tmp_path_factory.mktemp("batch") / "fixed")
    return _every_dtype(path, values, FIXED_SHAPES)


def _every_dtype(path: str, make: Any, shapes: dict[str, tuple[int, ...]]) -> str:
    """Saves N elements of a leaf ``DTYPE/SHAPE`` per dtype and shape, of ``make``'s values."""
    cols = {
        e.name: {
            s: tf.constant(make(e, shape, N, k), dtype=tf.as_dtype(e.name))
            for k, (s, shape) in enumerate(shapes.items())
        }
        for e in dtypes.DTYPES
    }
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), path, progress=False)
    return path


@pytest.fixture(scope="module")
def ragged_path(tmp_path_factory: Any) -> str:
    """N elements: ragged_rank 0 leaves of every numeric dtype, ``[None]`` (and some ``[None, 2]``)."""
    total = sum(LENGTHS)
    cols = {}
    for e in NUMERIC:
        dt = tf.as_dtype(e.name)
        cols[e.name] = {
            "flat": tf.RaggedTensor.from_row_lengths(
                tf.constant(values(e, (), total, 1), dtype=dt), LENGTHS
            )
        }
        if e.name in PAIRS:
            cols[e.name]["pairs"] = tf.RaggedTensor.from_row_lengths(
                tf.constant(values(e, (2,), total, 2), dtype=dt), LENGTHS
            )
    path = str(tmp_path_factory.mktemp("batch") / "ragged")
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), path, progress=False)
    return path


def _three_ways(path: str, name: str) -> tuple[list[Any], list[Any], list[Any]]:
    """Leaf ``name`` of every batch: fast decoder, per-record decoder, and TensorFlow."""
    ds = ssnp.load(path)
    fast_dec, slow_dec = BatchDecoder(ds.header), RecordDecoder(ds.header)
    k = [leaf.name for leaf in ds.header.leaves].index(name)
    fast, slow = [], []
    for a in range(0, N, BATCH):
        b = min(a + BATCH, N)
        buf, starts, ends = ds.records.read_span(a, b)
        got = fast_dec.decode(buf, starts, ends)
        assert fast_dec.supported and got is not None, "the fast path declined canonical records"
        records = [buf[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        fast.append(got[k])
        slow.append(slow_dec.decode(records, [f"r{i}" for i in range(a, b)])[k])
    group, leaf = name.split("/")
    return fast, slow, [batch[group][leaf] for batch in _tf_batches(path)]


_TF: dict[str, list[Any]] = {}


def _tf_batches(path: str) -> list[Any]:
    """The batches TensorFlow's reader gives (read once per dataset)."""
    if path not in _TF:
        _TF[path] = list(superserial.load(path, batch_size=BATCH))
    return _TF[path]


@pytest.mark.parametrize("shape", list(FIXED_SHAPES))
@pytest.mark.parametrize("dtype", [e.name for e in dtypes.DTYPES])
def test_fixed_leaf_as_per_record_and_tf(fixed_path: str, dtype: str, shape: str) -> None:
    fast, slow, tfb = _three_ways(fixed_path, f"{dtype}/{shape}")
    for f, s, t in zip(fast, slow, tfb, strict=True):
        assert type(f) is np.ndarray
        assert _key(f) == _key(s)
        t = t.numpy()
        assert _key(f) == _key(t if dtype != "string" else t.astype(object))


@pytest.mark.parametrize(
    ("dtype", "inner"),
    [(e.name, "flat") for e in NUMERIC] + [(name, "pairs") for name in PAIRS],
)
def test_ragged_leaf_as_per_record_and_tf(ragged_path: str, dtype: str, inner: str) -> None:
    fast, slow, tfb = _three_ways(ragged_path, f"{dtype}/{inner}")
    for f, s, t in zip(fast, slow, tfb, strict=True):
        assert len(f) == len(s) == t.shape[0]
        for i, (x, y) in enumerate(zip(f, s, strict=True)):
            assert _key(x) == _key(y) == _key(t[i].numpy())


def test_iter_batches_and_elements_as_per_record(ragged_path: str, fixed_path: str) -> None:
    for path in (fixed_path, ragged_path):
        ds = ssnp.load(path)
        batches, elements = list(ds.batches(BATCH)), list(ds)
        ds._fast.supported = False  # the per-record path, as a reference
        assert len(batches) == 2 and len(elements) == N
        for got, want in zip(batches + elements, list(ds.batches(BATCH)) + list(ds), strict=True):
            flat_got = tf.nest.flatten(got)
            flat_want = tf.nest.flatten(want)
            assert [_key(x) for x in flat_got] == [_key(x) for x in flat_want]


@pytest.fixture(scope="module")
def mixed_path(tmp_path_factory: Any) -> str:
    """Five leaf kinds in small records: int8, float32[2], uint8[3], string, ragged int32."""
    n = 5
    cols = {
        "a": np.arange(n, dtype=np.int8) - 2,
        "f": np.arange(2 * n, dtype=np.float32).reshape(n, 2) / 3,
        "r": tf.RaggedTensor.from_row_lengths(np.arange(7, dtype=np.int32) * 300, [2, 0, 1, 3, 1]),
        "s": np.array([b"x", b"", b"yz", b"\xff", b"w"], dtype=object),
        "u": np.arange(3 * n, dtype=np.uint8).reshape(n, 3),
    }
    path = str(tmp_path_factory.mktemp("batch") / "mixed")
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), path, progress=False)
    return path


def _flat_keys(leaves: list[Any]) -> list[Any]:
    return [[_key(x) for x in v] if isinstance(v, list) else _key(v) for v in leaves]


@pytest.fixture(scope="module")
def wide_path(tmp_path_factory: Any) -> str:
    """Records whose lengths are the same multi-byte varints in every record (uint8[200])."""
    n = 4
    cols = {
        "image": (np.arange(n * 200) % 251).astype(np.uint8).reshape(n, 200),
        "label": np.arange(n, dtype=np.int64) * 1000,
    }
    path = str(tmp_path_factory.mktemp("batch") / "wide")
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), path, progress=False)
    return path


@pytest.mark.parametrize("change", ["flip", 0x00, 0x80, 0xFF])
def test_any_altered_byte_declines_or_agrees(mixed_path: str, change: Any) -> None:
    """Every byte of record 2, altered: the fast path declines, or gives the parser's values."""
    _alter_each_byte(mixed_path, change)


@pytest.mark.parametrize("change", ["flip", 0x00, 0x80, 0xFF])
def test_altered_byte_of_shared_lengths_declines_or_agrees(wide_path: str, change: Any) -> None:
    """As above where every record has the same 2-byte lengths (decoded once for the batch)."""
    _alter_each_byte(wide_path, change)


def _alter_each_byte(path: str, change: Any, record: int = 2) -> None:
    ds = ssnp.load(path)
    buf, starts, ends = ds.records.read_span(0, len(ds))
    fast, slow = BatchDecoder(ds.header), RecordDecoder(ds.header)
    wheres = [f"record {i}" for i in range(len(ds))]
    declined = 0
    for pos in range(int(starts[record]), int(ends[record])):
        data = bytearray(buf)
        data[pos] = data[pos] ^ 0x01 if change == "flip" else change
        if data[pos] == buf[pos]:
            continue
        got = fast.decode(bytes(data), starts, ends)
        records = [bytes(data[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        try:
            want = slow.decode(records, wheres)
        except CorruptDataError:
            assert got is None, f"a value where the parser raises (byte {pos})"
            declined += 1
            continue
        if got is None:
            declined += 1
        else:
            assert _flat_keys(got) == _flat_keys(want), f"byte {pos}"
    assert declined > 10  # the layout bytes (tags, keys, lengths) are checked


def _patch_record(path: str, record: int, mutate: Any) -> str:
    """Alters record ``record`` of the single shard in place (same length), CRC recomputed."""
    file = os.path.join(path, superserial.read_header(path).shards[0].file)
    data = bytearray(Path(file).read_bytes())
    offsets = record_offsets(file, len(data))
    lo, hi = int(offsets[record]) + 12, int(offsets[record + 1]) - 4
    rec = bytearray(data[lo:hi])
    mutate(rec)
    data[lo:hi] = rec
    data[hi : hi + 4] = masked_crc(bytes(rec)).to_bytes(4, "little")
    Path(file).write_bytes(data)
    return file


def _copy(path: str, tmp_path: Any) -> str:
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(path, out)
    return out


def _rename_key(rec: bytearray) -> None:
    at = rec.find(b"\x01u\x12")  # the key "u" (length 1) and its value's tag
    rec[at + 1] = ord("v")


@pytest.mark.parametrize(
    ("mutate", "leaf", "text"),
    [(_rename_key, "u", "expected a feature 'u'")],
)
def test_damaged_record_named(
    mixed_path: str, tmp_path: Any, mutate: Any, leaf: str, text: str
) -> None:
    path = _copy(mixed_path, tmp_path)
    file = _patch_record(path, 3, mutate)
    with pytest.raises(CorruptDataError) as info:
        list(ssnp.iter_batches(path, 4))
    assert text in str(info.value) and f"{file} record 3" in str(info.value)
    assert info.value.leaf == leaf


def test_bad_crc_named(mixed_path: str, tmp_path: Any) -> None:
    path = _copy(mixed_path, tmp_path)
    file = os.path.join(path, superserial.read_header(path).shards[0].file)
    data = bytearray(Path(file).read_bytes())
    offsets = record_offsets(file, len(data))
    data[int(offsets[4]) + 14] ^= 0x04  # a payload byte of record 4, CRC left alone
    Path(file).write_bytes(data)
    for read in (lambda: list(ssnp.iter_batches(path, 2)), lambda: list(ssnp.load(path))):
        with pytest.raises(CorruptDataError, match="corrupted record") as info:
            read()
        assert f"{file} record 4" in str(info.value)


def test_mixed_batch_falls_back(mixed_path: str, tmp_path: Any) -> None:
    """A record in another (valid) wire form: its batch is parsed per record, the others fast."""
    path = _copy(mixed_path, tmp_path)
    want = [tf.nest.flatten(b) for b in ssnp.iter_batches(path, 2)]

    def reorder(rec: bytearray) -> None:
        # Entries "a" and "f" swapped: the same Example to protobuf, not the canonical order.
        ex = tf.train.Example.FromString(bytes(rec))
        feats = ex.features.feature
        out = b""
        for name in ["f", "a", "r", "s", "u"]:
            entry = tf.train.Features(feature={name: feats[name]}).SerializeToString()
            out += entry
        whole = b"\x0a" + varint(len(out)) + out
        assert len(whole) == len(rec)
        rec[:] = whole

    _patch_record(path, 3, reorder)
    ds = ssnp.load(path)
    fast = BatchDecoder(ds.header)
    assert fast.decode(*ds.records.read_span(0, 2)) is not None
    assert fast.decode(*ds.records.read_span(2, 4)) is None
    got = [tf.nest.flatten(b) for b in ssnp.iter_batches(path, 2)]
    assert [
        [_key(x) if not isinstance(x, list) else [_key(y) for y in x] for x in b] for b in got
    ] == [[_key(x) if not isinstance(x, list) else [_key(y) for y in x] for x in b] for b in want]


def _flat(batch: Any) -> list[Any]:
    return _flat_keys(tf.nest.flatten(batch))


def test_get_batch_fast_as_per_record(mixed_path: str, tmp_path: Any) -> None:
    """``get_batch`` decodes vectorized; a record in another form, or damaged, goes per record."""
    idx = [4, 0, 2, 2, -1]
    ds = ssnp.load(mixed_path)
    got = ds.get_batch(idx)
    assert ds._batch_hits == 1  # the vectorized decoder took it
    ref = ssnp.load(mixed_path)
    ref._fast.supported = False  # the per-record path, as a reference
    assert _flat(got) == _flat(ref.get_batch(idx))

    path = _copy(mixed_path, tmp_path)
    want = _flat(ssnp.load(path).get_batch([3, 1]))

    def reorder(rec: bytearray) -> None:  # entries "a" and "f" swapped: valid, not canonical
        feats = tf.train.Example.FromString(bytes(rec)).features.feature
        out = b"".join(
            tf.train.Features(feature={k: feats[k]}).SerializeToString()
            for k in ["f", "a", "r", "s", "u"]
        )
        rec[:] = b"\x0a" + varint(len(out)) + out

    file = _patch_record(path, 3, reorder)
    ds = ssnp.load(path)
    assert _flat(ds.get_batch([3, 1])) == want and ds._batch_misses == 1
    _patch_record(path, 3, _rename_key)
    with pytest.raises(CorruptDataError, match="expected a feature 'u'") as info:
        ssnp.load(path).get_batch([1, 3])
    assert f"{file} record 3" in str(info.value) and info.value.leaf == "u"


# ---------------------------------------------------------- records of one layout


def _even(e: Any, shape: tuple[int, ...], n: int, k: int) -> np.ndarray:
    """``values`` made to give every record the same length: strings of one length,
    and integers stored as varints of one size (negative: 10 bytes; else 1 byte)."""
    v = values(e, shape, n, k)
    if e.name == "string":
        return np.array([bytes([b, 255 - b]) for b in range(v.size)], dtype=object).reshape(v.shape)
    if e.name == "bool" or not e.is_integer:
        return v
    if np.iinfo(e.numpy).min < 0:
        return -(np.abs(v.astype(np.int64)) % 100) - 1
    return v % 100


def _one_length(path: str) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Every record of ``path``'s one shard, read together, checked to be of one length."""
    buf, starts, ends = ssnp.load(path).records.read_span(0, len(ssnp.load(path)))
    assert len(set((ends - starts).tolist())) == 1, "the fixture's records differ in length"
    return buf, starts, ends


@pytest.fixture(scope="module")
def even_path(tmp_path_factory: Any) -> str:
    """N records of one length: a [2, 3] leaf of every dtype, and a scalar one."""
    path = str(tmp_path_factory.mktemp("batch") / "even")
    return _every_dtype(path, _even, {"scalar": (), "matrix": (2, 3)})


@pytest.fixture(scope="module")
def small_even_path(tmp_path_factory: Any) -> str:
    """Small records of one length: 2-byte and 10-byte varints, raw, float and strings."""
    n = 5
    cols = {
        "a": np.arange(n, dtype=np.int8) - 50,
        "f": np.arange(2 * n, dtype=np.float32).reshape(n, 2) / 3,
        "l": np.arange(n, dtype=np.int64) + 1000,
        "s": np.array([[b"ab", b"c"], [b"\xff\x00", b"\x80"]] * 2 + [[b"zz", b"y"]], dtype=object),
        "u": np.arange(3 * n, dtype=np.uint8).reshape(n, 3),
    }
    path = str(tmp_path_factory.mktemp("batch") / "small_even")
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), path, progress=False)
    return path


def _cut(decoder: BatchDecoder, monkeypatch: Any) -> list[int]:
    """Counts the batches ``decoder`` cut by a template (not parsed field by field)."""
    cut = [0]
    by_template = decoder._by_template

    def counted(*args: Any) -> Any:
        out = by_template(*args)
        cut[0] += out is not None
        return out

    monkeypatch.setattr(decoder, "_by_template", counted)
    return cut


def test_one_layout_cut_as_per_record(even_path: str, monkeypatch: Any) -> None:
    """Records of one layout are cut by offsets, in any order and with repeats, to the
    values the per-record parser gives: every dtype, int64 varints of 1 and 10 bytes."""
    ds = ssnp.load(even_path)
    buf, starts, ends = _one_length(even_path)
    fast, slow = BatchDecoder(ds.header), RecordDecoder(ds.header)
    parsed = BatchDecoder(ds.header, templates=False)
    cut, never = _cut(fast, monkeypatch), _cut(parsed, monkeypatch)
    for pick in ([0, 1, 2, 3, 4, 5, 6], [4, 0, 2, 2, 6], [6, 5]):
        got = fast.decode(buf, starts[pick], ends[pick])
        records = [buf[starts[i] : ends[i]] for i in pick]
        assert got is not None
        assert _flat_keys(got) == _flat_keys(slow.decode(records, [f"r{i}" for i in pick]))
        assert _flat_keys(got) == _flat_keys(parsed.decode(buf, starts[pick], ends[pick]))
    assert cut[0] == 3 and never[0] == 0


@pytest.mark.parametrize("record", [0, 2])
@pytest.mark.parametrize("change", ["flip", 0x00, 0x80, 0xFF])
def test_altered_byte_of_one_layout_declines_or_agrees(
    small_even_path: str, change: Any, record: int
) -> None:
    """Every byte of a record of one layout altered (the template's own record too):
    the decoder declines, or gives the parser's values."""
    _one_length(small_even_path)
    _alter_each_byte(small_even_path, change, record)


def test_same_length_other_layout_as_per_record(tmp_path: Any, monkeypatch: Any) -> None:
    """Records of one length whose varints differ in size (1 + 2 bytes, 2 + 1), or whose
    entries come in another order: not cut by record 0's template; parsed, or declined."""
    cols = {"a": np.array([1, 300, 2, 3], np.int64), "b": np.array([300, 1, 400, 500], np.int64)}
    path = str(tmp_path / "swap")
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), path, progress=False)
    ds = ssnp.load(path)
    buf, starts, ends = _one_length(path)
    fast, slow = BatchDecoder(ds.header), RecordDecoder(ds.header)
    cut = _cut(fast, monkeypatch)
    got = fast.decode(buf, starts, ends)
    records = [buf[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    assert got is not None and cut[0] == 0
    assert _flat_keys(got) == _flat_keys(slow.decode(records, ["r0", "r1", "r2", "r3"]))
    assert [x.tolist() for x in got] == [[1, 300, 2, 3], [300, 1, 400, 500]]

    def reorder(rec: bytearray) -> None:  # entries "a" and "b" swapped: valid, not canonical
        feats = tf.train.Example.FromString(bytes(rec)).features.feature
        out = b"".join(
            tf.train.Features(feature={k: feats[k]}).SerializeToString() for k in ["b", "a"]
        )
        rec[:] = b"\x0a" + varint(len(out)) + out

    path = _copy(path, tmp_path)
    _patch_record(path, 1, reorder)
    buf, starts, ends = ssnp.load(path).records.read_span(0, 4)
    pick = [3, 2, 0]  # of one layout (a + b: 1 + 2 bytes)
    got = fast.decode(buf, starts[pick], ends[pick])
    assert got is not None and cut[0] == 1
    assert [x.tolist() for x in got] == [[3, 2, 1], [500, 400, 300]]
    assert fast.decode(buf, starts, ends) is None  # record 1 not canonical: declined
    assert fast.decode(buf, starts[[0, 1]], ends[[0, 1]]) is None

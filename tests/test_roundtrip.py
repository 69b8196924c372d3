"""Round trips: every dtype x shape x structure comes back bit for bit."""

from __future__ import annotations

import collections
import struct

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import assert_same_dataset
from matrix import SHAPES, values
from superserial.format import dtypes


def _nan_payloads_f32(n: int) -> np.ndarray:
    # Quiet and signalling NaNs with payloads, and -0.0: must survive bit for bit.
    bits = [0x7FC00001, 0x7F800001, 0xFFC0BEEF, 0x80000000, 0x7FBFFFFF]
    return np.array([bits[i % len(bits)] for i in range(n)], dtype=np.uint32).view(np.float32)


@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("entry", dtypes.DTYPES, ids=lambda d: d.name)
def test_every_dtype_and_shape(entry, shape_name, ds_path):
    vals = values(entry, SHAPES[shape_name], 7)
    tensor = tf.constant(vals, dtype=tf.as_dtype(entry.name))
    ds = tf.data.Dataset.from_tensor_slices({"x": tensor, "i": tf.range(7, dtype=tf.int64)})
    header = superserial.save(ds, ds_path)
    assert header.element_count == 7
    assert_same_dataset(ds, superserial.load(ds_path))


@pytest.mark.parametrize("entry", dtypes.DTYPES, ids=lambda d: d.name)
def test_every_dtype_ragged_and_unknown_dims(entry, ds_path):
    vals = values(entry, (), 10)
    flat = tf.constant(vals, dtype=tf.as_dtype(entry.name))
    ragged = tf.RaggedTensor.from_row_lengths(flat, [3, 0, 2, 5])
    ds = tf.data.Dataset.from_tensor_slices(ragged)
    dense_unknown = ds.map(lambda r: tf.reshape(r, [-1, 1]))  # TensorSpec([None, 1])
    nested = tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_lengths(ragged, [2, 0, 2]))
    both = tf.data.Dataset.zip((ds, dense_unknown, nested.repeat(2).take(4)))
    superserial.save(both, ds_path)
    assert_same_dataset(both, superserial.load(ds_path))


def test_float_bits_survive(ds_path):
    f32 = _nan_payloads_f32(10)
    f64 = np.array(
        [0x7FF0000000000001, 0xFFF8DEADBEEF0001, 0x8000000000000000] * 3, np.uint64
    ).view(np.float64)
    f16 = np.array([0x7C01, 0xFE01, 0x8000] * 3, np.uint16).view(np.float16)
    ds = tf.data.Dataset.from_tensor_slices((f32[:9], f64, f16))
    superserial.save(ds, ds_path)
    got = list(superserial.load(ds_path).as_numpy_iterator())
    assert (
        np.array([g[0] for g in got]).view(np.uint32).tolist() == f32[:9].view(np.uint32).tolist()
    )
    assert np.array([g[1] for g in got]).view(np.uint64).tolist() == f64.view(np.uint64).tolist()
    assert np.array([g[2] for g in got]).view(np.uint16).tolist() == f16.view(np.uint16).tolist()


def test_uint64_full_range_and_strings_with_nul(ds_path):
    u = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
    s = np.array([b"", b"\x00", b"a\x00b", bytes(range(256))], dtype=object)
    ds = tf.data.Dataset.from_tensor_slices({"u": u, "s": s})
    superserial.save(ds, ds_path)
    got = list(superserial.load(ds_path).as_numpy_iterator())
    assert [int(g["u"]) for g in got] == [0, 1, 2**63, 2**64 - 1]
    assert [g["s"] for g in got] == list(s)


def test_lengths_needing_varints_of_every_size(ds_path):
    # The graph encoder works out each length-delimited field's varint in graph: lengths
    # just under and over each varint size (1 to 4 bytes) at every level of the message,
    # read back by TF and by the TF-free parser, which share no decoding code.
    sizes = [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152]
    strings = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    floats = tf.RaggedTensor.from_row_lengths(
        tf.range(sum(n // 4 for n in sizes), dtype=tf.float32), [n // 4 for n in sizes]
    )
    ds = tf.data.Dataset.from_tensor_slices({"s": strings, "f": floats})
    superserial.save(ds, ds_path)
    assert_same_dataset(ds, superserial.load(ds_path))
    got = list(ssnp.load(ds_path))
    assert [e["s"].item() for e in got] == strings
    assert [e["f"].tolist() for e in got] == floats.to_list()


Point = collections.namedtuple("Point", ["x", "y"])


def _structures() -> dict[str, tf.data.Dataset]:
    n = 5
    ints = tf.range(n, dtype=tf.int32)
    return {
        "single": tf.data.Dataset.from_tensor_slices(ints),
        "tuple": tf.data.Dataset.from_tensor_slices((ints, tf.cast(ints, tf.float64))),
        "dict": tf.data.Dataset.from_tensor_slices({"a": ints, "b": tf.strings.as_string(ints)}),
        "nested": tf.data.Dataset.from_tensor_slices(
            {"outer": {"inner": (ints, {"deep": tf.cast(ints, tf.uint8)})}, "t": (ints,)}
        ),
        "odd_keys": tf.data.Dataset.from_tensor_slices(
            {"a/b": ints, "with space": ints, "dot.ted": ints, "ünï": ints, "~0": ints, "": ints}
        ),
        "namedtuple": tf.data.Dataset.from_tensor_slices(Point(ints, tf.cast(ints, tf.bfloat16))),
        "namedtuple_in_dict": tf.data.Dataset.from_tensor_slices({"p": Point(ints, ints)}),
    }


@pytest.mark.parametrize("name", list(_structures()))
def test_structures(name, ds_path):
    ds = _structures()[name]
    superserial.save(ds, ds_path)
    loaded = superserial.load(ds_path)
    assert_same_dataset(ds, loaded)
    if name.startswith("namedtuple"):
        first = next(iter(loaded))
        point = first if name == "namedtuple" else first["p"]
        assert type(point).__name__ == "Point" and point._fields == ("x", "y")


def test_unknown_dims_from_generator(ds_path):
    def gen():
        for i in range(6):
            yield np.full((i, 3), i, np.float32), np.ones((i % 3, i % 2), np.int16)

    ds = tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            tf.TensorSpec([None, 3], tf.float32),
            tf.TensorSpec([None, None], tf.int16),
        ),
    )
    superserial.save(ds, ds_path)
    assert_same_dataset(ds, superserial.load(ds_path))


def test_partial_last_batch(ds_path):
    ds = tf.data.Dataset.range(10).batch(4)  # [None] elements, last has 2
    superserial.save(ds, ds_path)
    loaded = superserial.load(ds_path)
    assert_same_dataset(ds, loaded)
    assert [len(x) for x in loaded] == [4, 4, 2]


@pytest.mark.parametrize("ragged_rank", [0, 1, 2])
def test_ragged_from_slices(ragged_rank, ds_path):
    rt = tf.ragged.constant(
        [[[[1, 2], [3]], [[]]], [], [[[4, 5, 6]]], [[[7]], [[8], [9, 10]]]],
        dtype=tf.int64,
        ragged_rank=3,
    )
    # rt has ragged_rank 3, so its slices have 2; merge dims for fewer.
    if ragged_rank == 1:
        rt = rt.merge_dims(2, 3)
    elif ragged_rank == 0:
        rt = tf.RaggedTensor.from_row_lengths(rt.flat_values, [3, 0, 4, 3])
    ds = tf.data.Dataset.from_tensor_slices(rt)
    assert ds.element_spec.ragged_rank == ragged_rank
    superserial.save(ds, ds_path)
    assert_same_dataset(ds, superserial.load(ds_path))


def test_ragged_batch_and_uniform_inner_dims(ds_path):
    ds = (
        tf.data.Dataset.range(9)
        .map(lambda i: tf.fill([i % 4, 2], tf.cast(i, tf.float32)))
        .ragged_batch(4)
    )
    assert ds.element_spec.ragged_rank == 1
    superserial.save(ds, ds_path)
    assert_same_dataset(ds, superserial.load(ds_path))


def test_ragged_int32_row_splits(ds_path):
    rt = tf.RaggedTensor.from_row_lengths(tf.range(6), tf.constant([2, 0, 4], tf.int32))
    ds = tf.data.Dataset.from_tensors(rt).repeat(3)
    assert ds.element_spec.row_splits_dtype == tf.int32
    superserial.save(ds, ds_path)
    assert_same_dataset(ds, superserial.load(ds_path))


def test_sparse(ds_path):
    sp = tf.sparse.SparseTensor([[0, 1], [1, 2], [3, 0]], [1.5, -0.0, 3.0], [4, 5])
    fixed = tf.data.Dataset.from_tensor_slices(sp)  # SparseTensorSpec([5])

    def gen():
        for i in range(4):
            idx = np.array([[0, i]] if i else np.zeros((0, 2)), np.int64)
            yield tf.sparse.SparseTensor(idx, tf.constant([b"v"] * len(idx), tf.string), [1, i + 1])

    unknown = tf.data.Dataset.from_generator(
        gen, output_signature=tf.SparseTensorSpec([None, None], tf.string)
    )
    ds = tf.data.Dataset.zip((fixed, unknown))
    superserial.save(ds, ds_path)
    assert_same_dataset(ds, superserial.load(ds_path))


def test_empty_dataset(ds_path):
    ds = tf.data.Dataset.from_tensor_slices({"x": np.zeros((0, 3), np.float64)})
    header = superserial.save(ds, ds_path)
    assert header.element_count == 0
    loaded = superserial.load(ds_path)
    assert loaded.element_spec == ds.element_spec
    assert len(loaded) == 0 and list(loaded) == []


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_shards_and_compression(compression, num_shards, ds_path):
    ds = tf.data.Dataset.range(50).map(lambda i: {"i": i, "f": tf.cast(i, tf.float32) / 3})
    header = superserial.save(ds, ds_path, compression=compression, num_shards=num_shards)
    assert len(header.shards) == num_shards
    assert sum(s.records for s in header.shards) == 50
    assert header.compression == compression
    assert_same_dataset(ds, superserial.load(ds_path))


def test_shard_size_rotation(ds_path):
    ds = tf.data.Dataset.range(3000).map(lambda i: tf.fill([64], i))
    header = superserial.save(ds, ds_path, shard_size=200_000)
    assert len(header.shards) > 1
    assert all(s.bytes < 200_000 * 1.5 for s in header.shards)
    assert_same_dataset(ds, superserial.load(ds_path))


def test_cardinality_and_len(ds_path):
    ds = tf.data.Dataset.range(17).filter(lambda i: i % 2 == 0)  # unknown cardinality
    superserial.save(ds, ds_path)
    loaded = superserial.load(ds_path)
    assert len(loaded) == 9
    assert int(loaded.cardinality()) == 9


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batch_size_matches_batch(drop_remainder, ds_path):
    ragged = tf.RaggedTensor.from_row_lengths(tf.range(10), [*[i % 3 for i in range(10)][:9], 1])
    ds = tf.data.Dataset.zip(
        {
            "x": tf.data.Dataset.range(10).map(lambda i: tf.fill([2], tf.cast(i, tf.uint8))),
            "r": tf.data.Dataset.from_tensor_slices(ragged),
        }
    )
    superserial.save(ds, ds_path)
    direct = superserial.load(ds_path, batch_size=4, drop_remainder=drop_remainder)
    assert_same_dataset(ds.batch(4, drop_remainder=drop_remainder), direct)
    assert len(direct) == (2 if drop_remainder else 3)


def test_batch_size_with_unknown_dims_falls_back(ds_path):
    ds = (
        tf.data.Dataset.range(6)
        .map(lambda i: tf.fill([2, 2], i))
        .map(lambda x: tf.ensure_shape(tf.reshape(x, [-1]), [None]))
    )
    superserial.save(ds, ds_path)
    assert_same_dataset(ds.batch(4), superserial.load(ds_path, batch_size=4))


def test_nondeterministic_and_shuffle_files_keep_the_multiset(ds_path):
    ds = tf.data.Dataset.range(100)
    superserial.save(ds, ds_path, num_shards=4)
    a = sorted(int(x) for x in superserial.load(ds_path, deterministic=False))
    b = sorted(int(x) for x in superserial.load(ds_path, shuffle_files=True, seed=1))
    assert a == b == list(range(100))


def test_shard_option_partitions(ds_path):
    superserial.save(tf.data.Dataset.range(40), ds_path, num_shards=5)
    parts = [[int(x) for x in superserial.load(ds_path, shard=(i, 2))] for i in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(40))
    assert set(parts[0]).isdisjoint(parts[1])
    assert len(superserial.load(ds_path, shard=(0, 2))) == len(parts[0])


def test_header_file_is_sorted_indented_json(ds_path):
    superserial.save(tf.data.Dataset.range(3), ds_path)
    with open(f"{ds_path}/header.json", encoding="utf-8") as f:
        text = f.read()
    import json

    obj = json.loads(text)
    assert text == json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert obj["format_version"] == 1
    assert superserial.read_header(ds_path).element_count == 3


def test_records_are_plain_examples_readable_with_obvious_features(ds_path):
    ds = tf.data.Dataset.from_tensor_slices(
        {
            "img": np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
            "label": np.array([7, 9], np.int64),
            "score": np.array([0.5, 1.5], np.float32),
            "name": np.array([b"a", b"b"]),
        }
    )
    superserial.save(ds, ds_path)
    files = tf.io.gfile.glob(f"{ds_path}/data-*.tfrecord")
    raw = (
        tf.data.TFRecordDataset(files)
        .batch(2)
        .map(
            lambda s: tf.io.parse_example(
                s,
                {
                    "img": tf.io.FixedLenFeature([], tf.string),
                    "label": tf.io.FixedLenFeature([], tf.int64),
                    "score": tf.io.FixedLenFeature([], tf.float32),
                    "name": tf.io.FixedLenFeature([], tf.string),
                },
            )
        )
    )
    got = next(iter(raw))
    assert (
        tf.io.decode_raw(got["img"], tf.uint8).numpy().reshape(2, 3, 4).tolist()
        == np.arange(24).reshape(2, 3, 4).tolist()
    )
    assert got["label"].numpy().tolist() == [7, 9]
    assert got["score"].numpy().tolist() == [0.5, 1.5]
    assert struct.pack("<f", 0.5) == np.float32(0.5).tobytes()


def test_ragged_rows_holding_no_values(ds_path):
    # [None, None, 0]: rows of zero-size inner dims (TF 2.21 cannot unbatch them).
    rt = tf.RaggedTensor.from_row_lengths(tf.zeros([5, 0]), [2, 0, 3])
    ds = tf.data.Dataset.from_tensors(rt).repeat(3)
    superserial.save(ds, ds_path)
    assert_same_dataset(ds, superserial.load(ds_path))
    assert_same_dataset(ds.batch(2), superserial.load(ds_path, batch_size=2))

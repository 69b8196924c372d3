"""Bad input to save and load: a clear error naming what is wrong, nothing lost."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import superserial
from conftest import assert_same_dataset
from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetNotFoundError,
    FormatVersionError,
    HeaderError,
    SuperserialError,
    UnsupportedError,
)


@pytest.mark.parametrize("thing", [[1, 2, 3], np.zeros(3), tf.zeros(3), "path"])
def test_save_of_a_non_dataset_is_a_type_error(thing, ds_path):
    with pytest.raises(TypeError, match=r"expected a tf\.data\.Dataset, got"):
        superserial.save(thing, ds_path)
    assert not os.path.exists(ds_path)


def test_a_non_dataset_is_also_a_superserial_error(ds_path):
    """``except SuperserialError`` catches it, in every writer that takes a dataset."""
    with pytest.raises(SuperserialError, match=r"expected a tf\.data\.Dataset, got builtins\.list"):
        superserial.save([1, 2, 3], ds_path)
    with pytest.raises(UnsupportedError, match=r"got builtins\.list"):
        superserial.save([1, 2, 3], ds_path, shard_index=0, num_shards=2)
    superserial.save(tf.data.Dataset.range(3), ds_path)
    with pytest.raises(UnsupportedError, match=r"got builtins\.list"):
        superserial.append([4, 5], ds_path)
    assert superserial.read_header(ds_path).element_count == 3


@pytest.mark.parametrize(
    "make, where",
    [
        (lambda: tf.data.Dataset.range(4).window(2), "<element>"),
        (
            lambda: tf.data.Dataset.range(3).map(
                lambda x: {"opt": tf.experimental.Optional.from_value(x)}
            ),
            "opt",
        ),
        (lambda: tf.data.Dataset.range(3).map(lambda x: (x, tf.data.Dataset.range(x))), "1"),
        (lambda: tf.data.Dataset.from_tensors({"q": tf.zeros([2], tf.qint8)}), "q"),
    ],
)
def test_unsupported_leaves_name_their_path(make, where, ds_path):
    with pytest.raises(UnsupportedError, match=f"at {where}"):
        superserial.save(make(), ds_path)
    assert not os.path.exists(ds_path)


def test_infinite_dataset_is_refused(ds_path):
    with pytest.raises(ValueError, match="finite"):
        superserial.save(tf.data.Dataset.range(3).repeat(), ds_path)


def test_existing_path_needs_overwrite_and_old_data_survives_until_done(ds_path):
    old = tf.data.Dataset.range(5)
    superserial.save(old, ds_path)
    with pytest.raises(DatasetExistsError, match="overwrite"):
        superserial.save(tf.data.Dataset.range(7), ds_path)
    assert_same_dataset(old, superserial.load(ds_path))

    def failing():
        yield 1
        raise RuntimeError("source broke")

    bad = tf.data.Dataset.from_generator(failing, output_signature=tf.TensorSpec([], tf.int64))
    with pytest.raises(Exception, match="source broke"):
        superserial.save(bad, ds_path, overwrite=True)
    assert_same_dataset(old, superserial.load(ds_path))
    new = tf.data.Dataset.range(9)
    superserial.save(new, ds_path, overwrite=True)
    assert_same_dataset(new, superserial.load(ds_path))
    leftovers = [
        n for n in os.listdir(os.path.dirname(ds_path)) if n != "ds" and not n.endswith("lock")
    ]
    assert leftovers == [], leftovers


def test_overwrite_refuses_to_delete_a_directory_that_is_not_a_dataset(tmp_path):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(DatasetExistsError, match="refusing"):
        superserial.save(tf.data.Dataset.range(2), str(precious), overwrite=True)
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_failed_save_leaves_nothing_that_looks_valid(ds_path):
    def failing():
        for i in range(5000):
            if i == 3000:
                raise ValueError("boom at 3000")
            yield i

    ds = tf.data.Dataset.from_generator(failing, output_signature=tf.TensorSpec([], tf.int64))
    with pytest.raises(Exception, match="boom at 3000"):
        superserial.save(ds, ds_path)
    assert not os.path.exists(ds_path)
    with pytest.raises(DatasetNotFoundError):
        superserial.load(ds_path)


def test_load_of_a_missing_path_names_it(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(DatasetNotFoundError, match="nowhere"):
        superserial.load(missing)
    with pytest.raises(FileNotFoundError):
        superserial.read_header(missing)


def _edit_header(path: str, fn) -> None:
    hp = os.path.join(path, "header.json")
    with open(hp, encoding="utf-8") as f:
        obj = json.load(f)
    fn(obj)
    with open(hp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


@pytest.fixture
def saved(ds_path):
    ds = tf.data.Dataset.from_tensor_slices(
        {"image": np.arange(60, dtype=np.float64).reshape(5, 3, 4), "label": np.arange(5)}
    )
    superserial.save(ds, ds_path)
    return ds_path


def test_unknown_format_version(saved):
    _edit_header(saved, lambda h: h.__setitem__("format_version", 99))
    with pytest.raises(FormatVersionError, match="expected format_version 1, got 99"):
        superserial.load(saved)


@pytest.mark.parametrize("leaf, shape", [("image", [5, 3]), ("image", [3]), ("label", [2])])
def test_header_with_wrong_shape_names_the_leaf(saved, leaf, shape):
    # (A shape with the same number of values, [4, 3] for [3, 4], cannot be told
    # from the records: the README says so.)
    _edit_header(saved, lambda h: h["structure"]["items"][leaf].__setitem__("shape", shape))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"at {leaf}|{leaf}"):
        list(superserial.load(saved))


def test_header_with_a_missing_feature_names_it(saved):
    def rename(h):
        leaf = h["structure"]["items"]["label"]
        h["structure"]["items"]["lbl"] = dict(leaf, name="lbl", features={"values": "lbl"})
        del h["structure"]["items"]["label"]

    _edit_header(saved, rename)
    with pytest.raises(tf.errors.InvalidArgumentError, match="lbl"):
        list(superserial.load(saved))


def test_header_claiming_more_records_is_an_error(saved):
    def more(h):
        h["element_count"] += 1
        h["shards"][0]["records"] += 1

    _edit_header(saved, more)
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain 6"):
        list(superserial.load(saved))


def test_truncated_record_file_is_an_error(saved):
    header = superserial.read_header(saved)
    shard = os.path.join(saved, header.shards[0].file)
    with open(shard, "r+b") as f:
        f.truncate(header.shards[0].bytes - 10)
    with pytest.raises(CorruptDataError, match=header.shards[0].file):
        superserial.load(saved)
    # Even with the header's size patched to match, the record layer catches it.
    _edit_header(saved, lambda h: h["shards"][0].__setitem__("bytes", header.shards[0].bytes - 10))
    with pytest.raises(
        (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.FailedPreconditionError)
    ):
        list(superserial.load(saved))


def test_corrupted_payload_is_an_error(saved):
    header = superserial.read_header(saved)
    shard = os.path.join(saved, header.shards[0].file)
    with open(shard, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0x40
        f.seek(0)
        f.write(bytes(data))
    with pytest.raises(tf.errors.DataLossError, match="corrupted record"):
        list(superserial.load(saved))


@pytest.mark.parametrize("name", ["../outside.tfrecord", "/etc/passwd", "a/b.tfrecord", ".."])
def test_shard_names_escaping_the_directory_are_refused(saved, name):
    _edit_header(saved, lambda h: h["shards"][0].__setitem__("file", name))
    with pytest.raises(HeaderError, match="plain file name"):
        superserial.load(saved)


@pytest.mark.parametrize("batch_size", [None, 2])
@pytest.mark.parametrize("dtype", ["int8", "uint16", "bool"])
def test_stored_int64_outside_the_dtype_is_an_error(ds_path, dtype, batch_size):
    # Saved as int64 (stored as int64, as the narrow dtypes are), then the
    # header says a narrower dtype: the in-graph decode must not wrap 300.
    superserial.save(
        tf.data.Dataset.from_tensor_slices({"n": np.array([0, 1, 300, -1, 1])}), ds_path
    )
    _edit_header(ds_path, lambda h: h["structure"]["items"]["n"].__setitem__("dtype", dtype))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=rf"expected {dtype} values in .* at n"
    ):
        list(superserial.load(ds_path, batch_size=batch_size))


@pytest.mark.parametrize("batch_size", [None, 2])
def test_raw_values_of_another_size_are_an_error(ds_path, batch_size):
    superserial.save(tf.data.Dataset.from_tensor_slices({"u": np.zeros((5, 3), np.uint8)}), ds_path)
    _edit_header(ds_path, lambda h: h["structure"]["items"]["u"].__setitem__("shape", [4]))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"expected 4 bytes per element.* at u"
    ):
        list(superserial.load(ds_path, batch_size=batch_size))

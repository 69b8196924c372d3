"""Any path tf.io.gfile supports works: tested with the in-memory ram:// filesystem."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tensorflow as tf

import superserial
from conftest import assert_same_dataset


@pytest.fixture
def ram_path():
    path = f"ram://superserial-test-{uuid.uuid4().hex}/ds"
    yield path
    if tf.io.gfile.exists(path.rsplit("/", 1)[0]):
        tf.io.gfile.rmtree(path.rsplit("/", 1)[0])


def test_save_load_inspect_verify_on_ram(ram_path):
    ds = tf.data.Dataset.from_tensor_slices(
        {
            "x": np.arange(40, dtype=np.float64).reshape(10, 4),
            "r": tf.ragged.constant([[1]] * 5 + [[]] * 5),
        }
    )
    header = superserial.save(ds, ram_path, num_shards=2, compression="GZIP")
    assert tf.io.gfile.exists(f"{ram_path}/header.json")
    assert superserial.read_header(ram_path) == header
    assert_same_dataset(ds, superserial.load(ram_path))
    report = superserial.verify(ram_path)
    assert report.ok, report.summary()


def test_overwrite_and_exists_on_ram(ram_path):
    superserial.save(tf.data.Dataset.range(3), ram_path)
    with pytest.raises(superserial.DatasetExistsError):
        superserial.save(tf.data.Dataset.range(4), ram_path)
    superserial.save(tf.data.Dataset.range(5), ram_path, overwrite=True)
    assert [int(x) for x in superserial.load(ram_path)] == list(range(5))
    leftovers = [n for n in tf.io.gfile.listdir(ram_path.rsplit("/", 1)[0]) if "tmp" in n]
    assert leftovers == []


def test_missing_ram_path_names_it():
    with pytest.raises(superserial.DatasetNotFoundError, match="nothing-here"):
        superserial.load("ram://nothing-here/ds")


def test_index_verify_and_build_index_on_ram(ram_path):
    """Indexes are written, read at random, checked and rebuilt through the filesystem layer."""
    import superserial.numpy as ssnp

    header = superserial.save(tf.data.Dataset.range(20), ram_path, num_shards=2)
    assert all(s.index is not None for s in header.shards)
    assert [int(ssnp.load(ram_path)[i]) for i in (0, 10, 19, -1)] == [0, 10, 19, 19]
    damaged = f"{ram_path}/{header.shards[1].index.file}"
    tf.io.gfile.remove(damaged)
    with pytest.raises(superserial.CorruptDataError, match="found no file"):
        ssnp.load(ram_path)[15]
    report = superserial.verify(ram_path)
    assert [p.file for p in report.problems] == [damaged]
    assert superserial.build_index(ram_path) == header
    assert superserial.verify(ram_path).ok
    assert [int(x) for x in ssnp.load(ram_path).get_elements([15, 3])] == [15, 3]
    leftovers = [n for n in tf.io.gfile.listdir(ram_path) if "tmp" in n or "lock" in n]
    assert leftovers == []

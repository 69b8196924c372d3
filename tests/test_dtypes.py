"""The dtype table is the single source of truth: check every entry against TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from superserial.format import dtypes


@pytest.mark.parametrize("entry", dtypes.DTYPES, ids=lambda d: d.name)
def test_entry_matches_tensorflow(entry):
    tf_dtype = tf.as_dtype(entry.name)
    assert tf_dtype.as_datatype_enum == entry.enum
    assert dtypes.by_enum(entry.enum) is entry
    assert dtypes.by_name(entry.name) is entry
    assert entry.stored in dtypes.STORED_KINDS
    if entry.name != "string":
        assert np.dtype(tf_dtype.as_numpy_dtype) == entry.numpy
        assert entry.itemsize == tf_dtype.size


@pytest.mark.parametrize("entry", dtypes.DTYPES, ids=lambda d: d.name)
def test_stored_kind_is_lossless(entry):
    """Natural list kinds only where every value survives them bit for bit."""
    if entry.stored == "int64":
        info = np.iinfo(np.uint8 if entry.name == "bool" else entry.numpy)
        assert np.iinfo(np.int64).min <= info.min and info.max <= np.iinfo(np.int64).max
    elif entry.stored == "float":
        assert entry.name == "float32"
    elif entry.stored == "bytes":
        assert entry.name == "string"
    else:
        assert entry.stored == "raw" and entry.itemsize > 0


def test_table_covers_every_dtype_tf_datasets_commonly_hold():
    names = {d.name for d in dtypes.DTYPES}
    assert names == {
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "string",
    }  # fmt: skip

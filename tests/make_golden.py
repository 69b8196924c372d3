"""Writes the golden super_serial 2.0 files in tests/golden/ (run once; kept in git).

The files are made the way the 2020 script made them: a YAML header of
{key: {shape, dtype enum}} and one TFRecord file of tf.train.Example records,
int64_list for ints and bools, float_list for floats, bytes_list for strings.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
import yaml

HERE = os.path.join(os.path.dirname(__file__), "golden")


def golden_values() -> dict[str, np.ndarray]:
    """The values stored in the golden files, 4 elements."""
    return {
        "image": np.arange(4 * 2 * 3, dtype=np.float64).reshape(4, 2, 3) / 7,
        "label": np.array([0, 1, -5, 2**40], np.int64),
        "small": np.array([1, 2, 3, 250], np.uint8),
        "flag": np.array([True, False, True, True]),
        "half": np.array([0.5, 1.5, -2.0, 65504], np.float16),
        "name": np.array([b"a", b"", b"\x00z", b"long" * 10], dtype=object),
    }


def golden_v1_dataset() -> tf.data.Dataset:
    """The dataset stored in tests/golden/v1 (format_version 1), 3 elements."""
    rt = tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3, 4, 5], tf.int32), [2, 0, 3])
    sp = tf.sparse.SparseTensor([[0, 1], [2, 0]], tf.constant([1.5, -2.5], tf.float64), [3, 4])
    return tf.data.Dataset.from_tensor_slices(
        {
            "image": np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2),
            "f64": np.array([0.1, -0.0, np.nan]),
            "u64": np.array([0, 2**63, 2**64 - 1], np.uint64),
            "bf16": tf.constant([1.0, -2.0, 3.5], tf.bfloat16),
            "text": np.array([b"a", b"", b"\x00b"], dtype=object),
            "nested": {"a/b": (np.array([1, 2, 3], np.int16), np.array([True, False, True]))},
            "tokens": rt,
            "sparse": sp,
        }
    )


def main() -> None:
    os.makedirs(HERE, exist_ok=True)
    import shutil

    import superserial

    v1 = os.path.join(HERE, "v1")
    shutil.rmtree(v1, ignore_errors=True)
    superserial.save(golden_v1_dataset(), v1, progress=False)
    vals = golden_values()
    header = {}
    for key, arr in vals.items():
        dt = tf.as_dtype(arr.dtype if arr.dtype != object else tf.string)
        header[key] = {"shape": list(arr.shape[1:]), "dtype": dt.as_datatype_enum}
    with open(os.path.join(HERE, "v2.header"), "w") as f:
        yaml.dump(header, stream=f)
    with tf.io.TFRecordWriter(os.path.join(HERE, "v2.tfrecord")) as w:
        for i in range(4):
            feats = {}
            for key, arr in vals.items():
                v = np.asarray(arr[i], dtype=arr.dtype).reshape(-1)
                if arr.dtype == object:
                    feats[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))
                elif np.issubdtype(arr.dtype, np.floating):
                    feats[key] = tf.train.Feature(
                        float_list=tf.train.FloatList(value=v.astype(np.float32))
                    )
                else:
                    feats[key] = tf.train.Feature(
                        int64_list=tf.train.Int64List(value=v.astype(np.int64))
                    )
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())


if __name__ == "__main__":
    main()

"""``gs://`` against a GCS emulator (gcp-storage-emulator on 127.0.0.1), through gcsfs.

TensorFlow registers ``gs://`` itself, but its client has Google's endpoint
built in; with ``STORAGE_EMULATOR_HOST`` set, superserial serves ``gs://`` with
gcsfs, which honours it. So these test the gcsfs path: save (superserial's own
TFRecord writer), streamed ``load``, random access, verify and overwrite.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import assert_same_dataset
from superserial.storage import fs


def _data() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(
        {"x": np.arange(60, dtype=np.int32).reshape(20, 3), "s": [b"v%d" % i for i in range(20)]}
    )


def test_gs_round_trip_on_emulator(gcs_bucket: str) -> None:
    path = f"{gcs_bucket}/ds"
    assert fs.backend_name(path) == "fsspec"
    header = superserial.save(_data(), path, num_shards=2)
    assert_same_dataset(_data(), superserial.load(path))
    got = list(superserial.load(path, shuffle=True, seed=3))
    assert sorted(int(e["x"][0]) for e in got) == list(range(0, 60, 3))
    ds = ssnp.load(path)
    assert [int(ds[i]["x"][0]) for i in (0, 19, 7)] == [0, 57, 21]
    assert superserial.verify(path).ok
    with pytest.raises(superserial.DatasetExistsError):
        superserial.save(_data(), path)
    superserial.save(_data().take(4), path, overwrite=True, compression="GZIP")
    assert_same_dataset(_data().take(4), superserial.load(path))
    old = {f[0] for s in header.shards for f in s.files()}
    assert not old & set(fs.listdir(path))  # the replaced dataset's files are gone

"""super_serial 2.0 pairs: golden files load with their original dtypes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import superserial
from make_golden import HERE, golden_values
from superserial.errors import CorruptDataError, DatasetNotFoundError, HeaderError

TFR = os.path.join(HERE, "v2.tfrecord")
HDR = os.path.join(HERE, "v2.header")


def test_golden_v2_pair_loads_with_original_dtypes():
    ds = superserial.load(TFR, HDR)
    want = golden_values()
    assert {k: s.dtype for k, s in ds.element_spec.items()} == {
        k: tf.as_dtype(v.dtype if v.dtype != object else tf.string) for k, v in want.items()
    }
    assert ds.element_spec["image"].shape == (2, 3)
    got = list(ds.as_numpy_iterator())
    assert len(got) == 4
    for key, arr in want.items():
        stacked = np.stack([g[key] for g in got])
        if key == "image":
            # The old script narrowed float64 to float32: that precision is what the file holds.
            np.testing.assert_array_equal(stacked, arr.astype(np.float32).astype(np.float64))
        elif arr.dtype == object:
            assert stacked.tolist() == arr.tolist()
        else:
            np.testing.assert_array_equal(stacked, arr)
            assert stacked.dtype == arr.dtype


def test_unsafe_yaml_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "bad.header"
    bad.write_text(f"x: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(HeaderError, match=r"bad\.header"):
        superserial.load(TFR, str(bad))
    assert not marker.exists()


@pytest.mark.parametrize(
    "text, match",
    [
        ("- 1\n- 2\n", "mapping"),
        ("x: {shape: [2], dtype: 999}\n", "dtype enum"),
        ("x: {shape: [-1], dtype: 1}\n", "non-negative"),
        ("x: {shape: [1099511627776, 1099511627776], dtype: 1}\n", "at most"),
        ("x: {shape: [1]}\n", "shape, dtype"),
    ],
)
def test_bad_legacy_headers(tmp_path, text, match):
    bad = tmp_path / "h.header"
    bad.write_text(text)
    with pytest.raises(HeaderError, match=match):
        superserial.load(TFR, str(bad))


def test_missing_legacy_files(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"nope\.header"):
        superserial.load(TFR, str(tmp_path / "nope.header"))
    with pytest.raises(DatasetNotFoundError, match=r"nope\.tfrecord"):
        superserial.load(str(tmp_path / "nope.tfrecord"), HDR)


def test_legacy_pair_has_its_record_count_as_cardinality():
    # The 2.0 YAML header holds no count: load counts the file's records.
    ds = superserial.load(TFR, HDR)
    assert len(ds) == 4
    assert ds.cardinality().numpy() == 4
    assert len(ds.batch(3)) == 2


def test_legacy_truncated_file_is_refused_naming_the_record(tmp_path):
    with open(TFR, "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(data[:-5])
    with pytest.raises(CorruptDataError, match=r"truncated file\) at .*cut\.tfrecord record 3 "):
        superserial.load(str(cut), HDR)
    bad = bytearray(data)
    bad[0] ^= 0x01  # the first record's length
    flipped = tmp_path / "flip.tfrecord"
    flipped.write_bytes(bytes(bad))
    with pytest.raises(CorruptDataError, match=r"CRC-32C .* at .*flip\.tfrecord record 0 "):
        superserial.load(str(flipped), HDR)

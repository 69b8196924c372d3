"""The header's ``metadata``: checked as untrusted input, kept by every rewrite of a header.

Appending and building indexes rewrite ``header.json``; neither may drop what a converter
wrote there (class names, the Arrow schema).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import superserial
from superserial.errors import HeaderError
from superserial.format.header import Header
from superserial.write.indexes import build_index

META = {"class_names": {"label": ["cat", "dog"]}, "source": {"format": "parquet", "rows": 6}}


def _text(path: str) -> str:
    with open(os.path.join(path, "header.json")) as f:
        return f.read()


def _with_metadata(path: str, metadata: object) -> None:
    file = os.path.join(path, "header.json")
    obj = json.loads(_text(path))
    obj["metadata"] = metadata
    with open(file, "w") as f:
        json.dump(obj, f)


@pytest.fixture
def saved(tmp_path):
    p = str(tmp_path / "ds")
    ds = tf.data.Dataset.from_tensor_slices({"label": np.arange(6, dtype=np.int64) % 2})
    superserial.save(ds, p, compression="GZIP")
    _with_metadata(p, META)
    return p, ds


def test_metadata_round_trips_through_header_json(saved):
    p, _ = saved
    header = Header.from_json(_text(p))
    assert header.metadata == META
    assert json.loads(header.to_json())["metadata"] == META


def test_an_empty_metadata_is_left_out_of_header_json(tmp_path):
    p = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.range(3), p)
    text = _text(p)
    assert "metadata" not in json.loads(text)
    assert Header.from_json(text).metadata == {}


def test_metadata_that_is_not_an_object_names_the_field(saved):
    p, _ = saved
    _with_metadata(p, [1, 2])
    with pytest.raises(HeaderError, match="metadata"):
        superserial.load(p)


def test_building_indexes_keeps_the_metadata(saved):
    p, _ = saved
    header = build_index(p)
    assert header.metadata == META
    assert Header.from_json(_text(p)).metadata == META


def test_appending_keeps_the_metadata(saved):
    p, ds = saved
    superserial.append(ds, p)
    header = Header.from_json(_text(p))
    assert header.element_count == 12
    assert header.metadata == META


def test_save_writes_the_metadata_it_is_given(tmp_path):
    p = str(tmp_path / "ds")
    header = superserial.save(tf.data.Dataset.range(3), p, metadata=META)
    assert header.metadata == META
    assert json.loads(_text(p))["metadata"] == META


@pytest.mark.parametrize(
    ("metadata", "found"),
    [({"x": {1, 2}}, "JSON values"), ({"x": float("nan")}, "JSON values"), ([1], "list")],
)
def test_save_refuses_metadata_json_cannot_hold(tmp_path, metadata, found):
    p = tmp_path / "ds"
    with pytest.raises(ValueError, match=found):
        superserial.save(tf.data.Dataset.range(3), str(p), metadata=metadata)
    assert not p.exists()
    with pytest.raises(ValueError, match="no metadata with shard_index"):
        superserial.save(
            tf.data.Dataset.range(3), str(p), num_shards=2, shard_index=0, metadata=META
        )

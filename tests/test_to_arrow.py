"""``NumpyDataset.to_arrow`` / ``iter_arrow`` / ``to_hf``: every leaf kind of every dtype.

Each dtype's dataset of every leaf kind (``tests/matrix.py``) is saved once; its Arrow
table must hold, element for element, what the numpy reader gives. The kept Arrow
schema and Hugging Face features of a conversion are restored; what Arrow cannot hold
is an error naming the leaf.
"""

from __future__ import annotations

import base64
import collections
import json
import math
import os
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import run_without
from matrix import SHAPES, N, leaf_kinds_dataset, values
from superserial.errors import HeaderError, UnsupportedError
from superserial.format import dtypes

ARROW_DTYPES = [d for d in dtypes.DTYPES if d.arrow is not None]
# Every leaf kind but sparse (which has no Arrow form; tested below).
KINDS = ["id", "dense", "rag0", "rag1", "rag2", "unknown"]
# Leaves other than fixed-shape dense ones are encoded in graph, about a second each
# on a loaded machine: all their kinds for one dtype of each stored kind (int64, raw,
# float, bytes) and bool; the other dtypes' dense leaves of every shape.
EVERY_KIND = {"bool", "int16", "float64", "float32", "string"}


def _plain(v: Any) -> Any:
    """A numpy reader value as nested Python lists (what ``Table.to_pylist`` gives)."""
    if isinstance(v, ssnp.Ragged):
        return _plain(v.to_list())
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return {str(i): _plain(x) for i, x in enumerate(v)}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: {a} != {b}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert isinstance(b, float), where
        assert (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        ), f"{where}: {a} != {b}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> str:
    # One dataset of every dtype's leaves (a save per dtype would take 13 times as long).
    p = str(tmp_path_factory.mktemp("to_arrow") / "ds")
    each = {}
    for k, entry in enumerate(ARROW_DTYPES):
        if entry.name in EVERY_KIND:
            full = leaf_kinds_dataset(entry, seed=k)
            each[entry.name] = full.map(lambda e: {n: e[n] for n in KINDS})
        else:
            dense = {name: values(entry, shape, N, k) for name, shape in SHAPES.items()}
            dense_ds = tf.data.Dataset.from_tensor_slices(dense)
            each[entry.name] = tf.data.Dataset.zip({"dense": dense_ds})
    superserial.save(tf.data.Dataset.zip(each), p)
    return p


@pytest.mark.parametrize("dtype", [d.name for d in ARROW_DTYPES])
def test_every_leaf_kind_of_every_dtype(saved: str, dtype: str) -> None:
    ds = ssnp.load(saved, select=[dtype])
    table = ds.to_arrow()
    assert table.num_rows == N and table.column_names == [dtype]
    kinds = table.schema.field(dtype).type
    names = [kinds.field(i).name for i in range(kinds.num_fields)]
    assert names == (sorted(KINDS) if dtype in EVERY_KIND else ["dense"])
    arrow = getattr(pa, dtypes.by_name(dtype).arrow)()
    # dense: known shapes are fixed-size lists (a zero dimension a list), scalars plain.
    dense = kinds.field("dense").type
    assert dense.field("scalar").type == arrow
    assert dense.field("vector").type == pa.list_(arrow, 3)
    assert dense.field("matrix").type == pa.list_(pa.list_(arrow, 3), 2)
    assert dense.field("zero_size").type == pa.list_(pa.list_(arrow), 2)
    if dtype in EVERY_KIND:
        assert kinds.field("unknown").type == pa.list_(pa.list_(arrow, 1))
        assert kinds.field("rag0").type == pa.list_(arrow)
        assert kinds.field("rag1").type == pa.list_(pa.list_(arrow))
        assert kinds.field("rag2").type == pa.list_(pa.list_(pa.list_(arrow)))
    rows = table.to_pylist()
    for i, element in enumerate(ds):
        _same(_plain(element), rows[i], f"{dtype} element {i}")


def test_batches_stream_and_join_to_the_table(saved: str) -> None:
    # No float leaves: Table.equals is False on NaN.
    ds = ssnp.load(saved, select=["string", "int16/rag2", "uint8"])
    batches = list(ds.iter_arrow(4))
    assert [b.num_rows for b in batches] == [4, N - 4]
    joined = pa.Table.from_batches(batches)
    assert joined.equals(ds.to_arrow())
    reader = ds.to_arrow_reader(batch_size=2)
    assert reader.read_all().equals(joined)


def test_sparse_is_an_error_naming_the_leaf(tmp_path: Any) -> None:
    p = str(tmp_path / "ds")
    sparse = tf.sparse.SparseTensor([[0, 1], [2, 0]], [1.0, 2.0], [3, 2])
    superserial.save(tf.data.Dataset.from_tensor_slices({"a": {"sp": sparse}}), p)
    with pytest.raises(UnsupportedError, match="sparse leaf 'a/sp'"):
        ssnp.load(p).to_arrow()


@pytest.mark.parametrize("dtype", ["bfloat16", "complex64", "complex128"])
def test_dtypes_arrow_lacks_are_errors_naming_the_leaf(tmp_path: Any, dtype: str) -> None:
    p = str(tmp_path / dtype)
    x = tf.zeros([3, 2], tf.as_dtype(dtype))
    superserial.save(tf.data.Dataset.from_tensor_slices({"x": x}), p)
    with pytest.raises(UnsupportedError, match=f"leaf 'x', found {dtype}"):
        ssnp.load(p).iter_arrow()


Point = collections.namedtuple("Point", ["x", "label"])


@pytest.fixture(scope="module")
def nested(tmp_path_factory: Any) -> str:
    p = str(tmp_path_factory.mktemp("nested") / "ds")
    points = Point(np.arange(8, dtype=np.float32).reshape(4, 2), np.arange(4) % 3)
    element = {"pair": (np.arange(4, dtype=np.int8), [b"a", b"b", b"c", b"d"]), "p": points}
    superserial.save(tf.data.Dataset.from_tensor_slices(element), p)
    return p


def test_tuples_and_namedtuples_are_structs(nested: str) -> None:
    table = ssnp.load(nested).to_arrow()
    assert table.schema.field("pair").type == pa.struct([("0", pa.int8()), ("1", pa.binary())])
    assert table.schema.field("p").type == pa.struct(
        [("x", pa.list_(pa.float32(), 2)), ("label", pa.int64())]
    )
    assert table.to_pylist()[3] == {
        "p": {"x": [6.0, 7.0], "label": 0},
        "pair": {"0": 3, "1": b"d"},
    }


def test_a_single_tensor_is_one_column_named_value(tmp_path: Any) -> None:
    p = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices(np.arange(6, dtype=np.uint16)), p)
    table = ssnp.load(p).to_arrow()
    assert table.column_names == ["value"]
    assert table.column("value").to_pylist() == list(range(6))
    p2 = str(tmp_path / "tuple")
    superserial.save(tf.data.Dataset.from_tensor_slices((np.arange(2), np.ones(2))), p2)
    assert ssnp.load(p2).to_arrow().column_names == ["0", "1"]


# ------------------------------------------------------------------ kept metadata


def _set_metadata(path: str, **metadata: Any) -> None:
    file = os.path.join(path, "header.json")
    with open(file) as f:
        obj = json.load(f)
    obj["metadata"] = metadata
    with open(file, "w") as f:
        json.dump(obj, f)


@pytest.fixture
def labelled(tmp_path: Any) -> str:
    p = str(tmp_path / "ds")
    element = {
        "text": np.array(["é", "b", "c"], dtype=object),
        "tokens": tf.ragged.constant([[1, 2], [], [3]], dtype=tf.int64),
        "label": np.array([0, 2, 1], dtype=np.int64),
    }
    superserial.save(tf.data.Dataset.from_tensor_slices(element), p)
    return p


def test_the_kept_arrow_schema_is_restored(labelled: str) -> None:
    schema = pa.schema(
        [
            pa.field("label", pa.int64(), nullable=False),
            pa.field("text", pa.string()),
            pa.field("tokens", pa.large_list(pa.int64())),
        ],
        metadata={b"origin": b"parquet"},
    )
    kept = base64.b64encode(schema.serialize().to_pybytes()).decode()
    _set_metadata(labelled, arrow_schema=kept)
    table = ssnp.load(labelled).to_arrow()
    assert table.schema.equals(schema, check_metadata=True)
    assert table.column("text").to_pylist() == ["é", "b", "c"]
    assert table.column("tokens").to_pylist() == [[1, 2], [], [3]]
    # select= reads fewer columns: their fields of the kept schema.
    assert ssnp.load(labelled, select=["text"]).to_arrow().schema.field("text").type == pa.string()


@pytest.mark.parametrize(
    ("kept", "said"),
    [
        ("not base64 at all!", "garbage"),
        (base64.b64encode(b"\x00" * 40).decode(), "garbage"),
        (7, "found int"),
        (
            base64.b64encode(pa.schema([("other", pa.int8())]).serialize().to_pybytes()).decode(),
            "found none for",
        ),
        (
            base64.b64encode(
                pa.schema(
                    [("label", pa.int64()), ("text", pa.int32()), ("tokens", pa.int8())]
                ).serialize()
            ).decode(),
            "cast",
        ),
    ],
)
def test_a_bad_kept_schema_is_an_error_naming_the_key(labelled: str, kept: Any, said: str) -> None:
    _set_metadata(labelled, arrow_schema=kept)
    with pytest.raises(HeaderError, match=f"metadata.arrow_schema(.|\n)*{said}"):
        ssnp.load(labelled).to_arrow()


def test_to_hf_gives_class_labels_from_class_names(labelled: str) -> None:
    _set_metadata(labelled, class_names={"label": ["cat", "dog", "fish"]})
    hf = ssnp.load(labelled).to_hf()
    assert isinstance(hf, datasets.Dataset)
    assert hf.features["label"] == datasets.ClassLabel(names=["cat", "dog", "fish"])
    assert hf.features["label"].int2str(hf[1]["label"]) == "fish"
    assert hf["tokens"] == [[1, 2], [], [3]]


def test_to_hf_restores_kept_features_and_streams_to_a_cache(labelled: str, tmp_path: Any) -> None:
    features = datasets.Features(
        {
            "label": datasets.ClassLabel(names=["a", "b", "c"]),
            "text": datasets.Value("string"),
            "tokens": datasets.List(datasets.Value("int32")),
        }
    )
    _set_metadata(labelled, hf_features=features.to_dict())
    in_memory = ssnp.load(labelled).to_hf()
    mapped = ssnp.load(labelled).to_hf(cache_dir=tmp_path / "cache")
    for hf in (in_memory, mapped):
        assert hf.features == features
        assert hf["text"] == ["é", "b", "c"]
    assert in_memory.data.table.equals(mapped.data.table)
    assert len(os.listdir(tmp_path / "cache")) == 1


def test_to_hf_wraps_image_bytes_as_the_image_struct(tmp_path: Any) -> None:
    p = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices({"img": [b"\x89PNG1", b"\x89PNG2"]}), p)
    _set_metadata(p, hf_features={"img": {"_type": "Image"}})
    hf = ssnp.load(p).to_hf()
    assert hf.features["img"] == datasets.Image()
    assert hf.with_format("arrow")["img"].to_pylist() == [
        {"bytes": b"\x89PNG1", "path": None},
        {"bytes": b"\x89PNG2", "path": None},
    ]


@pytest.mark.parametrize(
    "metadata",
    [{"hf_features": "nope"}, {"hf_features": {"label": {"_type": "NoSuchFeature"}}}],
)
def test_bad_kept_features_are_errors_naming_the_key(labelled: str, metadata: Any) -> None:
    _set_metadata(labelled, **metadata)
    with pytest.raises(HeaderError, match=r"metadata\.hf_features"):
        ssnp.load(labelled).to_hf()


def test_bad_class_names_are_errors_naming_the_key(labelled: str) -> None:
    _set_metadata(labelled, class_names={"label": "cat,dog"})
    with pytest.raises(HeaderError, match=r"metadata\.class_names"):
        ssnp.load(labelled).to_hf()


@pytest.mark.parametrize(
    ("hidden", "call", "extra"),
    [("pyarrow", "to_arrow()", "arrow"), ("datasets", "to_hf()", "hf-datasets")],
)
def test_a_missing_package_names_its_extra(nested: str, hidden: str, call: str, extra: str) -> None:
    code = (
        "import sys, superserial.numpy as ssnp\n"
        "from superserial.errors import MissingDependencyError\n"
        "try:\n"
        f"    ssnp.load(sys.argv[1]).{call}\n"
        "except MissingDependencyError as e:\n"
        "    print(e)\n"
    )
    child = run_without([hidden, "tensorflow"], code, nested)
    assert child.returncode == 0, child.stderr
    assert f"superserial[{extra}]" in child.stdout

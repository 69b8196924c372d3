"""Hugging Face datasets -> superserial: datasets built by `datasets` itself, every feature of
docs/convert.md compared element for element, the split rules, save_to_disk directories,
and the bad input."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import superserial
import superserial.numpy as ssnp
from conftest import run_without
from superserial.cli.main import cli
from superserial.errors import ConversionError, UnsupportedError

hd = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
Image = pytest.importorskip("PIL.Image")

N = 6


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((2, 3, 3), i, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


FEATURES = {
    "i8": hd.Value("int8"),
    "u16": hd.Value("uint16"),
    "f16": hd.Value("float16"),
    "f64": hd.Value("float64"),
    "b": hd.Value("bool"),
    "s": hd.Value("string"),
    "ls": hd.Value("large_string"),
    "bin": hd.Value("binary"),
    "a2": hd.Array2D(shape=(2, 3), dtype="float32"),
    "a3": hd.Array3D(shape=(1, 2, 2), dtype="uint8"),
    "a2n": hd.Array2D(shape=(None, 3), dtype="int32"),
    "seq": hd.Sequence(hd.Value("int64")),
    "fixed": hd.Sequence(hd.Value("float32"), length=3),
    "nested": hd.List(hd.List(hd.Value("int16"))),
    "large": hd.LargeList(hd.Value("uint8")),
    "label": hd.ClassLabel(names=["cat", "dog", "fish"]),
    "labels": hd.List(hd.ClassLabel(names=["a", "b"])),
    "img": hd.Image(),
    "img_path": hd.Image(),
    "meta": {
        "x": hd.Value("int32"),
        "a": hd.Array2D(shape=(1, 2), dtype="int64"),
        "t": hd.Value("string"),
    },
    "tr": hd.Translation(languages=["en", "fr"]),
}


def _rows(png_dir: str) -> dict[str, list[Any]]:
    paths = []
    for i in range(N):
        p = os.path.join(png_dir, f"{i}.png")
        with open(p, "wb") as f:
            f.write(_png(i + 100))
        paths.append(p)
    return {
        "i8": [-i for i in range(N)],
        "u16": [65535 - i for i in range(N)],
        "f16": [0.5 * i for i in range(N)],
        "f64": [i / 3 for i in range(N)],
        "b": [i % 2 == 0 for i in range(N)],
        "s": [f"s{i} é" for i in range(N)],
        "ls": ["x" * i for i in range(N)],
        "bin": [bytes([i]) * i for i in range(N)],
        "a2": [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(N)],
        "a3": [np.full((1, 2, 2), i, np.uint8) for i in range(N)],
        "a2n": [np.full((i, 3), i, np.int32) for i in range(N)],
        "seq": [list(range(i)) for i in range(N)],
        "fixed": [[i, i + 0.5, -i] for i in range(N)],
        "nested": [[[i], [], [1, 2]][: i % 4] for i in range(N)],
        "large": [[i] * i for i in range(N)],
        "label": [i % 3 for i in range(N - 1)] + [-1],
        "labels": [[0, 1][: i % 3] for i in range(N)],
        "img": [Image.fromarray(np.full((2, 3, 3), i, np.uint8)) for i in range(N)],
        "img_path": paths,
        "meta": [{"x": i, "a": np.array([[i, -i]]), "t": str(i)} for i in range(N)],
        "tr": [{"en": f"hi {i}", "fr": f"salut {i}"} for i in range(N)],
    }


def _with_uint64_and_audio(ds: Any) -> Any:
    # from_dict goes through Python ints (uint64 above int64 fails) and Audio encoding
    # needs torchcodec: these columns are built as Arrow and joined on as HF would hold them.
    feats = hd.Features({"u64": hd.Value("uint64"), "audio": hd.Audio()})
    audio = [{"bytes": b"RIFF" + bytes([i]) * i, "path": f"{i}.wav"} for i in range(N)]
    table = pa.table(
        {
            "u64": pa.array([2**64 - 1 - i for i in range(N)], pa.uint64()),
            "audio": pa.array(audio, feats.arrow_schema.field("audio").type),
        }
    )
    return hd.concatenate_datasets(
        [ds, hd.Dataset(table, info=hd.DatasetInfo(features=feats))], axis=1
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: Any) -> Any:
    png_dir = str(tmp_path_factory.mktemp("png"))
    ds = hd.Dataset.from_dict(_rows(png_dir), features=hd.Features(FEATURES))
    # A shuffle leaves an indices mapping over the table: it must be followed.
    return _with_uint64_and_audio(ds).shuffle(seed=3)


@pytest.fixture(scope="module")
def converted(source: Any, tmp_path_factory: Any) -> tuple[Any, str]:
    path = str(tmp_path_factory.mktemp("out") / "ds")
    return superserial.convert(source, path), path


def _py(x: Any) -> Any:
    """A numpy-reader value as Python lists, strings as bytes."""
    if isinstance(x, dict):
        return {k: _py(v) for k, v in x.items()}
    if isinstance(x, ssnp.Ragged):
        return [_py(r) for r in x.to_list()]
    if isinstance(x, list):
        return [_py(r) for r in x]
    return x.tolist()


def _expected(value: Any) -> Any:
    """A source row's value (Arrow's Python form) with strings as bytes, files as their bytes."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict) and set(value) == {"bytes", "path"}:
        return value["bytes"]
    if isinstance(value, dict):
        return {k: _expected(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expected(v) for v in value]
    return value


def test_every_feature_element_for_element(source: Any, converted: tuple[Any, str]) -> None:
    header, path = converted
    assert header.element_count == N
    rows = source.with_format("arrow")[:].to_pylist()
    rows = [
        {
            **r,
            "img_path": {
                "bytes": _png(int(os.path.basename(r["img_path"]["path"])[0]) + 100),
                "path": None,
            },
        }
        for r in rows
    ]
    got = list(ssnp.load(path))
    assert len(got) == N
    for i, (element, row) in enumerate(zip(got, rows, strict=True)):
        for column, value in row.items():
            assert _py(element[column]) == _expected(value), (i, column)
    dtypes = {c: got[0][c].dtype for c in ("i8", "u16", "u64", "f16", "f64", "b", "label")}
    assert dtypes == {
        "i8": np.int8,
        "u16": np.uint16,
        "u64": np.uint64,
        "f16": np.float16,
        "f64": np.float64,
        "b": np.bool_,
        "label": np.int64,
    }
    assert got[0]["a2"].shape == (2, 3) and got[0]["a3"].shape == (1, 2, 2)
    assert got[0]["meta"]["a"].shape == (1, 2)


def test_metadata_keeps_features_and_class_names(converted: tuple[Any, str]) -> None:
    header, path = converted
    meta = superserial.numpy.load(path).header.metadata
    assert meta == header.metadata
    assert meta["class_names"] == {"label": ["cat", "dog", "fish"], "labels": ["a", "b"]}
    features = hd.Features.from_dict(meta["hf_features"])
    assert features["a2"] == FEATURES["a2"] and features["label"] == FEATURES["label"]
    assert meta["source"]["format"] == "hf"


def test_element_spec_in_tensorflow(converted: tuple[Any, str]) -> None:
    tf = pytest.importorskip("tensorflow")
    spec = superserial.load(converted[1]).element_spec
    assert spec["a2"] == tf.TensorSpec([2, 3], tf.float32)
    assert spec["fixed"] == tf.TensorSpec([3], tf.float32)
    assert spec["img"] == tf.TensorSpec([], tf.string)
    assert spec["label"] == tf.TensorSpec([], tf.int64)
    assert isinstance(spec["seq"], tf.RaggedTensorSpec | tf.TensorSpec)
    assert spec["a2n"].shape.as_list() == [None, 3]
    assert isinstance(spec["nested"], tf.RaggedTensorSpec)


def _small(n: int = 3, offset: int = 0) -> Any:
    return hd.Dataset.from_dict({"x": [offset + i for i in range(n)]})


def test_splits_of_a_datasetdict(tmp_path: Any) -> None:
    dd = hd.DatasetDict({"train": _small(3), "test": _small(2, 10)})
    with pytest.raises(UnsupportedError, match=r"found 2 splits: \['train', 'test'\]"):
        superserial.convert(dd, str(tmp_path / "a"))
    assert not os.path.exists(tmp_path / "a")
    with pytest.raises(UnsupportedError, match=r"split= one of \['train', 'test'\], found 'dev'"):
        superserial.convert(dd, str(tmp_path / "a"), split="dev")
    header = superserial.convert(dd, str(tmp_path / "a"), split="test")
    assert header.element_count == 2 and header.metadata["source"]["split"] == "test"
    assert [e["x"].item() for e in ssnp.load(str(tmp_path / "a"))] == [10, 11]
    # One split: that one.
    assert (
        superserial.convert(hd.DatasetDict({"only": _small(4)}), str(tmp_path / "b")).element_count
        == 4
    )


def test_save_to_disk_directories_detected(tmp_path: Any) -> None:
    _small(5).save_to_disk(str(tmp_path / "one"))
    hd.DatasetDict({"train": _small(3), "validation": _small(2)}).save_to_disk(
        str(tmp_path / "dict")
    )
    assert superserial.convert(str(tmp_path / "one"), str(tmp_path / "a")).element_count == 5
    assert (
        superserial.convert(
            str(tmp_path / "dict"), str(tmp_path / "b"), split="validation"
        ).element_count
        == 2
    )
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "-q",
            "convert",
            str(tmp_path / "dict"),
            "-o",
            str(tmp_path / "c"),
            "--from",
            "hf",
            "--split",
            "train",
        ],
    )
    assert result.exit_code == 0, result.output
    assert len(ssnp.load(str(tmp_path / "c"))) == 3
    result = runner.invoke(
        cli, ["-q", "convert", str(tmp_path / "dict"), "-o", str(tmp_path / "d")]
    )
    assert result.exit_code != 0 and "validation" in result.output
    assert not os.path.exists(tmp_path / "d")


def test_mixed_type_column_names_column_and_row(tmp_path: Any) -> None:
    ds = hd.Dataset.from_dict(
        {"ok": [1, 2, 3], "mixed": [1, 2, "three"]}, on_mixed_types="use_json"
    )
    with pytest.raises(
        ConversionError, match=r"column 'mixed'.*row 0 holds int, row 2 holds str"
    ) as e:
        superserial.convert(ds, str(tmp_path / "o"))
    assert (e.value.column, e.value.row) == ("mixed", 2)
    assert not os.path.exists(tmp_path / "o")


def test_null_value_names_column_and_row(tmp_path: Any) -> None:
    ds = hd.Dataset.from_dict({"x": [1, 2, None, 4]})
    # The row is counted in the dataset's order (an indices mapping), not the table's.
    with pytest.raises(ConversionError, match=r"column 'x' at row 1") as e:
        superserial.convert(ds.select([3, 2, 0, 1]), str(tmp_path / "o"))
    assert (e.value.column, e.value.row) == ("x", 1)
    assert not os.path.exists(tmp_path / "o")


def test_features_without_an_exact_leaf(tmp_path: Any) -> None:
    ts = hd.Dataset.from_dict(
        {"when": [1, 2]}, features=hd.Features({"when": hd.Value("timestamp[s]")})
    )
    with pytest.raises(UnsupportedError, match=r"column 'when'.*timestamp\[s\]"):
        superserial.convert(ts, str(tmp_path / "o"))
    nulls = hd.Dataset.from_dict({"nothing": [None, None]})
    with pytest.raises(UnsupportedError, match=r"column 'nothing'.*every value is missing"):
        superserial.convert(nulls, str(tmp_path / "o"))
    rows = hd.Dataset.from_dict(
        {"l": [[{"a": 1}], []]}, features=hd.Features({"l": hd.List({"a": hd.Value("int32")})})
    )
    with pytest.raises(UnsupportedError, match=r"column 'l'.*List of a dict"):
        superserial.convert(rows, str(tmp_path / "o"))
    with pytest.raises(UnsupportedError, match="IterableDataset"):
        superserial.convert(_small().to_iterable_dataset(), str(tmp_path / "o"), source_format="hf")
    assert not os.path.exists(tmp_path / "o")


def test_needs_no_tensorflow(tmp_path: Any) -> None:
    _small(3).save_to_disk(str(tmp_path / "hf"))
    code = f"""
import superserial, superserial.numpy as snp
superserial.convert({str(tmp_path / "hf")!r}, {str(tmp_path / "o")!r})
print([int(e["x"]) for e in snp.load({str(tmp_path / "o")!r})])
"""
    proc = run_without(["tensorflow"], code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 1, 2]"

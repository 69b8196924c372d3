"""The sources of ``superserial.convert`` besides one Parquet file, the CLI, and bad input.

pandas frames, dicts of numpy arrays, pyarrow tables, Parquet directories and
globs, a superserial dataset (re-sharded with its metadata kept); detection,
``--from``, unknown formats, and Parquet converted and read back with no
TensorFlow imported (a child process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import superserial
import superserial.numpy as snp
from conftest import SRC
from superserial.errors import ConversionError, DatasetExistsError, UnsupportedError

CLI = [sys.executable, "-m", "superserial"]


def _nothing_at(path: Path) -> None:
    assert not path.exists()
    # nor a work directory or lock beside it
    assert [n for n in os.listdir(path.parent) if n.startswith(f".{path.name}")] == []


def _cli(*args: Any, code: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [*CLI, *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    return proc


# ------------------------------------------------------------------ pandas


def test_pandas_keeps_dtypes_nans_and_strings(tmp_path: Path) -> None:
    nan = np.float64(np.nan)
    df = pd.DataFrame(
        {
            "i": np.arange(5, dtype=np.int16),
            "u": np.arange(5, dtype=np.uint64) << np.uint64(60),
            "f": np.array([1.5, nan, -0.0, 2.0, 3.0], np.float32),
            "flag": np.array([True, False, True, True, False]),
            "s": ["a", "bb", "", "d\u00e9", "e"],
            "b": np.array([b"x", b"", b"\x00", b"y", b"z"], object),
        },
        index=[10, 11, 12, 13, 14],  # not kept
    )
    header = superserial.convert(df, tmp_path / "ds")
    assert header.metadata["source"] == {"format": "pandas"}
    ds = snp.load(str(tmp_path / "ds"))
    assert {leaf.name: leaf.dtype for leaf in header.leaves} == {
        "b": "string",
        "f": "float32",
        "flag": "bool",
        "i": "int16",
        "s": "string",
        "u": "uint64",
    }
    got = ds.get_batch(range(5))
    for name in ("i", "u", "f", "flag"):
        assert got[name].dtype == df[name].dtype
        assert got[name].tobytes() == df[name].to_numpy().tobytes()
    assert got["s"].tolist() == [s.encode() for s in df["s"]]
    assert got["b"].tolist() == df["b"].tolist()


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (
            np.array(["a", 1, "c"], object),
            "one type in column 'm', got str at row 0 and int at row 1",
        ),
        (["a", None, "c"], "no missing values, got nan in column 'm' at row 1"),
        (
            pd.array([1, 2, None], dtype="Int64"),
            "no missing values, got <NA> in column 'm' at row 2",
        ),
        (pd.Categorical(["a", None, "a"]), "in column 'm' at row 1"),
    ],
    ids=["str-int", "none", "pandas-NA", "categorical-missing"],
)
def test_bad_pandas_columns_are_named_and_nothing_is_written(
    tmp_path: Path, column: Any, message: str
) -> None:
    df = pd.DataFrame({"ok": [1, 2, 3], "m": column})
    with pytest.raises((ConversionError, UnsupportedError), match=message):
        superserial.convert(df, tmp_path / "ds")
    _nothing_at(tmp_path / "ds")


def test_a_categorical_column_keeps_its_values(tmp_path: Path) -> None:
    df = pd.DataFrame({"m": pd.Categorical(["b", "a", "b"]), "c": pd.Categorical([3, 1, 3])})
    header = superserial.convert(df, tmp_path / "ds")
    assert {leaf.name: leaf.dtype for leaf in header.leaves} == {"c": "int64", "m": "string"}
    got = snp.load(str(tmp_path / "ds")).get_batch(range(3))
    assert got["m"].tolist() == [b"b", b"a", b"b"] and got["c"].tolist() == [3, 1, 3]


# ------------------------------------------------------------------ numpy


def test_numpy_dicts_keep_dtype_and_shape_exactly(tmp_path: Path) -> None:
    n = 7
    rng = np.random.default_rng(3)
    source = {
        "image": rng.integers(0, 255, (n, 4, 3, 2), dtype=np.uint8),
        "bf": rng.standard_normal((n, 2)).astype(ml_dtypes.bfloat16),
        "c": (rng.standard_normal(n) + 1j).astype(np.complex128),
        "text": np.array([f"t{i}" * i for i in range(n)]),  # numpy U
        "raw": np.array([b"\x00x" * i for i in range(n)], object),
        "meta": {"id": np.arange(n, dtype=np.int64), "pair": np.zeros((n, 2, 0), np.float32)},
    }
    header = superserial.convert(source, tmp_path / "ds", num_shards=3)
    assert len(header.shards) == 3 and header.element_count == n
    ds = snp.load(str(tmp_path / "ds"))
    got = ds.get_batch(range(n))
    for name in ("image", "bf", "c"):
        assert got[name].dtype == source[name].dtype and got[name].shape == source[name].shape
        assert got[name].tobytes() == source[name].tobytes()
    assert got["text"].tolist() == [s.encode() for s in source["text"]]
    assert got["raw"].tolist() == source["raw"].tolist()
    assert got["meta"]["id"].tolist() == list(range(n))
    assert got["meta"]["pair"].shape == (n, 2, 0)


def test_bad_numpy_dicts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="one length"):
        superserial.convert({"a": np.zeros(3), "b": np.zeros(4)}, tmp_path / "ds")
    with pytest.raises(ConversionError, match="bytes or str values in 's', got int 3 at row 1"):
        superserial.convert({"s": np.array([[b"a"], [3]], object)}, tmp_path / "ds")
    with pytest.raises(UnsupportedError, match=r"dtype of docs/convert\.md, got >i4"):
        superserial.convert({"x": np.zeros(2, ">i4")}, tmp_path / "ds")
    _nothing_at(tmp_path / "ds")


# ------------------------------------------------------------------ Arrow and Parquet


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: Any) -> Path:
    root = tmp_path_factory.mktemp("pq") / "parts"
    (root / "sub").mkdir(parents=True)
    for i, where in enumerate(["a.parquet", "sub/b.parquet", "c.parquet"]):
        rows = np.arange(i * 10, i * 10 + 10)
        t = pa.table({"x": rows, "tok": pa.array([[int(r)] * (r % 3) for r in rows])})
        pq.write_table(t, root / where, row_group_size=4)
    (root / "_SUCCESS").write_text("")
    return root


def test_parquet_directories_and_globs_in_sorted_order(parquet_dir: Path, tmp_path: Path) -> None:
    header = superserial.convert(parquet_dir, tmp_path / "dir", compression="GZIP", shard_size=200)
    assert header.compression == "GZIP" and len(header.shards) > 1
    # sorted paths: a.parquet, c.parquet, sub/b.parquet
    want = [*range(10), *range(20, 30), *range(10, 20)]
    assert [int(e["x"]) for e in snp.load(str(tmp_path / "dir"))] == want
    header = superserial.convert(str(parquet_dir / "*.parquet"), tmp_path / "glob")
    assert header.element_count == 20 and header.metadata["source"]["files"] == 2
    tok = [e["tok"].tolist() for e in snp.load(str(tmp_path / "glob"))]
    assert tok == [[r] * (r % 3) for r in [*range(10), *range(20, 30)]]


def test_parquet_on_an_object_store(parquet_dir: Path, s3_bucket: str, tmp_path: Path) -> None:
    import fsspec

    s3 = fsspec.filesystem("s3")
    s3.put(str(parquet_dir), f"{s3_bucket}/parts", recursive=True)
    header = superserial.convert(f"{s3_bucket}/parts", tmp_path / "dir")
    assert header.metadata["source"] == {"format": "parquet", "files": 3}
    want = [*range(10), *range(20, 30), *range(10, 20)]  # sorted: a, c, sub/b
    assert [int(e["x"]) for e in snp.load(str(tmp_path / "dir"))] == want
    header = superserial.convert(f"{s3_bucket}/parts/*.parquet", tmp_path / "glob")
    assert header.element_count == 20
    header = superserial.convert(f"{s3_bucket}/parts/sub/b.parquet", tmp_path / "one")
    tok = [e["tok"].tolist() for e in snp.load(str(tmp_path / "one"))]
    assert tok == [[r] * (r % 3) for r in range(10, 20)]


def test_parquet_files_of_other_schemas_are_refused(parquet_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"x": [1]}), other / "a.parquet")
    pq.write_table(pa.table({"x": [1.0]}), other / "b.parquet")
    with pytest.raises(UnsupportedError, match=r"b\.parquet"):
        superserial.convert(other, tmp_path / "ds")
    _nothing_at(tmp_path / "ds")


def test_tables_and_options(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array(range(9), pa.int8())})
    header = superserial.convert(table, tmp_path / "ds", num_shards=2, progress=False)
    assert [s.records for s in header.shards] == [5, 4]
    with pytest.raises(DatasetExistsError):
        superserial.convert(table, tmp_path / "ds")
    superserial.convert(table.to_batches()[0], tmp_path / "ds", overwrite=True)
    with pytest.raises(TypeError, match="got 'resume'"):
        superserial.convert(table, tmp_path / "x", resume=True)


def test_unknown_formats_list_the_known_ones(tmp_path: Path) -> None:
    for source in ([1, 2], tmp_path / "missing", {"a": [1, 2]}):
        with pytest.raises(UnsupportedError, match=r"known format: superserial .*parquet .*numpy"):
            superserial.convert(source, tmp_path / "ds")
    with pytest.raises(UnsupportedError, match=r"among: .*got 'lance'"):
        superserial.convert([1], tmp_path / "ds", source_format="lance")
    _nothing_at(tmp_path / "ds")


def test_parquet_needs_no_tensorflow_to_convert_or_read(parquet_dir: Path, tmp_path: Path) -> None:
    code = f"""
import sys, superserial, superserial.numpy as snp
superserial.convert({str(parquet_dir)!r}, {str(tmp_path / "ds")!r})
assert [int(e["x"]) for e in snp.load({str(tmp_path / "ds")!r})][:3] == [0, 1, 2]
print("tensorflow" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ------------------------------------------------------------------ superserial sources and the CLI


def test_a_superserial_source_is_resharded_with_its_metadata(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array(range(6), pa.int8())})
    superserial.convert(table, tmp_path / "src", num_shards=3)
    header = superserial.convert(str(tmp_path / "src"), tmp_path / "out", compression="ZLIB")
    assert len(header.shards) == 3 and header.compression == "ZLIB"
    assert header.metadata == superserial.read_header(str(tmp_path / "src")).metadata
    assert "arrow_schema" in header.metadata


def test_the_cli_detects_parquet_and_names_bad_rows(parquet_dir: Path, tmp_path: Path) -> None:
    out = json.loads(_cli("convert", parquet_dir, "-o", tmp_path / "ds", "--json").stdout)
    assert out["element_count"] == 30
    _cli("convert", parquet_dir, "-o", tmp_path / "ds", "--overwrite", "--compression", "GZIP")
    assert superserial.read_header(str(tmp_path / "ds")).compression == "GZIP"
    bad = tmp_path / "bad.data"  # not named .parquet: not detected, named with --from
    pq.write_table(pa.table({"v": pa.array([1, None])}), bad)
    err = _cli("convert", bad, "-o", tmp_path / "b", "--from", "parquet", code=1).stderr
    assert "column 'v' at row 1" in err and "Traceback" not in err
    _nothing_at(tmp_path / "b")
    assert "--from" in _cli("convert", bad, "-o", tmp_path / "b", "--from", "x", code=2).stderr
    _cli("convert", parquet_dir, "-o", tmp_path / "r", "--resume", code=2)

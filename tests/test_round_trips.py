"""There and back (issue 25): Parquet -> superserial -> Parquet and HF -> superserial -> HF
give equal tables, through ``superserial.convert`` and the way out (``export``, ``to_hf``).

TensorFlow is not needed on either way; these tests do not save through it.
"""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import superserial
import superserial.numpy as ssnp
from superserial.foreign.export import export

N = 6


def test_parquet_there_and_back_is_equal(tmp_path: Any) -> None:
    source = pa.table(
        {
            "i8": pa.array(np.arange(N, dtype=np.int8)),
            "u64": pa.array(np.array([0, 1, 2, 3, 4, 2**64 - 1], dtype=np.uint64)),
            "f16": pa.array(np.arange(N, dtype=np.float16)),
            "f64": pa.array(np.linspace(-1, 1, N)),
            "flag": pa.array([True, False] * 3),
            "text": pa.array(["a", "é"] * 3, pa.string()),
            "raw": pa.array([b"\x00\xff", b""] * 3),
            "big_text": pa.array(["x"] * N, pa.large_string()),
            "grid": pa.array([[[1, 2], [3, 4]]] * N, pa.list_(pa.list_(pa.int32(), 2), 2)),
            "floats": pa.array([[1.0], [], [2.0, 3.0]] * 2, pa.list_(pa.float32())),
            "ids": pa.array([[1], [2, 3], []] * 2, pa.large_list(pa.int64())),
            "digest": pa.array([bytes([i]) * 4 for i in range(N)], pa.binary(4)),
            "label": pa.array(["cat", "dog", "cat"] * 2).dictionary_encode(),
            "meta": pa.array(
                [{"z": i, "a": str(i)} for i in range(N)],
                pa.struct([("z", pa.int16()), ("a", pa.string())]),
            ),
        }
    )
    pq.write_table(source, tmp_path / "in.parquet", row_group_size=4)
    superserial.convert(str(tmp_path / "in.parquet"), str(tmp_path / "ds"))
    export(tmp_path / "ds", tmp_path / "out.parquet", batch_size=4)
    back = pq.read_table(tmp_path / "out.parquet")
    original = pq.read_table(tmp_path / "in.parquet")
    assert back.schema.equals(original.schema, check_metadata=True)
    # A dictionary column is equal by its values: each exported batch has a
    # dictionary of its own, where the source's row groups had theirs.
    assert back["label"].to_pylist() == original["label"].to_pylist()
    assert back.drop_columns(["label"]).equals(original.drop_columns(["label"]))


def test_hf_there_and_back_is_equal(tmp_path: Any) -> None:
    features = datasets.Features(
        {
            "pixels": datasets.Array2D(shape=(2, 3), dtype="float32"),
            "tokens": datasets.Sequence(datasets.Value("int64")),
            "label": datasets.ClassLabel(names=["cat", "dog"]),
            "caption": datasets.Value("string"),
            "picture": datasets.Image(),
        }
    )
    source = datasets.Dataset.from_dict(
        {
            "pixels": [np.full((2, 3), i, np.float32) for i in range(N)],
            "tokens": [list(range(i)) for i in range(N)],
            "label": [0, 1, 1, 0, 1, 0],
            "caption": [f"número {i}" for i in range(N)],
            "picture": [{"bytes": b"\x89PNG%d" % i, "path": None} for i in range(N)],
        },
        features=features,
    )
    superserial.convert(source, str(tmp_path / "ds"))
    for back in (
        ssnp.load(tmp_path / "ds").to_hf(),
        ssnp.load(tmp_path / "ds").to_hf(cache_dir=tmp_path / "cache"),
    ):
        assert back.features == source.features
        assert back.data.table.equals(source.data.table)

"""Arrow and Parquet in: every type of docs/convert.md, kept exactly, and bad input refused.

One Parquet file written by pyarrow holds a column per (dtype, layout) of the type
table; it is converted once (module scope) and compared with what pyarrow reads
back: leaf by leaf through ``superserial.numpy``, record bytes against
``superserial.save`` of the same values as a ``tf.data.Dataset``, and element
spec and values through ``superserial.load``.
"""

from __future__ import annotations

import base64
import itertools
import os
from typing import Any

import ml_dtypes  # noqa: F401  # registers bfloat16 with numpy
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as snp
from superserial.errors import ConversionError, UnsupportedError
from superserial.foreign.sources.arrow import arrow_structure, write_arrow
from superserial.format.framing import read_records

rng = np.random.default_rng(25)
ROWS = 13

DTYPES = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
    "large_string": pa.large_string(),
    "large_binary": pa.large_binary(),
}
# layout -> (list levels, inner fixed dims) of a column
LAYOUTS = {
    "scalar": (0, ()),
    "fixed": (0, (2,)),
    "fixed2": (0, (2, 3)),
    "list": (1, ()),
    "list_fixed": (1, (2,)),
    "list_list": (2, ()),
    "list_list_fixed": (2, (3,)),
}
# every dtype scalar and as a list; every layout for a few dtypes
COLUMNS = [(d, lay) for d in DTYPES for lay in ("scalar", "list")] + [
    (d, lay)
    for d in ("int32", "uint8", "float64", "string", "bool")
    for lay in LAYOUTS
    if lay not in ("scalar", "list")
]


def _values(dtype: str, n: int) -> list[Any]:
    if dtype in ("string", "large_string"):
        return [
            "".join(chr(97 + int(c)) for c in rng.integers(0, 26, rng.integers(0, 5)))
            for _ in range(n)
        ]
    if dtype in ("binary", "large_binary"):
        return [bytes(rng.integers(0, 256, rng.integers(0, 5), dtype=np.uint8)) for _ in range(n)]
    if dtype == "bool":
        return (rng.random(n) > 0.5).tolist()
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "f":
        v = rng.standard_normal(n).astype(np_dtype)
        if n:
            v[0] = np.nan
        return v.tolist()
    info = np.iinfo(np_dtype)
    return rng.integers(info.min, info.max, n, dtype=np_dtype, endpoint=True).tolist()


def _cell(dtype: str, levels: int, inner: tuple[int, ...]) -> Any:
    if levels:
        return [_cell(dtype, levels - 1, inner) for _ in range(int(rng.integers(0, 4)))]
    if inner:
        flat = _values(dtype, int(np.prod(inner)))
        return np.array(flat, dtype=object).reshape(inner).tolist()
    return _values(dtype, 1)[0]


def _arrow_type(dtype: str, levels: int, inner: tuple[int, ...]) -> pa.DataType:
    t = DTYPES[dtype]
    for d in reversed(inner):
        t = pa.list_(t, d)
    for i in range(levels):
        t = pa.large_list(t) if i % 2 else pa.list_(t)
    return t


def _table() -> pa.Table:
    cols = {}
    for dtype, lay in COLUMNS:
        levels, inner = LAYOUTS[lay]
        cells = [_cell(dtype, levels, inner) for _ in range(ROWS)]
        cols[f"{dtype}.{lay}"] = pa.array(cells, _arrow_type(dtype, levels, inner))
    struct = pa.StructArray.from_arrays(
        [pa.array(_values("int16", ROWS), pa.int16()), pa.array([[1], [], [2, 3]] * 4 + [[]])],
        ["a", "z/b~"],
    )
    cols["st"] = pa.StructArray.from_arrays(
        [struct, pa.array(_values("string", ROWS))], ["inner", "s"]
    )
    return pa.table(cols)


# --------------------------------------------------------------- the reference


def _tf_dtype(t: pa.DataType) -> tf.DType:
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t):
        return tf.string
    if pa.types.is_large_binary(t):
        return tf.string
    return tf.as_dtype(t.to_pandas_dtype())


def _tf_column(array: pa.Array) -> Any:
    """A column as ``from_tensor_slices`` takes it, built from the Python values."""
    t, levels, inner = array.type, 0, []
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t, levels = t.value_type, levels + 1
    while pa.types.is_fixed_size_list(t):
        inner.append(t.list_size)
        t = t.value_type
    if pa.types.is_struct(t):
        return {t.field(i).name: _tf_column(array.field(i)) for i in range(t.num_fields)}
    dtype = _tf_dtype(t)
    cells = array.to_pylist()
    if not levels:
        if dtype == tf.string:
            return np.array(
                [
                    c.encode() if isinstance(c, str) else c
                    for c in np.ravel(np.array(cells, object))
                ],
                object,
            ).reshape(len(cells), *inner)
        return np.array(cells, dtype.as_numpy_dtype).reshape(len(cells), *inner)
    return tf.ragged.constant(cells, dtype, ragged_rank=levels, inner_shape=tuple(inner) or None)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("arrow")
    table = _table()
    parquet = str(root / "t.parquet")
    pq.write_table(table, parquet, row_group_size=5)  # three row groups
    read_back = pq.read_table(parquet)
    path = str(root / "ds")
    header = superserial.convert(parquet, path)
    return {"table": read_back, "path": path, "header": header, "root": root}


def _pylist(v: Any) -> Any:
    """A numpy reader value as nested Python lists."""
    if isinstance(v, snp.Ragged):
        flat = v.flat_values
        for splits in reversed(v.nested_row_splits):
            flat = [flat[a:b] for a, b in itertools.pairwise(splits)]
        return _pylist(flat)
    if isinstance(v, list):
        return [_pylist(x) for x in v]
    return np.asarray(v).tolist()


def _same(got: Any, want: Any) -> bool:
    """Equal values; floats bit for bit (NaN equals NaN), strings as bytes."""
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(want, str):
        want = want.encode()
    if isinstance(want, float):
        return isinstance(got, float) and (got == want or (np.isnan(got) and np.isnan(want)))
    return bool(got == want) and type(got) is type(want)


@pytest.mark.parametrize("column", [f"{d}.{lay}" for d, lay in COLUMNS])
def test_every_type_comes_through_the_numpy_reader(converted: dict[str, Any], column: str) -> None:
    ds = snp.load(converted["path"], select=[column])
    want = converted["table"].column(column).to_pylist()
    got = [_pylist(e[column]) for e in ds]
    assert len(got) == ROWS
    for row, (g, w) in enumerate(zip(got, want, strict=True)):
        assert _same(g, w), (column, row, g, w)


def test_structs_become_dicts(converted: dict[str, Any]) -> None:
    ds = snp.load(converted["path"], select=["st"])
    want = converted["table"].column("st").to_pylist()
    for e, w in zip(ds, want, strict=True):
        assert _same(_pylist(e["st"]["inner"]["a"]), w["inner"]["a"])
        assert _same(_pylist(e["st"]["inner"]["z/b~"]), w["inner"]["z/b~"])
        assert _same(_pylist(e["st"]["s"]), w["s"])


# The reference save traces a graph per leaf: a subset that still holds every dtype and layout.
REFERENCE = (
    [f"{d}.list" for d in DTYPES]
    + [f"{d}.{lay}" for d in ("float64", "string") for lay in LAYOUTS if lay != "list"]
    + ["uint16.scalar", "st"]
)


def test_records_are_those_save_writes_and_load_gives_them_back(converted: dict[str, Any]) -> None:
    table = converted["table"].select(REFERENCE)
    path = str(converted["root"] / "subset")
    superserial.convert(table, path)
    columns = {name: _tf_column(table.column(name).combine_chunks()) for name in REFERENCE}
    reference = tf.data.Dataset.from_tensor_slices(columns)
    saved = str(converted["root"] / "saved")
    superserial.save(reference, saved)

    def records(path: str) -> list[bytes]:
        header = superserial.read_header(path)
        return [r for s in header.shards for r in read_records(os.path.join(path, s.file))]

    assert records(path) == records(saved)
    loaded = superserial.load(path)
    assert loaded.element_spec == reference.element_spec
    for got, want in zip(loaded, reference, strict=True):
        for g, w in zip(tf.nest.flatten(got, True), tf.nest.flatten(want, True), strict=True):
            g, w = np.asarray(g.numpy()), np.asarray(w.numpy())
            assert g.dtype == w.dtype and g.shape == w.shape
            assert g.tolist() == w.tolist() if g.dtype == object else g.tobytes() == w.tobytes()


def test_the_header_keeps_the_arrow_schema(converted: dict[str, Any]) -> None:
    meta = superserial.read_header(converted["path"]).metadata
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(meta["arrow_schema"])))
    assert schema.equals(converted["table"].schema, check_metadata=True)
    assert meta["source"]["format"] == "parquet"


# --------------------------------------------------------------- bad input


def _nothing_at(path: str) -> None:
    parent = os.path.dirname(path)
    assert not os.path.exists(path)
    assert [n for n in os.listdir(parent) if n.startswith(".ds")] == [], os.listdir(parent)


@pytest.mark.parametrize(
    ("array", "row"),
    [
        (pa.array([1, 2, None, 4] * 40, pa.int32()), 2),
        (pa.array([[1], [2]] * 60 + [[3, None]], pa.list_(pa.int64())), 120),
        (pa.array([[[1]], [[2], None]], pa.list_(pa.list_(pa.int64()))), 1),
        (pa.array([{"x": 1}, None, {"x": 3}]), 1),
        (pa.array([{"x": 1}, {"x": None}]), 1),
        (pa.array([[1, 2], None], pa.list_(pa.uint8(), 2)), 1),
    ],
    ids=["scalar", "in-list", "in-nested-list", "struct", "in-struct", "fixed"],
)
def test_a_null_is_an_error_naming_column_and_row_and_nothing_is_written(
    tmp_path: Any, array: pa.Array, row: int
) -> None:
    table = pa.table({"ok": pa.array(range(len(array))), "bad": array})
    path = str(tmp_path / "ds")
    with pytest.raises(ConversionError, match=f"'bad.*' at row {row}") as e:
        write_arrow(table.to_batches(max_chunksize=64), path, schema=table.schema)
    assert e.value.row == row and e.value.column.startswith("bad")
    _nothing_at(path)


@pytest.mark.parametrize(
    "array",
    [
        pa.array([1], pa.timestamp("s")),
        pa.array([1], pa.decimal128(5, 2)),
        pa.array([[{"x": 1}]]),
        pa.array([[[1]]], pa.list_(pa.list_(pa.int8()), 1)),
        pa.array([None], pa.null()),
        pa.array([{"a": 1}], pa.map_(pa.string(), pa.int8())),
    ],
    ids=["timestamp", "decimal", "list-of-struct", "list-in-fixed", "null", "map"],
)
def test_types_not_kept_exactly_are_refused_before_anything_is_written(
    tmp_path: Any, array: pa.Array
) -> None:
    table = pa.table({"x": pa.array([1]), "bad": array})
    with pytest.raises(UnsupportedError, match="column 'bad'"):
        arrow_structure(table.schema)
    path = str(tmp_path / "ds")
    with pytest.raises(UnsupportedError, match="column 'bad'"):
        write_arrow(table.to_batches(), path, schema=table.schema)
    _nothing_at(path)


def test_a_list_of_structs_is_refused_as_such(tmp_path: Any) -> None:
    table = pa.table({"boxes": pa.array([[{"x": 1, "y": 2}], []])})
    with pytest.raises(
        UnsupportedError, match=r"list of structs in column 'boxes'.*struct of lists"
    ):
        arrow_structure(table.schema)


def test_dictionaries_and_fixed_size_binary_keep_their_values(tmp_path: Any) -> None:
    label = pa.array(["cat", "dog", "cat", "cat"]).dictionary_encode()
    table = pa.table(
        {
            "label": label,
            "digest": pa.array([b"ab", b"cd", b"\x00\x00", b"zz"], pa.binary(2)),
            "codes": pa.DictionaryArray.from_arrays(
                pa.array([1, 0, 1, 1], pa.int8()), pa.array([10, 20], pa.int64())
            ),
        }
    )
    path = str(tmp_path / "ds")
    write_arrow(table.to_batches(), path, schema=table.schema)
    ds = superserial.numpy.load(path)
    # .item(): numpy compares a 0-d bytes array as S, which drops trailing NULs.
    assert [ds[i]["label"].item() for i in range(4)] == [b"cat", b"dog", b"cat", b"cat"]
    assert [ds[i]["digest"].item() for i in range(4)] == [b"ab", b"cd", b"\x00\x00", b"zz"]
    assert [int(ds[i]["codes"]) for i in range(4)] == [20, 10, 20, 20]
    assert ds[0]["codes"].dtype == np.int64
    back = ds.to_arrow()
    # The source's types come back; a dictionary is equal by its values (it is
    # encoded anew, in the order values first appear).
    assert back.schema.equals(table.schema)
    assert back.to_pylist() == table.to_pylist()


def test_a_null_behind_a_dictionary_index_is_an_error(tmp_path: Any) -> None:
    label = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int8()), pa.array(["a", None]))
    table = pa.table({"label": label})
    path = str(tmp_path / "ds")
    with pytest.raises(ConversionError, match="column 'label' at row 1"):
        write_arrow(table.to_batches(), path, schema=table.schema)
    _nothing_at(path)

"""The TF-free numpy reader against the TensorFlow loader, and on damaged files."""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf  # imported before superserial.numpy on purpose: both orders must work

import superserial
import superserial.numpy as ssnp
from conftest import arr_key, canon_np
from superserial.errors import CorruptDataError, DatasetNotFoundError, IdleReaderWarning
from superserial.format import dtypes

N = 6
Point = collections.namedtuple("Point", ["x", "y"])

# ------------------------------------------------------------ comparison


def canon_tf(x: Any) -> Any:
    """A comparable form of a TensorFlow element."""
    if isinstance(x, dict):
        return {k: canon_tf(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return ("namedtuple", type(x).__name__, x._fields, [canon_tf(v) for v in x])
    if isinstance(x, tuple):
        return ("tuple", [canon_tf(v) for v in x])
    if isinstance(x, tf.RaggedTensor):
        return (
            "ragged",
            arr_key(x.flat_values.numpy()),
            [arr_key(s.numpy()) for s in x.nested_row_splits],
        )
    if isinstance(x, tf.SparseTensor):
        return (
            "sparse",
            arr_key(x.indices.numpy()),
            arr_key(x.values.numpy()),
            arr_key(x.dense_shape.numpy()),
        )
    return arr_key(x.numpy())


def flatten(x: Any) -> list[Any]:
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in flatten(x[k])]
    if isinstance(x, tuple):
        return [v for item in x for v in flatten(item)]
    return [x]


_COMPARED: dict[str, tuple[list[Any], list[Any], list[str]]] = {}


def compare_with_tf(path: str) -> tuple[list[Any], list[Any], list[str]]:
    """(TF elements in canonical form, numpy elements, names of leaves whose batches are wrong).

    Batches of 4 and of 1 are checked against the elements: stacked for
    fixed-shape leaves, lists of the per-element values for the others.
    Cached per path: several tests look at parts of one saved dataset.
    """
    if path in _COMPARED:
        return _COMPARED[path]
    want = [canon_tf(e) for e in superserial.load(path)]
    dataset = ssnp.load(path)
    got = list(dataset)
    assert len(dataset) == len(want) == len(got)
    leaves = superserial.read_header(path).leaves
    bad: list[str] = []
    for size in (4, 1):
        start = 0
        for batch in dataset.batches(size):
            elems = got[start : start + size]
            start += len(elems)
            for j, (leaf, b) in enumerate(zip(leaves, flatten(batch), strict=True)):
                per = [flatten(e)[j] for e in elems]
                if leaf.fixed:
                    ok = type(b) is np.ndarray and b.shape == (len(elems), *leaf.shape)
                    ok = ok and arr_key(b) == arr_key(np.stack(per))
                else:
                    ok = [canon_np(v) for v in b] == [canon_np(v) for v in per]
                if not ok:
                    bad.append(leaf.name)
        assert start == len(got)
    _COMPARED[path] = (want, got, bad)
    return want, got, bad


def check_against_tf(path: str) -> list[Any]:
    """Asserts numpy elements == TF elements, and batches == stacked elements."""
    want, got, bad = compare_with_tf(path)
    assert [canon_np(e) for e in got] == want
    assert not bad
    return got


# ------------------------------------------------------------ data


def _values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    entry = dtypes.by_name(name)
    n = int(np.prod(shape))
    if name == "string":
        out = np.array(
            [bytes(rng.integers(0, 256, rng.integers(0, 6), dtype=np.uint8)) for _ in range(n)],
            object,
        )
        out[:2] = [b"", b"\x00a\xff"]
    elif name == "bool":
        out = rng.integers(0, 2, n).astype(bool)
    elif entry.is_integer:
        info = np.iinfo(entry.numpy)
        out = rng.integers(info.min, info.max, n, dtype=entry.numpy, endpoint=True)
        out[:2] = [info.min, info.max]
    elif name.startswith("complex"):
        part = np.float32 if name == "complex64" else np.float64
        out = (
            rng.standard_normal(n).astype(part) + 1j * rng.standard_normal(n).astype(part)
        ).astype(entry.numpy)
        out[0] = complex(np.nan, -0.0)
    else:
        out = rng.standard_normal(n).astype(entry.numpy)
        bits = {  # signalling NaN, NaN with payload, -0.0, inf
            "float16": [0x7C01, 0xFE21, 0x8000, 0x7C00],
            "bfloat16": [0x7F81, 0xFFC1, 0x8000, 0x7F80],
            "float32": [0x7F800001, 0xFFC01234, 0x80000000, 0x7F800000],
            "float64": [0x7FF0000000000001, 0xFFF8000000001234, 1 << 63, 0x7FF0000000000000],
        }[name]
        view = out.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[entry.numpy.itemsize])
        view[:4] = bits
    return out.reshape(shape)


def dtype_dataset(name: str) -> tf.data.Dataset:
    """Every leaf kind for one dtype: fixed, scalar, unknown dims, ragged, sparse."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = _values(name, (N, 4, 2), rng)
    n = np.array([0, 4, 2, 1, 3, 4], np.int32)
    lens = np.array([[0, 0], [3, 5], [1, 0], [2, 2], [0, 8], [4, 1]], np.int32)
    mask = rng.integers(0, 2, (N, 4, 2)).astype(bool)
    mask[0] = False

    def build(x: Any, n: Any, lens: Any, mask: Any) -> Any:
        flat = tf.reshape(x, [-1])
        return {
            "fixed": x[:3],
            "scalar": x[0, 0],
            "unk": x[:n],
            "rag": tf.RaggedTensor.from_row_lengths(flat[: tf.reduce_sum(lens)], lens),
            "sp": tf.SparseTensor(
                tf.where(mask), tf.boolean_mask(x, mask), tf.constant([4, 2], tf.int64)
            ),
        }

    return tf.data.Dataset.from_tensor_slices((tf.constant(x), n, lens, mask)).map(build)


def _ragged_rank2() -> tf.data.Dataset:
    values = tf.reshape(tf.range(40, dtype=tf.float64), [20, 2])
    inner = tf.RaggedTensor.from_row_lengths(values, [2, 0, 3, 1, 4, 2, 0, 3, 5])
    mid = tf.RaggedTensor.from_row_lengths(inner, [2, 1, 0, 3, 3])
    outer = tf.RaggedTensor.from_row_lengths(mid, [1, 2, 0, 2])
    return tf.data.Dataset.from_tensor_slices(
        outer
    )  # elements [None, None, None, 2], ragged_rank 2


def _ragged_rank0() -> tf.data.Dataset:
    rt = tf.RaggedTensor.from_row_lengths(
        tf.reshape(tf.cast(tf.range(24), tf.int16), [12, 2]), [3, 0, 5, 4]
    )
    return tf.data.Dataset.from_tensor_slices(rt)  # elements [None, 2], ragged_rank 0


def _ragged_int32_uniform() -> tf.data.Dataset:
    rows = tf.RaggedTensor.from_row_lengths(
        tf.range(10, dtype=tf.int64), [2, 0, 3, 1, 4, 0], validate=False
    )
    rt = tf.RaggedTensor.from_uniform_row_length(rows.with_row_splits_dtype(tf.int32), 3)
    return tf.data.Dataset.from_tensor_slices(rt)  # elements [3, None], row splits int32


def _sparse_unknown() -> tf.data.Dataset:
    def build(i: Any) -> Any:
        n = tf.cast(i, tf.int64)
        idx = tf.stack([tf.range(n), tf.range(n) % 2], axis=1)
        return tf.SparseTensor(idx, tf.strings.as_string(tf.range(n)), [n + 1, 3])

    return tf.data.Dataset.range(5).map(build)


def _nested() -> tf.data.Dataset:
    def build(i: Any) -> Any:
        return (
            Point(
                x=tf.cast(i, tf.int8), y={"a/b": tf.fill([2], i), "c~d e": tf.cast(i, tf.uint16)}
            ),
            {
                "z": (tf.strings.as_string(i), tf.zeros([0, 3], tf.float32)),
                "é": tf.cast(i, tf.bfloat16),
            },
        )

    return tf.data.Dataset.range(5).map(build)


def _zero_size() -> tf.data.Dataset:
    return tf.data.Dataset.range(3).map(
        lambda i: {
            "u8": tf.zeros([0, 3], tf.uint8),
            "f": tf.zeros([2, 0], tf.float32),
            "s": tf.fill([0], "x"),
            "i": i,
        }
    )


def _plain() -> tf.data.Dataset:
    return tf.data.Dataset.range(7)


def _mixed() -> tf.data.Dataset:
    rng = np.random.default_rng(1)
    return tf.data.Dataset.from_tensor_slices(
        {
            "img": rng.integers(0, 256, (11, 5, 5), dtype=np.uint8),
            "label": np.arange(11),
            "w": rng.random(11, np.float32),
        }
    ).map(
        lambda d: {**d, "rag": tf.RaggedTensor.from_row_lengths(tf.range(d["label"]), [d["label"]])}
    )


STRUCTURES: dict[str, tuple[Any, dict[str, Any]]] = {
    "plain_scalar": (_plain, {}),
    "ragged_rank0": (_ragged_rank0, {}),
    "ragged_rank2": (_ragged_rank2, {}),
    "ragged_int32_uniform": (_ragged_int32_uniform, {}),
    "sparse_unknown_shape": (_sparse_unknown, {}),
    "nested_dict_tuple_namedtuple": (_nested, {}),
    "zero_size_dims": (_zero_size, {}),
    "empty": (lambda: _mixed().take(0), {}),
    "empty_gzip_2_shards": (lambda: _mixed().take(0), {"compression": "GZIP", "num_shards": 2}),
    "gzip_3_shards": (_mixed, {"compression": "GZIP", "num_shards": 3}),
    "zlib_3_shards": (_mixed, {"compression": "ZLIB", "num_shards": 3}),
    "4_shards": (_mixed, {"num_shards": 4}),
    "size_shards": (_mixed, {"shard_size": 300}),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> Any:
    """Saves each named dataset once per module; returns its path."""
    root = tmp_path_factory.mktemp("numpy_reader")
    cache: dict[str, str] = {}

    def get(key: str) -> str:
        if key not in cache:
            path = str(root / key)
            if key == "all_dtypes":
                ds = tf.data.Dataset.zip({d.name: dtype_dataset(d.name) for d in dtypes.DTYPES})
                superserial.save(ds, path)
            else:
                build, kwargs = STRUCTURES[key]
                superserial.save(build(), path, **kwargs)
            cache[key] = path
        return cache[key]

    return get


# ------------------------------------------------------------ equality with TF


@pytest.mark.parametrize("name", [d.name for d in dtypes.DTYPES])
def test_every_dtype_matches_tf(saved: Any, name: str) -> None:
    want, got, bad = compare_with_tf(saved("all_dtypes"))
    assert [canon_np(e[name]) for e in got] == [e[name] for e in want]
    assert [b for b in bad if b.startswith(name + "/")] == []
    got = [e[name] for e in got]
    first = got[1]
    assert first["fixed"].dtype == dtypes.by_name(name).numpy and first["fixed"].shape == (3, 2)
    assert first["scalar"].shape == () and first["unk"].shape == (4, 2)
    assert isinstance(first["rag"], ssnp.Ragged) and isinstance(first["sp"], ssnp.Sparse)
    assert got[0]["unk"].shape == (0, 2) and got[0]["sp"].values.shape == (0,)


@pytest.mark.parametrize("key", sorted(STRUCTURES))
def test_every_structure_matches_tf(saved: Any, key: str) -> None:
    path = saved(key)
    got = check_against_tf(path)
    assert len(got) == superserial.read_header(path).element_count


def test_representations(saved: Any) -> None:
    rr0 = list(ssnp.load(saved("ragged_rank0")))
    assert [e.shape for e in rr0] == [(3, 2), (0, 2), (5, 2), (4, 2)]
    rr2 = list(ssnp.load(saved("ragged_rank2")))
    assert rr2[1].ragged_rank == 2 and len(rr2[1]) == 2
    assert [len(r) for r in rr2[1].to_list()] == [1, 0]
    inner = tf.RaggedTensor.from_row_lengths(
        tf.reshape(tf.range(40, dtype=tf.float64), [20, 2]), [2, 0, 3, 1, 4, 2, 0, 3, 5]
    )
    mid = tf.RaggedTensor.from_row_lengths(inner, [2, 1, 0, 3, 3])
    assert [[r.tolist() for r in row] for row in rr2[0].to_list()] == [mid[0].to_list()]
    uni = list(ssnp.load(saved("ragged_int32_uniform")))
    assert uni[0].nested_row_splits[0].dtype == np.int32
    sp = list(ssnp.load(saved("sparse_unknown_shape")))
    dense = tf.sparse.to_dense(
        next(iter(superserial.load(saved("sparse_unknown_shape")).skip(3)))
    ).numpy()
    assert sp[3].to_dense().tolist() == dense.tolist()
    nested = list(ssnp.load(saved("nested_dict_tuple_namedtuple")))
    assert type(nested[2][0]).__name__ == "Point" and nested[2][0]._fields == ("x", "y")
    # Picklable (DataLoader workers pickle elements), though the class is made at run time.
    assert canon_np(pickle.loads(pickle.dumps(nested[2]))) == canon_np(nested[2])
    assert nested[2][0].y["a/b"].tolist() == [2, 2] and nested[2][1]["z"][1].shape == (0, 3)


# ------------------------------------------------------------ API


def test_len_and_shard_selection(saved: Any) -> None:
    path = saved("4_shards")
    all_ = [canon_np(e) for e in ssnp.load(path)]
    parts = [ssnp.load(path, shard=(i, 3)) for i in range(3)]
    assert sum(len(p) for p in parts) == len(all_) == 11
    assert len(parts[0].files) == 2 and len(parts[1].files) == 1
    seen = sorted(json.dumps(str(canon_np(e))) for p in parts for e in p)
    assert seen == sorted(json.dumps(str(e)) for e in all_)
    with pytest.raises(ValueError, match="shard"):
        ssnp.load(path, shard=(3, 3))


def test_shard_with_fewer_files_than_hosts_warns(saved: Any) -> None:
    # 4 files for 8 hosts: hosts 4..7 read nothing, and must say so (a warning, not a log line).
    path = saved("4_shards")
    with pytest.warns(IdleReaderWarning, match=r"host 5 reads nothing.*num_shards="):
        assert len(ssnp.load(path, shard=(5, 8))) == 0
    with pytest.warns(IdleReaderWarning, match=r"hosts 4\.\.7 of 8 read nothing"):
        assert len(superserial.load(path, shard=(5, 8))) == 0
    with pytest.warns(IdleReaderWarning, match=r"host 1 reads shard 1"):  # the busy hosts tell too
        assert len(superserial.load(path, shard=(1, 8))) == 3
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enough files: no warning
        ssnp.load(path, shard=(3, 4))
        superserial.load(path, shard=(3, 4))


def test_record_ranges_within_shards(saved: Any) -> None:
    # starts= reads a shard from a record on (found by walking the framing, or in a GZIP
    # shard by its index's restart points), which lets readers split a shard; the ranges
    # together are the shard, exactly once.
    for name in ("4_shards", "gzip_3_shards"):
        whole = ssnp.load(saved(name))
        want = [str(canon_np(e)) for e in whole]
        got = []
        for file, count in zip(whole.files, whole.counts, strict=True):
            cuts = [0, count // 3, count // 3, count]  # includes an empty range
            for a, b in itertools.pairwise(cuts):
                part = ssnp.NumpyDataset(whole.path, whole.header, [file], [b - a], starts=[a])
                got.extend(str(canon_np(e)) for e in part)
        assert got == want, name


def test_record_range_names_the_corrupt_record(saved: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "copy")
    shutil.copytree(saved("4_shards"), path)
    whole = ssnp.load(path)
    file, count = whole.files[0], whole.counts[0]
    data = bytearray(Path(file).read_bytes())
    (length,) = struct.unpack_from("<Q", data, 0)
    data[16 + length] ^= 0xFF  # record 1's length: the scan to a later record must stop there
    Path(file).write_bytes(bytes(data))
    part = ssnp.NumpyDataset(path, whole.header, [file], [count - 2], starts=[2])
    with pytest.raises(CorruptDataError, match=r"corrupted length.* record 1"):
        list(part)
    # A range that ends the shard checks that no record follows it; one inside it does not look.
    n = whole.counts[1]
    _set_shard_bytes(path, 1, os.path.getsize(whole.files[1]), records=n - 1)
    short = ssnp.load(path)
    inner = ssnp.NumpyDataset(path, short.header, [short.files[1]], [n - 3], starts=[1])
    assert len(list(inner)) == n - 3
    last = ssnp.NumpyDataset(path, short.header, [short.files[1]], [n - 2], starts=[1])
    with pytest.raises(CorruptDataError, match=f"expected {n - 1} records, got more"):
        list(last)


def test_iter_batches(saved: Any) -> None:
    path = saved("gzip_3_shards")
    batches = list(ssnp.iter_batches(path, 4))
    assert [len(b["label"]) for b in batches] == [4, 4, 3]
    assert np.concatenate([b["label"] for b in batches]).tolist() == list(range(11))
    assert batches[0]["img"].shape == (4, 5, 5) and batches[0]["img"].flags.writeable
    assert [len(b["label"]) for b in ssnp.iter_batches(path, 4, drop_remainder=True)] == [4, 4]
    assert isinstance(batches[0]["rag"], list) and len(batches[0]["rag"]) == 4
    with pytest.raises(ValueError, match="batch_size"):
        ssnp.iter_batches(path, 0)


def test_missing_dataset(tmp_path: Any) -> None:
    with pytest.raises(DatasetNotFoundError):
        ssnp.load(str(tmp_path / "nope"))


def test_read_records_matches_tf(saved: Any) -> None:
    for key, comp in (("zlib_3_shards", "ZLIB"), ("gzip_3_shards", "GZIP"), ("4_shards", None)):
        for file in ssnp.load(saved(key)).files:
            want = [r.numpy() for r in tf.data.TFRecordDataset(file, comp or "")]
            assert list(ssnp.read_records(file, comp)) == want
            with open(file, "rb") as f:
                assert list(ssnp.read_records(f, comp)) == want


def test_fsspec_memory(saved: Any) -> None:
    fsspec = pytest.importorskip("fsspec")
    path = saved("zlib_3_shards")
    mem = fsspec.filesystem("memory")
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            mem.pipe(f"/npreader/{name}", f.read())
    try:
        url = "memory://npreader"
        assert [canon_np(e) for e in ssnp.load(url)] == [canon_np(e) for e in ssnp.load(path)]
        assert len(ssnp.load(url)) == 11
        assert sum(len(b["label"]) for b in ssnp.iter_batches(url, 5)) == 11
        with pytest.raises(DatasetNotFoundError):
            ssnp.load("memory://npreader-missing")
        mem.pipe("/npreader/" + os.path.basename(_shard(path, 1)), b"")
        with pytest.raises(CorruptDataError, match="bytes"):
            ssnp.load(url)
    finally:
        mem.rm("/npreader", recursive=True)


def test_tensorflow_filesystem_url(saved: Any) -> None:
    """The reader reaches storage through superserial.storage.fs: a ram:// dataset (a scheme
    only TensorFlow serves, imported in this process) reads as the local copy."""
    path = saved("zlib_3_shards")
    url = f"ram://npreader-{os.getpid()}/ds"
    tf.io.gfile.makedirs(url)
    # Each shard before its index: TensorFlow's ram:// takes a name that prefixes an
    # existing one (NAME before NAME.index) for a directory, and refuses the copy.
    for name in sorted(os.listdir(path)):
        tf.io.gfile.copy(os.path.join(path, name), f"{url}/{name}")
    try:
        assert [canon_np(e) for e in ssnp.load(url)] == [canon_np(e) for e in ssnp.load(path)]
        assert sum(len(b["label"]) for b in ssnp.iter_batches(url, 4)) == 11
    finally:
        tf.io.gfile.rmtree(url)


# ------------------------------------------------------------ without TF / import order


def _digest(elements: list[Any]) -> str:
    return hashlib.sha256(repr([canon_np(e) for e in elements]).encode()).hexdigest()


_DIGEST_SRC = textwrap.dedent(
    """
    import hashlib, sys
    import numpy as np
    {pre}
    import superserial, superserial.numpy as ssnp
    {post}
    def arr(a):
        return ("bytes", a.shape, a.tolist()) if a.dtype == object else (str(a.dtype), a.shape, a.tobytes())
    def canon(x):
        if isinstance(x, dict): return {{k: canon(v) for k, v in x.items()}}
        if isinstance(x, tuple) and hasattr(x, "_fields"): return ("namedtuple", type(x).__name__, x._fields, [canon(v) for v in x])
        if isinstance(x, tuple): return ("tuple", [canon(v) for v in x])
        if isinstance(x, ssnp.Ragged): return ("ragged", arr(x.flat_values), [arr(s) for s in x.nested_row_splits])
        if isinstance(x, ssnp.Sparse): return ("sparse", arr(x.indices), arr(x.values), arr(x.dense_shape))
        return arr(x)
    els = list(ssnp.load(sys.argv[1]))
    print(hashlib.sha256(repr([canon(e) for e in els]).encode()).hexdigest())
    {check}
    """
)

_NO_TF = (
    "sys.modules['tensorflow'] = None",
    "",
    "import importlib\n"
    "try:\n    importlib.import_module('tensorflow')\nexcept ImportError:\n    print('no-tf')\n"
    "assert sys.modules['tensorflow'] is None",
)
_TF_FIRST = (
    "import tensorflow as tf",
    "",
    "print(tf.train.Example.FromString(next(iter(ssnp.read_records(ssnp.load(sys.argv[1]).files[0])))).ByteSize() > 0)",
)
_TF_AFTER = (
    "",
    "import tensorflow as tf",
    "print(tf.train.Example.FromString(next(iter(ssnp.read_records(ssnp.load(sys.argv[1]).files[0])))).ByteSize() > 0)",
)


@pytest.mark.parametrize("variant", ["no_tensorflow", "tensorflow_first", "tensorflow_after"])
def test_subprocess(saved: Any, variant: str) -> None:
    pre, post, check = {
        "no_tensorflow": _NO_TF,
        "tensorflow_first": _TF_FIRST,
        "tensorflow_after": _TF_AFTER,
    }[variant]
    path = (
        saved("nested_dict_tuple_namedtuple")
        if variant == "no_tensorflow"
        else saved("ragged_rank2")
    )
    src = _DIGEST_SRC.format(pre=pre, post=post, check=check)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", src, path], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split()
    assert lines[0] == _digest(list(ssnp.load(path)))
    assert lines[1] == ("no-tf" if variant == "no_tensorflow" else "True")


_MEMORY_NO_TF = textwrap.dedent(
    """
    import os, sys
    sys.modules["tensorflow"] = None
    import fsspec
    import superserial.numpy as ssnp
    mem = fsspec.filesystem("memory")
    for name in os.listdir(sys.argv[1]):
        with open(os.path.join(sys.argv[1], name), "rb") as f:
            mem.pipe("/np-tf-free/" + name, f.read())
    url = "memory://np-tf-free"
    whole = ssnp.load(url)
    labels = [int(e["label"]) for e in whole]
    starts = [1] * len(whole.files)  # record ranges walk the framing through fs too
    part = ssnp.NumpyDataset(url, whole.header, whole.files, [c - 1 for c in whole.counts], starts=starts)
    print(labels, [int(e["label"]) for e in part], sys.modules["tensorflow"])
    """
)


def test_url_without_tensorflow(saved: Any) -> None:
    """memory:// datasets (header, shard checks, records, record ranges) read with
    TensorFlow blocked: layout and fs serve URLs without it."""
    pytest.importorskip("fsspec")
    path = saved("4_shards")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_NO_TF, path],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    whole = ssnp.load(path)
    labels = [int(e["label"]) for e in whole]
    firsts = set(np.cumsum([0, *whole.counts[:-1]]).tolist())
    rest = [x for i, x in enumerate(labels) if i not in firsts]
    assert out.stdout.strip() == f"{labels} {rest} None"


# ------------------------------------------------------------ damaged files


def _records_layout(data: bytes) -> list[tuple[int, int]]:
    """(offset, payload length) of each record of an uncompressed TFRecord file."""
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        out.append((pos, length))
        pos += 16 + length
    return out


def _set_shard_bytes(path: str, index: int, size: int, records: int | None = None) -> None:
    """Edits header.json so the header agrees with a rewritten shard's size."""
    hpath = os.path.join(path, "header.json")
    with open(hpath) as f:
        obj = json.load(f)
    obj["shards"][index]["bytes"] = size
    if records is not None:
        delta = records - obj["shards"][index]["records"]
        obj["shards"][index]["records"] = records
        obj["element_count"] += delta
    with open(hpath, "w") as f:
        json.dump(obj, f)


_PRISTINE: dict[str, tuple[str, list[Any]]] = {}


@pytest.fixture(scope="module")
def pristine_root(tmp_path_factory: Any) -> Any:
    return tmp_path_factory.mktemp("pristine")


def _small(root: Any, tmp_path: Any, compression: str | None = None) -> tuple[str, list[Any]]:
    """A fresh copy of a small saved dataset (saved once per module) and its TF elements."""
    key = f"small-{compression}"
    if key not in _PRISTINE:
        ds = tf.data.Dataset.range(5).map(
            lambda i: {
                "x": tf.fill([3], tf.cast(i, tf.int8)),
                "s": tf.strings.as_string(i),
                "u": tf.fill([4], tf.cast(i, tf.uint8)),
            }
        )
        superserial.save(ds, str(root / key), compression=compression)
        _PRISTINE[key] = (str(root / key), [canon_tf(e) for e in superserial.load(str(root / key))])
    src, want = _PRISTINE[key]
    path = str(tmp_path / "small")
    shutil.copytree(src, path)
    return path, want


def _shard(path: str, index: int = 0) -> str:
    return os.path.join(path, superserial.read_header(path).shards[index].file)


def _consume(path: str) -> tuple[list[Any], CorruptDataError]:
    got = []
    with pytest.raises(CorruptDataError) as info:
        for e in ssnp.load(path):
            got.append(canon_np(e))
    return got, info.value


@pytest.mark.parametrize("record", [0, 4])
@pytest.mark.parametrize("part", ["length", "length_crc", "payload", "data_crc"])
def test_flipped_byte(pristine_root: Any, tmp_path: Any, part: str, record: int) -> None:
    path, want = _small(pristine_root, tmp_path)
    file = _shard(path)
    data = bytearray(Path(file).read_bytes())
    offset, length = _records_layout(bytes(data))[record]
    pos = {"length": 0, "length_crc": 8, "payload": 12 + length // 2, "data_crc": 12 + length}[part]
    data[offset + pos] ^= 0x04
    Path(file).write_bytes(data)
    got, err = _consume(path)
    assert got == want[:record]  # never a wrong value: everything before the damage, then an error
    assert file in str(err) and f"record {record}" in str(err)
    assert ("length CRC" if part in ("length", "length_crc") else "data CRC") in str(err)


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
@pytest.mark.parametrize("cut", [0.3, 0.5, 0.95])  # never on a record boundary
def test_truncated(pristine_root: Any, tmp_path: Any, compression: str | None, cut: float) -> None:
    path, want = _small(pristine_root, tmp_path, compression)
    file = _shard(path)
    data = Path(file).read_bytes()
    keep = int(len(data) * cut)
    Path(file).write_bytes(data[:keep])
    with pytest.raises(CorruptDataError, match="bytes"):
        ssnp.load(path)  # the size check against the header comes first
    with pytest.raises(CorruptDataError, match=r"record \d+"):
        list(ssnp.read_records(file, compression))
    _set_shard_bytes(path, 0, keep)
    got, err = _consume(path)
    assert got == want[: len(got)]  # a GZIP trailer cut shows only after the last record
    assert file in str(err)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
@pytest.mark.parametrize("where", [0.5, 0.97])
def test_compressed_flip(pristine_root: Any, tmp_path: Any, compression: str, where: float) -> None:
    path, want = _small(pristine_root, tmp_path, compression)
    file = _shard(path)
    data = bytearray(Path(file).read_bytes())
    data[int(len(data) * where)] ^= 0x10
    Path(file).write_bytes(data)
    got, err = _consume(path)
    assert got == want[: len(got)]
    assert file in str(err)


def _rewrite(path: str, mutate: Any, compression: str | None = None) -> None:
    """Rewrites the single shard with each tf.train.Example passed through ``mutate``."""
    file = _shard(path)
    records = [tf.train.Example.FromString(r) for r in ssnp.read_records(file, compression)]
    out = [m for i, ex in enumerate(records) if (m := mutate(i, ex)) is not None]
    with tf.io.TFRecordWriter(file, tf.io.TFRecordOptions(compression_type=compression or "")) as w:
        for ex in out:
            w.write(ex if isinstance(ex, bytes) else ex.SerializeToString())
    _set_shard_bytes(path, 0, os.path.getsize(file))


def _at(i: int, fn: Any) -> Any:
    def mutate(k: int, ex: Any) -> Any:
        if k == i:
            fn(ex.features.feature)
        return ex

    return mutate


def _set_int(name: str, values: list[int]) -> Any:
    def fn(f: Any) -> None:
        f[name].int64_list.value[:] = values

    return fn


def _del(name: str) -> Any:
    return lambda f: f.__delitem__(name)


def _float_kind(name: str) -> Any:
    def fn(f: Any) -> None:
        f[name].float_list.value[:] = [1.0, 2.0, 3.0]

    return fn


def _short_raw(name: str) -> Any:
    def fn(f: Any) -> None:
        f[name].bytes_list.value[0] = f[name].bytes_list.value[0][:-1]

    return fn


BAD_CONTENT = {
    "int8_out_of_range": ("small", "x", _set_int("x", [1, 300, 2]), "int8 values"),
    "too_few_values": ("small", "x", _set_int("x", [1, 2]), "expected 3 values"),
    "wrong_list_kind": ("small", "x", _float_kind("x"), "int64_list"),
    "missing_feature": ("small", "s", _del("s"), "feature 's'"),
    "raw_byte_length": ("small", "u", _short_raw("u"), "expected 4 bytes"),
    "bool_out_of_range": ("kinds", "b", _set_int("b", [2]), "bool values"),
    "shape_mismatch": ("kinds", "unk", _set_int("unk~shape", [3, 2]), "values for shape"),
    "shape_known_dim": ("kinds", "unk", _set_int("unk~shape", [2, 3]), "dimension 1 of size 2"),
    "negative_row_length": ("kinds", "rag", _set_int("rag~rl1", [-1, 3]), "row lengths >= 0"),
    "row_lengths_sum": ("kinds", "rag", _set_int("rag~rl1", [1, 1]), "adding up"),
    "ragged_missing_row_lengths": ("kinds", "rag", _del("rag~rl1"), "rag~rl1"),
    "sparse_index_outside": (
        "kinds",
        "sp",
        _set_int("sp~idx", [0, 0, 9, 1]),
        "inside the dense shape",
    ),
    "sparse_index_count": ("kinds", "sp", _set_int("sp~idx", [0, 0, 1]), "indices per value"),
    "not_an_example": ("small", "", lambda f: None, "tf.train.Example"),
}


def _kinds(path: str) -> None:
    def build(i: Any) -> Any:
        v = tf.cast(tf.range(4), tf.float64)
        return {
            "b": tf.cast(i % 2, tf.bool),
            "unk": tf.reshape(v, [2, 2])[: tf.cast(i, tf.int32) * 0 + 2],  # shape [None, 2]
            "rag": tf.RaggedTensor.from_row_lengths(v, [2, 2]),
            "sp": tf.SparseTensor([[0, 0], [1, 1]], v[:2], [2, 2]),
        }

    superserial.save(tf.data.Dataset.range(3).map(build), path)


@pytest.mark.parametrize("case", sorted(BAD_CONTENT))
def test_bad_content(pristine_root: Any, tmp_path: Any, case: str) -> None:
    which, leaf, fn, text = BAD_CONTENT[case]
    if which == "small":
        path, _ = _small(pristine_root, tmp_path)
    else:
        if "kinds" not in _PRISTINE:
            _kinds(str(pristine_root / "kinds"))
            _PRISTINE["kinds"] = (str(pristine_root / "kinds"), [])
        path = str(tmp_path / "kinds")
        shutil.copytree(_PRISTINE["kinds"][0], path)
    header = superserial.read_header(path)
    if which == "kinds":
        assert {lf.name: lf for lf in header.leaves}["unk"].shape == (None, 2)
    if case == "not_an_example":
        _rewrite(path, lambda k, ex: b"\xff\xff\xff" if k == 1 else ex)
    else:
        _rewrite(path, _at(1, fn))
    got, err = _consume(path)
    assert len(got) == 1
    assert text in str(err) and "record 1" in str(err)
    if leaf:
        assert f"leaf {leaf}" in str(err)
    with pytest.raises(CorruptDataError, match=text):
        list(ssnp.load(path).batches(3))
    # The TF loader refuses the same records.
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.DataLossError, ValueError)):
        list(superserial.load(path))


@pytest.mark.parametrize("change", ["fewer", "more"])
def test_record_count_checked(pristine_root: Any, tmp_path: Any, change: str) -> None:
    path, want = _small(pristine_root, tmp_path)
    if change == "fewer":
        _rewrite(path, lambda k, ex: None if k == 4 else ex)
    else:
        file = _shard(path)
        extra = Path(file).read_bytes()
        first = extra[: 16 + _records_layout(extra)[0][1]]
        with open(file, "ab") as f:
            f.write(first)
        _set_shard_bytes(path, 0, os.path.getsize(file))
    got, err = _consume(path)
    assert got == want[: len(got)]
    assert ("got 4" if change == "fewer" else "got more") in str(err)


def test_copy_then_corrupt_leaves_original(saved: Any, tmp_path: Any) -> None:
    src = saved("4_shards")
    dst = str(tmp_path / "copy")
    shutil.copytree(src, dst)
    name = os.path.basename(_shard(src, 2))
    os.remove(os.path.join(dst, name))
    with pytest.raises(CorruptDataError, match=name):
        ssnp.load(dst)
    assert len(list(ssnp.load(src))) == 11


def test_ragged_rows_of_zero_size(tmp_path: Any) -> None:
    # Elements [None, None, 0]: rows exist, but hold no values. Compared with the
    # source dataset: superserial.load fails on this one (reshape of an empty tensor).
    rt = tf.RaggedTensor.from_row_lengths(
        tf.RaggedTensor.from_row_lengths(tf.zeros([5, 0]), [2, 3]), [1, 1]
    )
    ds = tf.data.Dataset.from_tensor_slices(rt)
    path = str(tmp_path / "zr")
    superserial.save(ds, path)
    got = [canon_np(e) for e in ssnp.load(path)]
    assert got == [canon_tf(e) for e in ds]
    assert [e.flat_values.shape for e in ssnp.load(path)] == [(2, 0), (3, 0)]


def test_golden_v1_files(tmp_path: Any) -> None:
    # The committed format_version 1 files: the numpy reader reads them as TF does.
    golden = os.path.join(os.path.dirname(__file__), "golden", "v1")
    if not os.path.isdir(golden):
        pytest.skip("no golden files in this checkout")
    path = shutil.copytree(golden, str(tmp_path / "v1"))
    assert len(check_against_tf(path)) == superserial.read_header(path).element_count > 0

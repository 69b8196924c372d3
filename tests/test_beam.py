"""Apache Beam: WriteToSuperSerial / ReadFromSuperSerial on the DirectRunner with two workers.

Two pipelines in all (they are slow to start): one writes five datasets (the
round-trip matrix of every leaf kind among them), one reads four back. Records must be byte-identical to what ``save`` writes for
the same elements; Beam does not keep element order, so comparisons sort by
an ``id`` leaf (or by value).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_same_value, dataset_files
from matrix import N, leaf_kinds_dataset

beam = pytest.importorskip("apache_beam")
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

import superserial  # noqa: E402
import superserial.beam as ssb  # noqa: E402
import superserial.numpy as ssnp  # noqa: E402
from superserial.codec.tf_records import ElementEncoder  # noqa: E402
from superserial.errors import DatasetExistsError, UnsupportedError  # noqa: E402
from superserial.format import dtypes  # noqa: E402

Point = collections.namedtuple("Point", ["x", "y"])

OPTIONS = {"direct_num_workers": 2, "direct_running_mode": "multi_threading"}


def _dtype_values(entry: dtypes.DType, n: int, seed: int) -> np.ndarray:
    """[n, 2] values: extremes, NaN payloads, -0.0, random."""
    rng = np.random.default_rng(seed)
    size = 2 * n
    if entry.name == "string":
        pool = [b"", b"a", b"\x00\xff", "é".encode(), b"x" * 40]
        return np.array(
            [pool[i % 5] + bytes([i % 256]) for i in range(size)], dtype=object
        ).reshape(n, 2)
    if entry.name == "bool":
        return (np.arange(size) % 3 == 0).reshape(n, 2)
    if entry.is_integer:
        info = np.iinfo(entry.numpy)
        vals = rng.integers(info.min, info.max, size=size, dtype=entry.numpy, endpoint=True)
        vals[:4] = [info.min, info.max, 0, 1]
        return vals.reshape(n, 2)
    if entry.name == "float32":
        bits = np.array([0x7FC00001, 0x7F800001, 0xFFC0BEEF, 0x80000000], np.uint32).view(
            np.float32
        )
    elif entry.name in ("float16", "bfloat16"):
        bits = np.array([0x7E01, 0x7C01, 0xFE55, 0x8000], np.uint16).view(entry.numpy)
    else:
        real = {"complex64": np.float32, "complex128": np.float64}.get(entry.name, entry.numpy)
        bits = np.array([np.nan, -0.0, np.inf, -np.inf], real).astype(entry.numpy)
    vals = rng.standard_normal(size).astype(np.float64).astype(entry.numpy)
    if entry.name.startswith("complex"):
        vals = vals + 1j * vals[::-1]
    vals[:4] = bits
    return vals.reshape(n, 2)


def all_dtypes_dataset(n: int = 24) -> tf.data.Dataset:
    """Every dtype of the table as a [2] leaf, plus an id."""
    cols = {
        e.name: tf.constant(_dtype_values(e, n, i), dtype=tf.as_dtype(e.name))
        for i, e in enumerate(dtypes.DTYPES)
    }
    return tf.data.Dataset.from_tensor_slices({"id": tf.range(n, dtype=tf.int64), "d": cols})


# Every leaf kind, in dtypes whose numpy values are the least plain (an
# extension dtype, object arrays of bytes). The full product of leaf kinds and
# dtypes goes through the same encoder in test_distributed (Writer); "dtypes"
# covers every dtype here. Tracing the encoder of the full product (160
# leaves) several times would take Beam's test past ten minutes.
MATRIX_DTYPES = ("bfloat16", "string")


def matrix_dataset() -> tf.data.Dataset:
    """Every leaf kind of MATRIX_DTYPES, in one element, plus an id."""
    leaves = {
        name: leaf_kinds_dataset(dtypes.by_name(name), seed=3 * i)
        for i, name in enumerate(MATRIX_DTYPES)
    }
    return tf.data.Dataset.zip({"id": tf.data.Dataset.range(N), **leaves})


def nested_dataset(n: int = 18) -> tf.data.Dataset:
    """Namedtuple in tuple in dict; ragged of rank 1 and 2; sparse; unknown dims."""

    def element(k: tf.Tensor) -> dict:
        m = tf.cast(k % 4, tf.int64)
        r1 = tf.RaggedTensor.from_row_lengths(tf.cast(tf.range(2 * m), tf.float16), [m, m])
        inner = tf.RaggedTensor.from_row_lengths(tf.strings.as_string(tf.range(m + 1)), [m + 1])
        r2 = tf.RaggedTensor.from_row_lengths(inner, [1], validate=False).with_row_splits_dtype(
            tf.int32
        )
        sp = tf.sparse.from_dense(
            tf.reshape(tf.cast(tf.range(6, dtype=tf.int64) * (k % 2), tf.uint64), [2, 3])
        )
        return {
            "id": k,
            "t": (
                Point(x=tf.cast(k, tf.float32), y=tf.strings.as_string(k)),
                tf.cast(tf.fill([m, 2], k), tf.uint8),
            ),
            "r1": r1,
            "r2": r2,
            "sp": sp,
            "z": tf.zeros([2, 0], tf.complex64),
        }

    return tf.data.Dataset.range(n).map(element)


def plain_dataset(n: int = 10) -> tf.data.Dataset:
    """A single tensor leaf (feature ``value``), no id."""
    return tf.data.Dataset.from_tensor_slices(
        tf.constant(_dtype_values(dtypes.by_name("float64"), n, 7))
    )


def _to_numpy(x):
    """TF values to the numpy forms the numpy reader yields (exact, unlike as_numpy_iterator)."""
    if isinstance(x, tf.RaggedTensor):
        return ssnp.Ragged(x.flat_values.numpy(), tuple(s.numpy() for s in x.nested_row_splits))
    if isinstance(x, tf.SparseTensor):
        return ssnp.Sparse(x.indices.numpy(), x.values.numpy(), x.dense_shape.numpy())
    if isinstance(x, dict):
        return {k: _to_numpy(v) for k, v in x.items()}
    if isinstance(x, tuple):
        items = [_to_numpy(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    return x.numpy()


def _canon(x: object) -> tuple[object, ...]:
    """A hashable, exact form of a numpy element, for Beam's equal_to.

    Annotated because Beam otherwise infers ``beam.Map(_canon)``'s output type by
    interpreting its bytecode, recursing into each call of itself: 6-16 s of this test.
    """
    if isinstance(x, dict):
        return ("dict", tuple((k, _canon(v)) for k, v in sorted(x.items())))
    if isinstance(x, tuple):
        return (type(x).__name__, getattr(x, "_fields", None), tuple(_canon(v) for v in x))
    if isinstance(x, ssnp.Ragged):
        return ("ragged", _canon(x.flat_values), tuple(_canon(s) for s in x.nested_row_splits))
    if isinstance(x, ssnp.Sparse):
        return ("sparse", _canon(x.indices), _canon(x.values), _canon(x.dense_shape))
    a = np.asarray(x)
    body = tuple(a.ravel().tolist()) if a.dtype == object else a.tobytes()
    return (a.dtype.str, a.shape, body)


def _records(path: str) -> list[bytes]:
    header = superserial.read_header(path)
    out = []
    for s in header.shards:
        out.extend(ssnp.read_records(os.path.join(path, s.file), header.compression))
    return out


CASES = {
    # name: (dataset builder, numpy elements builder, options, sort key)
    "dtypes": (all_dtypes_dataset, "as_numpy_iterator", {}, "id"),
    # Numpy values as the numpy reader yields them (exact; as_numpy_iterator
    # densifies sparse leaves), ragged_rank 0 leaves included.
    "matrix": (matrix_dataset, "exact", {}, "id"),
    "nested": (nested_dataset, "exact", {"compression": "GZIP"}, "id"),
    "plain": (plain_dataset, "exact", {"compression": "ZLIB", "num_shards": 3}, None),
}


def _sorted(elements, key):
    if key is None:
        return sorted(elements, key=lambda e: _to_numpy(e).tobytes())
    return sorted(elements, key=lambda e: int(e[key]))


def test_write_and_read_round_trip(tmp_path):
    datasets = {name: builder() for name, (builder, _, _, _) in CASES.items()}
    inputs = {}
    for name, ds in datasets.items():
        mode = CASES[name][1]
        inputs[name] = (
            list(ds.as_numpy_iterator())
            if mode == "as_numpy_iterator"
            else [_to_numpy(e) for e in ds]
        )
    beam_path = {name: str(tmp_path / f"beam_{name}") for name in CASES}
    empty_path = str(tmp_path / "beam_empty")

    with beam.Pipeline(options=PipelineOptions(**OPTIONS)) as p:
        for name, ds in datasets.items():
            opts = CASES[name][2]
            _ = (
                p
                | f"Create {name}" >> beam.Create(inputs[name])
                | f"Write {name}"
                >> ssb.WriteToSuperSerial(
                    beam_path[name], ds.element_spec, max_batch_size=7, **opts
                )
            )
        _ = (
            p
            | "Create empty" >> beam.Create([])
            | "Write empty" >> ssb.WriteToSuperSerial(empty_path, datasets["plain"].element_spec)
        )

    save_path = {}
    for name, ds in datasets.items():
        opts = {k: v for k, v in CASES[name][2].items() if k != "num_shards"}
        save_path[name] = str(tmp_path / f"save_{name}")
        superserial.save(ds, save_path[name], **opts)
        header = superserial.read_header(beam_path[name])
        n = len(inputs[name])
        assert header.element_count == n
        assert header.compression == CASES[name][2].get("compression")
        assert header.structure == superserial.read_header(save_path[name]).structure
        files = [s.file for s in header.shards]
        assert files == [f"data-{k:05d}-of-{len(files):05d}.tfrecord" for k in range(len(files))]
        if "num_shards" in CASES[name][2]:
            assert len(files) == CASES[name][2]["num_shards"]
        # Byte-identical records, as a multiset (Beam keeps no order).
        beam_records, save_records = _records(beam_path[name]), _records(save_path[name])
        assert len(beam_records) == n
        assert sorted(beam_records) == sorted(save_records), name
        # And through superserial.load: the same elements, bit for bit.
        loaded = superserial.load(beam_path[name])
        assert loaded.element_spec == ds.element_spec
        key = CASES[name][3]
        got, want = _sorted(list(loaded), key), _sorted(list(ds), key)
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            assert_same_value(a, b, where=f"{name} element {i}")
    empty = superserial.read_header(empty_path)
    assert empty.element_count == 0 and sum(1 for _ in superserial.load(empty_path)) == 0

    # Read back with Beam: what save wrote, as the numpy reader yields it.
    with beam.Pipeline(options=PipelineOptions(**OPTIONS)) as p:
        for name in CASES:
            expected = [_canon(e) for e in ssnp.load(save_path[name])]
            got = (
                p
                | f"Read {name}" >> ssb.ReadFromSuperSerial(beam_path[name])
                | f"Shuffle {name}" >> beam.Reshuffle()  # elements cross a pickling boundary
                | f"Canon {name}" >> beam.Map(_canon)
            )
            assert_that(got, equal_to(expected), label=f"Check {name}")


def test_errors_without_a_pipeline(tmp_path):
    with pytest.raises(
        UnsupportedError, match=r"expected a leaf of a supported dtype, got TensorSpec qint8 at x"
    ):
        ssb.WriteToSuperSerial(str(tmp_path / "a"), {"x": tf.TensorSpec([], tf.qint8)})
    superserial.save(plain_dataset(2), str(tmp_path / "b"))
    with pytest.raises(DatasetExistsError, match=r"found header\.json"):
        ssb.WriteToSuperSerial(str(tmp_path / "b"), plain_dataset(2).element_spec)
    ds = nested_dataset(3)
    ssb.WriteToSuperSerial(str(tmp_path / "c"), ds.element_spec)
    # The workers' encoder: Beam's encode step runs exactly this on each batch.
    encoder = ElementEncoder(ds.element_spec)
    good = [_to_numpy(e) for e in ds]
    assert sum(len(records) for records, _ in encoder.encode(good)) == 3
    bad = dict(good[1])
    bad["t"] = (bad["t"][0]._replace(x=np.float64(1.0)), bad["t"][1])
    with pytest.raises(UnsupportedError, match=r"expected float32, got float64 at t/0/0"):
        list(encoder.encode([good[0], bad]))
    bad["t"] = (bad["t"][0]._replace(x=np.float32(1.0)), np.zeros([2, 3], np.uint8))
    with pytest.raises(UnsupportedError, match=r"expected shape \(None, 2\), got \(2, 3\) at t/1"):
        list(encoder.encode([bad]))
    with pytest.raises(ValueError, match="compression"):
        ssb.WriteToSuperSerial(str(tmp_path / "d"), ds.element_spec, compression="LZMA")


def test_import_superserial_does_not_import_beam():
    code = (
        "import sys, superserial; superserial.Writer; superserial.finalize; "
        "assert 'apache_beam' not in sys.modules, 'apache_beam imported'"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_shards_go_through_shard_writer(tmp_path):
    """One file per 128 MiB with num_shards=0 (one here), exactly n files with num_shards=n
    (empty ones written too), on any filesystem TensorFlow writes (ram://, which Beam's own
    sink cannot reach); the staging directory is gone after the commit."""
    ram = f"ram://superserial-beam-{uuid.uuid4().hex}/ds"
    spread = str(tmp_path / "spread")
    ds = plain_dataset(10)
    elements = [_to_numpy(e) for e in ds]
    with beam.Pipeline(options=PipelineOptions(**OPTIONS)) as p:
        _ = (
            p
            | "Create ram" >> beam.Create(elements)
            | "Write ram" >> ssb.WriteToSuperSerial(ram, ds.element_spec, max_batch_size=3)
        )
        _ = (
            p
            | "Create spread" >> beam.Create(elements[:2])
            | "Write spread"
            >> ssb.WriteToSuperSerial(spread, ds.element_spec, num_shards=5, max_batch_size=1)
        )
    save_path = str(tmp_path / "save")
    superserial.save(ds, save_path)
    try:
        header = superserial.read_header(ram)
        assert [s.file for s in header.shards] == ["data-00000-of-00001.tfrecord"]
        assert sorted(tf.io.gfile.listdir(ram)) == dataset_files(header)
        assert header.shards[0].index is not None
        got = [r.numpy() for r in tf.data.TFRecordDataset(f"{ram}/{header.shards[0].file}")]
        assert sorted(got) == sorted(_records(save_path))
    finally:
        tf.io.gfile.rmtree(ram.rsplit("/", 1)[0])

    header = superserial.read_header(spread)
    names = [f"data-{k:05d}-of-00005.tfrecord" for k in range(5)]
    assert [s.file for s in header.shards] == names
    assert sorted(os.listdir(spread)) == dataset_files(header)
    assert [s.index.file for s in header.shards if s.index] == [n + ".index" for n in names]
    assert header.element_count == 2 and sum(s.records for s in header.shards) == 2
    assert sum(s.records == 0 and s.bytes == 0 for s in header.shards) >= 3
    assert superserial.verify(spread).ok
    key = lambda e: _to_numpy(e).tobytes()  # noqa: E731
    got = sorted(superserial.load(spread), key=key)
    for i, (a, b) in enumerate(zip(sorted(list(ds)[:2], key=key), got, strict=True)):
        assert_same_value(a, b, where=f"spread element {i}")


def test_read_from_fsspec_url_without_tensorflow(tmp_path):
    """ReadFromSuperSerial checks and reads a URL through superserial.storage.fs (fsspec), TF blocked."""
    local = str(tmp_path / "ds")
    superserial.save(nested_dataset(6), local, num_shards=2, compression="GZIP")
    code = f"""
import sys
sys.modules["tensorflow"] = None  # any import of TensorFlow now fails
import apache_beam as beam, fsspec
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
import superserial.beam as ssb
fsspec.filesystem("memory").put({local!r}, "/beam-ds", recursive=True)
read = ssb.ReadFromSuperSerial("memory://beam-ds")
assert len(read.header.shards) == 2
with beam.Pipeline(options=PipelineOptions(**{OPTIONS!r})) as p:
    ids = p | read | beam.Reshuffle() | beam.Map(lambda e: (int(e["id"]), e["t"][0].y.item()))
    assert_that(ids, equal_to([(k, str(k).encode()) for k in range(6)]))
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]

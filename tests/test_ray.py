"""superserial.ray on a local Ray cluster: reads, writes, index-range tasks, failed writers.

One cluster for the module (Ray takes seconds to start), and one TensorFlow
save of the dataset every read test reads (every kind of leaf).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import pyarrow as pa  # noqa: E402

import superserial  # noqa: E402
import superserial.numpy as ssnp  # noqa: E402
import superserial.ray as ssr  # noqa: E402
from superserial.errors import (  # noqa: E402
    DatasetExistsError,
    DatasetNotFoundError,
    HeaderError,
    UnsupportedError,
)
from superserial.format import layout  # noqa: E402
from superserial.format.header import Header, IndexFile, Shard  # noqa: E402
from superserial.format.structure import DictNode  # noqa: E402
from superserial.integrations.ray.source import plan_ranges  # noqa: E402

N = 30
# The leaves the Ray datasink writes (it has no encoder of sparse ones).
ALL_BUT_SPARSE = ["bf", "cx", "img", "label", "meta/score", "meta/tags", "name", "rag", "unk"]


@pytest.fixture(scope="module")
def cluster(s3_server: str) -> Any:
    # After the S3 server: its settings (AWS_ENDPOINT_URL...) are in the environment the
    # workers start with.
    ray.init(
        num_cpus=2,
        object_store_memory=200 << 20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
    )
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # The failing sinks below are classes of this module, which workers cannot import.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def source(tmp_path_factory: Any) -> str:
    """3 shards of every kind of leaf, saved by superserial.save."""
    import ml_dtypes
    import tensorflow as tf

    rng = np.random.default_rng(0)
    lens = (np.arange(N) % 4).astype(np.int64)
    mask = rng.integers(0, 2, (N, 4)).astype(bool)
    cols = {
        "img": rng.integers(0, 256, (N, 2, 3), dtype=np.uint8),
        "label": rng.integers(-(2**62), 2**62, N),
        "name": np.array([f"n{i}é".encode() for i in range(N)], dtype=object),
        "bf": rng.normal(size=(N, 2)).astype(ml_dtypes.bfloat16),
        "cx": (rng.normal(size=N) + 1j * rng.normal(size=N)).astype(np.complex64),
        "score": rng.normal(size=N),
        "tags": np.array([[b"a%d" % i, b""] for i in range(N)], dtype=object),
        "vals": rng.normal(size=(N, 4)).astype(np.float32),
    }

    def build(c: Any, n: Any, m: Any) -> Any:
        return {
            "img": c["img"],
            "label": c["label"],
            "name": c["name"],
            "bf": c["bf"],
            "cx": c["cx"],
            "meta": {"score": c["score"], "tags": c["tags"]},
            "unk": c["vals"][:n],
            "rag": tf.RaggedTensor.from_row_lengths(tf.cast(c["vals"], tf.int32), [n, 4 - n]),
            "sp": tf.sparse.from_dense(tf.where(m, c["vals"], 0.0)),
        }

    ds = tf.data.Dataset.from_tensor_slices((cols, lens, mask)).map(build)
    path = str(tmp_path_factory.mktemp("ray") / "src")
    superserial.save(ds, path, num_shards=3, progress=False)
    return path


def _flat(header: Any, element: Any) -> dict[str, Any]:
    """An element of the numpy reader as {leaf name: value}."""
    out = {}
    for leaf in header.leaves:
        v = element
        for key in leaf.name.split("/"):
            v = v[key]
        out[leaf.name] = v
    return out


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, ssnp.Ragged):
        assert isinstance(b, ssnp.Ragged), where
        _same(a.flat_values, b.flat_values, where)
        for x, y in zip(a.nested_row_splits, b.nested_row_splits, strict=True):
            _same(x, y, where)
        return
    if isinstance(a, ssnp.Sparse):
        assert isinstance(b, ssnp.Sparse), where
        for f in ("indices", "values", "dense_shape"):
            _same(getattr(a, f), getattr(b, f), where)
        return
    a, b = np.asarray(a), np.asarray(b)
    assert (a.dtype, a.shape) == (b.dtype, b.shape), (where, a, b)
    if a.dtype == object:
        assert a.tolist() == b.tolist(), where
    else:
        assert a.tobytes() == b.tobytes(), where


def _assert_rows(path: str, rows: list[dict[str, Any]], select: list[str] | None = None) -> None:
    """Rows from Ray equal the numpy reader's elements, leaf for leaf, bit for bit."""
    expected = ssnp.load(path, select=select)
    assert len(rows) == len(expected)
    names = [leaf.name for leaf in expected.header.leaves]
    for i, (row, element) in enumerate(zip(rows, expected, strict=True)):
        assert sorted(row) == sorted(names), i
        for name, want in _flat(expected.header, element).items():
            got = row[name]
            if isinstance(got, np.generic):  # Ray's scalars, of their own dtype
                got = np.asarray(got)
            elif isinstance(got, bytes):
                got = np.asarray(got, dtype=object)
            _same(want, got, f"element {i} leaf {name}")


def test_read_gives_every_leaf_as_the_numpy_reader(cluster: Any, source: str) -> None:
    ds = ssr.read(source)
    assert ds.count() == N
    _assert_rows(source, ds.take_all())
    # select= prunes the columns; index-range tasks (3 shards cut for 7 tasks) read the same.
    picked = ["img", "meta/tags", "rag"]
    _assert_rows(source, ssr.read(source, select=picked, override_num_blocks=7).take_all(), picked)


def test_read_over_http(cluster: Any, source: str, web_server: Any) -> None:
    # Served by nginx: whole-shard tasks and index-range tasks, through the workers' fetches.
    shutil.copytree(source, os.path.join(web_server.root, "ray-src"))
    url = f"{web_server.url}/ray-src"
    _assert_rows(source, ssr.read(url).take_all())
    _assert_rows(
        source, ssr.read(url, select=["label"], override_num_blocks=6).take_all(), ["label"]
    )


def test_write_and_read_on_s3(cluster: Any, s3_bucket: str) -> None:
    # Parts staged and committed on an object store (no locks, renames are copies).
    url = f"{s3_bucket}/ds"
    items = [{"x": np.full(3, i, np.int16), "name": f"s{i}"} for i in range(9)]
    header = ssr.write(ray.data.from_items(items).repartition(3), url)
    assert header.element_count == 9 and len(header.shards) == 3
    got = ssr.read(url, override_num_blocks=5).take_all()
    assert [r["x"].tolist() for r in got] == [[i] * 3 for i in range(9)]
    assert [r["name"] for r in got] == [f"s{i}".encode() for i in range(9)]


def test_few_shards_are_cut_into_index_ranges_read_through_the_index(source: str) -> None:
    src = ssr.SuperserialDatasource(source, block_rows=4)
    tasks = src.get_read_tasks(8)
    # 30 records in 3 shards of 10, cut for 8 tasks: ranges of 3, 3 and 4 in each shard.
    assert [t.metadata.num_rows for t in tasks] == [3, 3, 4] * 3
    assert all(t.metadata.size_bytes > 0 for t in tasks)
    assert len(ssr.SuperserialDatasource(source).get_read_tasks(2)) == 3  # one per shard
    # Each task's own read (here, in this process): its range, in order, in blocks of 4 rows.
    rows = []
    for t in tasks:
        for block in t.read_fn():
            assert block.num_rows <= 4
            rows += list(_rows(block))
    _assert_rows(source, rows)


def test_compressed_shards_are_cut_too(source: str, tmp_path: Any) -> None:
    # A GZIP shard's index holds its restart points: a range inflates from its first block.
    gz = str(tmp_path / "gz")
    superserial.convert(source, gz, compression="GZIP")
    tasks = ssr.SuperserialDatasource(gz, block_rows=4).get_read_tasks(8)
    assert [t.metadata.num_rows for t in tasks] == [3, 3, 4] * 3
    _assert_rows(source, [r for t in tasks for block in t.read_fn() for r in _rows(block)])


def _rows(block: Any) -> Any:
    from ray.data.block import BlockAccessor

    batch = BlockAccessor.for_block(block).to_numpy()
    for i in range(block.num_rows):
        yield {k: v[i] for k, v in batch.items()}


def test_plan_cuts_only_indexed_shards() -> None:
    shard = Shard("data-00000-of-00001.tfrecord", 20, 100, "00000000")
    header = Header(DictNode({}), 20, "GZIP", (shard,))
    assert [(r.shard, r.start, r.count) for r in plan_ranges(header, 8)] == [(0, 0, 20)]
    index = IndexFile("data-00000-of-00001.tfrecord.index", 168, "00000000")
    indexed = header.with_shards((dataclasses.replace(shard, index=index),))
    assert [(r.start, r.count) for r in plan_ranges(indexed, 4)] == [
        (0, 5),
        (5, 5),
        (10, 5),
        (15, 5),
    ]


def test_write_then_read_back_exactly(cluster: Any, source: str, tmp_path: Any) -> None:
    # Ray columns of every kind the sink takes, in 3 write tasks.
    n = 12
    items = [
        {
            "i8": np.int8(i - 6),
            "h": np.full((2, 2), i, np.float16),
            "s": f"é{i}",
            "b": bytes([i, 0]),
            "meta/id": np.uint64(2**64 - 1 - i),
            "flags": np.array([i % 2 == 0, True, False]),
            "tokens": np.arange(i, dtype=np.int32),  # a Ray variable-shaped tensor column
        }
        for i in range(n)
    ]
    out = str(tmp_path / "out")
    header = ssr.write(ray.data.from_items(items).repartition(3), out)
    assert len(header.shards) == 3 and header.element_count == n
    assert not os.path.exists(os.path.join(out, layout.STAGING_DIR))
    got = list(ssnp.load(out))
    for i, (want, element) in enumerate(zip(items, got, strict=True)):
        _same(np.array(want["s"].encode(), dtype=object), element["s"], "s")
        _same(np.array(want["b"], dtype=object), element["b"], "b")
        _same(want["meta/id"], element["meta"]["id"], "meta/id")
        for k in ("i8", "h", "flags", "tokens"):
            _same(want[k], element[k], f"{i} {k}")
    assert header.leaves[-1].name == "tokens" and header.leaves[-1].shape == (None,)
    # superserial -> Ray -> superserial: the same elements, every leaf but the sparse one
    # (bfloat16, complex, string arrays, unknown shapes and ragged included), from 7
    # index-range read tasks. A ragged leaf's outer dimension comes back unknown.
    again = str(tmp_path / "again")
    header = ssr.write(ssr.read(source, select=ALL_BUT_SPARSE, override_num_blocks=7), again)
    original = ssnp.load(source, select=ALL_BUT_SPARSE)
    kinds = {leaf.name: (leaf.kind, leaf.dtype, leaf.shape) for leaf in original.header.leaves}
    kinds["rag"] = ("ragged", "int32", (None, None))
    assert {leaf.name: (leaf.kind, leaf.dtype, leaf.shape) for leaf in header.leaves} == kinds
    for i, (a, b) in enumerate(zip(original, ssnp.load(again), strict=True)):
        for name, want in _flat(original.header, a).items():
            _same(want, _flat(original.header, b)[name], f"element {i} leaf {name}")
    # Read tasks of one row each: every task's shapes agree, and the column stays
    # variable-shaped (else Ray makes it a fixed-shape one, and the write tasks disagree).
    one = str(tmp_path / "one")
    ssr.write(ssr.read(source, select=["unk"], override_num_blocks=N), one)
    for i, (a, b) in enumerate(zip(ssnp.load(source, select=["unk"]), ssnp.load(one), strict=True)):
        _same(a["unk"], b["unk"], f"element {i}")
    # Sparse values: named, and nothing written.
    with pytest.raises(UnsupportedError, match="no sparse values in column 'sp'"):
        ssr.write(ssr.read(source, select=["sp"]), str(tmp_path / "sparse"))
    assert not os.path.exists(os.path.join(tmp_path, "sparse", layout.HEADER_FILE))


class _FailingSink(ssr.SuperserialDatasink):
    """Write task 1 raises once part 0 is committed (so that there is a part to remove)."""

    def write(self, blocks: Any, ctx: Any) -> Any:
        if ctx.task_idx != 1:
            return super().write(blocks, ctx)
        manifest = os.path.join(layout.part_dir(self.path, 0), layout.MANIFEST_FILE)
        deadline = time.monotonic() + 20
        while not os.path.exists(manifest) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("write task 1 fails")


class _DyingSink(ssr.SuperserialDatasink):
    """Write task 1 dies (os._exit) after its first block is in its attempt's files."""

    def write(self, blocks: Any, ctx: Any) -> Any:
        if ctx.task_idx != 1:
            return super().write(blocks, ctx)

        def first_then_die() -> Any:
            it = iter(blocks)
            yield next(it)
            part = layout.part_dir(self.path, 1)
            # The first block reached the shard writer's file before the process dies.
            assert any(name.startswith("attempt-") for name in os.listdir(part))
            os._exit(1)

        return super().write(first_then_die(), ctx)

    def on_write_failed(self, error: Exception) -> None:
        del error  # as if the driver had died too: its staging area stays


def test_failed_and_killed_writers_leave_no_dataset(cluster: Any, tmp_path: Any) -> None:
    def nothing_at(path: str) -> None:
        assert not os.path.exists(os.path.join(path, layout.HEADER_FILE))
        with pytest.raises(DatasetNotFoundError):
            ssnp.load(path)

    # A task that raises (a null where Ray would make a NaN): named, and no dataset.
    table = pa.table({"x": pa.array([1, 2, None, 4], pa.int64())})
    path = str(tmp_path / "nulls")
    with pytest.raises(UnsupportedError, match=r"column 'x', got null at row 2"):
        ssr.write(ray.data.from_arrow(table), path)
    nothing_at(path)
    assert not os.path.exists(os.path.join(path, layout.STAGING_DIR))

    # A task that raises after another committed its part: that part is removed too.
    path = str(tmp_path / "raised")
    two_tasks = ray.data.range(20, override_num_blocks=2)
    with pytest.raises(RuntimeError, match="write task 1 fails"):
        two_tasks.write_datasink(_FailingSink(path))
    nothing_at(path)
    assert not os.path.exists(os.path.join(path, layout.STAGING_DIR))

    # A task killed in the middle of its part (no retries), and no cleanup after: the
    # other parts' manifests and the dead attempt stay, and nothing takes them for a dataset.
    four_tasks = ray.data.range(40, override_num_blocks=4).map_batches(
        lambda b: {"x": b["id"] * 2}, batch_size=10
    )
    path = str(tmp_path / "killed")
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        four_tasks.write_datasink(_DyingSink(path), ray_remote_args={"max_retries": 0})
    nothing_at(path)
    staging = os.path.join(path, layout.STAGING_DIR)
    assert "part-00001" in os.listdir(staging)
    with pytest.raises(HeaderError, match="num_parts 0: left by a Ray Data write"):
        superserial.finalize(path)
    nothing_at(path)

    # Tasks that disagree on a column's shape: the commit refuses, nothing is written.
    shapes = ray.data.range(4, override_num_blocks=2).map_batches(
        lambda b: {"v": np.zeros((len(b["id"]), 2 if b["id"][0] < 2 else 3))}, batch_size=2
    )
    path = str(tmp_path / "mixed")
    with pytest.raises(HeaderError, match="expected the structure of part 0 in every part"):
        ssr.write(shapes, path)
    nothing_at(path)

    # An old dataset at the path is refused before any task runs, and left as it was.
    old = str(tmp_path / "old")
    ssr.write(ray.data.range(3), old)
    before = sorted(os.listdir(old))
    with pytest.raises(DatasetExistsError):
        ssr.write(four_tasks, old)
    assert sorted(os.listdir(old)) == before
    assert [int(e["id"]) for e in ssnp.load(old)] == [0, 1, 2]

"""Random access through the record index: ``ds[i]``, slices, ``get_batch``, damage, sharing."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import arr_key, canon_np
from matrix import N, SavedOnUse, leaf_kinds_dataset
from superserial.errors import CorruptDataError, UnsupportedError
from superserial.format import dtypes
from superserial.format.record_index import crc32c, encode, read_index
from superserial.format.structure import pack


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in _flatten(x[k])]
    if isinstance(x, tuple):
        return [v for item in x for v in _flatten(item)]
    return [x]


def _batch_key(batch: Any, leaves: Any) -> list[Any]:
    """A comparable form of a batch: stacked leaves as arrays, the others per element."""
    out = []
    for leaf, b in zip(leaves, _flatten(batch), strict=True):
        if leaf.fixed:
            assert type(b) is np.ndarray
            out.append(arr_key(b))
        else:
            out.append([canon_np(v) for v in b])
    return out


@pytest.fixture(scope="module")
def matrix_paths(tmp_path_factory: Any) -> SavedOnUse:
    """Each dtype's leaf-kinds dataset, saved in 2 shards (so reads cross a boundary)."""
    base = tmp_path_factory.mktemp("matrix")
    seeds = {e.name: i for i, e in enumerate(dtypes.DTYPES)}

    def make(name: Any) -> str:
        path = str(base / name)
        entry = dtypes.by_name(name)
        superserial.save(leaf_kinds_dataset(entry, seed=seeds[name]), path, num_shards=2)
        return path

    return SavedOnUse(make)


@pytest.mark.parametrize("dtype", [e.name for e in dtypes.DTYPES])
def test_every_leaf_kind_reads_at_random_as_in_order(matrix_paths: SavedOnUse, dtype: str) -> None:
    ds = ssnp.load(matrix_paths[dtype])
    seq = [canon_np(e) for e in ds]
    assert len(seq) == len(ds) == N
    for i in range(-N, N):
        assert canon_np(ds[i]) == seq[i], f"element {i}"
    for key in (
        slice(None, None, 2),
        slice(1, 5),
        slice(None, None, -1),
        slice(5, 1, -2),
        slice(3, 3),
    ):
        assert [canon_np(e) for e in ds[key]] == seq[key], f"slice {key}"
    order = [5, 0, 5, 2, -1, 3]
    assert [canon_np(e) for e in ds.get_elements(order)] == [seq[i] for i in order]
    leaves = ds.header.leaves
    want = _batch_key(_single_batch(ds, order), leaves)
    assert _batch_key(ds.get_batch(order), leaves) == want


def _single_batch(ds: ssnp.NumpyDataset, order: list[int]) -> Any:
    """The batch of ``order`` as the sequential reader makes it (from a dataset of those)."""
    elements = list(ds)
    picked = [elements[i] for i in order]
    leaves = ds.header.leaves
    flat = [_flatten(e) for e in picked]
    cols = []
    for j, leaf in enumerate(leaves):
        per = [f[j] for f in flat]
        cols.append(np.stack(per) if leaf.fixed else per)
    return pack(ds.header.structure, cols)


@pytest.mark.parametrize(
    ("count", "kwargs"),
    [
        (100, {"num_shards": 7}),  # uneven shards
        (3, {"num_shards": 5}),  # empty shards
        (200, {"shard_size": 500}),  # shards cut by size
        (1, {}),
    ],
)
def test_shard_boundaries(tmp_path: Path, count: int, kwargs: dict[str, Any]) -> None:
    path = str(tmp_path / "ds")
    ds = tf.data.Dataset.range(count).map(lambda i: {"i": i, "s": tf.strings.as_string(i)})
    superserial.save(ds, path, **kwargs)
    d = ssnp.load(path)
    assert [int(d[i]["i"]) for i in range(count)] == list(range(count))
    assert [int(d[i]["i"]) for i in range(-count, 0)] == list(range(count))
    rng = np.random.default_rng(0)
    idx = rng.integers(-count, count, size=300)
    batch = d.get_batch(idx)
    assert batch["i"].tolist() == (idx % count).tolist()
    assert batch["s"].tolist() == [str(i).encode() for i in idx % count]


@pytest.fixture
def small(tmp_path: Path) -> str:
    path = str(tmp_path / "small")
    ds = tf.data.Dataset.range(40).map(
        lambda i: {"i": i, "v": tf.fill([i % 7], tf.cast(i, tf.float32))}
    )
    superserial.save(ds, path, num_shards=2)
    return path


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (20 * 2, IndexError),
        (-41, IndexError),
        ("a", TypeError),
        (1.5, TypeError),
        (None, TypeError),
    ],
)
def test_bad_index(small: str, key: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        ssnp.load(small)[key]


@pytest.mark.parametrize(
    ("indices", "error", "text"),
    [
        ([0, 40], IndexError, "got 40 at position 1"),
        ([-41], IndexError, "got -41"),
        (np.array([True, False]), TypeError, "booleans"),
        (np.array([0.5]), TypeError, "float64"),
        (np.zeros((2, 2), dtype=int), TypeError, "shape"),
    ],
)
def test_bad_batch_indices(small: str, indices: Any, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        ssnp.load(small).get_batch(indices)


def test_empty_batch(small: str) -> None:
    d = ssnp.load(small)
    assert d.get_batch([])["i"].shape == (0,)
    assert d.get_elements([]) == [] and d[5:5] == []


def _record_offsets(path: str, k: int) -> tuple[str, int, int]:
    """(shard file, start, end) of record ``k`` of shard 0, from the index."""
    header = superserial.read_header(path)
    shard = header.shards[0]
    offsets = read_index(path, shard)
    return os.path.join(path, shard.file), int(offsets[k]), int(offsets[k + 1])


def _flip(file: str, at: int) -> None:
    with open(file, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize(
    ("where", "text"),
    [
        (2, "length field of"),  # the length: it disagrees with the index
        (9, "corrupted length"),  # the length's CRC
        (20, "corrupted record"),  # the data
        (-2, "corrupted record"),  # the data's CRC
    ],
)
def test_damaged_record_fails_alone(small: str, where: int, text: str) -> None:
    file, lo, hi = _record_offsets(small, 5)
    _flip(file, lo + where if where >= 0 else hi + where)
    d = ssnp.load(small)
    with pytest.raises(CorruptDataError, match=text) as e:
        d[5]
    assert f"{file} record 5" in str(e.value) and "byte offset" in str(e.value)
    assert int(d[4]["i"]) == 4 and int(d[6]["i"]) == 6  # its neighbours still read
    assert d.get_batch([4, 6, 39])["i"].tolist() == [4, 6, 39]
    with pytest.raises(CorruptDataError, match="record 5"):
        d.get_batch([4, 5, 6])


@pytest.mark.parametrize(
    ("where", "text"),
    [("data", "corrupted record"), ("length", "length"), ("length_crc", "length CRC")],
)
def test_damaged_record_fails_in_batches_too(small: str, where: str, text: str) -> None:
    file, lo, hi = _record_offsets(small, 5)
    _flip(file, {"data": hi - 6, "length": lo + 2, "length_crc": lo + 9}[where])
    records = ssnp.load(small).records
    for read in (records.read_many, records.read_packed):
        with pytest.raises(CorruptDataError, match=text) as e:
            read(np.array([3, 39, 5, 5, 0]))
        assert f"{file} record 5" in str(e.value)
        read(np.array([3, 39, 6, 4, 0]))  # the others still read


@pytest.mark.parametrize("touched", [False, True])
def test_truncated_shard_fails_clearly_never_crashes(small: str, touched: bool) -> None:
    # A local shard is mapped; a slice past the end of a truncated file would
    # kill the process (SIGBUS) rather than raise, so the size is checked first.
    file, cut, _ = _record_offsets(small, 10)
    records = ssnp.load(small).records
    if touched:  # mapped before the truncation
        assert len(records.read_packed(np.array([0, 15]))[0])
    os.truncate(file, cut + 5)
    for read in (records.read_many, records.read_packed):
        with pytest.raises(CorruptDataError, match=f"{file}.*the file ends first"):
            read(np.array([3, 12, 1]))
        assert len(read(np.array([3, 9, 1]))[0])  # the records before the cut still read
    with pytest.raises(CorruptDataError, match="ends first"):
        records.read(12)


@pytest.mark.parametrize("count", [0, 1, 300])
def test_packed_reads_equal_record_reads(tmp_path: Path, count: int) -> None:
    path = str(tmp_path / "ds")
    ds = tf.data.Dataset.range(count).map(lambda i: tf.strings.as_string(i * i * 7919))
    superserial.save(ds, path, num_shards=3)
    records = ssnp.load(path).records
    rng = np.random.default_rng(1)
    for size in (0, 1, 5, 400):  # duplicates, neighbours and far apart, every shard
        idx = rng.integers(0, count, size=size if count else 0)
        data, wheres = records.read_many(idx)
        assert len(data) == len(wheres) == len(idx)
        assert data == [records.read(int(i))[0] for i in idx]
        assert wheres == [records.where(int(i)) for i in idx]
        buffer, starts, lengths = records.read_packed(idx)
        assert starts.dtype == lengths.dtype == np.int64
        assert [buffer[a : a + n] for a, n in zip(starts, lengths, strict=True)] == data


def test_compressed_dataset_reads_at_random(tmp_path: Path) -> None:
    # Through its restart points (tests/test_compressed_access.py has the rest).
    path = str(tmp_path / "gz")
    superserial.save(tf.data.Dataset.range(5), path, compression="GZIP")
    assert all(s.index is not None for s in superserial.read_header(path).shards)
    d = ssnp.load(path)
    assert [int(x) for x in d] == list(range(5))
    assert [int(d[i]) for i in range(-5, 5)] == list(range(5)) * 2
    assert d.get_batch([4, 0, 4]).tolist() == [4, 0, 4]


def _strip_indexes(path: str) -> None:
    hpath = os.path.join(path, "header.json")
    obj = json.loads(Path(hpath).read_text())
    for s in obj["shards"]:
        os.remove(os.path.join(path, s.pop("index")["file"]))
    Path(hpath).write_text(json.dumps(obj))


def test_dataset_without_index_reads_in_order_and_says_so_at_random(small: str) -> None:
    _strip_indexes(small)
    d = ssnp.load(small)
    assert [int(e["i"]) for e in d] == list(range(40))
    with pytest.raises(UnsupportedError, match=re.escape(f"`superserial index {small}`")):
        d[3]


@pytest.mark.parametrize("damage", ["missing", "flipped", "truncated"])
def test_damaged_index_is_refused_never_wrong(small: str, damage: str) -> None:
    shard = superserial.read_header(small).shards[1]
    assert shard.index is not None
    ipath = os.path.join(small, shard.index.file)
    if damage == "missing":
        os.remove(ipath)
    elif damage == "flipped":
        _flip(ipath, 40)
    else:
        os.truncate(ipath, 30)
    d = ssnp.load(small)
    assert [int(e["i"]) for e in d] == list(range(40))  # sequential reading ignores the index
    assert int(d[0]["i"]) == 0  # shard 0's index is fine
    with pytest.raises(CorruptDataError, match=f"index {ipath}|{shard.index.file}") as e:
        d[30]
    assert f"rebuild it with `superserial index {small}`" in str(e.value)


def test_index_of_another_shard_is_detected(small: str) -> None:
    """An index with a valid CRC but offsets of other records: every read checks the framing."""
    header = superserial.read_header(small)
    s0 = header.shards[0]
    assert s0.index is not None
    offsets = read_index(small, s0).copy()
    # Shift record 3's start by 4 bytes: the CRC of the index is recomputed, so only the
    # framing check of the record itself can tell.
    offsets[3] += 4
    data = encode(offsets, s0.crc32c)
    Path(small, s0.index.file).write_bytes(data)
    obj = json.loads(Path(small, "header.json").read_text())
    obj["shards"][0]["index"]["crc32c"] = f"{crc32c(data):08x}"
    Path(small, "header.json").write_text(json.dumps(obj))
    d = ssnp.load(small)
    with pytest.raises(CorruptDataError, match="record 3"):
        d[3]
    with pytest.raises(CorruptDataError, match="record 2"):
        d[2]
    assert int(d[4]["i"]) == 4


def _in_threads(work: Any, count: int = 4) -> None:
    """Runs ``work(seed)`` in ``count`` threads at once; fails with the first error of any."""
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            work(seed)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]


def test_threads_share_one_dataset(small: str) -> None:
    d = ssnp.load(small)

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            i = int(rng.integers(40))
            assert int(d[i]["i"]) == i
            idx = rng.integers(40, size=17)
            assert d.get_batch(idx)["i"].tolist() == idx.tolist()

    _in_threads(work)


def _child_reads(d: ssnp.NumpyDataset, q: Any) -> None:
    q.put([int(d[i]["i"]) for i in (39, 0, 17)])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pickled_or_forked_into_processes(small: str, method: str) -> None:
    d = ssnp.load(small)
    assert int(d[1]["i"]) == 1  # files are open in the parent
    again = pickle.loads(pickle.dumps(d))
    assert [int(e["i"]) for e in again[::13]] == [0, 13, 26, 39]
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(d, q))
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=60)
    assert got == [39, 0, 17] and p.exitcode == 0
    assert int(d[2]["i"]) == 2  # the parent's files still work


def test_host_shards_read_at_random(small: str) -> None:
    d = ssnp.load(small, shard=(1, 2))  # shard 1 only: elements 20..39
    assert len(d) == 20
    assert [int(d[i]["i"]) for i in (0, -1)] == [20, 39]


def test_range_reads_through_fsspec(small: str) -> None:
    """A URL dataset: records come by byte-range requests of the filesystem layer."""
    fsspec = pytest.importorskip("fsspec")
    mem = fsspec.filesystem("memory")
    url = "memory://random-access-ds"
    for name in os.listdir(small):
        mem.pipe(f"{url}/{name}", Path(small, name).read_bytes())
    try:
        d = ssnp.load(url)
        assert [int(d[i]["i"]) for i in (0, 39, 21)] == [0, 39, 21]
        assert d.get_batch([3, 38, 3])["i"].tolist() == [3, 38, 3]
    finally:
        mem.rm(url, recursive=True)


def test_copy_keeps_random_access(small: str, tmp_path: Path) -> None:
    """The index names no absolute path: a copied dataset reads the same."""
    dst = str(tmp_path / "copy")
    shutil.copytree(small, dst)
    assert int(ssnp.load(dst)[33]["i"]) == 33


def test_threads_share_a_tf_gfile_dataset() -> None:
    """ram:// goes through tf.io.gfile (seek + read): threads must not interleave them."""
    path = "ram://random-access-threads/ds"
    superserial.save(tf.data.Dataset.range(300).map(lambda i: {"i": i}), path, num_shards=2)
    try:
        d = ssnp.load(path)

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(300):
                i = int(rng.integers(300))
                assert int(d[i]["i"]) == i

        _in_threads(work)
    finally:
        tf.io.gfile.rmtree("ram://random-access-threads")

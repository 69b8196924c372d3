"""Many writers, one dataset: parts written by real processes, then finalize."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import superserial
from conftest import assert_same_dataset, assert_same_value, dataset_files
from matrix import leaf_kinds_dataset
from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetNotFoundError,
    HeaderError,
    UnsupportedError,
)
from superserial.format import dtypes
from superserial.format.layout import MANIFEST_FILE, STAGING_DIR, part_dir
from superserial.storage import fs
from superserial.write import parts

SIZES = (40, 0, 33)
SHARD_SIZE = 1500  # bytes: several files per part


def part_dataset(i: int, n: int | None = None) -> tf.data.Dataset:
    """Part i: dense, var-length, ragged, sparse, string and uint8 leaves."""
    n = SIZES[i] if n is None else n
    base = 1000 * i

    def element(k: tf.Tensor) -> dict:
        m = k % 5
        return {
            "id": k,
            "pair": (tf.cast(tf.fill([2, 3], k % 256), tf.uint8), tf.strings.as_string(k)),
            "var": tf.cast(tf.range(m), tf.float64) / 3.0,
            "rag": tf.RaggedTensor.from_row_lengths(tf.cast(tf.range(2 * m), tf.int32), [m, m]),
            "sp": tf.sparse.from_dense(
                tf.reshape(tf.cast(tf.range(6, dtype=tf.int64) * (k % 2), tf.int16), [2, 3])
            ),
        }

    return tf.data.Dataset.range(base, base + n).map(element)


def concat_parts(sizes: tuple[int, ...] = SIZES) -> tf.data.Dataset:
    ds = part_dataset(0, sizes[0])
    for i in range(1, len(sizes)):
        ds = ds.concatenate(part_dataset(i, sizes[i]))
    return ds


# ------------------------------------------------------------ processes


def _worker(path: str, i: int, n: int, mode: str, marker: str | None) -> None:
    """Runs in a subprocess: writes part i of n."""
    ds = part_dataset(i)
    if mode.startswith("wait-"):  # start only once `marker` exists (TF already imported)
        mode = mode[len("wait-") :]
        while not os.path.exists(marker):  # type: ignore[arg-type]
            time.sleep(0.1)
    if mode == "elements":  # numpy elements one by one through a Writer
        with superserial.Writer(
            path, shard_index=i, num_shards=n, element_spec=ds.element_spec, shard_size=SHARD_SIZE
        ) as w:
            for el in ds.as_numpy_iterator():
                w.write(el)
    elif mode == "save":
        superserial.save(ds, path, shard_index=i, num_shards=n, shard_size=SHARD_SIZE)
    elif mode == "hang":  # write some, then wait to be killed
        w = superserial.Writer(path, shard_index=i, num_shards=n, shard_size=SHARD_SIZE)
        w.write_dataset(ds.take(10))
        with open(marker, "w") as f:  # type: ignore[arg-type]
            f.write("started")
        time.sleep(600)
    else:
        raise ValueError(f"expected a worker mode, got {mode!r}")


def _spawn(path: str, i: int, n: int, mode: str, marker: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    args = [sys.executable, __file__, path, str(i), str(n), mode, marker or ""]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait(p: subprocess.Popen, timeout: float = 120) -> None:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out.decode(errors="replace")[-3000:]


def test_parallel_workers_one_killed_and_restarted(tmp_path):
    path = str(tmp_path / "ds")
    marker = str(tmp_path / "started")
    go = str(tmp_path / "go")
    procs = [
        _spawn(path, 0, 3, "elements"),
        _spawn(path, 1, 3, "save"),
        _spawn(path, 2, 3, "hang", marker),
    ]
    # The restart of worker 2: a new process that writes only once `go` exists,
    # after worker 2 was killed (started early to overlap TensorFlow's import).
    restart = _spawn(path, 2, 3, "wait-save", go)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker):
            assert procs[2].poll() is None, (
                procs[2].communicate()[0].decode(errors="replace")[-3000:]
            )
            assert time.monotonic() < deadline, "worker 2 never started writing"
            time.sleep(0.2)
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait(30)
        assert procs[2].returncode == -signal.SIGKILL
        _wait(procs[0])
        _wait(procs[1])
        # The killed worker left an attempt with data but no manifest: part 2 is missing.
        p2 = part_dir(path, 2)
        assert os.listdir(p2) and not os.path.exists(os.path.join(p2, MANIFEST_FILE))
        with pytest.raises(DatasetNotFoundError, match=r"part 2 is missing.*part-00002"):
            superserial.finalize(path)
        assert not os.path.exists(os.path.join(path, "header.json"))
        with open(go, "w") as f:
            f.write("go")
        _wait(restart)
    finally:
        for p in [*procs, restart]:
            if p.poll() is None:
                p.kill()
                p.wait()
    committed = [parts.read_part(part_dir(path, i)) for i in range(3)]
    assert [p.header.element_count for p in committed] == list(SIZES)
    assert all(len(p.header.shards) > 1 for i, p in enumerate(committed) if SIZES[i])

    header = superserial.finalize(path, verify=True)
    nfiles = sum(len(p.header.shards) for p in committed)
    assert [s.file for s in header.shards] == [
        f"data-{k:05d}-of-{nfiles:05d}.tfrecord" for k in range(nfiles)
    ]
    assert header.element_count == sum(SIZES)
    assert sorted(os.listdir(path)) == dataset_files(header)
    assert_same_dataset(concat_parts(), superserial.load(path))
    # Part order is file order: the files of part 0 come first, then 1, then 2.
    first = [s.records for s in header.shards[: len(committed[0].header.shards)]]
    assert first == [s.records for s in committed[0].header.shards]


# ------------------------------------------------------------ in process


def _write_parts(path: str, sizes: tuple[int, ...], **kw) -> None:
    for i, n in enumerate(sizes):
        superserial.save(part_dataset(i, n), path, shard_index=i, num_shards=len(sizes), **kw)


def test_finalize_again_is_a_no_op(tmp_path):
    path = str(tmp_path / "ds")
    _write_parts(path, (5, 7), compression="GZIP")
    header = superserial.finalize(path)
    assert header.compression == "GZIP" and header.element_count == 12
    before = {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in os.listdir(path)}
    assert superserial.finalize(path) == header
    assert {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in os.listdir(path)} == before
    assert_same_dataset(concat_parts((5, 7)), superserial.load(path))
    # With one file per part, shard=(i, n) reads back exactly part i.
    for i, n in enumerate((5, 7)):
        assert_same_dataset(part_dataset(i, n), superserial.load(path, shard=(i, 2)))
    with pytest.raises(DatasetExistsError, match=r"header\.json"):
        superserial.Writer(path, shard_index=0, num_shards=2)


def test_finalize_interrupted_after_moving_then_rerun(tmp_path, monkeypatch):
    path = str(tmp_path / "ds")
    _write_parts(path, (6, 4, 3))
    real = fs.write_atomically

    def crash(target, text):
        raise OSError("simulated crash before the header")

    monkeypatch.setattr(fs, "write_atomically", crash)
    with pytest.raises(OSError, match="simulated"):
        superserial.finalize(path)
    moved = [n for n in os.listdir(path) if n.startswith("data-")]
    # Three shards and their indexes moved, and no header yet.
    assert len(moved) == 6 and not os.path.exists(os.path.join(path, "header.json"))
    monkeypatch.setattr(fs, "write_atomically", real)
    header = superserial.finalize(path, verify=True)
    assert header.element_count == 13 and not os.path.exists(os.path.join(path, STAGING_DIR))
    assert_same_dataset(concat_parts((6, 4, 3)), superserial.load(path))


def test_restart_of_a_committed_part_replaces_it(tmp_path):
    path = str(tmp_path / "ds")
    _write_parts(path, (3, 2))
    superserial.save(part_dataset(1, 5), path, shard_index=1, num_shards=2)  # rewritten
    superserial.finalize(path)
    assert_same_dataset(concat_parts((3, 5)), superserial.load(path))


def _listing(root: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
    )


def test_finalize_refuses_bad_parts_and_changes_nothing(tmp_path):
    path = str(tmp_path / "ds")
    _write_parts(path, (4, 3, 2))
    before = _listing(path)

    # A file of a part cut short.
    part1 = parts.read_part(part_dir(path, 1))
    victim = os.path.join(part_dir(path, 1), part1.attempt, part1.header.shards[0].file)
    with open(victim, "rb") as f:
        data = f.read()
    with open(victim, "wb") as f:
        f.write(data[:-3])
    with pytest.raises(CorruptDataError, match=rf"expected {len(data)} bytes in .*part-00001"):
        superserial.finalize(path)
    with open(victim, "wb") as f:  # same size, other bytes: only verify=True sees it
        f.write(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptDataError, match=r"expected crc32c .* of .*part-00001"):
        superserial.finalize(path, verify=True)
    with open(victim, "wb") as f:
        f.write(data)

    # Compression and structure must agree.
    superserial.save(part_dataset(2, 2), path, shard_index=2, num_shards=3, compression="ZLIB")
    with pytest.raises(
        HeaderError, match=r"expected compression None as in part 0, got ZLIB at part 2"
    ):
        superserial.finalize(path)
    other = part_dataset(2, 2).map(lambda el: {"id": el["id"]})
    superserial.save(other, path, shard_index=2, num_shards=3)
    with pytest.raises(
        HeaderError, match=r"expected the structure of part 0 in every part, got another at part 2"
    ):
        superserial.finalize(path)
    with pytest.raises(HeaderError, match=r"expected 4 parts, got parts written for 3"):
        superserial.finalize(path, num_shards=4)

    # A missing part is named.
    mpath = os.path.join(part_dir(path, 1), MANIFEST_FILE)
    os.remove(mpath)
    with pytest.raises(
        DatasetNotFoundError, match=r"part 1 is missing: expected .*part-00001.manifest\.json"
    ):
        superserial.finalize(path)
    assert not os.path.exists(os.path.join(path, "header.json"))
    assert not [n for n in os.listdir(path) if n.startswith("data-")]
    assert {n for n in _listing(path) if "part-00000" in n} == {
        n for n in before if "part-00000" in n
    }


def test_writer_elements_abort_and_errors(tmp_path):
    path = str(tmp_path / "ds")
    ds = part_dataset(0, 6)
    spec = ds.element_spec
    with (
        pytest.raises(RuntimeError, match="boom"),
        superserial.Writer(path, shard_index=0, num_shards=1, element_spec=spec) as w,
    ):
        w.write(next(ds.as_numpy_iterator()))
        raise RuntimeError("boom")
    assert not os.path.exists(path)  # the attempt is gone, and the directories it made

    with superserial.Writer(path, shard_index=0, num_shards=1, element_spec=spec) as w:
        bad = dict(next(ds.as_numpy_iterator()))
        bad["var"] = bad["var"].astype("float32")
        with pytest.raises(UnsupportedError, match=r"expected float64, got float32 at var"):
            w.write(bad)
        bad["var"] = [[1.0]]
        with pytest.raises(
            UnsupportedError, match=r"expected shape \(None,\), got \(1, 1\) at var"
        ):
            w.write(bad)
        with pytest.raises(
            UnsupportedError,
            match=r"expected a dict with keys \[.id., .pair., .rag., .sp., .var.\], got tuple at <element>",
        ):
            w.write((1, 2))
        for el in ds.as_numpy_iterator():
            w.write(el)
        w.write_dataset(part_dataset(0, 3))
        assert w.element_count == 9
    header = superserial.finalize(path)
    assert header.element_count == 9
    got = list(superserial.load(path))
    want = [*ds, *part_dataset(0, 3)]
    for k, (a, b) in enumerate(zip(want, got, strict=True)):
        assert_same_value(a, b, where=f"element {k}")

    with pytest.raises(ValueError, match="shard_index"):
        superserial.Writer(str(tmp_path / "x"), shard_index=2, num_shards=2)
    with pytest.raises(DatasetNotFoundError, match="found neither"):
        superserial.finalize(str(tmp_path / "nothing"))


@pytest.mark.parametrize("entry", dtypes.DTYPES, ids=lambda d: d.name)
def test_writer_round_trips_every_leaf_kind(entry, tmp_path):
    # Elements as users have them: numpy values as as_numpy_iterator() gives
    # them, ragged_rank 0 leaves (a ragged column of from_tensor_slices)
    # included. Sparse leaves go as tf.SparseTensor: as_numpy_iterator()
    # densifies them, losing explicit zeros, and fails on bfloat16.
    ds = leaf_kinds_dataset(entry)
    path = str(tmp_path / "ds")

    def as_numpy(x):
        return x if isinstance(x, tf.SparseTensor) else x.numpy()

    with superserial.Writer(path, shard_index=0, num_shards=1, element_spec=ds.element_spec) as w:
        for el in ds:
            w.write(tf.nest.map_structure(as_numpy, el))
    superserial.finalize(path)
    assert_same_dataset(ds, superserial.load(path))


def test_writer_ragged_column_from_the_readme(tmp_path):
    path = str(tmp_path / "ds")
    ds = tf.data.Dataset.from_tensor_slices(
        {"tokens": tf.ragged.constant([[1, 2, 3], [4], []], dtype=tf.int32)}
    )
    with superserial.Writer(path, shard_index=0, num_shards=1, element_spec=ds.element_spec) as w:
        for el in ds.as_numpy_iterator():
            w.write(el)
        w.write({"tokens": [5, 6]})  # a plain list, cast to the leaf dtype
        w.write({"tokens": tf.constant([7], tf.int32)})
        with pytest.raises(
            UnsupportedError, match=r"expected shape \(None,\), got \(1, 1\) at tokens"
        ):
            w.write({"tokens": [[1]]})
    superserial.finalize(path)
    got = [list(e["tokens"]) for e in superserial.load(path).as_numpy_iterator()]
    assert got == [[1, 2, 3], [4], [], [5, 6], [7]]
    assert superserial.load(path).element_spec == ds.element_spec


Pair = collections.namedtuple("Pair", ["r", "x"])


@pytest.mark.parametrize("kind", ["root", "tuple", "namedtuple"])
def test_writer_ragged_rank_0_in_any_structure(kind, tmp_path):
    rt = tf.ragged.constant([[1, 2, 3], [4], []], dtype=tf.int32)
    structure = {"root": rt, "tuple": (rt, tf.range(3)), "namedtuple": Pair(rt, tf.range(3))}
    ds = tf.data.Dataset.from_tensor_slices(structure[kind])
    path = str(tmp_path / "ds")
    with superserial.Writer(path, shard_index=0, num_shards=1, element_spec=ds.element_spec) as w:
        for el in ds.as_numpy_iterator():
            w.write(el)
    superserial.finalize(path)
    assert_same_dataset(ds, superserial.load(path))


def test_writer_keeps_trailing_nul_bytes(tmp_path):
    # as_numpy_iterator() gives a string scalar as bytes; numpy's "S" dtype
    # would drop its trailing NULs.
    path = str(tmp_path / "ds")
    spec = {"s": tf.TensorSpec([], tf.string), "v": tf.TensorSpec([2], tf.string)}
    with superserial.Writer(path, shard_index=0, num_shards=1, element_spec=spec) as w:
        w.write({"s": b"a\x00", "v": [b"\x00", b"b\x00\x00"]})
    superserial.finalize(path)
    (got,) = superserial.load(path).as_numpy_iterator()
    assert got["s"] == b"a\x00" and list(got["v"]) == [b"\x00", b"b\x00\x00"]


def test_failed_writer_leaves_nothing_behind(tmp_path):
    path = str(tmp_path / "ds")
    ds = part_dataset(0, 3)
    for spec in (ds.element_spec, None):
        with (
            pytest.raises(RuntimeError, match="boom"),
            superserial.Writer(path, shard_index=0, num_shards=1, element_spec=spec),
        ):
            raise RuntimeError("boom")
        assert not os.path.exists(path)
    with (  # no element_spec and nothing written: close() fails, and aborts
        pytest.raises(ValueError, match="element_spec"),
        superserial.Writer(path, shard_index=0, num_shards=1),
    ):
        pass
    assert not os.path.exists(path)
    superserial.save(ds, path)  # no overwrite=True needed: nothing is there
    assert_same_dataset(ds, superserial.load(path))

    # A directory that was there stays; a committed part stays.
    other = str(tmp_path / "other")
    os.mkdir(other)
    superserial.save(part_dataset(0, 2), other, shard_index=0, num_shards=2)
    with (
        pytest.raises(RuntimeError, match="boom"),
        superserial.Writer(other, shard_index=1, num_shards=2, element_spec=ds.element_spec),
    ):
        raise RuntimeError("boom")
    assert os.listdir(os.path.join(other, STAGING_DIR)) == ["part-00000"]
    with (
        pytest.raises(RuntimeError, match="boom"),
        superserial.Writer(str(tmp_path / "made"), shard_index=0, num_shards=1),
    ):
        os.mkdir(str(tmp_path / "made" / "mine"))  # not the Writer's: kept
        raise RuntimeError("boom")
    assert os.listdir(tmp_path / "made") == ["mine"]


def test_cleanup_removes_abandoned_attempts_only(tmp_path):
    path = str(tmp_path / "ds")
    marker = str(tmp_path / "started")
    # Part 0: a worker killed while writing (a real process, SIGKILL).
    killed = _spawn(path, 0, 3, "hang", marker)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker):
            assert killed.poll() is None, killed.communicate()[0].decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "worker 0 never started writing"
            time.sleep(0.2)
    finally:
        killed.kill()
        killed.wait(30)
    dead = [n for n in os.listdir(part_dir(path, 0)) if not n.endswith(".lock")]
    assert len(dead) == 1 and dead[0].startswith("attempt-")
    # Part 1: committed, then rewritten by a writer still running (live).
    superserial.save(part_dataset(1, 2), path, shard_index=1, num_shards=3)
    committed = parts.read_part(part_dir(path, 1)).attempt
    live = superserial.Writer(path, shard_index=1, num_shards=3)
    live.write_dataset(part_dataset(1, 4))
    # Part 2: committed, with a dead earlier attempt beside it.
    superserial.save(part_dataset(2, 1), path, shard_index=2, num_shards=3)
    stale = os.path.join(part_dir(path, 2), "attempt-0123456789abcdef")
    os.makedirs(stale)

    removed = superserial.cleanup(path)
    assert sorted(removed) == sorted(
        [os.path.join(part_dir(path, 0), dead[0]), part_dir(path, 0), stale]
    )
    assert sorted(os.listdir(part_dir(path, 1))) == sorted(
        [MANIFEST_FILE, committed, live.attempt, live.attempt + ".lock"]
    )
    assert sorted(os.listdir(part_dir(path, 2))) == sorted(
        [MANIFEST_FILE, parts.read_part(part_dir(path, 2)).attempt]
    )
    live.close()
    assert superserial.cleanup(path) == [os.path.join(part_dir(path, 1), committed)]
    superserial.save(part_dataset(0, 3), path, shard_index=0, num_shards=3)
    superserial.finalize(path)
    want = part_dataset(0, 3).concatenate(part_dataset(1, 4)).concatenate(part_dataset(2, 1))
    assert_same_dataset(want, superserial.load(path))
    assert superserial.cleanup(path) == []

    # Nothing committed and nothing live: cleanup leaves nothing, and save may write there.
    path = str(tmp_path / "ds2")
    stale = os.path.join(part_dir(path, 0), "attempt-0123456789abcdef")
    os.makedirs(stale)
    with open(os.path.join(stale, "data-00000.tfrecord"), "wb") as f:
        f.write(b"partial")
    assert superserial.cleanup(path)[-1] == path
    assert not os.path.exists(path)
    superserial.save(part_dataset(0, 2), path)


def test_manifest_is_plain_json(tmp_path):
    path = str(tmp_path / "ds")
    _write_parts(path, (2,))
    with open(os.path.join(part_dir(path, 0), MANIFEST_FILE)) as f:
        obj = json.load(f)
    assert obj["kind"] == "superserial-part" and obj["part"] == 0 and obj["num_parts"] == 1
    assert obj["header"]["element_count"] == 2
    shard = obj["header"]["shards"][0]
    assert (
        os.path.getsize(os.path.join(part_dir(path, 0), obj["attempt"], shard["file"]))
        == shard["bytes"]
    )


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] or None)

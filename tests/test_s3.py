"""Every path on ``s3://`` against a real S3 API (moto's server on 127.0.0.1), bit for bit.

TensorFlow 2.21 has no ``s3://`` filesystem, so these go through fsspec (s3fs):
shards are written with superserial's own TFRecord writer, ``load`` streams
them into tf.data through the filesystem layer, and random access uses
byte-range GETs. The endpoint comes from ``AWS_ENDPOINT_URL`` only, as a user's
would (the fixture sets it; nothing of ours is told about the server).
"""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import superserial
import superserial.numpy as ssnp
from conftest import assert_same_dataset, assert_same_value, canon_np
from superserial.cli.main import cli
from superserial.foreign.sources.infer import infer
from superserial.storage import fs


def _data(n: int = 24) -> tf.data.Dataset:
    rng = np.random.default_rng(5)
    return tf.data.Dataset.from_tensor_slices(
        {
            "x": rng.standard_normal((n, 3)).astype(np.float32),
            "s": [f"item-{i}".encode() * (i % 3) for i in range(n)],
            "r": tf.ragged.constant([[i] * (i % 4) for i in range(n)], dtype=tf.int64),
        }
    )


def _keys(bucket: str, prefix: str = "") -> list[str]:
    client = boto3.client("s3")
    got = client.list_objects_v2(Bucket=bucket.removeprefix("s3://"), Prefix=prefix)
    return sorted(o["Key"] for o in got.get("Contents", []))


@pytest.fixture(scope="module")
def saved(s3_server: str) -> str:
    """One dataset on S3 for the read-only tests: 2 indexed shards, 24 elements."""
    bucket = f"saved-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    path = f"s3://{bucket}/ds"
    superserial.save(_data(), path, num_shards=2)
    return path


@pytest.fixture(scope="module")
def want_np(tmp_path_factory: Any) -> list[Any]:
    """The elements as the numpy reader gives them from a local copy."""
    local = str(tmp_path_factory.mktemp("local") / "ds")
    superserial.save(_data(), local, num_shards=2)
    return [canon_np(e) for e in ssnp.load(local)]


def test_s3_goes_through_fsspec(saved: str) -> None:
    assert fs.backend_name(saved) == "fsspec"


def test_save_writes_tagged_shards_in_place(s3_bucket: str) -> None:
    """No work directory, no copies: the shards' final names, then the header."""
    header = superserial.save(_data(), f"{s3_bucket}/ds", num_shards=2)
    names = [f[0] for s in header.shards for f in s.files()]
    assert all(superserial.format.layout.is_tagged_shard_file(n) for n in names)
    assert _keys(s3_bucket) == sorted(f"ds/{n}" for n in [*names, "header.json"])


@pytest.mark.parametrize("batch_size", [None, 5])
def test_load_round_trip(saved: str, batch_size: int | None) -> None:
    want = _data() if batch_size is None else _data().batch(batch_size)
    assert_same_dataset(want, superserial.load(saved, batch_size=batch_size))


def test_load_shuffled_reads_by_offset(saved: str) -> None:
    want = list(_data())
    got = list(superserial.load(saved, shuffle=True, seed=7))
    order = superserial.permutation(len(want), 7)
    for pos, el in enumerate(got):
        assert_same_value(want[int(order[pos])], el, where=f"position {pos}")


def test_resumable_save(s3_bucket: str) -> None:
    """resume=True keeps a work directory beside the path (it must outlive the process)."""
    path = f"{s3_bucket}/ds"
    superserial.save(_data(), path, num_shards=2, resume=True)
    assert_same_dataset(_data(), superserial.load(path))
    assert [k for k in _keys(s3_bucket) if not k.startswith("ds/")] == []


@pytest.mark.parametrize(
    ("compression", "shard_size"), [("GZIP", None), ("ZLIB", 200), (None, 200)]
)
def test_save_options_round_trip(s3_bucket: str, compression: str | None, shard_size: Any) -> None:
    """Compressed shards and shards cut by size (count unknown ahead) read back exactly."""
    path = f"{s3_bucket}/ds"
    header = superserial.save(_data(), path, compression=compression, shard_size=shard_size)
    assert (len(header.shards) > 2) == (shard_size is not None)
    assert_same_dataset(_data(), superserial.load(path))
    assert superserial.verify(path).ok
    # The same bytes TensorFlow's own writer would have written, read by TensorFlow.
    local = tf.io.gfile.join(
        "ram://", uuid.uuid4().hex, header.shards[0].file
    )  # ram:// goes through tf.io.gfile
    with tf.io.gfile.GFile(local, "wb") as f:
        f.write(fs.read_bytes(f"{path}/{header.shards[0].file}"))
    got = list(tf.data.TFRecordDataset(local, compression or ""))
    assert len(got) == header.shards[0].records


def test_numpy_sequential_and_random_access(saved: str, want_np: list[Any]) -> None:
    want = want_np
    ds = ssnp.load(saved)
    assert [canon_np(e) for e in ds] == want
    assert [canon_np(ds[i]) for i in (0, 13, -1)] == [want[0], want[13], want[-1]]
    assert [canon_np(e) for e in ds.get_elements([20, 2, 2, 11])] == [
        want[i] for i in (20, 2, 2, 11)
    ]
    assert len(list(ssnp.iter_batches(saved, 5))) == 5


def test_torch_and_grain(saved: str, want_np: list[Any]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("grain")
    from superserial.grain import DataSource
    from superserial.torch import MapDataset, TorchDataset

    want = want_np
    assert len(list(TorchDataset(saved))) == len(want)
    m = MapDataset(saved)
    assert len(m) == len(want)
    assert int(m[13]["x"].numel()) == 3
    src = DataSource(saved)
    assert [canon_np(src[i]) for i in (0, 23)] == [want[0], want[23]]


def test_verify_finds_damage(s3_bucket: str) -> None:
    path = f"{s3_bucket}/ds"
    header = superserial.save(_data(), path, num_shards=2)
    assert superserial.verify(path).ok
    shard = f"{path}/{header.shards[1].file}"
    data = bytearray(fs.read_bytes(shard))
    data[30] ^= 1
    fs.write_bytes(shard, bytes(data))
    report = superserial.verify(path)
    assert not report.ok
    assert {p.file for p in report.problems} == {shard}
    with pytest.raises(tf.errors.OpError, match="CRC"):
        list(superserial.load(path))


def test_writer_and_finalize(s3_bucket: str) -> None:
    path = f"{s3_bucket}/ds"
    parts = [_data().skip(12 * i).take(12) for i in range(2)]
    for i, part in enumerate(parts):
        with superserial.Writer(
            path, shard_index=i, num_shards=2, element_spec=part.element_spec
        ) as w:
            w.write_dataset(part)
    superserial.finalize(path, verify=True)
    assert_same_dataset(_data(), superserial.load(path))


def test_convert_and_build_index(s3_bucket: str, want_np: list[Any]) -> None:
    """CLI convert from S3 to S3 (gzip, then back without compression), then build_index."""
    src, gz, back = (f"{s3_bucket}/{n}" for n in ("src", "gz", "back"))
    superserial.save(_data(), src, num_shards=2)
    for a, b, comp in ((src, gz, "GZIP"), (gz, back, "NONE")):
        result = CliRunner().invoke(cli, ["convert", a, "-o", b, "--compression", comp])
        assert result.exit_code == 0, result.output
    assert superserial.read_header(gz).compression == "GZIP"
    assert_same_dataset(_data(), superserial.load(back))
    header = superserial.read_header(back)
    for s in header.shards:
        fs.remove(f"{back}/{s.index.file}")
    with pytest.raises(superserial.CorruptDataError, match="found no file"):
        ssnp.load(back)[3]
    assert superserial.build_index(back) == header
    assert canon_np(ssnp.load(back)[3]) == want_np[3]


# ------------------------------------------------------------------ errors


def test_missing_dataset_and_shard(s3_bucket: str) -> None:
    with pytest.raises(superserial.DatasetNotFoundError, match="no such directory"):
        superserial.load(f"{s3_bucket}/nothing")
    with pytest.raises(superserial.DatasetNotFoundError):
        ssnp.load(f"{s3_bucket}/nothing")
    path = f"{s3_bucket}/ds"
    header = superserial.save(_data(), path, num_shards=2)
    fs.remove(f"{path}/{header.shards[0].file}")
    with pytest.raises(superserial.CorruptDataError, match="found no file"):
        superserial.load(path)
    with pytest.raises(superserial.CorruptDataError, match="found no file"):
        ssnp.load(path)[0]


def test_missing_bucket_names_it(s3_server: str) -> None:
    with pytest.raises(superserial.DatasetNotFoundError, match="no-such-bucket"):
        superserial.load("s3://no-such-bucket-x1/ds")


def test_exists_and_overwrite(s3_bucket: str) -> None:
    path = f"{s3_bucket}/ds"
    first = superserial.save(_data(), path, num_shards=2)
    with pytest.raises(superserial.DatasetExistsError):
        superserial.save(_data().take(3), path)
    second = superserial.save(_data().take(5), path, overwrite=True)
    assert_same_dataset(_data().take(5), superserial.load(path))
    # The replaced dataset's files are gone; nothing else is left over.
    assert _keys(s3_bucket) == sorted(
        f"ds/{n}" for n in ["header.json", *(f[0] for s in second.shards for f in s.files())]
    )
    assert not {f[0] for s in first.shards for f in s.files()} & set(_keys(s3_bucket))


# ------------------------------------------------------------------ commit on S3


def test_reader_during_overwrite_sees_old_or_error(s3_bucket: str) -> None:
    """Readers opened on the old header get the old elements, or a clear error: never new ones."""
    path = f"{s3_bucket}/ds"
    old = tf.data.Dataset.range(30).map(lambda x: {"v": x})
    superserial.save(old, path, num_shards=3)
    tf_ds = superserial.load(path)
    np_ds = ssnp.load(path)
    it = iter(tf_ds)
    first = next(it)  # shard 0 is open (and read ahead): its bytes are old ones
    superserial.save(old.map(lambda d: {"v": d["v"] + 1000}), path, num_shards=3, overwrite=True)
    got = [int(first["v"])]
    try:  # what was read ahead before the old files went, then an error (or the end)
        got.extend(int(e["v"]) for e in it)
    except tf.errors.OpError as e:
        assert "found no file (removed while loading" in str(e), e
    assert got == list(range(len(got))), got  # a prefix of the old elements, never a new one
    with pytest.raises(superserial.CorruptDataError, match="found no file"):
        np_ds[29]
    with pytest.raises(tf.errors.OpError, match="found no file"):
        list(tf_ds)
    # Opened now: the new dataset, whole.
    assert [int(e["v"]) for e in superserial.load(path)] == list(range(1000, 1030))
    assert [int(e["v"]) for e in ssnp.load(path)] == list(range(1000, 1030))


def test_other_saves_tagged_shards_are_ignored(s3_bucket: str) -> None:
    """A save in flight (or killed) leaves tagged shards beside the header: readers skip them."""
    path = f"{s3_bucket}/ds"
    stray = "data-00000-of-00001-0badc0de.tfrecord"
    fs.write_bytes(f"{path}/{stray}", b"not yet a dataset")
    superserial.save(_data(), path)  # only leftovers there: no overwrite needed
    assert_same_dataset(_data(), superserial.load(path))
    assert superserial.verify(path).ok
    assert f"ds/{stray}" in _keys(s3_bucket)  # maybe another save's: left alone
    fs.write_bytes(f"{path}/data-00000-of-00001.tfrecord", b"untagged")
    with pytest.raises(superserial.CorruptDataError, match="extra file"):
        superserial.load(path)


def test_conditional_header_put(s3_bucket: str) -> None:
    """The commit point: If-None-Match creates once, If-Match loses to a newer header."""
    path = f"{s3_bucket}/ds"
    header = f"{path}/header.json"
    assert fs.version(header) is None
    assert fs.put_if(header, b"{}", None)
    assert not fs.put_if(header, b"{}", None)
    token = fs.version(header)
    superserial.save(_data(), path, overwrite=True)  # another save replaces it meanwhile
    assert not fs.put_if(header, b"{}", token)
    assert_same_dataset(_data(), superserial.load(path))


def test_two_saves_at_once_one_wins(s3_bucket: str) -> None:
    """Two threads overwrite one path: one dataset results, whole; the loser leaves nothing.

    (Two saves to an empty path race the same way, on If-None-Match instead:
    test_conditional_header_put checks that condition.)
    """
    import threading

    path = f"{s3_bucket}/ds"
    overwrite = True
    superserial.save(_data().take(2), path)
    results: dict[int, Any] = {}
    start = threading.Barrier(2)

    def save(k: int) -> None:
        data = _data().map(lambda d, k=k: {**d, "x": d["x"] + k})
        start.wait()
        try:
            results[k] = superserial.save(data, path, num_shards=2, overwrite=overwrite)
        except BaseException as e:  # noqa: BLE001  (any other error fails the test below)
            results[k] = e

    threads = [threading.Thread(target=save, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    headers = [r for r in results.values() if isinstance(r, superserial.Header)]
    assert len(headers) >= 1
    lost = (superserial.DatasetExistsError, superserial.DatasetLockedError)
    for r in results.values():  # the loser gets our error, never a raw s3fs one
        assert isinstance(r, (superserial.Header, *lost)), repr(r)
    final = superserial.read_header(path)
    assert final in headers
    files = {f[0] for s in final.shards for f in s.files()}
    assert set(_keys(s3_bucket)) == {f"ds/{n}" for n in [*files, "header.json"]}
    assert superserial.verify(path).ok


def test_infer_from_s3_to_s3(s3_bucket: str, tmp_path: Any) -> None:
    """Foreign tf.train.Example files on S3 become a dataset on S3."""
    local = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(local) as w:
        for i in range(6):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
            w.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    fs.copy_file(local, f"{s3_bucket}/raw/x.tfrecord")
    header, _ = infer([f"{s3_bucket}/raw/*.tfrecord"], f"{s3_bucket}/ds")
    assert all(superserial.format.layout.is_tagged_shard_file(s.file) for s in header.shards)
    assert [int(e["id"]) for e in ssnp.load(f"{s3_bucket}/ds")] == list(range(6))


def test_tf_free_reader_on_s3(saved: str, want_np: list[Any]) -> None:
    """The numpy reader reaches S3 without importing TensorFlow (a fresh process)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys, superserial.numpy as n\n"
        f"ds = n.load({saved!r})\n"
        "print(len(ds), int(ds[13]['r'].sum()), len(list(ds)))\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["24", str(13 * (13 % 4)), "24"]


def test_failed_save_leaves_old_dataset(s3_bucket: str) -> None:
    """A save that fails midway removes its shards; the old dataset stays, exactly."""
    path = f"{s3_bucket}/ds"
    superserial.save(_data(), path, num_shards=2)
    before = {k: fs.read_bytes(f"{s3_bucket}/{k}") for k in _keys(s3_bucket)}

    def bad(x: tf.Tensor) -> tf.Tensor:
        tf.debugging.assert_less(x, tf.constant(15, tf.int64), message="element 15 is bad")
        return x

    with pytest.raises(tf.errors.InvalidArgumentError, match="element 15 is bad"):
        superserial.save(tf.data.Dataset.range(30).map(bad), path, num_shards=3, overwrite=True)
    after = {k: fs.read_bytes(f"{s3_bucket}/{k}") for k in _keys(s3_bucket)}
    assert after == before
    assert_same_dataset(_data(), superserial.load(path))


def test_sees_another_processs_overwrite(s3_bucket: str) -> None:
    """s3fs caches listings forever: a dataset replaced by another client must still load."""
    path, other = f"{s3_bucket}/ds", f"{s3_bucket}/other"
    superserial.save(_data(), path, num_shards=2)
    assert len(superserial.load(path)) == 24  # listings of path now cached in this process
    superserial.save(_data().take(5), other)
    # Another client (boto3, not this process's s3fs) copies it over: new shards, then the header.
    client, bucket = boto3.client("s3"), s3_bucket.removeprefix("s3://")
    for key in sorted(_keys(s3_bucket, "other/"), key=lambda k: k.endswith("header.json")):
        new = "ds/" + key.removeprefix("other/")
        client.copy_object(Bucket=bucket, Key=new, CopySource={"Bucket": bucket, "Key": key})
    assert_same_dataset(_data().take(5), superserial.load(path))
    assert superserial.verify(path).ok


def test_append_on_s3(s3_bucket: str, want_np: list[Any]) -> None:
    """append on S3: new shards after the old, the old objects untouched, no work files left."""
    path = f"{s3_bucket}/ds"
    superserial.save(_data().take(10), path, num_shards=2)
    old = superserial.read_header(path)
    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    etags = {k: client.head_object(Bucket=bucket, Key=k)["ETag"] for k in _keys(s3_bucket)}
    header = superserial.append(_data().skip(10), path, num_shards=2)
    assert header.shards[:2] == old.shards and header.element_count == 24
    assert_same_dataset(_data(), superserial.load(path))
    ds = ssnp.load(path)  # random access across the old and the new shards
    assert [canon_np(ds[i]) for i in (0, 9, 10, 23)] == [want_np[i] for i in (0, 9, 10, 23)]
    for k, etag in etags.items():  # the old shards and indexes, byte for byte
        if not k.endswith("header.json"):
            assert client.head_object(Bucket=bucket, Key=k)["ETag"] == etag, k
    files = {f[0] for s in header.shards for f in s.files()}
    assert set(_keys(s3_bucket)) == {f"ds/{n}" for n in [*files, "header.json"]}
    with pytest.raises(superserial.SpecMismatchError):
        superserial.append(tf.data.Dataset.range(3), path)
    assert superserial.read_header(path) == header

"""Record indexes: every writer makes one per shard; build_index adds or repairs them.

Each index is checked twice: through ``record_index.read_index`` (the reader's own
checks) and against ``framing.record_offsets`` of the shard file (an
independent walk of its records). Damaged indexes must be refused by random
access, ignored by sequential reading, reported by ``verify`` and repaired by
``build_index``, which refuses (changing nothing) a dataset whose shards do
not match their header.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import superserial
import superserial.numpy as ssnp
from superserial.cli.main import cli
from superserial.errors import (
    CorruptDataError,
    DatasetLockedError,
    HeaderError,
    UnsupportedError,
)
from superserial.format import framing, layout, record_index
from superserial.read.blocks import check_blocks
from superserial.storage import fs
from superserial.write.local_commit import SaveLock

N = 30
GOLDEN = Path(__file__).parent / "golden" / "v1"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _source(n: int = N) -> tf.data.Dataset:
    """Records of varying sizes (the string grows with i), so offsets are irregular."""
    return tf.data.Dataset.range(n).map(
        lambda i: {"id": i, "s": tf.strings.as_string(i * i * 7919)}
    )


def check_indexes(path: str) -> superserial.Header:
    """Every shard has a correct index (compressed: with restart points); no stray files."""
    header = superserial.read_header(path)
    names = {"header.json"}
    for s in header.shards:
        file = os.path.join(path, s.file)
        names.add(s.file)
        assert s.index is not None, s
        assert s.index.file == layout.index_name(s.file)
        names.add(s.index.file)
        if header.compression:
            table = record_index.read_restarts(path, s, header.compression)
            assert check_blocks(file, table) is None
            stream = str(Path(path).parent / f"{s.file}.stream")
            raw = Path(file).read_bytes()
            unpack = gzip.decompress if header.compression == "GZIP" else zlib.decompress
            Path(stream).write_bytes(unpack(raw))
            walked = framing.record_offsets(stream, os.path.getsize(stream))
            os.remove(stream)
            np.testing.assert_array_equal(table.offsets, walked)
            continue
        offsets = record_index.read_index(path, s)
        walked = framing.record_offsets(file, os.path.getsize(file))
        np.testing.assert_array_equal(offsets, walked)
        assert len(offsets) == s.records + 1 and int(offsets[-1]) == s.bytes
    assert sorted(os.listdir(path)) == sorted(names)
    return header


def _ids(path: str) -> list[int]:
    return [int(e["id"]) for e in ssnp.load(path)]


def same(a: Any, b: Any) -> None:
    """Asserts two numpy elements (as superserial.numpy yields them) are identical."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, ssnp.Ragged):
        same(a.flat_values, b.flat_values)
        same(tuple(a.nested_row_splits), tuple(b.nested_row_splits))
    elif isinstance(a, ssnp.Sparse):
        same((a.indices, a.values, a.dense_shape), (b.indices, b.values, b.dense_shape))
    else:
        x, y = np.asarray(a), np.asarray(b)
        assert (x.dtype, x.shape) == (y.dtype, y.shape)
        if x.dtype == object:
            assert x.tolist() == y.tolist()
        else:
            assert x.tobytes() == y.tobytes()


def check_random_access(path: str) -> None:
    """ds[i], negative i and get_elements equal the elements read in order."""
    ds = ssnp.load(path)
    elements = list(ds)
    assert len(ds) == len(elements)
    for i, el in enumerate(elements):
        same(ds[i], el)
        same(ds[i - len(ds)], el)
    order = list(range(len(ds)))[::-1]
    for got, i in zip(ds.get_elements(order), order, strict=True):
        same(got, elements[i])


def snapshot(path: str) -> dict[str, Any]:
    """Every file of the dataset (bytes and mtime) and what lies beside it."""
    files = {
        name: (Path(path, name).read_bytes(), os.stat(os.path.join(path, name)).st_mtime_ns)
        for name in sorted(os.listdir(path))
    }
    return {"files": files, "siblings": sorted(os.listdir(os.path.dirname(path)))}


def edit_header(path: str, fn: Any) -> None:
    p = os.path.join(path, "header.json")
    obj = json.loads(Path(p).read_text())
    fn(obj)
    Path(p).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def strip_indexes(path: str) -> None:
    """Makes ``path`` look written before indexes existed."""
    header = superserial.read_header(path)
    for s in header.shards:
        if s.index is not None:
            os.remove(os.path.join(path, s.index.file))
    edit_header(path, lambda h: [s.pop("index", None) for s in h["shards"]])


def run(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == code, (result.output, result.stderr, result.exception)
    return result


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> str:
    """Three uncompressed shards of 10 records, with indexes; read only (copy to damage)."""
    path = str(tmp_path_factory.mktemp("index") / "ds")
    superserial.save(_source(), path, num_shards=3)
    return path


@pytest.fixture
def copy(saved: str, tmp_path: Path) -> str:
    dst = str(tmp_path / "copy")
    shutil.copytree(saved, dst)
    return dst


# ------------------------------------------------------------------ every writer


@pytest.mark.parametrize(
    "n, kwargs",
    [
        (N, {"num_shards": 3}),
        (3, {"num_shards": 5}),  # empty shards: an index of no records
        (N, {"shard_size": 300}),
        (N, {"num_shards": 2, "compression": "GZIP"}),
        (N, {"shard_size": 300, "compression": "ZLIB"}),
    ],
)
def test_save_indexes_every_uncompressed_shard(tmp_path, n, kwargs):
    path = str(tmp_path / "ds")
    superserial.save(_source(n), path, **kwargs)
    header = check_indexes(path)
    assert header.element_count == n and len(header.shards) > 1
    check_random_access(path)


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("mode", ["save_part", "Writer"])
def test_distributed_parts_and_finalize_index_every_shard(tmp_path, mode, compression):
    path = str(tmp_path / "ds")
    ds = _source()
    for i in range(2):
        part = ds.shard(2, i)
        if mode == "save_part":
            superserial.save(part, path, shard_index=i, num_shards=2, compression=compression)
            continue
        with superserial.Writer(
            path,
            shard_index=i,
            num_shards=2,
            element_spec=ds.element_spec,
            compression=compression,
            shard_size=200,  # several files per part
        ) as w:
            for el in part.as_numpy_iterator():
                w.write(el)
    superserial.finalize(path)
    header = check_indexes(path)
    assert sorted(_ids(path)) == list(range(N))
    if mode == "Writer":
        assert len(header.shards) > 2
    check_random_access(path)


def test_beam_indexes_every_uncompressed_shard(tmp_path):
    beam = pytest.importorskip("apache_beam")
    from apache_beam.options.pipeline_options import PipelineOptions

    import superserial.beam as ssb

    ds = _source()
    elements = list(ds.as_numpy_iterator())
    cases = {"plain": {"num_shards": 3}, "gzip": {"compression": "GZIP", "num_shards": 2}}
    options = PipelineOptions(direct_num_workers=2, direct_running_mode="multi_threading")
    with beam.Pipeline(options=options) as p:
        for name, kw in cases.items():
            _ = (
                p
                | f"Create {name}" >> beam.Create(elements)
                | f"Write {name}"
                >> ssb.WriteToSuperSerial(
                    str(tmp_path / name), ds.element_spec, max_batch_size=4, **kw
                )
            )
    for name, kw in cases.items():
        header = check_indexes(str(tmp_path / name))
        assert len(header.shards) == kw["num_shards"]
        assert sorted(_ids(str(tmp_path / name))) == list(range(N))
    check_random_access(str(tmp_path / "plain"))
    check_random_access(str(tmp_path / "gzip"))


def test_convert_indexes_uncompressed_output_only(saved, tmp_path):
    gz, plain = tmp_path / "gz", tmp_path / "plain"
    run("convert", saved, "-o", gz, "--compression", "GZIP")
    assert check_indexes(str(gz)).compression == "GZIP"
    check_random_access(str(gz))
    run("convert", gz, "-o", plain, "--compression", "none", "--num-shards", "4")
    assert len(check_indexes(str(plain)).shards) == 4
    assert _ids(str(plain)) == list(range(N))
    check_random_access(str(plain))


def _write_foreign(prefix: Path, compression: str) -> list[str]:
    """Two TFRecord files of tf.train.Example written without superserial."""
    files = []
    for k in range(2):
        file = f"{prefix}-{k}.tfrecord"
        with tf.io.TFRecordWriter(file, compression) as w:
            for i in range(k * 7, (k + 1) * 7):
                feature = {
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "xs": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * i)),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                w.write(example.SerializeToString())
        files.append(file)
    return files


@pytest.mark.parametrize("compression", ["", "GZIP"])
def test_infer_indexes_uncompressed_output_only(tmp_path, compression):
    files = _write_foreign(tmp_path / "in", compression)
    out = str(tmp_path / "out")
    run("infer", *files, "-o", out)
    header = check_indexes(out)
    assert header.compression == (compression or None) and header.element_count == 14
    assert _ids(out) == list(range(14))
    check_random_access(out)


def test_resumed_save_indexes_every_shard(tmp_path, caplog):
    """Shards completed before the interruption keep their index; a damaged one is rewritten."""
    path = str(tmp_path / "ds")
    fail = {"on": True}

    def flaky(i: Any) -> Any:
        if fail["on"] and int(i) == 2500:
            raise OSError("transient read error at 2500")
        return i

    def make() -> tf.data.Dataset:
        ds = tf.data.Dataset.range(3000).map(lambda i: tf.py_function(flaky, [i], tf.int64))
        return ds.map(lambda i: tf.ensure_shape(i, []))

    # Batches of 1024 are encoded ahead: 2048 elements (4 shards) are written first.
    with pytest.raises(tf.errors.OpError, match="transient read error at 2500"):
        superserial.save(make(), path, num_shards=6, resume=True)
    partial = tmp_path / f".ds{layout.PARTIAL_SUFFIX}"
    done = sorted(p.name for p in partial.iterdir() if p.name.endswith(".index"))
    assert done[:2] == [
        layout.index_name(layout.done_shard_name(0)),
        layout.index_name(layout.done_shard_name(1)),
    ]
    damaged = partial / done[1]
    damaged.write_bytes(damaged.read_bytes()[:-1])
    fail["on"] = False
    caplog.set_level("WARNING", logger="superserial")
    superserial.save(make(), path, num_shards=6, resume=True)
    assert f"{done[1]} is missing or damaged" in caplog.text
    check_indexes(path)
    ds = ssnp.load(path)
    assert [int(ds[i]) for i in (0, 499, 500, 2999, -1)] == [0, 499, 500, 2999, 2999]
    assert [int(x) for x in ds] == list(range(3000))


# ------------------------------------------------------------------ build_index


def test_build_index_on_a_golden_dataset_written_before_indexes(tmp_path):
    path = str(tmp_path / "golden")
    shutil.copytree(GOLDEN, path)
    before = superserial.read_header(path)
    assert all(s.index is None for s in before.shards)
    with pytest.raises(UnsupportedError, match=f"`superserial index {re.escape(path)}`"):
        ssnp.load(path)[0]
    elements = list(ssnp.load(path))
    header = superserial.build_index(path)
    assert header == check_indexes(path)
    assert header.structure == before.structure and header.writer == before.writer
    assert [(s.file, s.records, s.bytes, s.crc32c) for s in header.shards] == [
        (s.file, s.records, s.bytes, s.crc32c) for s in before.shards
    ]
    ds = ssnp.load(path)
    for i, el in enumerate(elements):
        same(ds[i], el)
    check_random_access(path)
    assert superserial.verify(path).ok


def test_build_index_restores_what_save_wrote(copy, saved):
    """Indexes stripped from a save come back byte for byte, and the header with them."""
    strip_indexes(copy)
    assert sorted(os.listdir(copy)) == sorted(
        ["header.json", *(s.file for s in superserial.read_header(saved).shards)]
    )
    with pytest.raises(UnsupportedError, match="written before indexes existed"):
        ssnp.load(copy)[3]
    seen: list[tuple[int, int]] = []
    header = superserial.build_index(copy, progress=lambda n, b: seen.append((n, b)))
    assert header == superserial.read_header(saved)
    for name in os.listdir(saved):
        assert Path(copy, name).read_bytes() == Path(saved, name).read_bytes(), name
    assert sum(n for n, _ in seen) == N
    assert sum(b for _, b in seen) == header.total_bytes
    check_random_access(copy)


def test_build_index_twice_changes_nothing(copy):
    strip_indexes(copy)
    first = superserial.build_index(copy)
    before = snapshot(copy)
    assert superserial.build_index(copy) == first
    assert snapshot(copy) == before
    # An already indexed dataset, as save wrote it: nothing to do either.
    result = run("index", copy, "--json")
    assert json.loads(result.stdout)["changed"] is False
    assert snapshot(copy) == before


def _flip(file: str, offset: int) -> None:
    data = bytearray(Path(file).read_bytes())
    data[offset] ^= 0x20
    Path(file).write_bytes(bytes(data))


def _set_shard(path: str, k: int, **fields: Any) -> None:
    edit_header(path, lambda h: h["shards"][k].update(fields))


def _damage_shard(path: str, case: str) -> str:
    """Damages shard 1 of ``path`` as ``case`` says; returns its file."""
    shard = superserial.read_header(path).shards[1]
    file = os.path.join(path, shard.file)
    if case == "flip":
        _flip(file, shard.bytes // 2)
    elif case == "truncate":
        Path(file).write_bytes(Path(file).read_bytes()[:-3])
    elif case == "append":
        Path(file).write_bytes(Path(file).read_bytes() + b"\0" * 16)
    elif case == "delete":
        os.remove(file)
    elif case == "framing":  # a damaged length field, the header's crc32c made to agree
        offsets = framing.record_offsets(file, shard.bytes)
        _flip(file, int(offsets[4]) + 1)
        _set_shard(path, 1, crc32c=f"{record_index.crc32c(Path(file).read_bytes()):08x}")
    return file


@pytest.mark.parametrize("stripped", [True, False], ids=["no_index", "indexed"])
@pytest.mark.parametrize("case", ["flip", "truncate", "append", "delete", "framing"])
def test_build_index_refuses_a_shard_that_disagrees_with_its_header(copy, case, stripped):
    if stripped:
        strip_indexes(copy)
    else:  # a damaged index of shard 0 is not rebuilt either: nothing is written
        _flip(os.path.join(copy, superserial.read_header(copy).shards[0].index.file), 30)
    file = _damage_shard(copy, case)
    before = snapshot(copy)
    with pytest.raises(
        CorruptDataError, match=f"{file}.*refusing to index.*nothing was changed"
    ) as e:
        superserial.build_index(copy)
    assert f"`superserial verify {copy}` lists every problem" in str(e.value)
    assert snapshot(copy) == before
    result = run("index", copy, "--json", code=1)
    assert json.loads(result.stdout)["ok"] is False
    assert file in result.stderr
    assert snapshot(copy) == before


def test_build_index_refuses_compressed_shards_without_restart_points(tmp_path):
    path = str(tmp_path / "gz")
    superserial.save(_source(), path, num_shards=2, compression="GZIP")
    before = snapshot(path)
    assert superserial.build_index(path) == superserial.read_header(path)  # valid: kept
    assert snapshot(path) == before
    strip_indexes(path)  # as written before restart points existed
    before = snapshot(path)
    with pytest.raises(
        UnsupportedError,
        match=rf"GZIP shards.*superserial convert {re.escape(path)} -o NEW_PATH --compression GZIP",
    ):
        superserial.build_index(path)
    assert snapshot(path) == before


def test_build_index_waits_for_no_save(copy):
    strip_indexes(copy)
    before = snapshot(copy)
    with SaveLock(copy), pytest.raises(DatasetLockedError):
        superserial.build_index(copy)
    assert snapshot(copy)["files"] == before["files"]


# ------------------------------------------------------------------ damaged indexes


def _rewrite_index(path: str, k: int, data: bytes) -> None:
    """Writes ``data`` as shard k's index, the header made to list its size and CRC."""
    ref = superserial.read_header(path).shards[k].index
    Path(path, ref.file).write_bytes(data)
    _set_shard(
        path,
        k,
        index={"file": ref.file, "bytes": len(data), "crc32c": f"{record_index.crc32c(data):08x}"},
    )


def _with_crc(body: bytes) -> bytes:
    """An index body with its own CRC-32C recomputed."""
    return body + struct.pack("<I", record_index.crc32c(body))


def _damage_index(path: str, case: str) -> None:
    """Damages the index of shard 1 of ``path``."""
    header = superserial.read_header(path)
    file = os.path.join(path, header.shards[1].index.file)
    data = Path(file).read_bytes()
    if case == "flip":
        _flip(file, 24 + 8 * 3)
    elif case == "truncate":
        Path(file).write_bytes(data[:-5])
    elif case == "missing":
        os.remove(file)
    elif case == "magic":
        _rewrite_index(path, 1, _with_crc(b"SSINDEX\x02" + data[8:-4]))
    elif case == "offsets":  # every CRC agrees; record 5 starts one byte late
        offsets = np.frombuffer(data, "<u8", offset=24, count=header.shards[1].records + 1).copy()
        offsets[5] += 1
        _rewrite_index(path, 1, _with_crc(data[:24] + offsets.tobytes()))
    elif case == "swapped":  # shard 0's index, listed as shard 1's
        _rewrite_index(path, 1, Path(path, header.shards[0].index.file).read_bytes())
    else:
        raise ValueError(case)


@pytest.mark.parametrize("case", ["flip", "truncate", "missing", "magic", "offsets", "swapped"])
def test_damaged_index(copy, saved, case):
    _damage_index(copy, case)
    name = superserial.read_header(copy).shards[1].index.file
    # Random access refuses shard 1, with an error naming the index; shard 0 still reads.
    ds = ssnp.load(copy)
    assert int(ds[3]["id"]) == 3
    with pytest.raises(CorruptDataError, match="index") as info:
        ds[15]
    if case != "offsets":  # there the record read is found to disagree with the index
        assert name in str(info.value)
    with pytest.raises(CorruptDataError):
        ds.get_batch([0, 15])
    # Sequential reading ignores the index.
    assert _ids(copy) == list(range(N))
    got = [int(e["id"]) for e in superserial.load(copy)]
    assert got == list(range(N))
    # verify names it.
    report = superserial.verify(copy)
    assert not report.ok
    assert [p.file for p in report.problems] == [os.path.join(copy, name)]
    assert report.shards[1].index_ok is False and report.shards[0].index_ok is True
    # build_index repairs it: the dataset is again exactly what save wrote.
    result = run("index", copy, "--json")
    out = json.loads(result.stdout)
    assert out["changed"] is True and out["indexed"] == [
        superserial.read_header(saved).shards[1].file
    ]
    assert len(out["already_indexed"]) == 2
    assert superserial.read_header(copy) == superserial.read_header(saved)
    assert Path(copy, name).read_bytes() == Path(saved, name).read_bytes()
    assert superserial.verify(copy).ok
    check_random_access(copy)


def test_verify_checks_the_indexes_of_a_good_dataset(saved):
    report = superserial.verify(saved)
    assert report.ok
    header = superserial.read_header(saved)
    assert [s.index_file for s in report.shards] == [
        os.path.join(saved, s.index.file) for s in header.shards
    ]
    assert all(s.index_ok for s in report.shards)


def test_verify_names_the_command_that_rebuilds_a_damaged_index(copy):
    index = os.path.join(copy, superserial.read_header(copy).shards[1].index.file)
    _flip(index, 30)
    report = superserial.verify(copy)
    assert [p.file for p in report.problems] == [index]
    assert f"rebuild it with `superserial index {copy}`" in report.problems[0].message


def test_index_named_as_another_shard_is_refused(copy):
    edit_header(copy, lambda h: h["shards"][0]["index"].update(file=h["shards"][1]["file"]))
    with pytest.raises(HeaderError, match="distinct file names"):
        superserial.read_header(copy)


# ------------------------------------------------------------------ command line


def _module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "superserial", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )


def test_index_command_end_to_end(copy, saved, tmp_path):
    strip_indexes(copy)
    files = [s.file for s in superserial.read_header(copy).shards]
    proc = _module("index", copy, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["changed"] is True and out["path"] == copy
    assert out["indexed"] == files and out["already_indexed"] == []
    assert out["shards"] == [s.to_obj() for s in superserial.read_header(saved).shards]
    check_indexes(copy)
    proc = _module("index", copy)
    assert proc.returncode == 0, proc.stderr
    assert "already have a valid record index" in proc.stdout
    # Compressed: exit 1, the way out named.
    gz = str(tmp_path / "gz")
    superserial.save(_source(4), gz, compression="GZIP")
    assert _module("index", gz).returncode == 0  # restart points: valid, kept
    strip_indexes(gz)  # as written before restart points existed
    proc = _module("index", gz, "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"]["type"] == "UnsupportedError"
    assert "compressed" in proc.stderr and "superserial convert" in proc.stderr


def test_index_command_text_names_each_shard_indexed(copy):
    strip_indexes(copy)
    text = run("index", copy).stdout
    for s in superserial.read_header(copy).shards:
        assert f"indexed {s.file}" in text
    assert "3 shard(s) indexed, 0 already indexed" in text
    assert "record index on all 3 shard(s)" in run("inspect", copy).stdout


def test_cleanup_removes_temporary_files_of_a_dead_indexer(copy):
    """A build_index killed before its renames leaves hidden temporaries; cleanup removes them."""
    header = superserial.read_header(copy)
    dead = Path(copy, f".{header.shards[0].file}.index{fs.TMP_MARK}999999999-0123456789ab")
    mine = Path(copy, f".{header.shards[1].file}.index{fs.TMP_MARK}{os.getpid()}-0123456789ab")
    dead.write_bytes(b"x")
    mine.write_bytes(b"y")
    removed = superserial.cleanup(copy)
    assert removed == [str(dead)] and not dead.exists() and mine.exists()
    assert superserial.verify(copy).ok

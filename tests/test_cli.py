"""The command line: every subcommand in-process (CliRunner), a few as real processes."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import yaml
from click.testing import CliRunner

import superserial
from conftest import assert_same_dataset, dataset_files, interrupt_after, run_without
from superserial.cli.main import cli

N = 12


def run(*args: str, code: int = 0) -> Any:
    """Runs the CLI in-process and checks its exit code."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == code, (
        result.exit_code,
        result.output,
        result.stderr,
        result.exception,
    )
    return result


def run_json(*args: str, code: int = 0) -> Any:
    return json.loads(run(*args, "--json", code=code).stdout)


def _dataset() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    return tf.data.Dataset.from_tensor_slices(
        {
            "a/b": rng.standard_normal((N, 3)),
            "big": np.arange(N * 100, dtype=np.float32).reshape(N, 100),
            "img": np.arange(N * 4, dtype=np.uint8).reshape(N, 2, 2),
            "label": np.arange(N, dtype=np.int64) * 7,
            "name": [b"n%d" % i for i in range(N)],
            "tags": tf.ragged.constant([list(range(i % 3)) for i in range(N)], dtype=tf.int32),
        }
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> str:
    """A small dataset of 2 shards, to be read only (copy it to damage it)."""
    path = str(tmp_path_factory.mktemp("cli") / "ds")
    superserial.save(_dataset(), path, num_shards=2)
    return path


@pytest.fixture
def copy(saved: str, tmp_path: Path) -> str:
    dst = str(tmp_path / "copy")
    shutil.copytree(saved, dst)
    return dst


def record_spans(file: str) -> list[tuple[int, int]]:
    """(start, end) of each record's data in an uncompressed TFRecord file."""
    data = Path(file).read_bytes()
    spans, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack("<Q", data[pos : pos + 8])
        spans.append((pos + 12, pos + 12 + n))
        pos += 12 + n + 4
    return spans


def shard_file(path: str, i: int) -> str:
    return os.path.join(path, superserial.read_header(path).shards[i].file)


# ------------------------------------------------------------------ inspect


def test_inspect_json_matches_header(saved: str) -> None:
    out = run_json("inspect", saved)
    header = superserial.read_header(saved)
    assert out["header"]["element_count"] == N
    assert out["header"]["format_version"] == 1
    assert [s["file"] for s in out["header"]["shards"]] == [s.file for s in header.shards]
    assert [s["records"] for s in out["header"]["shards"]] == [6, 6]
    assert out["total_bytes"] == header.total_bytes
    leaves = out["header"]["structure"]["items"]
    assert leaves["tags"]["kind"] == "ragged" and leaves["img"]["encoding"] == "raw"


def test_inspect_text(saved: str) -> None:
    text = run("inspect", saved).stdout
    for word in (
        "a~1b",
        "float64",
        "uint8",
        "[2, 2]",
        "ragged",
        "12 elements",
        "2 shard(s)",
        "raw",
    ):
        assert word in text, word
    for s in superserial.read_header(saved).shards:
        assert s.file in text and s.crc32c in text


# ------------------------------------------------------------------ head


def test_head_json_values(saved: str) -> None:
    out = run_json("head", saved, "-n", "3")
    assert [e["index"] for e in out["elements"]] == [0, 1, 2]
    expected = list(_dataset().take(3))
    for got, want in zip(out["elements"], expected, strict=True):
        leaves = got["leaves"]
        assert leaves["label"]["value"] == int(want["label"])
        assert leaves["name"]["value"] == want["name"].numpy().decode()  # a JSON string
        assert leaves["img"]["value"] == want["img"].numpy().tolist()
        assert leaves["img"]["shape"] == [2, 2] and leaves["img"]["dtype"] == "uint8"
        assert leaves["a~1b"]["value"] == want["a/b"].numpy().tolist()  # float64 exactly
        assert leaves["big"]["value"] == want["big"].numpy().tolist()  # in full
        assert leaves["tags"]["value"] == want["tags"].numpy().tolist()


def test_head_json_prints_an_image_on_one_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, [2, 32, 32, 3], dtype=np.uint8)
    names = [b"ok", b"\xff\xfe"]  # the second is {"base64": ...}
    path = str(tmp_path / "img")
    superserial.save(tf.data.Dataset.from_tensor_slices({"image": images, "name": names}), path)
    text = run("head", path, "-n", "1", "--json").stdout
    assert len(text.splitlines()) < 30, len(text.splitlines())
    image = json.loads(text)["elements"][0]["leaves"]["image"]
    assert image["value"] == images[0].tolist() and image["shape"] == [32, 32, 3]
    value_lines = [line for line in text.splitlines() if '"value":' in line]
    assert len(value_lines) == 2 and json.loads(value_lines[0].split(": ", 1)[1].rstrip(","))
    second = json.loads(run("head", path, "-n", "2", "--json").stdout)["elements"][1]
    assert second["leaves"]["name"]["value"] == {"base64": "//4="}


def test_head_text_summarizes(saved: str) -> None:
    text = run("head", saved, "-n", "2").stdout
    assert "element 1" in text and "element 2" not in text
    assert "b'n1'" in text and "label: int64[] = 7" in text
    assert "..." in text  # big: 100 values > threshold 20
    assert "1099." not in text  # a value of element 10, not shown
    full = run("head", saved, "-n", "1", "--threshold", "1000").stdout
    assert "..." not in full and "99." in full


def test_head_zero(saved: str) -> None:
    assert run_json("head", saved, "-n", "0")["elements"] == []


# ------------------------------------------------------------------ verify


def test_verify_ok(saved: str) -> None:
    out = run_json("verify", saved)
    assert out["ok"] is True and out["problems"] == []
    assert out["elements_decoded"] == N and out["records_read"] == N
    assert "OK" in run("verify", saved).stdout


def test_verify_library_and_progress(saved: str) -> None:
    seen = []
    report = superserial.verify(saved, progress=lambda n, b: seen.append(n))
    assert report.ok and report.elements_decoded == N
    assert sum(seen) == 2 * N  # read pass and decode pass
    import superserial.inspect.verify as module

    # The module has its own name, so importing it cannot shadow the function.
    assert superserial.verify(saved).ok and module.verify(saved).ok


def test_verify_corrupted_record_names_file_and_record(copy: str) -> None:
    file = shard_file(copy, 1)
    start, end = record_spans(file)[2]
    data = bytearray(Path(file).read_bytes())
    data[(start + end) // 2] ^= 0x40
    Path(file).write_bytes(bytes(data))
    result = run("verify", copy, code=1)
    assert os.path.basename(file) in result.stdout and "record 2" in result.stdout
    assert os.path.basename(file) in result.stderr
    out = run_json("verify", copy, code=1)
    assert out["ok"] is False
    framing = [p for p in out["problems"] if p["record"] is not None]
    assert len(framing) == 1 and framing[0]["file"] == file and framing[0]["record"] == 2
    assert any("crc32c" in p["message"] for p in out["problems"])
    # The intact shard was still decoded.
    assert out["shards"][0]["ok"] is True and out["shards"][0]["elements_decoded"] == 6


def test_verify_bad_value_names_record_and_leaf(copy: str) -> None:
    file = shard_file(copy, 0)
    records = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(file)]
    ex = tf.train.Example.FromString(records[4])
    ex.features.feature["img"].bytes_list.value[0] = b"\x01\x02\x03"  # 3 bytes, not 4
    records[4] = ex.SerializeToString()
    with tf.io.TFRecordWriter(file) as w:
        for r in records:
            w.write(r)
    out = run_json("verify", copy, code=1)
    decoded = [p for p in out["problems"] if p["leaf"] is not None]
    assert len(decoded) == 1, out["problems"]
    assert decoded[0] == {
        "file": file,
        "record": 4,
        "leaf": "img",
        "message": "expected 4 bytes per element, got 3",
    }
    assert out["shards"][1]["elements_decoded"] == 6  # the next shard was still decoded


def test_verify_missing_shard_and_extra_file(copy: str) -> None:
    file = shard_file(copy, 0)
    os.rename(file, os.path.join(copy, "data-99999-of-99999.tfrecord"))
    out = run_json("verify", copy, code=1)
    messages = {p["file"]: p["message"] for p in out["problems"]}
    assert "found no file" in messages[file]
    assert "extra file" in messages[os.path.join(copy, "data-99999-of-99999.tfrecord")]


def test_verify_truncated_shard(copy: str) -> None:
    file = shard_file(copy, 1)
    data = Path(file).read_bytes()
    Path(file).write_bytes(data[: record_spans(file)[5][0] + 3])  # inside the last record
    out = run_json("verify", copy, code=1)
    assert any(p["file"] == file and p["record"] == 5 for p in out["problems"]), out["problems"]
    assert any("bytes" in p["message"] for p in out["problems"] if p["file"] == file)


def test_bad_header(copy: str) -> None:
    Path(copy, "header.json").write_text('{"format_version": 1, "structure": ')
    result = run("verify", copy, code=1)
    assert "header.json" in result.stdout and "expected JSON" in result.stdout
    result = run("inspect", copy, code=1)
    assert "header.json" in result.stderr
    out = run_json("inspect", copy, code=1)
    assert out["ok"] is False and out["error"]["type"] == "HeaderError"
    Path(copy, "header.json").write_text(json.dumps({"format_version": 99}))
    out = run_json("head", copy, code=1)
    assert out["error"]["type"] == "FormatVersionError"


@pytest.mark.parametrize("command", ["inspect", "head", "verify"])
def test_missing_path_is_exit_1(command: str, tmp_path: Path) -> None:
    result = run(command, tmp_path / "nope", code=1)
    assert "nope" in result.stderr and "expected a superserial dataset" in result.stderr


def test_usage_errors_are_exit_2(saved: str, tmp_path: Path) -> None:
    assert "Missing argument" in run("head", code=2).stderr
    run("head", saved, "-n", "-1", code=2)
    run("convert", saved, code=2)  # no -o
    run("convert", saved, "-o", tmp_path / "x", "--compression", "LZMA", code=2)
    run("convert", saved, "-o", tmp_path / "x", "--shard-size", "lots", code=2)
    both = run(
        "convert", saved, "-o", tmp_path / "x", "--shard-size", "1M", "--num-shards", "2", code=2
    )
    assert "got both" in both.stderr and not (tmp_path / "x").exists()
    run("upgrade", tmp_path / "old.yaml", "-o", tmp_path / "x", code=2)
    run("no-such-command", code=2)


def test_help_for_every_command() -> None:
    for command in cli.commands:
        text = run(command, "--help").stdout
        assert "--json" in text and "Usage: " in text, command


def test_verbose_logs_to_stderr(saved: str) -> None:
    result = run("-v", "verify", saved, "-q")
    assert "INFO superserial: verified" in result.stderr
    assert "superserial:" not in run("verify", saved, "-q").stderr


# ------------------------------------------------------------------ infer


def _example(features: dict[str, Any]) -> bytes:
    feats = {}
    for name, value in features.items():
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            feats[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=value))
        elif isinstance(value, list) and value and isinstance(value[0], float):
            feats[name] = tf.train.Feature(float_list=tf.train.FloatList(value=value))
        else:
            feats[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=value))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _foreign_element(i: int) -> dict[str, Any]:
    el: dict[str, Any] = {
        "id": [i],
        "pos": [i * 0.5, -1.0, 2.25],
        "meta/name": [b"item-%d" % i],
        "meta/tags": list(range(i % 4)),  # varying length, sometimes empty
        "scores": [float(i)] * (1 + i % 2),
    }
    if i % 5 != 3:
        el["maybe"] = [b"x" * i]  # missing from some records
    return el


def write_foreign(
    prefix: Path, files: int = 2, per_file: int = 10, compression: str = ""
) -> list[str]:
    paths = []
    for k in range(files):
        path = f"{prefix}-{k}.tfrecord"
        with tf.io.TFRecordWriter(path, compression) as w:
            for i in range(k * per_file, (k + 1) * per_file):
                w.write(_example(_foreign_element(i)))
        paths.append(path)
    return paths


def test_infer_and_load(tmp_path: Path) -> None:
    files = write_foreign(tmp_path / "in")
    before = [Path(f).read_bytes() for f in files]
    out_dir = tmp_path / "inferred"
    out = run_json("infer", str(tmp_path / "in-*.tfrecord"), "-o", out_dir)
    assert out["element_count"] == 20 and out["records_scanned"] == 20 and out["note"] is None
    assert out["files"] == files
    kinds = {f["feature"]: (f["leaf_kind"], f["dtype"], f["shape"]) for f in out["features"]}
    assert kinds == {
        "id": ("dense", "int64", []),
        "pos": ("dense", "float32", [3]),
        "meta/name": ("dense", "string", []),
        "meta/tags": ("ragged", "int64", [None]),
        "scores": ("ragged", "float32", [None]),
        "maybe": ("ragged", "string", [None]),
    }
    # The originals are copied, untouched.
    assert [Path(f).read_bytes() for f in files] == before
    assert sorted(os.listdir(out_dir)) == [
        "data-00000-of-00002.tfrecord",
        "data-00000-of-00002.tfrecord.index",
        "data-00001-of-00002.tfrecord",
        "data-00001-of-00002.tfrecord.index",
        "header.json",
    ]
    ds = superserial.load(str(out_dir))
    spec = ds.element_spec
    assert spec["id"] == tf.TensorSpec([], tf.int64)
    assert spec["pos"] == tf.TensorSpec([3], tf.float32)
    assert spec["meta"]["name"] == tf.TensorSpec([], tf.string)
    assert spec["meta"]["tags"] == tf.RaggedTensorSpec([None], tf.int64, 0)
    elements = list(ds)
    assert len(elements) == 20
    for i, el in enumerate(elements):
        want = _foreign_element(i)
        assert int(el["id"]) == i
        assert el["pos"].numpy().tolist() == want["pos"]
        assert el["meta"]["name"].numpy() == want["meta/name"][0]
        assert el["meta"]["tags"].numpy().tolist() == want["meta/tags"]
        assert el["scores"].numpy().tolist() == want["scores"]
        assert el["maybe"].numpy().tolist() == want.get("maybe", [])
    assert superserial.verify(str(out_dir)).ok


def test_infer_gzip_sample_counts_all(tmp_path: Path) -> None:
    files = write_foreign(tmp_path / "gz", compression="GZIP")
    out_dir = tmp_path / "inferred"
    result = run("infer", *files, "-o", out_dir, "--sample", "5")
    assert "first 5 of 20 records" in result.stderr
    header = superserial.read_header(str(out_dir))
    assert header.compression == "GZIP" and header.element_count == 20
    assert [s.records for s in header.shards] == [10, 10]
    # The first 5 records have 'scores' of lengths 1 and 2: ragged; 'id' fixed.
    leaves = {leaf.name: leaf for leaf in header.leaves}
    assert leaves["scores"].kind == "ragged" and leaves["id"].shape == ()
    assert [int(el["id"]) for el in superserial.load(str(out_dir))] == list(range(20))


def test_infer_sample_mismatch_surfaces_at_verify(tmp_path: Path) -> None:
    path = str(tmp_path / "late.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(10):
            w.write(_example({"v": [1.0] * (3 if i < 6 else 4), "id": [i]}))
    out_dir = str(tmp_path / "inferred")
    out = run_json("infer", path, "-o", out_dir, "--sample", "4")
    assert "fails at load" in out["note"]
    out = run_json("verify", out_dir, code=1)
    assert [(p["record"], p["leaf"]) for p in out["problems"]] == [(6, "v")]
    with pytest.raises(tf.errors.InvalidArgumentError):
        list(superserial.load(out_dir))


@pytest.mark.parametrize(
    ("names", "complaint"),
    [
        (["a~b"], "'~'"),
        (["a", "a/b"], "form a tree"),
        (["m/n", "m/n/o"], "form a tree"),
    ],
)
def test_infer_rejects_unrepresentable_names(
    tmp_path: Path, names: list[str], complaint: str
) -> None:
    path = str(tmp_path / "bad.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        w.write(_example({n: [1] for n in names}))
    result = run("infer", path, "-o", tmp_path / "out", code=1)
    assert complaint in result.stderr
    assert not (tmp_path / "out").exists()
    assert not [n for n in os.listdir(tmp_path) if "superserial-tmp" in n]


def test_infer_rejects_mixed_kinds_and_garbage(tmp_path: Path) -> None:
    path = str(tmp_path / "mixed.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        w.write(_example({"x": [1]}))
        w.write(_example({"x": [1.0]}))
    assert "float_list and int64_list" in run("infer", path, "-o", tmp_path / "o", code=1).stderr
    Path(path).write_bytes(b"not a tfrecord file at all")
    assert "mixed.tfrecord" in run("infer", path, "-o", tmp_path / "o", code=1).stderr
    assert "matching" in run("infer", str(tmp_path / "none-*"), "-o", tmp_path / "o", code=1).stderr


def test_infer_refuses_existing_output(tmp_path: Path, saved: str) -> None:
    files = write_foreign(tmp_path / "in", files=1, per_file=3)
    out_dir = tmp_path / "out"
    run("infer", *files, "-o", out_dir)
    assert "--overwrite" in run("infer", *files, "-o", out_dir, code=1).stderr
    run("infer", *files, "-o", out_dir, "--overwrite")
    assert superserial.read_header(str(out_dir)).element_count == 3


def test_infer_holds_the_save_lock(tmp_path: Path) -> None:
    """infer commits as save does: a save (or infer) holding the output's lock makes it
    fail with the locked error, before writing anything, also with --overwrite."""
    from superserial.write.local_commit import SaveLock

    files = write_foreign(tmp_path / "in", files=1, per_file=3)
    out_dir = tmp_path / "out"
    with SaveLock(str(out_dir)):
        before = sorted(os.listdir(tmp_path))
        out = run_json("infer", *files, "-o", out_dir, code=1)
        assert out["error"]["type"] == "DatasetLockedError"
        assert "expected no other save" in out["error"]["message"]
        assert sorted(os.listdir(tmp_path)) == before
    assert not out_dir.exists()

    run("infer", *files, "-o", out_dir)
    old = {name: (out_dir / name).read_bytes() for name in os.listdir(out_dir)}
    with SaveLock(str(out_dir)):
        before = sorted(os.listdir(tmp_path))
        stderr = run("infer", *files, "-o", out_dir, "--overwrite", code=1).stderr
        assert "expected no other save" in stderr
        assert sorted(os.listdir(tmp_path)) == before
    assert {name: (out_dir / name).read_bytes() for name in os.listdir(out_dir)} == old


def test_infer_overwrite_never_reuses_the_old_file_names(tmp_path: Path) -> None:
    """As with save: a reader still reading the replaced dataset by file name must
    never open a file of the new one (and on object stores, where files are moved
    one by one, the old files must stay intact until the new header is written)."""
    files = write_foreign(tmp_path / "in", files=2, per_file=3)
    out_dir = tmp_path / "out"
    run("infer", *files, "-o", out_dir)
    old = set(os.listdir(out_dir))
    run("infer", *files, "-o", out_dir, "--overwrite")
    new = {s.file for s in superserial.read_header(str(out_dir)).shards}
    assert len(new) == 2 and not new & old, (old, new)
    assert sorted(os.listdir(out_dir)) == dataset_files(superserial.read_header(str(out_dir)))
    assert superserial.verify(str(out_dir)).ok


def test_infer_output_files_are_the_inputs_reframed(tmp_path: Path) -> None:
    """Uncompressed inputs come out byte for byte (one shard per file, empty files
    too); compressed ones keep their compression and records."""
    files = write_foreign(tmp_path / "in", files=2, per_file=4)
    empty = tmp_path / "in-2.tfrecord"
    empty.write_bytes(b"")
    out_dir = tmp_path / "plain"
    run("infer", *files, empty, "-o", out_dir)
    header = superserial.read_header(str(out_dir))
    assert [s.records for s in header.shards] == [4, 4, 0]
    for s, f in zip(header.shards, [*files, empty], strict=True):
        assert (out_dir / s.file).read_bytes() == Path(f).read_bytes()
    for comp in ("GZIP", "ZLIB"):
        zfiles = write_foreign(tmp_path / comp, files=2, per_file=4, compression=comp)
        out = run_json("infer", *zfiles, "-o", tmp_path / f"out-{comp}")
        assert out["compression"] == comp
        header = superserial.read_header(str(tmp_path / f"out-{comp}"))
        assert header.compression == comp and [s.records for s in header.shards] == [4, 4]
        for s, f in zip(header.shards, zfiles, strict=True):
            got = list(tf.data.TFRecordDataset(str(tmp_path / f"out-{comp}" / s.file), comp))
            assert [r.numpy() for r in got] == [r.numpy() for r in tf.data.TFRecordDataset(f, comp)]
        assert superserial.verify(str(tmp_path / f"out-{comp}")).ok


# ------------------------------------------------------------------ upgrade


def write_legacy(base: Path) -> None:
    with tf.io.TFRecordWriter(f"{base}.tfrecord") as w:
        for i in range(9):
            w.write(_example({"x": [i * 0.5, 1.0], "y": [i - 4], "s": [b"s%d" % i]}))
    spec = {
        "x": {"shape": [2], "dtype": 2},
        "y": {"shape": [], "dtype": 3},
        "s": {"shape": [], "dtype": 7},
    }
    Path(f"{base}.header").write_text(yaml.safe_dump(spec))


@pytest.mark.parametrize("form", ["header", "both"])
def test_upgrade(tmp_path: Path, form: str) -> None:
    base = tmp_path / "old"
    write_legacy(base)
    args = [f"{base}.header"] if form == "header" else [f"{base}.tfrecord", f"{base}.header"]
    out_dir = str(tmp_path / "new")
    out = run_json("upgrade", *args, "-o", out_dir, "--num-shards", "2")
    assert out["element_count"] == 9 and len(out["shards"]) == 2
    ds = superserial.load(out_dir)
    assert ds.element_spec == {
        "s": tf.TensorSpec([], tf.string),
        "x": tf.TensorSpec([2], tf.float64),
        "y": tf.TensorSpec([], tf.int32),
    }
    for i, el in enumerate(ds):
        assert el["x"].numpy().tolist() == [i * 0.5, 1.0]
        assert int(el["y"]) == i - 4 and el["s"].numpy() == b"s%d" % i


def test_upgrade_missing_pair(tmp_path: Path) -> None:
    Path(tmp_path / "lonely.header").write_text("x: {shape: [], dtype: 9}\n")
    result = run("upgrade", tmp_path / "lonely.header", "-o", tmp_path / "new", code=1)
    assert "lonely.tfrecord" in result.stderr


# ------------------------------------------------------------------ convert


def test_convert_reshard_and_compress(saved: str, tmp_path: Path) -> None:
    out_dir = str(tmp_path / "gz")
    out = run_json("convert", saved, "-o", out_dir, "--compression", "gzip", "--num-shards", "3")
    assert out["compression"] == "GZIP" and [s["records"] for s in out["shards"]] == [4, 4, 4]
    assert_same_dataset(superserial.load(saved), superserial.load(out_dir))
    assert superserial.verify(out_dir).ok
    # Back, uncompressed, by size; the source's compression is kept by default.
    small = str(tmp_path / "small")
    run("convert", out_dir, "-o", small, "--shard-size", "1K", "-q")
    header = superserial.read_header(small)
    assert header.compression == "GZIP" and len(header.shards) > 1
    plain = str(tmp_path / "plain")
    run("convert", small, "-o", plain, "--compression", "none")
    assert superserial.read_header(plain).compression is None
    assert_same_dataset(superserial.load(saved), superserial.load(plain))


def test_convert_keeps_the_source_shard_count(tmp_path: Path) -> None:
    """Without --num-shards or --shard-size, re-compressing keeps the source's layout."""
    source = str(tmp_path / "four")
    superserial.save(_dataset(), source, num_shards=4)
    out = run_json("convert", source, "-o", tmp_path / "gz", "--compression", "GZIP")
    assert out["compression"] == "GZIP" and [s["records"] for s in out["shards"]] == [3, 3, 3, 3]
    assert_same_dataset(superserial.load(source), superserial.load(str(tmp_path / "gz")))


def test_convert_refuses_itself_and_existing(saved: str, copy: str) -> None:
    assert "other than the source" in run("convert", saved, "-o", saved + "/", code=2).stderr
    assert "overwrite" in run("convert", saved, "-o", copy, code=1).stderr
    run("convert", saved, "-o", copy, "--overwrite", "--num-shards", "1")
    assert len(superserial.read_header(copy).shards) == 1


def test_convert_resume_continues_an_interrupted_convert(tmp_path: Path, caplog: Any) -> None:
    # An interrupted convert is an interrupted save of load(SOURCE): it keeps its shards.
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    superserial.save(tf.data.Dataset.range(3000).map(lambda i: tf.fill([8], i)), src)
    with pytest.raises(KeyboardInterrupt):
        superserial.save(superserial.load(src), out, num_shards=6, progress=interrupt_after(2))
    assert not os.path.exists(out)
    caplog.set_level("INFO", logger="superserial")
    run("convert", src, "-o", out, "--num-shards", "6", "--resume", "-q")
    assert re.search(r"after [1-5] complete shard\(s\)", caplog.text), caplog.text
    assert_same_dataset(superserial.load(src), superserial.load(out))


# ------------------------------------------------------------------ real processes

VENV_BIN = Path(sys.executable).parent
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def test_module_inspect_without_tensorflow(saved: str) -> None:
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['superserial', 'inspect', {saved!r}, '--json']\n"
        "try:\n"
        "    runpy.run_module('superserial', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "assert 'tensorflow' not in sys.modules, 'inspect imported TensorFlow'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["header"]["element_count"] == N


def test_module_verify_subprocess(saved: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "superserial", "verify", saved, "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


def test_console_script(copy: str) -> None:
    script = str(VENV_BIN / "superserial")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 0 and "infer" in proc.stdout and "upgrade" in proc.stdout
    proc = subprocess.run(
        [script, "inspect", copy], capture_output=True, text=True, env=ENV, timeout=60
    )
    assert proc.returncode == 0 and "12 elements" in proc.stdout
    file = shard_file(copy, 0)
    start, _ = record_spans(file)[1]
    data = bytearray(Path(file).read_bytes())
    data[start] ^= 0xFF
    Path(file).write_bytes(bytes(data))
    proc = subprocess.run(
        [script, "verify", copy], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"{file}, record 1:" in proc.stdout
    assert "failed verification" in proc.stderr


# ------------------------------------------------------------------ composite leaves


@pytest.fixture
def composite(tmp_path: Path) -> str:
    """Sparse, ragged_rank 1, unknown-shape complex and bfloat16 leaves."""
    sp = tf.sparse.SparseTensor(
        [[i, i % 4] for i in range(6)], np.arange(6, dtype=np.float64), [6, 4]
    )
    rt = tf.ragged.constant([[[1, 2], [3]], [[4]], [[], [5, 6, 7]]] * 2, dtype=tf.int16)
    var = tf.data.Dataset.range(6).map(
        lambda i: tf.fill(tf.cast([i % 3, 2], tf.int32), tf.complex(tf.cast(i, tf.float32), -1.0))
    )
    bf = tf.constant([1.0, float("nan"), float("inf"), 2, 3, 4], tf.bfloat16)
    ds = tf.data.Dataset.zip(
        (
            tf.data.Dataset.from_tensor_slices({"sp": sp, "rt": rt}),
            var,
            tf.data.Dataset.from_tensor_slices(bf),
        )
    )
    path = str(tmp_path / "composite")
    superserial.save(ds, path)
    return path


def test_head_composite_leaves(composite: str) -> None:
    out = run_json("head", composite, "-n", "3")
    e1, e2 = out["elements"][1]["leaves"], out["elements"][2]["leaves"]
    assert e1["0/sp"] == {
        "kind": "sparse",
        "dtype": "float64",
        "dense_shape": [4],
        "indices": [[1]],
        "values": [1.0],
    }
    assert e2["0/rt"]["value"] == [[], [5, 6, 7]] and e2["0/rt"]["shape"] == [2, None]
    assert e1["1"]["value"] == [[[1.0, -1.0], [1.0, -1.0]]]  # complex as [re, im]
    assert e1["2"]["value"] == "nan" and e2["2"]["value"] == "inf"
    text = run("head", composite, "-n", "3").stdout
    assert "0/sp: sparse float64[4] nnz=1" in text
    assert "0/rt: ragged int16[2, None] = [[], [5, 6, 7]]" in text
    assert "1: complex64[0, 2] = []" in text and "2: bfloat16[] = nan" in text


def test_verify_bad_sparse_index(composite: str) -> None:
    assert superserial.verify(composite).ok
    file = shard_file(composite, 0)
    records = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(file)]
    ex = tf.train.Example.FromString(records[3])
    ex.features.feature["0/sp~idx"].int64_list.value[0] = 7  # outside dense shape [4]
    records[3] = ex.SerializeToString()
    with tf.io.TFRecordWriter(file) as w:
        for r in records:
            w.write(r)
    report = superserial.verify(composite)
    decoded = [p for p in report.problems if p.leaf is not None]
    assert [(p.file, p.record, p.leaf) for p in decoded] == [(file, 3, "0/sp")]
    assert "indices inside the dense shape" in decoded[0].message


def test_byte_sizes() -> None:
    import click

    from superserial.cli.main import ByteSize

    parse = ByteSize().convert
    assert parse("1000", None, None) == 1000
    # coreutils' rule, shared with cache_limit=: a bare letter and KiB are binary, kB decimal.
    assert parse("64K", None, None) == parse("64KiB", None, None) == 65536
    assert parse("64kB", None, None) == parse("64KB", None, None) == 64000
    assert parse("1.5M", None, None) == 3 << 19
    for bad in ("0", "B", "lots", "-1K", "64KX"):
        with pytest.raises(click.BadParameter):
            parse(bad, None, None)


# ------------------------------------------------------------------ issue 9: messages and CLI


def test_cli_overwrite_hint_names_the_flag(saved: str, copy: str) -> None:
    for command in (["convert", saved], ["upgrade", os.path.join(copy, "old.header")]):
        stderr = run(*command, "-o", copy, code=1).stderr
        assert "--overwrite" in stderr and "overwrite=True" not in stderr, stderr


def test_quiet_and_verbose_before_or_after_the_subcommand(saved: str, tmp_path: Path) -> None:
    assert "OK" in run("-q", "verify", saved).stdout
    assert "OK" in run("verify", saved, "-q").stdout
    for args in (["-v", "verify", saved], ["verify", saved, "-v"], ["-q", "verify", "-v", saved]):
        assert "INFO superserial: verified" in run(*args).stderr, args
    missing = tmp_path / "nope"
    assert "DEBUG superserial" in run("-v", "inspect", missing, "-v", code=1).stderr  # -vv
    assert "DEBUG" not in run("-v", "inspect", missing, code=1).stderr
    assert run("-q", "inspect", saved, "-q").exit_code == 0
    run("-q", "convert", saved, "-o", tmp_path / "c", "-v")
    assert superserial.verify(str(tmp_path / "c")).ok


def test_existing_file_is_named_a_file(saved: str, tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(superserial.DatasetExistsError, match="found a file") as err:
            superserial.save(tf.data.Dataset.range(3), str(file), overwrite=overwrite)
        assert "overwrite=True" not in str(err.value)
    stderr = run("convert", saved, "-o", file, code=1).stderr
    assert "found a file" in stderr and "--overwrite" not in stderr
    assert file.read_text() == "keep me"


def test_hints_for_the_obvious_next_step(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    write_foreign(raw / "part", files=2, per_file=2)
    with pytest.raises(superserial.DatasetNotFoundError, match="superserial infer") as err:
        superserial.load(str(raw))
    assert f"'{raw}/*'" in str(err.value)
    assert "superserial infer" in run("head", raw, code=1).stderr
    (tmp_path / "empty").mkdir()  # nothing to infer from: no hint
    with pytest.raises(superserial.DatasetNotFoundError) as err:
        superserial.load(str(tmp_path / "empty"))
    assert "infer" not in str(err.value)

    with pytest.raises(TypeError, match=r"tf\.data\.Dataset\.from_tensor_slices"):
        superserial.save([1, 2, 3], str(tmp_path / "list"))  # type: ignore[arg-type]

    def gen() -> Any:
        yield np.zeros((2, 2), np.float32)

    unknown_rank = tf.data.Dataset.from_generator(
        gen, output_signature=tf.TensorSpec(None, tf.float32)
    )
    with pytest.raises(superserial.UnsupportedError, match=r"tf\.ensure_shape"):
        superserial.save(unknown_rank, str(tmp_path / "rank"))


def test_verify_names_file_record_and_tf_offset_of_a_corruption(copy: str) -> None:
    """``load`` reports TF's "corrupted record at <offset>" without the file (TF's
    TFRecordDataset gives no more, see the report); ``verify`` names the file, the
    record and that same byte offset."""
    file = shard_file(copy, 1)
    start, end = record_spans(file)[3]
    data = bytearray(Path(file).read_bytes())
    data[(start + end) // 2] ^= 0x01
    Path(file).write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError, match=r"corrupted record at (\d+)") as err:
        list(superserial.load(copy))
    offset = int(re.search(r"corrupted record at (\d+)", err.value.message).group(1))
    assert offset == start  # the first byte of the record's data
    out = run_json("verify", copy, code=1)
    framing = [p for p in out["problems"] if p["record"] is not None]
    assert len(framing) == 1 and framing[0]["file"] == file and framing[0]["record"] == 3
    assert f"byte offset {offset}" in framing[0]["message"], framing


def test_head_json_strings_utf8_or_base64(tmp_path: Path) -> None:
    path = str(tmp_path / "strings")
    texts = [b"doc-0", "naïve ✓".encode(), b"\xff\x00binary"]
    superserial.save(tf.data.Dataset.from_tensor_slices({"s": texts, "v": [texts] * 3}), path)
    elements = run_json("head", path)["elements"]
    assert [e["leaves"]["s"]["value"] for e in elements] == [
        "doc-0",
        "naïve ✓",
        {"base64": base64.b64encode(b"\xff\x00binary").decode()},
    ]
    assert elements[0]["leaves"]["v"]["value"][1] == "naïve ✓"
    assert "b'\\xff\\x00binary'" in run("head", path).stdout  # text output: bytes literals


def test_infer_says_why_a_leaf_is_ragged(tmp_path: Path) -> None:
    files = write_foreign(tmp_path / "in", files=1, per_file=10)
    text = run("infer", *files, "-o", tmp_path / "out").stdout
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()[1:]}
    assert "(missing in 2 of 10 scanned records)" in lines["maybe"], lines
    assert "(lengths vary)" in lines["scores"] and "(" not in lines["id"]
    out = run_json("infer", *files, "-o", tmp_path / "out2")
    why = {f["feature"]: f["ragged_because"] for f in out["features"]}
    assert why["maybe"] == "missing in 2 of 10 scanned records" and why["id"] is None


def test_numpy_reader_reads_absent_features_as_load_does(tmp_path: Path) -> None:
    """Records of an inferred dataset lack a feature: ``load`` reads it as empty, so
    must the numpy reader (and ``verify``, which decodes with it)."""
    import superserial.numpy as ssnp

    files = write_foreign(tmp_path / "in", files=1, per_file=10)
    out_dir = str(tmp_path / "out")
    run("infer", *files, "-o", out_dir)
    want = [el["maybe"].numpy().tolist() for el in superserial.load(out_dir)]
    assert want[3] == [] and want[8] == []
    assert [el["maybe"].tolist() for el in ssnp.load(out_dir)] == want
    assert superserial.verify(out_dir).ok


_NO_TF = (
    "import runpy\n"
    "sys.argv = ['superserial', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('superserial', run_name='__main__')\n"
    "finally:\n"
    "    assert sys.modules['tensorflow'] is None\n"
)


def _no_tf(*args: str) -> subprocess.CompletedProcess[str]:
    return run_without(["tensorflow"], _NO_TF, *args, timeout=60)


def test_verify_and_head_work_without_tensorflow(saved: str, copy: str) -> None:
    proc = _no_tf("verify", saved, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["elements_decoded"] == N
    proc = _no_tf("head", saved, "-n", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    elements = json.loads(proc.stdout)["elements"]
    assert [e["leaves"]["name"]["value"] for e in elements] == ["n0", "n1"]
    assert "label: int64[] = 7" in _no_tf("head", saved, "-n", "2").stdout

    file = shard_file(copy, 0)
    start, _ = record_spans(file)[1]
    data = bytearray(Path(file).read_bytes())
    data[start] ^= 0xFF
    Path(file).write_bytes(bytes(data))
    proc = _no_tf("verify", copy)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"{file}, record 1:" in proc.stdout and "Traceback" not in proc.stderr

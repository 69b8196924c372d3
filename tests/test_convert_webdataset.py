"""WebDataset tar shards -> superserial: shards written by webdataset's own writers, every
extension kind of docs/convert.md compared element for element, and the bad tars."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tarfile
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import superserial
import superserial.numpy as ssnp
from conftest import canon_np, run_without
from superserial.cli.main import cli
from superserial.errors import (
    ConversionError,
    CorruptDataError,
    DatasetNotFoundError,
    UnsupportedError,
)

wds = pytest.importorskip("webdataset")

N = 7


def _sample(i: int) -> dict[str, Any]:
    return {
        "__key__": f"s{i:03d}",
        "cls": i,
        "cls2": 10 - i,
        "index": -i,
        "id": 2**40 + i,
        "txt": f"caption {i} é",
        "json": {"i": i, "tags": ["a"] * i},
        "npy": np.arange(6, dtype=np.float16).reshape(2, 3) * i,
        "u64.npy": np.array([2**64 - 1 - i, i], np.uint64),
        "f64.npy": np.float64(i) / 3,
        "bool.npy": np.array([i % 2 == 0]),
        "jpg": b"\xff\xd8\xff" + bytes([i]) * i,  # bytes go into the tar as they are
        "seg.png": b"\x89PNG" + bytes([i]),
        "flac": b"fLaC" + bytes(i),
        "pyd": {"obj": i},  # pickled by the writer; kept as its bytes, never unpickled
        "xyz": b"\x00raw\x01" * i,
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory: Any) -> str:
    root = tmp_path_factory.mktemp("wds")
    with wds.ShardWriter(str(root / "train-%03d.tar"), maxcount=3, verbose=0) as writer:
        for i in range(N):
            writer.write(_sample(i))
    return str(root / "train-{000..002}.tar")


@pytest.fixture(scope="module")
def converted(shards: str, tmp_path_factory: Any) -> tuple[Any, str]:
    path = str(tmp_path_factory.mktemp("out") / "ds")
    header = superserial.convert(shards, path)
    return header, path


def _tar(path: str, samples: list[dict[str, Any]]) -> str:
    with wds.TarWriter(path) as writer:
        for s in samples:
            writer.write(s)
    return path


def test_every_extension_element_for_element(converted: tuple[Any, str]) -> None:
    header, path = converted
    assert header.element_count == N
    got = list(ssnp.load(path))
    assert len(got) == N
    for i, element in enumerate(got):
        want = _sample(i)
        assert element["__key__"].item() == want["__key__"].encode()
        for ext in ("cls", "cls2", "index", "id"):
            assert element[ext].dtype == np.int64 and element[ext].shape == ()
            assert element[ext].item() == want[ext]
        assert element["txt"].item() == want["txt"].encode()
        # The JSON text exactly as the writer wrote it, not re-serialized.
        assert element["json"].item() == wds.writer.default_handlers["json"](want["json"])
        for ext in ("npy", "u64.npy", "f64.npy", "bool.npy"):
            expected = np.asarray(want[ext])
            assert element[ext].dtype == expected.dtype, ext
            assert element[ext].shape == expected.shape, ext
            assert element[ext].tobytes() == expected.tobytes(), ext
        for ext in ("jpg", "seg.png", "flac", "xyz"):
            assert element[ext].item() == want[ext], ext
        assert pickle.loads(element["pyd"].item()) == want["pyd"]
    src = header.metadata["source"]
    assert src["format"] == "webdataset" and src["shards"] == 3
    assert src["extensions"]["npy"] == "npy" and src["extensions"]["jpg"] == "bytes"


def test_element_spec_in_tensorflow(converted: tuple[Any, str]) -> None:
    tf = pytest.importorskip("tensorflow")
    spec = superserial.load(converted[1]).element_spec
    assert spec["cls"] == tf.TensorSpec([], tf.int64)
    assert spec["txt"] == tf.TensorSpec([], tf.string)
    assert spec["npy"] == tf.TensorSpec([2, 3], tf.float16)
    assert spec["u64.npy"] == tf.TensorSpec([2], tf.uint64)
    assert spec["bool.npy"] == tf.TensorSpec([1], tf.bool)


def test_detect_and_cli(shards: str, tmp_path: Any) -> None:
    root = os.path.dirname(shards)
    runner = CliRunner()
    # A directory of tars, detected.
    result = runner.invoke(cli, ["-q", "convert", root, "-o", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    # A brace pattern, forced.
    result = runner.invoke(
        cli, ["-q", "convert", shards, "-o", str(tmp_path / "b"), "--from", "webdataset"]
    )
    assert result.exit_code == 0, result.output
    for name in ("a", "b"):
        assert len(ssnp.load(str(tmp_path / name))) == N
    # A list of shards, and a glob.
    files = sorted(os.path.join(root, f) for f in os.listdir(root))
    assert superserial.convert(files[:2], str(tmp_path / "c")).element_count == 6
    assert superserial.convert(os.path.join(root, "*.tar"), str(tmp_path / "d")).element_count == N


def test_member_missing_for_one_key_names_tar_and_key(tmp_path: Any) -> None:
    samples = [{"__key__": f"k{i}", "cls": i, "txt": "t"} for i in range(4)]
    del samples[2]["cls"]
    tar = _tar(str(tmp_path / "bad.tar"), samples)
    out = str(tmp_path / "out")
    with pytest.raises(
        ConversionError, match=r"found no \.cls for key 'k2' \(sample 2\) in .*bad\.tar"
    ) as e:
        superserial.convert(tar, out)
    assert (e.value.column, e.value.row) == ("cls", 2)
    assert not os.path.exists(out)


def test_member_more_for_one_key(tmp_path: Any) -> None:
    samples = [{"__key__": f"k{i}", "txt": "t"} for i in range(3)]
    samples[1]["cls"] = 1
    tar = _tar(str(tmp_path / "more.tar"), samples)
    with pytest.raises(
        ConversionError, match=r"found also \.cls for key 'k1' \(sample 1\) in .*more\.tar"
    ):
        superserial.convert(tar, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_npy_shape_that_varies_is_an_error(tmp_path: Any) -> None:
    samples = [{"__key__": f"k{i}", "npy": np.zeros((2, i + 1), np.int32)} for i in range(2)]
    tar = _tar(str(tmp_path / "var.tar"), samples)
    with pytest.raises(ConversionError, match=r"int32\[2, 1\].*found int32\[2, 2\] for key 'k1'"):
        superserial.convert(tar, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_bad_values(tmp_path: Any) -> None:
    bad_int = _tar(
        str(tmp_path / "int.tar"), [{"__key__": "a", "cls": 1}, {"__key__": "b", "cls": b"one"}]
    )
    with pytest.raises(ConversionError, match=r"decimal int64 in \.cls, found b'one' for key 'b'"):
        superserial.convert(bad_int, str(tmp_path / "o1"))
    bad_text = _tar(str(tmp_path / "txt.tar"), [{"__key__": "a", "txt": b"\xff\xfe"}])
    with pytest.raises(ConversionError, match=r"UTF-8 text in \.txt, found .* for key 'a'"):
        superserial.convert(bad_text, str(tmp_path / "o2"))
    complex_npy = _tar(
        str(tmp_path / "c.tar"), [{"__key__": "a", "npy": np.zeros(2, np.complex64)}]
    )
    with pytest.raises(UnsupportedError, match=r"found complex64"):
        superserial.convert(complex_npy, str(tmp_path / "o3"))
    for name in ("o1", "o2", "o3"):
        assert not os.path.exists(tmp_path / name)


def test_not_a_tar_and_no_shards(tmp_path: Any) -> None:
    fake = tmp_path / "fake.tar"
    fake.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(CorruptDataError, match=r"tar file at .*fake\.tar"):
        superserial.convert(str(fake), str(tmp_path / "o"))
    with pytest.raises(DatasetNotFoundError, match=r"missing-\{0\.\.1\}|missing-0\.tar"):
        superserial.convert(str(tmp_path / "missing-{0..1}.tar"), str(tmp_path / "o"))
    # A tar with only non-sample members (webdataset skips __meta__ files).
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w") as t:
        info = tarfile.TarInfo("__meta__")
        info.size = 2
        t.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(DatasetNotFoundError, match="found none"):
        superserial.convert(str(empty), str(tmp_path / "o"))
    assert not os.path.exists(tmp_path / "o")


def test_big_endian_npy_is_the_same_numbers(tmp_path: Any) -> None:
    values = np.array([1.5, -2.25, 3e10], ">f8")
    tar = tmp_path / "be.tar"
    buf = io.BytesIO()
    np.save(buf, values)
    _tar(str(tar), [{"__key__": "a", "npy": buf.getvalue()}])
    superserial.convert(str(tar), str(tmp_path / "o"))
    got = ssnp.load(str(tmp_path / "o"))[0]["npy"]
    assert got.dtype == np.float64 and got.tolist() == values.tolist()


def test_shards_over_http_through_the_storage_layer(
    shards: str, converted: tuple[Any, str], web_server: Any, tmp_path: Any
) -> None:
    for name in os.listdir(os.path.dirname(shards)):
        shutil.copy(
            os.path.join(os.path.dirname(shards), name), os.path.join(web_server.root, name)
        )
    url = f"{web_server.url}/{os.path.basename(shards)}"  # the brace pattern, on the URL
    header = superserial.convert(url, str(tmp_path / "o"))
    assert header.element_count == N and header.metadata["source"]["shards"] == 3
    got, want = ssnp.load(str(tmp_path / "o")), ssnp.load(converted[1])
    assert [canon_np(e) for e in got] == [canon_np(e) for e in want]


def test_needs_no_tensorflow(shards: str, tmp_path: Any) -> None:
    code = f"""
import superserial, superserial.numpy as snp
superserial.convert({shards!r}, {str(tmp_path / "o")!r})
print([int(e["cls"]) for e in snp.load({str(tmp_path / "o")!r})])
"""
    proc = run_without(["tensorflow"], code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(list(range(N)))

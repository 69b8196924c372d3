"""ArrayRecord files of tf.train.Example in: files written here with array-record's own
writer (several group sizes, several files), converted, and compared element for element
with the Examples parsed by tf.io.parse_example."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ar = pytest.importorskip("array_record.python.array_record_module")
tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

import superserial  # noqa: E402
import superserial.numpy as snp  # noqa: E402
from conftest import run_without  # noqa: E402
from superserial.cli.main import cli  # noqa: E402
from superserial.errors import CorruptDataError, DatasetNotFoundError, UnsupportedError  # noqa: E402
from superserial.foreign.convert import detect_format  # noqa: E402
from superserial.foreign.sources.array_record import array_record_files  # noqa: E402

# (file name, group size, records): the order of the names is the order of the elements.
FILES = (("a-0.array_record", 1, 5), ("a-1.array_record", 3, 11), ("a-2.array_record", 64, 70))
SPEC = {
    "id": tf.io.FixedLenFeature([], tf.int64),
    "vec": tf.io.FixedLenFeature([3], tf.float32),
    "name": tf.io.FixedLenFeature([], tf.string),
    "img/bytes": tf.io.FixedLenFeature([], tf.string),
    "tokens": tf.io.RaggedFeature(tf.int64),
    "maybe": tf.io.RaggedFeature(tf.float32),
}


def _example(i: int) -> bytes:
    f = tf.train.Feature
    feature = {
        "id": f(int64_list=tf.train.Int64List(value=[i * 1_000_003 - 7])),
        "vec": f(float_list=tf.train.FloatList(value=[i, i / 3, -i])),
        "name": f(bytes_list=tf.train.BytesList(value=[f"név {i}".encode()])),
        "img/bytes": f(bytes_list=tf.train.BytesList(value=[bytes(range(i % 256))])),
        "tokens": f(int64_list=tf.train.Int64List(value=range(i % 5))),
    }
    if i % 4:  # missing in every fourth record
        feature["maybe"] = f(float_list=tf.train.FloatList(value=[i / 2] * (i % 3)))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path: Path, group_size: int, records: list[bytes]) -> None:
    writer = ar.ArrayRecordWriter(str(path), f"group_size:{group_size}")
    for r in records:
        writer.write(r)
    writer.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """A directory of three ArrayRecord files, and all their records in order."""
    root = tmp_path_factory.mktemp("ar")
    records, start = [], 0
    for name, group, n in FILES:
        chunk = [_example(i) for i in range(start, start + n)]
        _write(root / name, group, chunk)
        records += chunk
        start += n
    (root / "notes.txt").write_text("not a shard")  # ignored: not named as ArrayRecord
    return root, records


def _expected(records: list[bytes]) -> list[dict[str, Any]]:
    parsed = tf.io.parse_example(tf.constant(records), SPEC)
    out = []
    for i in range(len(records)):
        out.append(
            {
                "id": parsed["id"][i].numpy().tolist(),
                "vec": parsed["vec"][i].numpy().tolist(),
                "name": parsed["name"][i].numpy(),
                "img": {"bytes": parsed["img/bytes"][i].numpy()},
                "tokens": parsed["tokens"][i].numpy().tolist(),
                "maybe": parsed["maybe"][i].numpy().tolist(),
            }
        )
    return out


def _as_lists(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _as_lists(v) for k, v in x.items()}
    a = np.asarray(x)
    return a.item() if a.dtype == object and a.ndim == 0 else a.tolist()


def test_directory_matches_parse_example(files: tuple[Path, list[bytes]], tmp_path: Path) -> None:
    root, records = files
    assert detect_format(str(root)) == "array_record"
    header = superserial.convert(str(root), str(tmp_path / "out"), progress=False)
    assert header.element_count == len(records) == 86
    assert [s.records for s in header.shards] == [n for _, _, n in FILES]
    assert header.metadata["source"] == {"format": "array_record", "files": 3}
    leaves = {leaf.name: (leaf.kind, leaf.dtype, leaf.shape) for leaf in header.leaves}
    assert leaves == {
        "id": ("dense", "int64", ()),
        "vec": ("dense", "float32", (3,)),
        "name": ("dense", "string", ()),
        "img/bytes": ("dense", "string", ()),
        "tokens": ("ragged", "int64", (None,)),
        "maybe": ("ragged", "float32", (None,)),
    }
    ds = snp.load(str(tmp_path / "out"))
    for i, want in enumerate(_expected(records)):
        assert _as_lists(ds[i]) == want, f"element {i}"


def test_globs_lists_and_tfds_names(files: tuple[Path, list[bytes]], tmp_path: Path) -> None:
    root, records = files
    names = [str(root / n) for n, _, _ in FILES]
    assert array_record_files(str(root / "a-*.array_record")) == names
    glob = str(root / "a-[02].array_record")
    result = CliRunner().invoke(cli, ["convert", glob, "-o", str(tmp_path / "cli"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["element_count"] == 5 + 70
    assert array_record_files([names[2], names[0]]) == [names[2], names[0]]
    # TFDS names its ArrayRecord shards "<name>-<split>.array_record-00000-of-00002".
    tfds_dir = tmp_path / "tfds_like"
    tfds_dir.mkdir()
    for k in range(2):
        _write(
            tfds_dir / f"tiny-train.array_record-{k:05d}-of-00002", 2, records[k * 4 : k * 4 + 4]
        )
    assert detect_format(str(tfds_dir)) == "array_record"
    assert detect_format(str(tfds_dir / "*.array_record-*")) == "array_record"
    header = superserial.convert([str(tfds_dir)], str(tmp_path / "out"), progress=False)
    assert header.element_count == 8
    ds = snp.load(str(tmp_path / "out"))
    assert [ds[i]["id"].item() for i in range(8)] == [i * 1_000_003 - 7 for i in range(8)]
    for marker in ("features.json", "dataset_info.json"):  # now a TFDS directory: TFDS's
        (tfds_dir / marker).write_text("{}")
    assert detect_format(str(tfds_dir)) == "tfds"


def test_non_example_record_names_file_and_index(
    files: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    _, records = files
    bad = tmp_path / "in" / "b.array_record"
    bad.parent.mkdir()
    _write(bad, 2, [*records[:5], b"this is no Example", *records[5:9]])
    out = tmp_path / "out"
    with pytest.raises(CorruptDataError, match=rf"{bad} record 5\b"):
        superserial.convert(str(bad.parent), str(out), progress=False)
    assert not out.exists()
    assert not [n for n in os.listdir(tmp_path) if n not in ("in",)]  # no work directory left


def test_bad_inputs(tmp_path: Path) -> None:
    garbage = tmp_path / "g.array_record"
    garbage.write_bytes(b"\x00garbage" * 100)
    out = str(tmp_path / "out")
    with pytest.raises(CorruptDataError, match=rf"array-record cannot open at {garbage}"):
        superserial.convert(str(garbage), out)
    with pytest.raises(DatasetNotFoundError, match="matching"):
        superserial.convert(str(tmp_path / "none-*.array_record"), out)
    with pytest.raises(UnsupportedError, match="local"):
        superserial.convert("s3://bucket/x.array_record", out, source_format="array_record")
    with pytest.raises(ValueError, match="one shard"):
        superserial.convert(str(garbage), out, num_shards=2)
    assert not (tmp_path / "out").exists()
    with pytest.raises(UnsupportedError, match="known format"):
        detect_format(str(tmp_path / "elsewhere"))


def test_conversion_imports_no_tensorflow(files: tuple[Path, list[bytes]], tmp_path: Path) -> None:
    root, _ = files
    code = (
        "import superserial\n"
        "h = superserial.convert(sys.argv[1], sys.argv[2], progress=False)\n"
        "assert h.element_count == 86, h.element_count\n"
    )
    proc = run_without(["tensorflow"], code, str(root), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr


def test_without_array_record_the_extra_is_named(tmp_path: Path) -> None:
    code = (
        "import superserial\n"
        "try:\n"
        "    superserial.convert(sys.argv[1], sys.argv[2])\n"
        "except superserial.MissingDependencyError as e:\n"
        "    print(e)\n"
    )
    source = str(tmp_path / "x.array_record")
    proc = run_without(["array_record"], code, source, str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'superserial[array-record]'" in proc.stdout

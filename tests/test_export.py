"""The way out to other tools: ``superserial export`` (Parquet, WebDataset) and
``superserial index --export tfindex``, each read back by the other tool's own reader.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import webdataset as wds
from click.testing import CliRunner

import superserial
import superserial.numpy as ssnp
from conftest import run_without
from superserial.cli.main import cli
from superserial.errors import DatasetExistsError, HeaderError, UnsupportedError
from superserial.foreign.export import export

N = 10


def run(*args: Any, code: int = 0) -> Any:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def _elements() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (N, 4, 4, 3), dtype=np.uint8)
    columns = {
        "image": image,
        "label": np.arange(N, dtype=np.int64) % 3,
        "text": np.array([f"ü{i}".encode() for i in range(N)], dtype=object),
        "meta": {"score": rng.standard_normal(N).astype(np.float32)},
    }
    fixed = tf.data.Dataset.from_tensor_slices(columns)
    lengths = [i % 4 for i in range(N)]
    tokens = tf.RaggedTensor.from_row_lengths(tf.range(sum(lengths), dtype=tf.int32), lengths)
    varying = tf.data.Dataset.from_tensor_slices(tokens)  # ragged_rank 0 per element
    vec = varying.map(lambda t: tf.cast(tf.reshape(t, [-1, 1]), tf.float64))  # [None, 1]
    return tf.data.Dataset.zip((fixed, varying, vec)).map(
        lambda f, t, v: {**f, "tokens": t, "vec": v}
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> str:
    p = str(tmp_path_factory.mktemp("export") / "ds")
    superserial.save(_elements(), p, num_shards=2)
    return p


# ------------------------------------------------------------------ Parquet


def test_parquet_holds_the_arrow_table_a_row_group_per_batch(saved: str, tmp_path: Any) -> None:
    out = tmp_path / "out.parquet"
    run("export", saved, "-o", out, "--batch-size", 4, "-q")
    table = pq.read_table(out)
    assert table.equals(ssnp.load(saved).to_arrow())
    assert pq.ParquetFile(out).metadata.num_row_groups == 3
    assert table.schema.field("image").type == pa.list_(pa.list_(pa.list_(pa.uint8(), 3), 4), 4)
    assert table.column("tokens").to_pylist()[3] == [3, 4, 5]
    assert os.listdir(tmp_path) == ["out.parquet"]  # no temporary file left beside it


def test_parquet_keeps_the_schema_a_conversion_kept(tmp_path: Any) -> None:
    # What superserial.convert keeps of a Parquet source: the file comes back equal.
    source = pa.table(
        {
            "name": pa.array(["a", "bé"], pa.string()),
            "ids": pa.array([[1, 2], []], pa.large_list(pa.int64())),
        }
    )
    p = str(tmp_path / "ds")
    element = {"name": [b"a", "bé".encode()], "ids": tf.ragged.constant([[1, 2], []], tf.int64)}
    superserial.save(tf.data.Dataset.from_tensor_slices(element), p)
    header = os.path.join(p, "header.json")
    with open(header) as f:
        obj = json.load(f)
    obj["metadata"] = {"arrow_schema": base64.b64encode(source.schema.serialize()).decode()}
    with open(header, "w") as f:
        json.dump(obj, f)
    export(p, tmp_path / "back.parquet")
    back = pq.read_table(tmp_path / "back.parquet")
    assert back.select(source.column_names).equals(source)


def test_an_export_over_something_is_refused_unless_overwrite(saved: str, tmp_path: Any) -> None:
    out = tmp_path / "out.parquet"
    out.write_bytes(b"mine")
    with pytest.raises(DatasetExistsError, match="overwrite"):
        export(saved, out)
    assert out.read_bytes() == b"mine"
    export(saved, out, overwrite=True, select=["label"])
    assert pq.read_table(out).column_names == ["label"]


@pytest.mark.parametrize("to", ["parquet", "webdataset"])
def test_a_failed_export_leaves_nothing(saved: str, tmp_path: Any, to: str) -> None:
    out = tmp_path / "out"
    seen = []

    def fail(elements: int, nbytes: int) -> None:
        # Until the end, nothing is at the output (a killed export leaves none there).
        seen.append(out.exists())
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(saved, out, to=to, select=["label"], batch_size=2, progress=fail)
    assert seen == [False, False]
    assert os.listdir(tmp_path) == []


def test_a_bad_kept_schema_writes_nothing(saved: str, tmp_path: Any) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(saved, copy)
    header = copy / "header.json"
    obj = json.loads(header.read_text())
    obj["metadata"] = {"arrow_schema": "garbage"}
    header.write_text(json.dumps(obj))
    with pytest.raises(HeaderError, match=r"metadata\.arrow_schema"):
        export(copy, tmp_path / "out.parquet")
    assert sorted(os.listdir(tmp_path)) == ["ds"]


# ------------------------------------------------------------------ WebDataset

WDS_LEAVES = ["image", "label", "text", "meta", "tokens", "vec"]


def test_webdataset_shards_read_by_webdataset(saved: str, tmp_path: Any) -> None:
    out = tmp_path / "wds"
    done = run("export", saved, "-o", out, "--to", "webdataset", "--shard-size", 2000, "--json")
    files = json.loads(done.output)["files"]
    assert len(files) > 1 and sorted(os.listdir(out)) == [os.path.basename(f) for f in files]
    pattern = str(out / f"data-{{00000..{len(files) - 1:05d}}}.tar")
    samples = list(wds.WebDataset(pattern, shardshuffle=False).decode())
    assert len(samples) == N
    for i, (sample, element) in enumerate(zip(samples, ssnp.load(saved), strict=True)):
        assert sample["__key__"] == f"{i:09d}"
        assert sample["label.cls"] == int(element["label"])
        assert sample["text.bin"] == element["text"].item()
        for name, want in [
            ("image.npy", element["image"]),
            ("meta.score.npy", element["meta"]["score"]),
            ("tokens.npy", element["tokens"]),
            ("vec.npy", element["vec"]),
        ]:
            assert sample[name].dtype == want.dtype and np.array_equal(sample[name], want)


def test_webdataset_refuses_leaves_it_cannot_hold_before_writing(tmp_path: Any) -> None:
    p = str(tmp_path / "ds")
    rag = tf.ragged.constant([[[1], [2, 3]], [[4]]], tf.int64)
    superserial.save(tf.data.Dataset.from_tensor_slices({"x": [1, 2], "rows": rag}), p)
    with pytest.raises(UnsupportedError, match="ragged leaf: 'rows'"):
        export(p, tmp_path / "wds", to="webdataset")
    assert sorted(os.listdir(tmp_path)) == ["ds"]


# ------------------------------------------------------------------ tfindex

# vahidk/tfrecord registers its own copy of TensorFlow's Example protos, which clashes
# with TensorFlow's in one process: it reads in a child without TensorFlow.
_READ = """
import json, sys
from tfrecord.reader import tfrecord_loader
from tfrecord.tools.tfrecord2idx import create_index
from tfrecord.torch.dataset import TFRecordDataset
description = {"image": "byte", "label": "int", "meta/score": "float"}
out = {}
for data, index, theirs in zip(*[iter(sys.argv[1:])] * 3):
    create_index(data, theirs)
    # The index's reads split into ranges (as its DataLoader workers do).
    split = [r for k in range(3) for r in tfrecord_loader(data, index, description, shard=(k, 3))]
    # The torch dataset starts at a random record of the index, then wraps around.
    labels = [int(r["label"][0]) for r in TFRecordDataset(data, index, description)]
    out[data] = {
        "theirs": open(theirs).read(),
        "split": [[r["image"].hex(), r["label"].tolist(), r["meta/score"].tolist()] for r in split],
        "labels": labels,
    }
print(json.dumps(out))
"""


def _tfrecord_reads(dataset: str, index_dir: str, tmp_path: Any) -> None:
    """vahidk/tfrecord reads every shard through our index, element for element."""
    header = superserial.read_header(dataset)
    args = []
    for shard in header.shards:
        stem = shard.file.removesuffix(".tfrecord")
        data = os.path.join(dataset, shard.file)
        args += [data, os.path.join(index_dir, stem + ".tfindex"), str(tmp_path / f"{stem}.idx")]
    child = run_without(["tensorflow"], _READ, *args)
    assert child.returncode == 0, child.stderr
    got = json.loads(child.stdout)
    elements = list(ssnp.load(dataset))
    begin = 0
    for shard, data in zip(header.shards, args[::3], strict=True):
        mine = elements[begin : begin + shard.records]
        begin += shard.records
        ours = os.path.join(index_dir, shard.file.removesuffix(".tfrecord") + ".tfindex")
        with open(ours) as f:
            assert f.read() == got[data]["theirs"]  # what tfrecord2idx writes, byte for byte
        want = [
            [e["image"].tobytes().hex(), [int(e["label"])], [float(e["meta"]["score"])]]
            for e in mine
        ]
        assert got[data]["split"] == want
        assert sorted(got[data]["labels"]) == sorted(int(e["label"]) for e in mine)


def test_tfindex_next_to_the_shards_is_what_tfrecord2idx_writes(saved: str, tmp_path: Any) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(saved, copy)
    run("index", copy, "--export", "tfindex", "-q")
    _tfrecord_reads(str(copy), str(copy), tmp_path)
    run("verify", copy, "-q")  # the extra files do not trouble the dataset


def test_tfindex_without_record_indexes_scans_into_another_dir(saved: str, tmp_path: Any) -> None:
    from test_index import strip_indexes

    copy = tmp_path / "ds"
    shutil.copytree(saved, copy)
    strip_indexes(str(copy))
    out = tmp_path / "idx"
    done = json.loads(run("index", copy, "--export", "tfindex", "-o", out, "--json").output)
    assert sorted(os.listdir(out)) == sorted(os.path.basename(f) for f in done["files"])
    _tfrecord_reads(str(copy), str(out), tmp_path)


def test_tfindex_of_compressed_shards_is_an_error(tmp_path: Any) -> None:
    p = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.range(4), p, compression="GZIP")
    result = run("index", p, "--export", "tfindex", code=1)
    assert "uncompressed" in result.output + str(result.stderr)
    assert not [n for n in os.listdir(p) if n.endswith(".tfindex")]

"""``superserial.append`` and ``superserial append``: elements added after a saved dataset.

The result must be, record for record, what a save of the concatenation
writes; the old files must never change (bytes, mtimes); a mismatch, an
error or a SIGKILL at any instant must leave the old dataset exactly, or the
complete new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import superserial
import superserial.numpy as snp
from superserial.cli.main import cli
from superserial.errors import (
    DatasetLockedError,
    ResumeError,
    SpecMismatchError,
    UnsupportedError,
)
from superserial.format.layout import PARTIAL_SUFFIX, PROGRESS_FILE
from superserial.write.local_commit import SaveLock


def _elements(a: int, b: int) -> tf.data.Dataset:
    """Elements a..b-1 of one dataset: fixed, string, ragged and unknown-shape leaves."""
    return tf.data.Dataset.range(a, b).map(
        lambda i: {
            "id": i,
            "vec": tf.fill([3], tf.cast(i, tf.float32)),
            "name": tf.strings.as_string(i * 7),
            "rag": tf.RaggedTensor.from_tensor(tf.reshape(tf.range(i % 5), [1, -1])),
            "var": tf.range(i % 4, dtype=tf.int32),
        }
    )


def _records(path: str) -> list[bytes]:
    """Every record of the dataset at ``path``, in order, through its indexes."""
    ds = snp.load(path)
    records, _ = ds.records.read_many(np.arange(len(ds), dtype=np.int64))
    return [bytes(r) for r in records]


def _ids(path: str, **kwargs: Any) -> list[int]:
    return [int(e["id"]) for e in superserial.load(path, **kwargs)]


def _state(path: str) -> dict[str, Any]:
    """Every file under ``path`` (bytes digest, mtime, inode), and what lies beside it."""
    files = {}
    for root, _, names in os.walk(path):
        for name in names:
            p = os.path.join(root, name)
            st = os.stat(p)
            digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            files[os.path.relpath(p, path)] = (digest, st.st_mtime_ns, st.st_ino)
    return {"files": files, "siblings": sorted(os.listdir(os.path.dirname(path)))}


def _kept(before: dict[str, Any], path: str) -> None:
    """Every file of ``before`` is still in ``path``, the same inode, bytes and mtime."""
    after = _state(path)["files"]
    for name, info in before["files"].items():
        if name != "header.json":
            assert after.get(name) == info, name


def test_save_append_append_is_the_saved_concatenation(tmp_path):
    path, whole = str(tmp_path / "ds"), str(tmp_path / "whole")
    superserial.save(_elements(0, 30), path, num_shards=2)
    before = _state(path)
    superserial.append(_elements(30, 50), path, num_shards=3)
    header = superserial.append(_elements(50, 75), path, shard_size=300)
    superserial.save(_elements(0, 75), whole, num_shards=1)

    assert header == superserial.read_header(path)
    assert header.element_count == 75
    assert [s.records for s in header.shards[:5]] == [15, 15, 7, 7, 6]
    assert len(header.shards) > 6  # shard_size=300 split the last append
    assert len({s.file for s in header.shards}) == len(header.shards)
    _kept(before, path)
    assert sorted(os.listdir(tmp_path)) == ["ds", "whole"]  # no leftovers, no lock

    got, want = list(superserial.load(path)), list(superserial.load(whole))
    assert len(got) == 75
    for g, w in zip(got, want, strict=True):
        tf.nest.map_structure(
            lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
            {k: v.to_list() if isinstance(v, tf.RaggedTensor) else v for k, v in g.items()},
            {k: v.to_list() if isinstance(v, tf.RaggedTensor) else v for k, v in w.items()},
        )
    np_ids = [int(e["id"]) for e in snp.load(path)]
    assert np_ids == list(range(75))
    assert all(s.index is not None for s in header.shards)
    assert _records(path) == _records(whole)  # bit for bit what save writes
    ds = snp.load(path)
    for i in (0, 14, 15, 29, 30, 49, 50, 74, -1):
        assert int(ds[i]["id"]) == i % 75
        assert ds[i]["name"] == str((i % 75) * 7).encode()
    shuffled = _ids(path, shuffle=True, seed=3)
    assert sorted(shuffled) == list(range(75)) and shuffled != list(range(75))


def test_unknown_saved_dimension_accepts_any_size_and_is_never_widened(tmp_path):
    path, whole = str(tmp_path / "ds"), str(tmp_path / "whole")
    var = tf.data.Dataset.range(10).map(lambda i: tf.range(i % 4))  # shape [None]
    fixed = tf.data.Dataset.range(10, 20).map(lambda i: tf.fill([3], i))  # shape [3]
    superserial.save(var, path)
    superserial.append(fixed, path)
    assert superserial.read_header(path).leaves[0].shape == (None,)
    superserial.save(var.concatenate(fixed), whole)  # the concatenation's spec is [None]
    assert _records(path) == _records(whole)

    # The other way round: a size known when saved cannot take an unknown one.
    known = str(tmp_path / "known")
    superserial.save(fixed, known)
    before = _state(known)
    with pytest.raises(SpecMismatchError, match=r"dimension 0 is unknown.*tf\.ensure_shape") as e:
        superserial.append(var, known)
    assert e.value.leaf == "value"
    assert _state(known) == before


_SPEC = {
    "id": tf.TensorSpec([], tf.int64),
    "vec": tf.TensorSpec([3], tf.float32),
    "rag": tf.RaggedTensorSpec([None, None, 2], tf.int32, 1, tf.int64),
    "var": tf.TensorSpec([None, 2], tf.int32),
}

_BAD = {
    "dtype": ({"id": tf.TensorSpec([], tf.int32)}, "expected dtype int64 at leaf id, got int32"),
    "shape": (
        {"vec": tf.TensorSpec([4], tf.float32)},
        r"expected shape \[3\] at leaf vec, got \[4\]",
    ),
    "rank": (
        {"vec": tf.TensorSpec([1, 3], tf.float32)},
        r"\(rank 1\) at leaf vec, got .* \(rank 2\)",
    ),
    "kind": (
        {"var": tf.RaggedTensorSpec([None, 2], tf.int32, 0)},
        "expected a dense tensor at leaf var, got a ragged tensor",
    ),
    "ragged_rank": (
        {"rag": tf.RaggedTensorSpec([None, None, 2], tf.int32, 2)},
        "expected ragged_rank 1 at leaf rag, got 2",
    ),
    "row_splits": (
        {"rag": tf.RaggedTensorSpec([None, None, 2], tf.int32, 1, tf.int32)},
        "expected row_splits_dtype int64 at leaf rag, got int32",
    ),
    "inner dim": ({"var": tf.TensorSpec([None, 3], tf.int32)}, "at leaf var.*dimension 1"),
    "missing key": ({"vec": None}, "'vec' is missing"),
    "new key": ({"new": tf.TensorSpec([], tf.int64)}, "'new' is new"),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_spec_difference_names_the_first_difference(case):
    from superserial.codec.tf_spec import from_element_spec
    from superserial.tf.append import spec_difference

    change, message = _BAD[case]
    given = {k: v for k, v in {**_SPEC, **change}.items() if v is not None}
    diff = spec_difference(from_element_spec(_SPEC), from_element_spec(given))
    assert diff is not None and re.search(message, diff), diff
    assert spec_difference(from_element_spec(_SPEC), from_element_spec(_SPEC)) is None
    # Known where the saved spec has None: accepted (the saved spec stays).
    narrower = {**_SPEC, "var": tf.TensorSpec([5, 2], tf.int32)}
    assert spec_difference(from_element_spec(_SPEC), from_element_spec(narrower)) is None


def test_first_difference_gives_the_leaf_name_apart():
    from superserial.codec.tf_spec import from_element_spec
    from superserial.tf.append import first_difference

    saved = {"a": {"odd key, with: spaces/": tf.TensorSpec([2], tf.uint8)}}
    given = {"a": {"odd key, with: spaces/": tf.TensorSpec([2], tf.int8)}}
    diff = first_difference(from_element_spec(saved), from_element_spec(given))
    assert diff is not None and diff[0] == "a/odd key, with: spaces~1"
    diff = first_difference(
        from_element_spec(saved), from_element_spec({"a": given["a"], "b": saved["a"]})
    )
    assert diff == (
        None,
        "expected keys ['a'] in the dict at the top of the element, got ['a', 'b']: 'b' is new",
    )


@pytest.mark.parametrize(
    "given",
    [
        lambda e: {**e, "id": tf.cast(e["id"], tf.int32)},
        lambda e: (e["id"], e["name"]),
    ],
    ids=["dtype", "tuple"],
)
def test_a_spec_mismatch_is_refused_and_changes_nothing(tmp_path, given):
    path = str(tmp_path / "ds")
    superserial.save(_elements(0, 5), path)
    before = _state(path)
    with pytest.raises(SpecMismatchError, match="nothing was changed") as e:
        superserial.append(_elements(5, 8).map(given), path)
    if isinstance(e.value.leaf, str):
        assert e.value.leaf == "id" and "expected dtype int64 at leaf id" in str(e.value)
    else:
        assert "expected a dict at the top of the element, got a tuple of 2" in str(e.value)
    assert _state(path) == before


def test_compression_must_be_the_datasets_own(tmp_path):
    path = str(tmp_path / "ds")
    superserial.save(_elements(0, 5), path, compression="ZLIB")
    before = _state(path)
    for wrong in (None, "GZIP"):
        with pytest.raises(SpecMismatchError, match=f"expected compression ZLIB.*got {wrong}"):
            superserial.append(_elements(5, 8), path, compression=wrong)
    assert _state(path) == before
    header = superserial.append(_elements(5, 8), path, compression="zlib")  # the same: accepted
    assert header.compression == "ZLIB" and all(s.index is not None for s in header.shards)
    assert _ids(path) == list(range(8))
    assert [int(e["id"]) for e in snp.load(path)] == list(range(8))


def _fail_at_2100(i: Any) -> Any:
    # Records are encoded 1024 at a time: batches 0 and 1 reach the shards first.
    with tf.control_dependencies([tf.debugging.assert_less(i, np.int64(2100))]):
        return tf.identity(i)


def test_an_error_in_the_pipeline_changes_nothing(tmp_path):
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.range(5), path)
    before = _state(path)
    with pytest.raises(tf.errors.InvalidArgumentError):
        superserial.append(tf.data.Dataset.range(5, 3005).map(_fail_at_2100), path, num_shards=6)
    after = _state(path)
    assert after["files"] == before["files"]
    # No lock file; the work directory keeps the complete new shards for resume=True.
    partial = f".ds{PARTIAL_SUFFIX}"
    assert after["siblings"] == sorted([*before["siblings"], partial])
    assert json.loads((tmp_path / partial / PROGRESS_FILE).read_text())["shards"]
    superserial.cleanup(path)
    assert _state(path) == before
    # Nothing happens for an empty dataset either.
    assert superserial.append(tf.data.Dataset.range(0), path) == superserial.read_header(path)
    assert _state(path) == before


def test_append_takes_the_save_lock(tmp_path):
    path = str(tmp_path / "ds")
    superserial.save(_elements(0, 5), path)
    with SaveLock(path), pytest.raises(DatasetLockedError):
        superserial.append(_elements(5, 8), path)
    assert _ids(path) == list(range(5))


def test_resume_continues_after_the_last_complete_shard(tmp_path):
    path = str(tmp_path / "ds")
    partial = tmp_path / f".ds{PARTIAL_SUFFIX}"
    superserial.save(tf.data.Dataset.range(5), path)
    before = _state(path)

    new = tf.data.Dataset.range(5, 3005)
    with pytest.raises(tf.errors.InvalidArgumentError):
        superserial.append(new.map(_fail_at_2100), path, num_shards=6, resume=True)
    assert _state(path)["files"] == before["files"]
    done = json.loads((partial / PROGRESS_FILE).read_text())["shards"]
    assert len(done) == 4  # 4 x 500 of the 2048 elements before the failing batch
    inodes = {os.stat(partial / s["file"]).st_ino for s in done}
    with pytest.raises(ResumeError, match="num_shards"):
        superserial.append(new, path, num_shards=5, resume=True)
    header = superserial.append(new, path, num_shards=6, resume=True)
    assert header.element_count == 3005
    assert [int(x) for x in superserial.load(path)] == list(range(3005))
    assert inodes <= {os.stat(os.path.join(path, s.file)).st_ino for s in header.shards}
    _kept(before, path)
    assert not partial.exists()


def test_append_to_a_dataset_without_indexes(tmp_path):
    from test_index import strip_indexes

    path = str(tmp_path / "ds")
    superserial.save(_elements(0, 20), path, num_shards=2)
    strip_indexes(path)
    header = superserial.append(_elements(20, 30), path)
    assert [s.index is not None for s in header.shards] == [False, False, True]
    assert _ids(path) == list(range(30))  # sequential reading needs no index
    assert [int(e["id"]) for e in snp.load(path)] == list(range(30))
    with pytest.raises(UnsupportedError, match="superserial index"):
        snp.load(path)[3]
    superserial.build_index(path)
    ds = snp.load(path)
    assert [int(ds[i]["id"]) for i in (3, 19, 20, 29)] == [3, 19, 20, 29]


def test_a_super_serial_2_pair_is_refused_with_the_way_out(tmp_path):
    golden = Path(__file__).parent / "golden"
    for name in ("v2.tfrecord", "v2.header"):
        shutil.copy(golden / name, tmp_path / name)
    for given in ("v2.tfrecord", "v2.header"):
        with pytest.raises(UnsupportedError, match=r"super_serial 2\.0 pair.*superserial upgrade"):
            superserial.append(tf.data.Dataset.range(3), str(tmp_path / given))
    assert sorted(os.listdir(tmp_path)) == ["v2.header", "v2.tfrecord"]


def _cli(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(cli, ["-q", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def test_cli_append_one_dataset_to_another(tmp_path):
    dest, src = str(tmp_path / "dest"), str(tmp_path / "src")
    superserial.save(_elements(0, 10), dest)
    superserial.save(_elements(10, 25), src, compression="GZIP")  # re-encoded in dest's
    before = _state(src)
    out = _cli("append", src, dest, "--num-shards", "2").output
    assert f"appended 15 element(s) from {src} to {dest}: 25 elements, 3 shard(s)" in out
    assert _ids(dest) == list(range(25))
    assert _state(src)["files"] == before["files"]
    obj = json.loads(_cli("append", src, dest, "--json").output)
    assert obj["appended"] == 15 and obj["element_count"] == 40 and obj["compression"] is None
    assert _ids(dest) == list(range(25)) + list(range(10, 25))

    other = str(tmp_path / "other")
    superserial.save(tf.data.Dataset.range(3), other)
    state = _state(dest)
    err = _cli("append", other, dest, code=1).output
    assert "SpecMismatchError" in err or "expected a dict" in err
    assert _state(dest)["files"] == state["files"]
    _cli("append", dest, dest + "/", code=2)
    _cli("append", src, dest, "--num-shards", "2", "--shard-size", "1M", code=2)
    assert "append" in _cli("--help").output


# ------------------------------------------------------------------ SIGKILL

N, SHARDS = 20_000, 40

CHILD = """
import os, signal, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf, superserial
from superserial.storage import fs
point = sys.argv[2]
if point != "shards":
    real_link, real_exchange = fs.link_tree, fs.exchange_or_rename
    def link_tree(src, dst, **kw):
        real_link(src, dst, **kw)
        if point == "linked":
            os.kill(os.getpid(), signal.SIGKILL)
    def exchange(new, path, **kw):
        old = real_exchange(new, path, **kw)
        if point == "exchanged":
            os.kill(os.getpid(), signal.SIGKILL)
        return old
    fs.link_tree, fs.exchange_or_rename = link_tree, exchange
start, n = int(sys.argv[3]), int(sys.argv[4])
ds = tf.data.Dataset.range(start, start + n).map(lambda i: (i, tf.strings.as_string(i * 7)))
superserial.append(ds, sys.argv[1], num_shards=__SHARDS__)
print("APPENDED", flush=True)
"""


def _shards_done(partial: str) -> int:
    try:
        with open(os.path.join(partial, PROGRESS_FILE)) as f:
            return len(json.load(f)["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def _pairs(path: str) -> list[int]:
    return [int(a) for a, _ in superserial.load(path, batch_size=8192).unbatch()]


@pytest.mark.timeout(150)
def test_sigkill_at_any_point_leaves_the_old_dataset_or_the_new_one(tmp_path):
    rng = random.Random(13)
    path = str(tmp_path / "ds")
    partial = str(tmp_path / f".ds{PARTIAL_SUFFIX}")
    superserial.save(
        tf.data.Dataset.range(10).map(lambda i: (i, tf.strings.as_string(i * 7))), path
    )
    code = CHILD.replace("__SHARDS__", str(SHARDS))
    count, outcomes = 10, []
    for point in ("shards", "linked", "exchanged"):
        before = _state(path)
        # Kills at the commit need no more than a few elements to commit.
        n = N if point == "shards" else SHARDS
        proc = subprocess.Popen(
            [sys.executable, "-c", code, path, point, str(count), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if point == "shards":
            k, delay = rng.randint(0, SHARDS - 10), rng.uniform(0, 0.1)
            end = time.monotonic() + 90
            while _shards_done(partial) < k and proc.poll() is None:
                assert time.monotonic() < end, "timed out waiting for shards"
                time.sleep(0.005)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=100)
        finished = b"APPENDED" in out  # a kill that came too late: allowed, it is "new"
        assert finished or proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        after = _state(path)
        ids = _pairs(path)
        if after["files"] == before["files"]:
            outcomes.append((point, "old"))
            assert ids == list(range(count))
        else:
            outcomes.append((point, "new" if not finished else "finished"))
            _kept(before, path)
            assert ids == list(range(count + n))
            count += n
    # Killed at the commit: after linking the old files, still the old dataset;
    # after the exchange, the new one (and the old directory left aside).
    assert outcomes[1:] == [("linked", "old"), ("exchanged", "new")], outcomes
    # What a kill leaves is the work directory (and the lock file); cleanup removes it.
    removed = superserial.cleanup(path)
    assert partial in removed
    assert sorted(os.listdir(tmp_path)) == ["ds"]
    assert _pairs(path) == list(range(count))
    print(f"CENSUS append sigkill: {outcomes}")


def test_append_where_directories_cannot_be_renamed():
    """Not local (here TensorFlow's ram://): the header is the commit point."""
    path = f"ram://append-{os.getpid()}-{time.monotonic_ns()}/ds"
    superserial.save(tf.data.Dataset.range(10), path, num_shards=2)
    old = superserial.read_header(path)
    header = superserial.append(tf.data.Dataset.range(10, 25), path, num_shards=2)
    assert header.shards[:2] == old.shards and header.element_count == 25
    assert [int(x) for x in superserial.load(path)] == list(range(25))
    ds = snp.load(path)
    assert [int(ds[i]) for i in (0, 9, 10, 24)] == [0, 9, 10, 24]
    parent = path.rsplit("/", 1)[0]
    assert tf.io.gfile.listdir(parent) == ["ds"]  # no work directory left

"""Hostile input: crafted headers, escaping file names, links, unsafe YAML, lying records.

Every case goes through ``read_header`` and ``load`` on a real dataset
directory and must end in a clear ``HeaderError`` / ``CorruptDataError`` (or,
for records, a TensorFlow error naming the leaf), before any large allocation.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import superserial
from superserial.errors import CorruptDataError, FormatVersionError, HeaderError
from superserial.format.header import Header


def _source() -> tf.data.Dataset:
    return tf.data.Dataset.range(4).map(
        lambda i: {
            "pixels": tf.cast(tf.fill([2, 3], i), tf.uint8),
            "label": tf.cast(i, tf.int32),
            "title": tf.strings.as_string(i),
        }
    )


@pytest.fixture(scope="module")
def good(tmp_path_factory: Any) -> tuple[str, dict[str, Any]]:
    path = str(tmp_path_factory.mktemp("hostile") / "ds")
    superserial.save(_source(), path)
    with open(os.path.join(path, "header.json")) as f:
        return path, json.load(f)


@pytest.fixture
def victim(good: tuple[str, dict[str, Any]], tmp_path: Any) -> str:
    """A fresh copy of the good dataset, to damage."""
    import shutil

    dst = str(tmp_path / "victim")
    shutil.copytree(good[0], dst)
    return dst


def _write_header(path: str, text: str | bytes) -> None:
    with open(os.path.join(path, "header.json"), "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def _refused(path: str, match: str, error: type[Exception] = HeaderError) -> Exception:
    with pytest.raises(error, match=match) as info:
        superserial.read_header(path)
    with pytest.raises(error, match=match):
        superserial.load(path)
    assert len(str(info.value)) < 2000, "error message too long"
    return info.value


def _leaf(h: dict[str, Any], name: str) -> dict[str, Any]:
    return h["structure"]["items"][name]


def _set(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def mutate(h: dict[str, Any]) -> dict[str, Any]:
        h = copy.deepcopy(h)
        fn(h)
        return h

    return mutate


MUTATIONS = {
    "absurd_shape": (
        _set(lambda h: _leaf(h, "pixels").update(shape=[2**40, 2**40])),
        "values per element",
    ),
    "huge_rank": (_set(lambda h: _leaf(h, "pixels").update(shape=[1] * 1000)), "rank"),
    "negative_dim": (_set(lambda h: _leaf(h, "pixels").update(shape=[-1, 3])), "dimensions >= 0"),
    "bool_dim": (_set(lambda h: _leaf(h, "pixels").update(shape=[True, 3])), "dimensions >= 0"),
    "float_dim": (_set(lambda h: _leaf(h, "pixels").update(shape=[2.0, 3])), "dimensions >= 0"),
    "negative_records": (_set(lambda h: h["shards"][0].update(records=-1)), "non-negative"),
    "negative_bytes": (_set(lambda h: h["shards"][0].update(bytes=-5)), "non-negative"),
    "negative_count": (_set(lambda h: h.update(element_count=-4)), "element_count >= 0"),
    "count_mismatch": (_set(lambda h: h.update(element_count=2**62)), "adding up"),
    "unknown_dtype": (
        _set(lambda h: _leaf(h, "label").update(dtype="float128")),
        "supported dtype",
    ),
    "unknown_kind": (_set(lambda h: _leaf(h, "label").update(kind="quantum")), "kind"),
    "unknown_type": (_set(lambda h: h["structure"].update(type="pickle")), "type"),
    "unknown_field": (_set(lambda h: h.update(exec="import os")), "unexpected field"),
    "metadata_not_object": (_set(lambda h: h.update(metadata=["a"])), "metadata"),
    "unknown_compression": (_set(lambda h: h.update(compression="LZMA")), "compression|GZIP"),
    "wrong_encoding": (_set(lambda h: _leaf(h, "label").update(encoding="float")), "encoding"),
    "wrong_features": (
        _set(lambda h: _leaf(h, "label").update(features={"values": "pixels"})),
        "features",
    ),
    "wrong_leaf_name": (_set(lambda h: _leaf(h, "label").update(name="pixels")), "leaf name"),
    "bad_crc": (_set(lambda h: h["shards"][0].update(crc32c="ZZZZZZZZ")), "crc32c"),
    "no_structure": (_set(lambda h: h.pop("structure")), "object|structure"),
    "empty_structure": (
        _set(lambda h: h.update(structure={"type": "tuple", "items": []})),
        "at least one",
    ),
    "shards_not_list": (_set(lambda h: h.update(shards={"a": 1})), "list"),
    "duplicate_shard": (
        _set(lambda h: h["shards"].append(dict(h["shards"][0]))),
        "distinct|adding up",
    ),
    "version_2": (_set(lambda h: h.update(format_version=2)), "format_version"),
    "huge_dtype_string": (
        _set(lambda h: _leaf(h, "label").update(dtype="x" * 20_000_000)),
        "supported dtype",
    ),
    "huge_key": (
        _set(lambda h: h["structure"]["items"].update({"k" * 100_000: _leaf(h, "label")})),
        "dict keys",
    ),
    "index_named_as_its_shard": (
        _set(lambda h: h["shards"][0]["index"].update(file=h["shards"][0]["file"])),
        "other than its shard",
    ),
    "index_unknown_field": (
        _set(lambda h: h["shards"][0]["index"].update(offsets=[0, 16])),
        r"unexpected field.*offsets.* at shards\[0\]\.index",
    ),
    "index_missing_field": (_set(lambda h: h["shards"][0]["index"].pop("crc32c")), "crc32c"),
    "index_not_object": (_set(lambda h: h["shards"][0].update(index="x.index")), "index"),
    "index_negative_bytes": (
        _set(lambda h: h["shards"][0]["index"].update(bytes=-1)),
        "non-negative",
    ),
    "index_bad_crc": (_set(lambda h: h["shards"][0]["index"].update(crc32c="0")), "crc32c"),
    "ragged_rank_out_of_range": (
        _set(
            lambda h: _leaf(h, "pixels").update(
                kind="ragged", ragged_rank=7, row_splits_dtype="int64"
            )
        ),
        "ragged_rank",
    ),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_mutated_header_is_refused(case, good, victim):
    mutate, match = MUTATIONS[case]
    _write_header(victim, json.dumps(mutate(good[1])))
    err = _refused(victim, match, FormatVersionError if case == "version_2" else HeaderError)
    if case.startswith("huge"):
        assert "chars>" in str(err) or len(str(err)) < 500


def _wrap(structure: str) -> str:
    return (
        '{"format_version": 1, "writer": "", "element_count": 0, "compression": null, '
        f'"shards": [], "structure": {structure}}}'
    )


_LEAF = (
    '{"type": "tensor", "name": "%s", "kind": "dense", "dtype": "int64", "shape": [], '
    '"encoding": "int64", "features": {"values": "%s"}}'
)

# Built lazily: some are tens of megabytes.
RAW: dict[str, tuple[Callable[[], str | bytes], str]] = {
    "json_nested_5000_deep": (
        lambda: _wrap('{"type": "dict", "items": {"a": ' * 5000 + "{}" + "}}" * 5000),
        "nested|deep",
    ),
    "arrays_nested_100000_deep": (lambda: _wrap("[" * 100_000 + "]" * 100_000), "arrays|deep"),
    "nodes_100_deep": (
        lambda: _wrap(
            '{"type": "dict", "items": {"a": ' * 100
            + _LEAF % ("a/" * 99 + "a", "a/" * 99 + "a")
            + "}}" * 100
        ),
        "nesting at most",
    ),
    "leaves_10001": (
        lambda: _wrap(
            '{"type": "tuple", "items": [' + ", ".join(_LEAF % (i, i) for i in range(10_001)) + "]}"
        ),
        "at most 10000 leaves",
    ),
    "leaves_1000000": (
        lambda: _wrap(
            '{"type": "tuple", "items": ['
            + ", ".join(_LEAF % (i, i) for i in range(1_000_000))
            + "]}"
        ),
        "at most",
    ),
    "tiny_objects_20000000": (
        lambda: _wrap('{"type": "tuple", "items": [' + "{}," * 20_000_000 + "{}]}"),
        "JSON objects",
    ),
    "huge_int": (
        lambda: _wrap('{"type": "tensor", "shape": [' + "9" * 100_000 + "]}"),
        "JSON|digits|unparsable",
    ),
    "nan": (lambda: _wrap(_LEAF.replace("[]", "[NaN]") % ("value", "value")), "JSON|unparsable"),
    "duplicate_key": (lambda: '{"format_version": 1, "format_version": 1}', "duplicate"),
    "not_utf8": (lambda: b'{"format_version": 1, "writer": "\xff\xfe"}', "JSON|unparsable"),
    "not_an_object": (lambda: "[1, 2, 3]", "object"),
    "empty": (lambda: "", "JSON|unparsable"),
    "yaml_tag": (lambda: "!!python/object/apply:os.system ['true']", "JSON|unparsable"),
}


@pytest.mark.parametrize("case", list(RAW))
def test_raw_header_is_refused(case, victim):
    make, match = RAW[case]
    _write_header(victim, make())
    _refused(victim, match)


@pytest.mark.timeout(120)
def test_parsing_a_huge_hostile_header_stays_small(tmp_path):
    """A 60 MB header of tiny objects is refused before json builds them (peak RSS bound)."""
    code = f"""
import os, resource, sys
from superserial.format.layout import read_header
from superserial.errors import HeaderError
path = {str(tmp_path / "big")!r}
os.makedirs(path)
with open(os.path.join(path, "header.json"), "w") as f:
    f.write('{{"format_version": 1, "structure": [' + "{{}}," * 20_000_000 + '{{}}]}}')
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    read_header(path)
except HeaderError as e:
    print("refused:", str(e)[:100])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("rss_growth_kb", after - before)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "refused:" in out, out
    growth = int(out.split("rss_growth_kb")[1])
    assert growth < 200_000, f"parsing grew RSS by {growth} kB"


# ------------------------------------------------------------ file names and links


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "/etc/passwd",
        "a/b",
        "..",
        ".",
        "",
        ".hidden",
        "a\\b",
        "x" * 300,
        "data\x00.tfrecord",
    ],
)
@pytest.mark.parametrize("field", ["file", "index"])
def test_shard_names_cannot_escape(name, field, good, victim):
    h = copy.deepcopy(good[1])
    (h["shards"][0] if field == "file" else h["shards"][0]["index"])["file"] = name
    _write_header(victim, json.dumps(h))
    _refused(victim, "plain file name")


def test_shard_symlink_out_of_the_dataset_is_refused(good, victim, tmp_path):
    shard = os.path.join(victim, good[1]["shards"][0]["file"])
    outside = str(tmp_path / "outside.tfrecord")
    os.rename(shard, outside)  # identical content: only the link is wrong
    os.symlink(outside, shard)
    with pytest.raises(CorruptDataError, match="link pointing out"):
        superserial.load(victim)
    os.unlink(shard)
    os.symlink(os.path.relpath(outside, victim), shard)  # relative link, same
    with pytest.raises(CorruptDataError, match="link pointing out"):
        superserial.load(victim)


def test_header_symlink_out_of_the_dataset_is_refused(victim, tmp_path):
    hpath = os.path.join(victim, "header.json")
    outside = str(tmp_path / "header.json")
    os.rename(hpath, outside)
    os.symlink(outside, hpath)
    with pytest.raises(HeaderError, match="link pointing out"):
        superserial.read_header(victim)


def test_symlinked_dataset_directory_is_fine(good, tmp_path):
    link = str(tmp_path / "link")
    os.symlink(good[0], link)
    assert len(list(superserial.load(link))) == 4


# ------------------------------------------------------------------- legacy YAML


def test_legacy_yaml_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"
    header = tmp_path / "old.header"
    header.write_text(f"!!python/object/apply:os.system ['touch {marker}']\n")
    record = tmp_path / "old.tfrecord"
    with tf.io.TFRecordWriter(str(record)) as w:
        w.write(b"")
    with pytest.raises(HeaderError):
        superserial.load(str(record), str(header))
    header.write_text(f"x: !!python/object/apply:subprocess.call [['touch', '{marker}']]\n")
    with pytest.raises(HeaderError):
        superserial.load(str(record), str(header))
    assert not marker.exists(), "the YAML payload ran"


# ----------------------------------------------------- records that lie about leaves


def _example(**features: Any) -> bytes:
    feats = {}
    for k, (kind, values) in features.items():
        if kind == "int64":
            feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        elif kind == "float":
            feats[k] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        else:
            feats[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


GOOD_RECORD = {"pixels": ("bytes", [bytes(6)]), "label": ("int64", [1]), "title": ("bytes", [b"x"])}

LIES = {
    "label_as_float": ({"label": ("float", [1.0])}, "label"),
    "label_as_bytes": ({"label": ("bytes", [b"1"])}, "label"),
    "label_two_values": ({"label": ("int64", [1, 2])}, "label"),
    "label_out_of_int32_range": ({"label": ("int64", [2**40])}, "label"),
    "label_missing": ({"label": None}, "label"),
    "pixels_too_few_bytes": ({"pixels": ("bytes", [bytes(5)])}, "pixels"),
    "pixels_too_many_bytes": ({"pixels": ("bytes", [bytes(7)])}, "pixels"),
    "pixels_two_strings": ({"pixels": ("bytes", [bytes(6), bytes(6)])}, "pixels"),
    "pixels_as_int64": ({"pixels": ("int64", [0] * 6)}, "pixels"),
    "title_missing": ({"title": None}, "title"),
}


@pytest.mark.parametrize("case", list(LIES))
def test_record_disagreeing_with_header_names_the_leaf(case, good, victim):
    change, leaf = LIES[case]
    feats = {k: v for k, v in {**GOOD_RECORD, **change}.items() if v is not None}
    records = [
        _example(**GOOD_RECORD),
        _example(**feats),
        _example(**GOOD_RECORD),
        _example(**GOOD_RECORD),
    ]
    shard = os.path.join(victim, good[1]["shards"][0]["file"])
    with tf.io.TFRecordWriter(shard) as w:
        for r in records:
            w.write(r)
    h = copy.deepcopy(good[1])
    h["shards"][0]["bytes"] = os.path.getsize(shard)
    _write_header(victim, json.dumps(h))
    got = []
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError)) as info:
        for el in superserial.load(victim):
            got.append(int(el["label"]))
    assert leaf in info.value.message, info.value.message
    print(f"{case}: {info.value.message.splitlines()[0][-160:]}")
    assert got in ([], [1]), got  # only the good record before the bad one, if any


def test_good_records_written_by_hand_load(good, victim):
    """Control for the test above: the hand-written good records do load."""
    shard = os.path.join(victim, good[1]["shards"][0]["file"])
    with tf.io.TFRecordWriter(shard) as w:
        for _ in range(4):
            w.write(_example(**GOOD_RECORD))
    h = copy.deepcopy(good[1])
    h["shards"][0]["bytes"] = os.path.getsize(shard)
    _write_header(victim, json.dumps(h))
    got = [(int(e["label"]), np.asarray(e["pixels"]).tolist()) for e in superserial.load(victim)]
    assert got == [(1, [[0, 0, 0], [0, 0, 0]])] * 4


# ---------------------------------------------------------- fuzzing (hypothesis)

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(
        [
            "tensor",
            "dict",
            "tuple",
            "namedtuple",
            "dense",
            "ragged",
            "sparse",
            "int64",
            "uint8",
            "string",
        ]
    ),
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=12), kids, max_size=6)
    ),
    max_leaves=40,
)
_KEYS = ["format_version", "writer", "element_count", "compression", "structure", "shards", "type", "items",
         "name", "kind", "dtype", "shape", "encoding", "features", "file", "records", "bytes", "crc32c",
         "ragged_rank", "row_splits_dtype", "fields", "values"]  # fmt: skip


def _parse_only_header_errors(text: str | bytes) -> None:
    try:
        h = Header.from_json(text, source="hypothesis")
    except HeaderError:
        return
    assert Header.from_json(h.to_json()) == h


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON)
def test_fuzz_random_json_raises_only_header_error(obj):
    _parse_only_header_errors(json.dumps(obj))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=8))
def test_fuzz_header_shaped_json_raises_only_header_error(obj):
    obj.setdefault("format_version", 1)
    _parse_only_header_errors(json.dumps(obj))


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_fuzz_mutated_valid_header_raises_only_header_error(good, data):
    h = copy.deepcopy(good[1])
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(h)
        path = data.draw(st.sampled_from(paths[1:]))
        parent = h
        for p in path[:-1]:
            parent = parent[p]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace" or isinstance(parent, list):
            parent[path[-1]] = data.draw(_JSON)
        elif action == "delete":
            del parent[path[-1]]
        else:
            parent[data.draw(st.sampled_from(_KEYS))] = data.draw(_JSON)
    _parse_only_header_errors(json.dumps(h))


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_fuzz_byte_mutated_header_raises_only_header_error(good, data):
    text = bytearray(json.dumps(good[1], indent=2).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(text) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip":
            text[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            text[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del text[pos : pos + data.draw(st.integers(1, 8))]
    _parse_only_header_errors(bytes(text))

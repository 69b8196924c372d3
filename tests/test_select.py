"""``select=``: reading only some leaves, on every reader, bit for bit as the full read."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import assert_same_value, canon_np
from superserial.codec import tf_decode
from superserial.format.layout import read_header
from superserial.read.selection import node_names, select_header

torch = pytest.importorskip("torch")
grain = pytest.importorskip("grain")

from superserial.grain import DataSource, dataset  # noqa: E402
from superserial.torch import MapDataset, TorchDataset  # noqa: E402

N, SHARDS = 20, 3
Pair = collections.namedtuple("Pair", ["a", "b"])
PairB = collections.namedtuple("Pair", ["b"])  # what selecting only Pair.b gives


def _element(i: tf.Tensor) -> dict[str, Any]:
    return {
        "image": tf.fill([4, 4], tf.cast(i, tf.uint8)),
        "label": i * 100,
        "meta": {
            "id": i,
            "tags": tf.strings.as_string(tf.range(i % 3)),
            "a/b": tf.cast(i, tf.float32) / 3,  # a key with "/": named meta/a~1b
        },
        "rag": tf.RaggedTensor.from_row_lengths(tf.cast(tf.range(i % 4), tf.int32), [i % 4]),
        "sp": tf.SparseTensor([[i % 5]], [tf.cast(i, tf.float32)], [5]),
        "pair": (i + 1, Pair(a=tf.cast(i, tf.float64), b=tf.fill([2], tf.strings.as_string(i)))),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> str:
    path = str(tmp_path_factory.mktemp("select") / "ds")
    superserial.save(tf.data.Dataset.range(N).map(_element), path, num_shards=SHARDS)
    return path


# (select, the selected part of a full element e)
CASES: list[tuple[list[str], Callable[[Any], Any]]] = [
    (["image", "meta/id"], lambda e: {"image": e["image"], "meta": {"id": e["meta"]["id"]}}),
    (["meta"], lambda e: {"meta": e["meta"]}),
    (["rag", "sp"], lambda e: {"rag": e["rag"], "sp": e["sp"]}),
    (["pair/1/1"], lambda e: {"pair": (PairB(b=e["pair"][1].b),)}),
    (
        ["pair/0", "meta/a~1b", "label"],
        lambda e: {"label": e["label"], "meta": {"a/b": e["meta"]["a/b"]}, "pair": (e["pair"][0],)},
    ),
    # Repeats and overlaps are one selection; the order of names does not matter.
    (["meta/id", "label", "meta", "label"], lambda e: {"label": e["label"], "meta": e["meta"]}),
    (["pair"], lambda e: {"pair": e["pair"]}),
]
IDS = ["dense", "inner-dict", "ragged-sparse", "namedtuple-field", "mixed", "overlap", "tuple"]


def _form(x: Any) -> Any:
    """The container structure of a value: dicts, tuples and namedtuples (name, fields)."""
    if isinstance(x, dict):
        return {k: _form(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return ("namedtuple", type(x).__name__, x._fields, [_form(v) for v in x])
    if isinstance(x, tuple):
        return ("tuple", [_form(v) for v in x])
    return "leaf"


def _same_tf(got: Any, want: Any, where: str) -> None:
    assert _form(got) == _form(want), where
    assert_same_value(got, want, where)


def _same_np(got: Any, want: Any, where: str) -> None:
    assert _key(got) == _key(want), where


def _key(x: Any) -> Any:
    """A comparable form of numpy-reader or torch values, batches (lists) included."""
    if isinstance(x, dict):
        return {k: _key(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return ("namedtuple", type(x).__name__, x._fields, [_key(v) for v in x])
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, [_key(v) for v in x])
    if isinstance(x, (ssnp.Ragged, ssnp.Sparse)):
        return (type(x).__name__, [_key(v) for v in vars(x).values()])
    if isinstance(x, torch.Tensor):
        return (str(x.dtype), tuple(x.shape), x.flatten().tolist())
    if isinstance(x, np.ndarray):
        return canon_np(x)
    return x


@pytest.fixture(scope="module")
def full_tf(saved: str) -> list[Any]:
    return list(superserial.load(saved))


# ------------------------------------------------------------ names and pruning


def test_names_are_the_inspect_names(saved: str) -> None:
    header = read_header(saved)
    leaves = [leaf.name for leaf in header.leaves]
    assert leaves == [
        "image", "label", "meta/a~1b", "meta/id", "meta/tags",
        "pair/0", "pair/1/0", "pair/1/1", "rag", "sp",
    ]  # fmt: skip
    names = node_names(header.structure)
    assert set(leaves) < set(names) and {"meta", "pair", "pair/1"} <= set(names)


@pytest.mark.parametrize(("select", "want"), CASES, ids=IDS)
def test_parse_spec_lists_only_the_selected_features(saved: str, select: list[str], want) -> None:
    header = read_header(saved)
    picked = select_header(header, select)
    features = set(tf_decode.parse_spec(picked.leaves))
    expected = {f for leaf in picked.leaves for f in leaf.feature_names()}
    assert features == expected
    assert features < set(tf_decode.parse_spec(header.leaves))
    # Ragged and sparse leaves bring all their features.
    if "rag" in select:
        assert {"rag", "rag~rl1", "sp", "sp~idx", "sp~shape"} <= features


def test_select_everything_is_the_header_itself(saved: str) -> None:
    header = read_header(saved)
    assert select_header(header, None) is header
    assert select_header(header, ["image", "label", "meta", "pair", "rag", "sp"]) is header


# ------------------------------------------------------------ TensorFlow


# (The other cases are read by the numpy reader below; the pruning is the same code.)
TF_CASES = [0, 2, 3, 4, 6]


@pytest.mark.parametrize(
    ("select", "want"), [CASES[i] for i in TF_CASES], ids=[IDS[i] for i in TF_CASES]
)
def test_tf_load(saved: str, full_tf: list[Any], select: list[str], want) -> None:
    full = full_tf
    part = superserial.load(saved, select=select)
    assert len(part) == N
    assert part.element_spec == want(superserial.load(saved).element_spec)
    got = list(part)
    assert len(got) == N
    for i, (g, f) in enumerate(zip(got, full, strict=True)):
        _same_tf(g, want(f), f"element {i}")


@pytest.mark.parametrize(
    ("kwargs", "case"),
    [
        ({"batch_size": 6}, 2),
        ({"batch_size": 6, "drop_remainder": True}, 0),
        ({"shuffle": True, "seed": 5}, 2),
        ({"shuffle": True, "seed": 5, "batch_size": 4, "shard": (1, 2)}, 4),
        ({"shard": (1, SHARDS)}, 2),
        ({"deterministic": False, "shuffle_files": True, "seed": 3}, 4),
    ],
    ids=["batch", "batch-drop", "shuffle", "shuffle-batch-shard", "shard", "nondeterministic"],
)
def test_tf_load_options(saved: str, kwargs: dict[str, Any], case: int) -> None:
    select, want = CASES[case]
    # The reference: the full load with the same options (unbatched, as the
    # full element cannot batch: meta/tags varies), pruned, then batched.
    batch = kwargs.pop("batch_size", None)
    drop = kwargs.pop("drop_remainder", False)
    ref = superserial.load(saved, **kwargs).map(want)
    if batch is not None:
        ref = ref.batch(batch, drop_remainder=drop)
        kwargs.update(batch_size=batch, drop_remainder=drop)
    part = superserial.load(saved, select=select, **kwargs)
    assert part.element_spec == ref.element_spec
    got, full = list(part), list(ref)
    assert len(got) == len(full) == len(part)
    if kwargs.get("deterministic") is False:
        # Shards come in any order: compare sorted by the first leaf's bytes.
        def key(e: Any) -> list[bytes]:
            return [x.numpy().tobytes() for x in tf.nest.flatten(e, expand_composites=True)]

        got.sort(key=key)
        full.sort(key=key)
    for i, (g, f) in enumerate(zip(got, full, strict=True)):
        _same_tf(g, f, f"batch {i}")


# ------------------------------------------------------------ numpy, torch, grain


@pytest.mark.parametrize(("select", "want"), CASES, ids=IDS)
def test_numpy(saved: str, select: list[str], want) -> None:
    full_ds = ssnp.load(saved)
    part = ssnp.load(saved, select=select)
    full = list(full_ds)
    got = list(part)
    assert len(part) == len(got) == N
    for i, (g, f) in enumerate(zip(got, full, strict=True)):
        _same_np(g, want(f), f"element {i}")
    _same_np(part[-3], want(full[-3]), "ds[-3]")
    for g, f in zip(part.get_elements([7, 2, 7]), [full[7], full[2], full[7]], strict=True):
        _same_np(g, want(f), "get_elements")
    _same_np(part.get_batch([4, 1, 9]), want(full_ds.get_batch([4, 1, 9])), "get_batch")
    for g, f in zip(part.batches(6), full_ds.batches(6), strict=True):
        _same_np(g, want(f), "batches")
    sharded = ssnp.load(saved, shard=(2, SHARDS), select=select)
    full_sharded = ssnp.load(saved, shard=(2, SHARDS))
    for g, f in zip(sharded, full_sharded, strict=True):
        _same_np(g, want(f), "shard")


@pytest.mark.parametrize(("select", "want"), [CASES[0], CASES[2], CASES[3]], ids=IDS[:4:1][:3])
def test_torch(saved: str, select: list[str], want) -> None:
    full = list(ssnp.load(saved))
    it = TorchDataset(saved, select=select, convert=False, rank=1, world_size=2)
    ref = TorchDataset(saved, convert=False, rank=1, world_size=2)
    assert len(it) == len(ref)
    for g, f in zip(it, ref, strict=True):
        _same_np(g, want(f), "TorchDataset")
    conv = list(TorchDataset(saved, select=select))
    ref_conv = list(TorchDataset(saved))
    for g, f in zip(conv, ref_conv, strict=True):
        assert _key(g) == _key(want(f))
    m, mref = MapDataset(saved, select=select), MapDataset(saved)
    assert len(m) == N
    assert _key(m[5]) == _key(want(mref[5]))
    # (a list subclass, Elements: compared as the list of its elements)
    assert _key(list(m.__getitems__([3, 0]))) == _key([want(mref[3]), want(mref[0])])
    for i in (0, N - 1):
        _same_np(ssnp.load(saved, select=select)[i], want(full[i]), "numpy")


@pytest.mark.parametrize(("select", "want"), [CASES[0], CASES[2], CASES[4]], ids=IDS[0:5:2])
def test_grain(saved: str, select: list[str], want) -> None:
    src, ref = DataSource(saved, select=select), DataSource(saved)
    assert len(src) == N
    _same_np(src[4], want(ref[4]), "source[4]")
    for g, f in zip(src._getitems([9, 1]), ref._getitems([9, 1]), strict=True):
        _same_np(g, want(f), "_getitems")
    batch = src.collate([src[1], src[2]])
    _same_np(batch, want(ref.collate([ref[1], ref[2]])), "collate")
    shuffled = list(dataset(saved, seed=11, select=select))
    ref_shuffled = list(dataset(saved, seed=11))
    assert len(shuffled) == N
    for g, f in zip(shuffled, ref_shuffled, strict=True):
        _same_np(g, want(f), "dataset")
    with pytest.raises(ValueError, match="on the DataSource"):
        dataset(src, seed=1, select=select)


# ------------------------------------------------------------ errors


def _readers(path: str) -> dict[str, Callable[[Any], Any]]:
    return {
        "tf": lambda s: superserial.load(path, select=s),
        "tf-shuffle": lambda s: superserial.load(path, select=s, shuffle=True, seed=1),
        "numpy": lambda s: ssnp.load(path, select=s),
        "torch": lambda s: TorchDataset(path, select=s),
        "torch-map": lambda s: MapDataset(path, select=s),
        "grain": lambda s: DataSource(path, select=s),
        "grain-dataset": lambda s: dataset(path, seed=1, select=s),
    }


@pytest.mark.parametrize(
    "reader", ["tf", "tf-shuffle", "numpy", "torch", "torch-map", "grain", "grain-dataset"]
)
def test_unknown_name_lists_the_names(saved: str, reader: str) -> None:
    make = _readers(saved)[reader]
    with pytest.raises(ValueError, match=r"unknown 'imag', 'meta/x'.*: image, label, meta, ") as e:
        make(["imag", "label", "meta/x"])
    assert "meta/a~1b" in str(e.value) and "pair/1/1" in str(e.value)
    with pytest.raises(ValueError, match="unknown 'meta/a/b'"):  # names are escaped
        make(["meta/a/b"])
    with pytest.raises(ValueError, match="at least one name"):
        make([])
    with pytest.raises(TypeError, match=r"a string: \['label'\]"):
        make("label")
    with pytest.raises(TypeError, match="names as strings, got int"):
        make(["label", 3])


def test_plain_tensor_dataset_is_value(tmp_path: Any) -> None:
    path = str(tmp_path / "plain")
    superserial.save(tf.data.Dataset.range(5), path)
    assert [int(x) for x in superserial.load(path, select=["value"])] == list(range(5))
    assert [int(x) for x in ssnp.load(path, select=["value"])] == list(range(5))
    with pytest.raises(ValueError, match=r"are: value$"):
        ssnp.load(path, select=["x"])


def test_root_tuple_keeps_a_shorter_tuple(tmp_path: Any) -> None:
    path = str(tmp_path / "pairs")
    ds = tf.data.Dataset.range(6).map(lambda i: (tf.fill([3], i), tf.strings.as_string(i), -i))
    superserial.save(ds, path)
    part = superserial.load(path, select=["2", "0"])
    assert part.element_spec == (tf.TensorSpec([3], tf.int64), tf.TensorSpec([], tf.int64))
    got = [(a.numpy().tolist(), int(b)) for a, b in part]
    assert got == [([i] * 3, -i) for i in range(6)]
    one = superserial.load(path, select=["1"], batch_size=4)
    assert [b.numpy().tolist() for (b,) in one] == [[b"0", b"1", b"2", b"3"], [b"4", b"5"]]
    assert [x for (x,) in ssnp.load(path, select=["1"])] == [str(i).encode() for i in range(6)]


# ------------------------------------------------------------ only the selected features are read


@pytest.fixture
def broken_label(saved: str, tmp_path: Any) -> str:
    """A copy of the dataset whose header says ``label`` is float32: its int64 features mismatch."""
    path = str(tmp_path / "broken")
    os.makedirs(path)
    for name in os.listdir(saved):
        with (
            open(os.path.join(saved, name), "rb") as src,
            open(os.path.join(path, name), "wb") as d,
        ):
            d.write(src.read())
    with open(os.path.join(path, "header.json")) as f:
        obj = json.load(f)
    label = obj["structure"]["items"]["label"]
    label.update(dtype="float32", encoding="float")
    with open(os.path.join(path, "header.json"), "w") as f:
        json.dump(obj, f)
    return path


def test_unselected_feature_is_not_parsed(broken_label: str, saved: str) -> None:
    # The full read fails on the label feature (int64_list where float_list is
    # expected), in both decoders; without label, nothing looks at it.
    with pytest.raises(tf.errors.InvalidArgumentError, match="label"):
        list(superserial.load(broken_label))
    with pytest.raises(superserial.CorruptDataError, match="label"):
        list(ssnp.load(broken_label))
    select = ["image", "meta/id", "meta/a~1b", "pair", "rag", "sp"]
    for kwargs in ({"batch_size": 7}, {"shuffle": True, "seed": 2}):
        got = list(superserial.load(broken_label, select=select, **kwargs))
        ref = list(superserial.load(saved, select=select, **kwargs))
        assert len(got) == len(ref) == (3 if "batch_size" in kwargs else N)
        for g, r in zip(got, ref, strict=True):
            _same_tf(g, r, str(kwargs))
    for g, r in zip(
        ssnp.load(broken_label, select=select), ssnp.load(saved, select=select), strict=True
    ):
        _same_np(g, r, "numpy")
    np.testing.assert_array_equal(
        MapDataset(broken_label, select=["image"])[3]["image"].numpy(), np.full([4, 4], 3)
    )

"""superserial.torch: shard splitting over DataLoader workers and ranks, conversion, collate."""

from __future__ import annotations

import collections
import json
import os
import shutil
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import superserial  # noqa: E402
import superserial.numpy as ssnp  # noqa: E402
from superserial.errors import IdleReaderWarning  # noqa: E402
from superserial.integrations.torch.share import in_slot  # noqa: E402
from superserial.torch import (  # noqa: E402
    Padded,
    TorchDataset,
    collate,
    collate_padded,
    to_torch,
)

COUNT = 30
Pair = collections.namedtuple("Pair", ["a", "b"])


@pytest.fixture(scope="module")
def path(tmp_path_factory: Any) -> str:
    import tensorflow as tf

    def build(i: Any) -> Any:
        return {
            "id": i,
            "img": tf.fill([2, 3], tf.cast(i, tf.uint8)),
            "u32": tf.cast(i, tf.uint32) + 4_000_000_000,
            "u16": tf.fill([2], tf.cast(i, tf.uint16)),
            "bf": tf.cast(tf.stack([i, -i]), tf.bfloat16),
            "s": tf.strings.as_string(i),
            "pair": Pair(a=tf.cast(i, tf.float64), b=tf.fill([2], tf.strings.as_string(i))),
            "rag": tf.RaggedTensor.from_row_lengths(tf.range(i % 4), [i % 4]),
            "sp": tf.SparseTensor([[1]], [tf.cast(i, tf.float32)], [3]),
        }

    out = str(tmp_path_factory.mktemp("torch") / "ds")
    superserial.save(tf.data.Dataset.range(COUNT).map(build), out, num_shards=7)
    return out


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


@pytest.mark.timeout(120)  # a worker failing to pickle an element hangs the DataLoader
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_sees_every_element_once(path: str, workers: int) -> None:
    ds = TorchDataset(path)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=collate)
    ids = _ids(loader)
    assert sorted(ids) == list(range(COUNT))
    assert len(ds) == COUNT


@pytest.mark.timeout(120)
def test_two_ranks_split_without_duplicates(path: str) -> None:
    seen = []
    for rank in range(2):
        ds = TorchDataset(path, rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate)
        ids = _ids(loader)
        assert len(ids) == len(ds) > 0
        seen.append(set(ids))
        assert len(set(ids)) == len(ids)
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(COUNT))
    # Rank r reads shards r::2 whatever its number of workers.
    assert [TorchDataset(path, rank=1, world_size=2).shards_for(w, 2) for w in range(2)] == [
        [1, 5],
        [3],
    ]


def test_more_readers_than_shards(path: str) -> None:
    # 3 ranks x 3 workers = 9 readers for 7 shards: rank 0 deals out its 3 whole
    # shards; ranks 1 and 2, with 2 shards each, split them by records. None idles.
    ids: list[int] = []
    for rank in range(3):
        ds = TorchDataset(path, rank=rank, world_size=3)
        per_worker = [ds.parts_for(w, 3) for w in range(3)]
        for parts in per_worker:
            assert sum(n for _, _, n in parts) > 0
            got = [int(e["id"]) for e in _read_parts(ds, parts)]
            ids.extend(got)
        assert sum(n for p in per_worker for _, _, n in p) == len(ds)
        if rank == 0:
            assert per_worker == [[(i, 0, ds._all.counts[i])] for i in (0, 3, 6)]
    assert sorted(ids) == list(range(COUNT))


def _read_parts(ds: TorchDataset, parts: list[tuple[int, int, int]]) -> ssnp.NumpyDataset:
    return ssnp.NumpyDataset(
        ds.path,
        ds.header,
        [ds._all.files[i] for i, _, _ in parts],
        [n for _, _, n in parts],
        starts=[a for _, a, _ in parts],
    )


def test_shuffled_shards_same_on_every_rank(path: str) -> None:
    a = [TorchDataset(path, rank=r, world_size=2, shuffle_shards=True, seed=3) for r in range(2)]
    assert a[0]._order() == a[1]._order() and sorted(a[0]._order()) == list(range(7))
    orders = set()
    for epoch in range(4):
        a[0].set_epoch(epoch)
        orders.add(tuple(a[0]._order()))
    assert len(orders) > 1
    a[1].set_epoch(3)  # every rank must be at the same epoch
    assert a[0]._order() == a[1]._order()
    ids = [int(e["id"]) for r in range(2) for e in a[r]]
    assert sorted(ids) == list(range(COUNT))


def test_rank_from_torch_distributed(path: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    ds = TorchDataset(path)
    assert (ds.rank, ds.world_size) == (1, 3)
    assert ds.shards_for() == [1, 4]
    with pytest.raises(ValueError, match="rank"):
        TorchDataset(path, rank=2, world_size=2)
    with pytest.raises(ValueError, match="together"):
        TorchDataset(path, rank=0)


def test_values_and_dtypes_match_numpy_reader(path: str) -> None:
    want = list(ssnp.load(path))
    got = list(TorchDataset(path))
    assert len(got) == len(want) == COUNT
    for w, g in zip(want, got, strict=True):
        assert g["img"].dtype == torch.uint8 and g["img"].shape == (2, 3)
        assert g["u32"].dtype == torch.uint32 and g["u16"].dtype == torch.uint16
        assert g["bf"].dtype == torch.bfloat16
        assert g["id"].dtype == torch.int64 and g["id"].shape == ()
        for name in ("img", "u32", "u16", "id"):
            assert g[name].numpy().tobytes() == w[name].tobytes(), name
        assert g["bf"].view(torch.uint16).numpy().tobytes() == w["bf"].view(np.uint16).tobytes()
        assert g["s"] == w["s"].item() and isinstance(g["s"], bytes)
        assert type(g["pair"]).__name__ == "Pair" and g["pair"].b == w["pair"].b.tolist()
        assert g["pair"].a.dtype == torch.float64 and float(g["pair"].a) == float(w["pair"].a)
        assert g["rag"].flat_values.tolist() == w["rag"].flat_values.tolist()
        assert g["rag"].nested_row_splits[0].tolist() == w["rag"].nested_row_splits[0].tolist()
        sp = torch.sparse_coo_tensor(
            g["sp"].indices.T, g["sp"].values, tuple(g["sp"].dense_shape), check_invariants=True
        )
        assert sp.to_dense().tolist() == w["sp"].to_dense().tolist()


def test_collate(path: str) -> None:
    els = list(TorchDataset(path))[:3]
    batch = collate(els)
    assert batch["img"].shape == (3, 2, 3) and batch["img"].dtype == torch.uint8
    assert batch["id"].tolist() == [int(e["id"]) for e in els]
    assert batch["s"] == [e["s"] for e in els]
    assert type(batch["pair"]) is type(els[0]["pair"]) and batch["pair"].a.shape == (3,)
    assert batch["pair"].b == [e["pair"].b for e in els]
    assert isinstance(batch["rag"], list) and len(batch["rag"]) == 3
    with pytest.raises(ValueError, match="one shape"):
        collate([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])
    with pytest.raises(ValueError, match="keys"):
        collate([{"x": torch.zeros(2)}, {"y": torch.zeros(2)}])


def test_to_torch_on_numpy_batches(path: str) -> None:
    batch = to_torch(next(ssnp.iter_batches(path, 8)))
    assert batch["img"].shape == (8, 2, 3) and batch["bf"].dtype == torch.bfloat16
    assert batch["s"] == [str(i).encode() for i in range(8)]
    assert batch["u32"].dtype == torch.uint32 and int(batch["u32"][7]) == 4_000_000_007


def test_without_tensorflow(path: str) -> None:
    import subprocess
    import sys
    import textwrap

    src = textwrap.dedent(
        """
        import sys
        sys.modules["tensorflow"] = None  # any import of TensorFlow fails
        import superserial
        assert "torch" not in sys.modules
        import torch
        from superserial.torch import TorchDataset, collate
        loader = torch.utils.data.DataLoader(TorchDataset(sys.argv[1]), batch_size=8, collate_fn=collate)
        print(sorted(int(i) for b in loader for i in b["id"]) == list(range(30)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", src, path], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True"]


# ------------------------------------------------------------ variable-length leaves

TEXT = 40


def _text(i: Any) -> Any:
    import tensorflow as tf

    return {
        "label": i,
        "dense": tf.range(i % 3),  # int64[None]
        "grid": tf.fill(tf.stack([i % 2, i % 3 + 1]), tf.cast(i, tf.uint16)),  # uint16[None, None]
        "sents": tf.RaggedTensor.from_row_lengths(  # ragged_rank 1, uint32
            tf.cast(tf.range(i % 4), tf.uint32), [i % 4]
        ),
        "sp": tf.SparseTensor([[1]], [tf.cast(i, tf.float32)], [3]),
    }


@pytest.fixture(scope="module")
def text(tmp_path_factory: Any) -> dict[str, str]:
    """A text-like dataset in one shard: uncompressed, GZIP, and GZIP as written before restart
    points (no index: a compressed stream whose records cannot be found inside it)."""
    import tensorflow as tf

    tokens = tf.ragged.constant([[i] * (i % 5) for i in range(TEXT)], dtype=tf.int32)
    words = tf.ragged.constant([[b"w%d" % i] * (i % 3) for i in range(TEXT)])
    ds = tf.data.Dataset.zip(
        tf.data.Dataset.from_tensor_slices({"tokens": tokens, "words": words}),  # ragged_rank 0
        tf.data.Dataset.range(TEXT).map(_text),
    ).map(
        lambda a, b: {**a, **b, "doc": tf.strings.join(["doc-", tf.strings.as_string(b["label"])])}
    )
    root = tmp_path_factory.mktemp("text")
    out = {"plain": str(root / "plain"), "gzip": str(root / "gzip")}
    superserial.save(ds, out["plain"])  # one shard, as save's 128 MiB default gives
    superserial.save(ds, out["gzip"], compression="GZIP")
    assert [len(superserial.read_header(p).shards) for p in out.values()] == [1, 1]
    out["gzip_old"] = str(root / "gzip_old")
    shutil.copytree(out["gzip"], out["gzip_old"])
    header_file = os.path.join(out["gzip_old"], "header.json")
    with open(header_file) as f:
        obj = json.load(f)
    os.remove(os.path.join(out["gzip_old"], obj["shards"][0].pop("index")["file"]))
    with open(header_file, "w") as f:
        json.dump(obj, f)
    return out


def _by_label(batches: list[Any]) -> dict[int, dict[str, Any]]:
    """Per element, by label: each leaf's value taken back out of its batch."""
    out: dict[int, dict[str, Any]] = {}
    for b in batches:
        for j, label in enumerate(b["label"].tolist()):
            out[label] = {k: v[j] for k, v in b.items()}
    return out


@pytest.mark.timeout(180)
def test_collate_batches_every_leaf_kind(text: dict[str, str]) -> None:
    want = {int(e["label"]): e for e in ssnp.load(text["plain"])}
    loader = torch.utils.data.DataLoader(
        TorchDataset(text["plain"]), batch_size=4, num_workers=2, collate_fn=collate
    )
    batches = list(loader)
    for b in batches:
        assert b["label"].shape == (4,)  # fixed: stacked
        for name in ("tokens", "dense", "grid", "words", "sents", "sp", "doc"):
            assert isinstance(b[name], list) and len(b[name]) == 4, name  # as iter_batches
    got = _by_label(batches)
    assert sorted(got) == list(range(TEXT))
    for i, w in want.items():
        g = got[i]
        assert g["tokens"].dtype == torch.int32 and g["tokens"].tolist() == w["tokens"].tolist()
        assert g["dense"].tolist() == w["dense"].tolist() and g["grid"].shape == w["grid"].shape
        assert g["words"] == w["words"].tolist() and g["doc"] == w["doc"].item()
        assert g["sents"].flat_values.tolist() == w["sents"].flat_values.tolist()
        assert g["sp"].values.tolist() == w["sp"].values.tolist()
    # Equal lengths in a batch still give a list: decided by the header, not the data.
    same = collate([e for e in TorchDataset(text["plain"]) if int(e["label"]) % 5 == 0][:3])
    assert isinstance(same["tokens"], list) and [len(t) for t in same["tokens"]] == [0, 0, 0]


@pytest.mark.timeout(180)
def test_collate_padded(text: dict[str, str]) -> None:
    want = {int(e["label"]): e for e in ssnp.load(text["plain"])}
    loader = torch.utils.data.DataLoader(
        TorchDataset(text["plain"]), batch_size=5, num_workers=2, collate_fn=collate_padded(-1)
    )
    batches = list(loader)
    for b in batches:
        tok = b["tokens"]
        assert isinstance(tok, Padded) and tok.values.dtype == torch.int32
        assert tok.lengths.dtype == torch.int64 and tok.lengths.shape == (5,)  # one variable dim
        assert tok.values.shape == (5, int(tok.lengths.max()))
        assert b["grid"].lengths.shape == (5, 2) and b["grid"].values.dtype == torch.uint16
        assert b["sents"].lengths.shape == (5, 2)  # a Ragged: its outer and ragged dimension
        assert isinstance(b["words"], list) and isinstance(b["sp"], list)  # strings, sparse
        assert b["label"].shape == (5,)
        for j, i in enumerate(b["label"].tolist()):
            w = want[i]
            n = len(w["tokens"])
            assert int(tok.lengths[j]) == n
            assert tok.values[j, :n].tolist() == w["tokens"].tolist()
            assert set(tok.values[j, n:].tolist()) <= {-1}
            assert b["dense"].values[j, : len(w["dense"])].tolist() == w["dense"].tolist()
            r, c = w["grid"].shape
            assert b["grid"].lengths[j].tolist() == [r, c]
            grid = b["grid"].values[j].to(torch.int64)
            assert grid[:r, :c].tolist() == w["grid"].tolist()
            assert (grid[r:] == 65535).all() and (grid[:, c:] == 65535).all()  # -1 as uint16
            rows = w["sents"].to_list()
            assert b["sents"].lengths[j].tolist() == [1, max(len(x) for x in rows)]
            flat = b["sents"].values[j].to(torch.int64)
            assert flat[0, : len(rows[0])].tolist() == rows[0].tolist()
    assert sorted(i for b in batches for i in b["label"].tolist()) == list(range(TEXT))
    assert repr(collate_padded(0)) == "collate_padded(pad_value=0)"


class _Tagged(TorchDataset):
    """Tags each element with the DataLoader worker that read it."""

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        for e in super().__iter__():
            e["worker"] = torch.tensor(info.id if info is not None else -1)
            yield e


@pytest.mark.timeout(180)
def test_one_shard_split_over_four_workers(text: dict[str, str]) -> None:
    loader = torch.utils.data.DataLoader(
        _Tagged(text["plain"]), batch_size=3, num_workers=4, collate_fn=collate
    )
    per_worker: dict[int, list[int]] = {}
    for b in loader:
        for w, i in zip(b["worker"].tolist(), b["label"].tolist(), strict=True):
            per_worker.setdefault(w, []).append(i)
    assert sorted(per_worker) == [0, 1, 2, 3]  # every worker got data
    assert all(len(ids) == TEXT // 4 for ids in per_worker.values())
    # Contiguous record ranges: the workers' outputs concatenated are the saved order.
    assert [i for w in range(4) for i in per_worker[w]] == list(range(TEXT))


@pytest.mark.timeout(180)
def test_fewer_shards_than_ranks_split_by_records(text: dict[str, str]) -> None:
    seen: list[int] = []
    for rank in range(3):
        ds = TorchDataset(text["plain"], rank=rank, world_size=3)
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)
        ids = [i for b in loader for i in b["label"].tolist()]
        assert len(ids) == len(ds) in (TEXT // 3, TEXT // 3 + 1)
        seen.extend(ids)
    assert sorted(seen) == list(range(TEXT))


def test_compressed_shards_without_restart_points_cannot_be_split_so_idle_readers_warn(
    text: dict[str, str],
) -> None:
    with pytest.warns(
        IdleReaderWarning, match=r"rank 1 of 2 gets no records.*GZIP shards have no restart"
    ):
        ds = TorchDataset(text["gzip_old"], rank=1, world_size=2)
    assert len(ds) == 0
    with pytest.warns(IdleReaderWarning, match="worker 0 of 1 of rank 1 gets no records"):
        assert list(ds) == []
    assert TorchDataset(text["gzip_old"], rank=0, world_size=1).parts_for(1, 3) == []
    # With restart points the shard is split like an uncompressed one.
    assert TorchDataset(text["gzip"], rank=0, world_size=1).parts_for(1, 3) == [(0, 13, 13)]


@pytest.mark.timeout(180)
def test_compressed_idle_dataloader_workers_warn(text: dict[str, str]) -> None:
    # In a real DataLoader the warning comes from the worker processes (under pytest, a
    # forked worker would inherit pytest's warning capture, hence a subprocess).
    import subprocess
    import sys
    import textwrap

    src = textwrap.dedent(
        """
        import sys, torch
        from superserial.torch import TorchDataset, collate
        loader = torch.utils.data.DataLoader(
            TorchDataset(sys.argv[1]), batch_size=4, num_workers=3, collate_fn=collate)
        print(sorted(i for b in loader for i in b["label"].tolist()) == list(range(40)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", src, text["gzip_old"]], capture_output=True, text=True, timeout=150
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True"]
    for w in (1, 2):
        assert f"IdleReaderWarning: superserial: worker {w} of 3 of rank 0 gets no records" in (
            out.stderr
        )
    assert "worker 0 of 3" not in out.stderr


# ------------------------------------------------------------ batched mode (batch_size=)


def _row(batch: Any, j: int) -> Any:
    """Element ``j`` of a batch: each leaf's ``j``-th value, structure kept."""
    if isinstance(batch, dict):
        return {k: _row(v, j) for k, v in batch.items()}
    if isinstance(batch, tuple):
        parts = [_row(v, j) for v in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else tuple(parts)
    return batch[j]


def _plain(x: Any) -> Any:
    """``x`` with its tensors as (dtype, shape, values): comparable with ``==``."""
    if isinstance(x, torch.Tensor):
        v = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        return (str(x.dtype), tuple(x.shape), v.to(torch.float64).tolist())
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (ssnp.Ragged, ssnp.Sparse)):
        return (type(x).__name__, [_plain(v) for v in vars(x).values()])
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, [_plain(v) for v in x])
    return x


def _kinds(batch: Any) -> Any:
    """The type of every leaf of a batch (and of its values, for lists), structure kept."""
    if isinstance(batch, dict):
        return {k: _kinds(v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return (type(batch).__name__, [_kinds(v) for v in batch])
    if isinstance(batch, torch.Tensor):
        return ("Tensor", str(batch.dtype), tuple(batch.shape[1:]))
    return (type(batch).__name__, {type(v).__name__ for v in batch})


def _key(element: Any) -> int:
    return int(element["id"] if "id" in element else element["label"])


def _per_element(p: str) -> dict[int, Any]:
    loader = torch.utils.data.DataLoader(TorchDataset(p), batch_size=4, collate_fn=collate)
    return {
        _key(e): e
        for b in loader
        for e in (_row(b, j) for j in range(len(b["label" if "label" in b else "id"])))
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("which", ["path", "text"])
def test_batched_mode_equals_per_element_path(
    path: str, text: dict[str, str], which: str, workers: int
) -> None:
    p = path if which == "path" else text["plain"]
    want = _per_element(p)
    reference = collate(list(TorchDataset(p))[:3])
    loader = torch.utils.data.DataLoader(
        TorchDataset(p, batch_size=3), batch_size=None, num_workers=workers
    )
    batches = list(loader)
    got: dict[int, Any] = {}
    for b in batches:
        assert _kinds(b) == _kinds(reference)  # the types collate gives: switching is transparent
        n = len(b["label" if "label" in b else "id"])
        assert 1 <= n <= 3
        for j in range(n):
            e = _row(b, j)
            assert _key(e) not in got
            got[_key(e)] = e
    assert sorted(got) == sorted(want) == list(range(len(want)))
    for i, w in want.items():
        assert _plain(got[i]) == _plain(w), i
    # Each reader batches its own share: only each worker's last batch may be short.
    shares = [
        sum(n for _, _, n in TorchDataset(p).parts_for(w, max(workers, 1)))
        for w in range(max(workers, 1))
    ]
    sizes = sorted(len(b["label" if "label" in b else "id"]) for b in batches)
    want_sizes = sorted(s for n in shares for s in [3] * (n // 3) + ([n % 3] if n % 3 else []))
    assert sizes == want_sizes


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_batched_mode_batch_sizes_and_drop_remainder(path: str, batch_size: int) -> None:
    ds = TorchDataset(path, batch_size=batch_size, drop_remainder=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    ids = [b["id"].tolist() for b in loader]
    assert all(len(x) == batch_size for x in ids)
    # Every worker keeps the whole batches of its share, in the saved order.
    want = []
    for w in range(2):
        share = [int(e["id"]) for e in _read_parts(ds, ds.parts_for(w, 2))]
        want.extend(share[: len(share) // batch_size * batch_size])
    assert sorted(i for x in ids for i in x) == sorted(want)
    kept = TorchDataset(path, batch_size=batch_size)
    assert sorted(int(i) for b in kept for i in b["id"]) == list(range(COUNT))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("which", "world"), [("path", 2), ("path", 3), ("text", 3)])
def test_batched_mode_rank_split_exact(
    path: str, text: dict[str, str], which: str, world: int
) -> None:
    p = path if which == "path" else text["plain"]
    seen: list[int] = []
    for rank in range(world):
        ds = TorchDataset(p, rank=rank, world_size=world, batch_size=4)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        ids = [
            _key(_row(b, j))
            for b in loader
            for j in range(len(b["label" if "label" in b else "id"]))
        ]
        per_element = [_key(e) for e in TorchDataset(p, rank=rank, world_size=world)]
        assert sorted(ids) == sorted(per_element) and len(ids) == len(ds)
        seen.extend(ids)
    assert sorted(seen) == list(range(COUNT if which == "path" else TEXT))


@pytest.mark.timeout(180)
def test_batched_mode_sends_lists_as_one_storage(text: dict[str, str]) -> None:
    loader = torch.utils.data.DataLoader(
        TorchDataset(text["plain"], batch_size=8), batch_size=None, num_workers=2
    )
    for b in loader:
        for name, tensors in [
            ("tokens", b["tokens"]),
            ("grid", b["grid"]),
            ("sents", [r.flat_values for r in b["sents"]]),
            ("sents splits", [r.nested_row_splits[0] for r in b["sents"]]),
            ("sp", [s.values for s in b["sp"]]),
        ]:
            storages = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
            assert len(storages) == 1, name


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_batched_mode_rejects_bad_batch_size(path: str, bad: Any) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        TorchDataset(path, batch_size=bad)


def test_batched_mode_without_conversion_gives_numpy_batches(path: str) -> None:
    got = list(TorchDataset(path, batch_size=8, convert=False))
    want = list(ssnp.load(path).batches(8))
    assert [b["id"].tolist() for b in got] == [b["id"].tolist() for b in want]
    assert isinstance(got[0]["img"], np.ndarray) and got[0]["img"].shape == (8, 2, 3)


class _SharedInWorker(TorchDataset):
    """Yields, per batch, whether its tensors were in shared memory before leaving the worker."""

    def __iter__(self) -> Any:
        for b in super().__iter__():
            tensors = [b["label"], *b["tokens"], *[r.flat_values for r in b["sents"]]]
            tensors += [s.values for s in b["sp"]]
            # Stacked leaves are copied into a reused slot of shared memory (torch_share).
            yield torch.tensor([t.is_shared() or in_slot(t) for t in tensors if t.numel()])


@pytest.mark.timeout(180)
def test_batched_mode_moves_batches_to_shared_memory_in_workers(text: dict[str, str]) -> None:
    # Moved when made, not by the queue's feeder thread later: the decoded arrays are freed
    # before the next batch is decoded (interleaved, they fragmented the heap to 1 GB).
    loader = torch.utils.data.DataLoader(
        _SharedInWorker(text["plain"], batch_size=8), batch_size=None, num_workers=1
    )
    flags = torch.cat(list(loader))
    assert len(flags) > 10 and bool(flags.all())
    # Outside a worker nothing is moved.
    b = next(iter(TorchDataset(text["plain"], batch_size=8)))
    assert not b["label"].is_shared() and not b["tokens"][1].is_shared()


@pytest.mark.timeout(180)
def test_batched_mode_keeps_tuples_with_keep(tmp_path: Any) -> None:
    import tensorflow as tf

    from superserial.torch import keep

    p = str(tmp_path / "pairs")
    x = np.arange(24, dtype=np.float32).reshape(12, 2)
    superserial.save(tf.data.Dataset.from_tensor_slices((x, np.arange(12))), p)
    ds = TorchDataset(p, batch_size=5)
    kept = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, collate_fn=keep))
    per_element = collate(list(TorchDataset(p))[:5])
    assert all(type(b) is tuple is type(per_element) for b in kept)
    assert sorted(int(i) for b in kept for i in b[1]) == list(range(12))
    assert torch.equal(kept[0][0], torch.from_numpy(x[:5]))
    # DataLoader's default for batch_size=None makes lists of them.
    assert type(next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))) is list

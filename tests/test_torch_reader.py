"""superserial.torch: shard splitting over DataLoader workers and ranks, conversion, collate."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import superserial  # noqa: E402
import superserial.numpy as ssnp  # noqa: E402
from superserial.torch import TorchDataset, collate, to_torch  # noqa: E402

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
    # 3 ranks x 3 workers = 9 readers for 7 shards: two read nothing, none repeats.
    ids: list[int] = []
    for rank in range(3):
        ds = TorchDataset(path, rank=rank, world_size=3)
        per_worker = [ds.shards_for(w, 3) for w in range(3)]
        for worker in range(3):
            part = ssnp.NumpyDataset(
                ds.path,
                ds.header,
                [ds._all.files[i] for i in per_worker[worker]],
                [ds._all.counts[i] for i in per_worker[worker]],
            )
            ids.extend(int(e["id"]) for e in part)
        assert sum(len(s) for s in per_worker) == len(range(rank, 7, 3))
    assert sorted(ids) == list(range(COUNT))


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

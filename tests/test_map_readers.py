"""Map-style readers: superserial.torch.MapDataset and superserial.grain.DataSource."""

from __future__ import annotations

import collections
import json
import os
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
grain = pytest.importorskip("grain")

import superserial  # noqa: E402
import superserial.numpy as ssnp  # noqa: E402
from superserial.errors import UnsupportedError  # noqa: E402
from superserial.format import layout  # noqa: E402
from superserial.grain import DataSource  # noqa: E402
from superserial.numpy import Ragged, Sparse  # noqa: E402
from superserial.torch import MapDataset, TorchDataset, collate  # noqa: E402

COUNT = 24  # even, for DistributedSampler over 2 replicas without padding
Pair = collections.namedtuple("Pair", ["a", "b"])


def _dict(i: Any) -> Any:
    import tensorflow as tf

    return {
        "id": i,
        "img": tf.fill([2, 3], tf.cast(i, tf.uint8)),  # fixed dense
        "seq": tf.range(i % 3),  # dense int64[None]
        "rag": tf.RaggedTensor.from_row_lengths(tf.cast(tf.range(i % 4), tf.int32), [i % 4]),
        "s": tf.strings.as_string(i),
        "bf": tf.cast(tf.stack([i, -i]), tf.bfloat16),
    }


def _nested(i: Any) -> Any:
    import tensorflow as tf

    return (
        i,
        Pair(a=tf.cast(i, tf.float64), b=tf.fill([2], tf.strings.as_string(i))),
        tf.SparseTensor([[1]], [tf.cast(i, tf.float32)], [3]),
    )


def _seq(i: Any) -> Any:
    import tensorflow as tf

    return {"seq": tf.range(i % 3)}


STRUCTURES = {"dict": _dict, "nested": _nested}


def _save(root: Any, build: Any, **kwargs: Any) -> str:
    import tensorflow as tf

    out = str(root / "ds")
    superserial.save(tf.data.Dataset.range(COUNT).map(build), out, **kwargs)
    return out


@pytest.fixture(scope="module", params=sorted(STRUCTURES))
def path(request: Any, tmp_path_factory: Any) -> str:
    """A dataset of COUNT elements in 5 uncompressed shards of unequal sizes."""
    root = tmp_path_factory.mktemp(request.param)
    return _save(root, STRUCTURES[request.param], num_shards=5)


def _id(element: Any) -> Any:
    return element["id"] if isinstance(element, dict) else element[0]


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in _id(b)]


def canon(x: Any) -> Any:
    """A comparable form of a numpy or torch element (or batch): dtypes, shapes, bytes."""
    if isinstance(x, dict):
        return {k: canon(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return ("namedtuple", type(x).__name__, x._fields, [canon(v) for v in x])
    if isinstance(x, tuple | list):
        return (type(x).__name__, [canon(v) for v in x])
    if isinstance(x, Ragged):
        return ("ragged", canon(x.flat_values), [canon(s) for s in x.nested_row_splits])
    if isinstance(x, Sparse):
        return ("sparse", canon(x.indices), canon(x.values), canon(x.dense_shape))
    if isinstance(x, torch.Tensor):
        raw = x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return ("tensor", str(x.dtype), tuple(x.shape), raw)
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return ("array", "object", x.shape, x.tolist())
        return ("array", str(x.dtype), x.shape, x.tobytes())
    return (type(x).__name__, x)


# ------------------------------------------------------------------ PyTorch


def test_map_dataset_equals_torch_dataset(path: str) -> None:
    md = MapDataset(path)
    streamed = list(TorchDataset(path))
    assert len(md) == len(streamed) == COUNT
    assert [canon(md[i]) for i in range(COUNT)] == [canon(e) for e in streamed]
    assert [canon(e) for e in md.__getitems__(list(range(COUNT)))] == [canon(e) for e in streamed]
    # collate batches them alike (variable-length leaves become lists in both).
    assert canon(collate(md.__getitems__([0, 1, 2, 3]))) == canon(collate(streamed[:4]))


def test_map_dataset_indexing(path: str) -> None:
    md = MapDataset(path)
    picked = md.__getitems__([5, 0, 5, -1, 23])
    assert isinstance(picked, list)
    assert [canon(e) for e in picked] == [canon(md[i]) for i in (5, 0, 5, COUNT - 1, 23)]
    assert [int(_id(e)) for e in picked] == [5, 0, 5, COUNT - 1, 23]
    assert int(_id(md[-COUNT])) == 0
    assert [int(_id(e)) for e in md[2:9:3]] == [2, 5, 8]
    assert md.__getitems__([]) == []
    for bad in (COUNT, -COUNT - 1):
        with pytest.raises(IndexError, match=f"got {bad}"):
            md[bad]
    with pytest.raises(IndexError, match=f"got {COUNT} at position 1"):
        md.__getitems__([0, COUNT])
    again = pickle.loads(pickle.dumps(md))
    assert canon(again[7]) == canon(md[7])
    assert repr(md) == f"MapDataset({path!r}, {COUNT} elements)"


class _NoSingleReads(MapDataset):
    """Fails on ``ds[i]``: a DataLoader that batches must call ``__getitems__`` instead."""

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError(f"DataLoader called ds[{index!r}]")


def test_dataloader_fetches_a_batch_with_one_call(path: str) -> None:
    loader = torch.utils.data.DataLoader(
        _NoSingleReads(path), batch_size=5, shuffle=True, collate_fn=collate
    )
    assert sorted(_ids(loader)) == list(range(COUNT))


@pytest.mark.timeout(120)  # a worker failing to pickle hangs the DataLoader
def test_dataloader_shuffled_with_workers(path: str) -> None:
    md = MapDataset(path)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(
        md, batch_size=5, shuffle=True, num_workers=2, collate_fn=collate
    )
    for _ in range(2):  # every element exactly once per epoch
        batches = list(loader)
        ids = _ids(batches)
        assert sorted(ids) == list(range(COUNT))
        assert ids != list(range(COUNT))
        assert [len(_id(b)) for b in batches] == [5, 5, 5, 5, 4]
    first = batches[0]
    if isinstance(first, dict):
        assert first["img"].shape == (5, 2, 3) and first["bf"].dtype == torch.bfloat16
        assert isinstance(first["seq"], list) and isinstance(first["rag"], list)
        assert first["s"] == [str(int(i)).encode() for i in first["id"]]
    else:
        assert first[1].b == [[str(int(i)).encode()] * 2 for i in first[0]]


def test_default_collate_fails_on_variable_length_leaves(tmp_path: Any) -> None:
    # What the docstring says: torch's default_collate cannot batch these leaves.
    md = MapDataset(_save(tmp_path, _seq))
    with pytest.raises(RuntimeError, match="equal size"):
        next(iter(torch.utils.data.DataLoader(md, batch_size=4)))


@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_sampler_two_replicas(path: str, shuffle: bool) -> None:
    md = MapDataset(path)
    seen = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(
            md, num_replicas=2, rank=rank, shuffle=shuffle, seed=3
        )
        loader = torch.utils.data.DataLoader(md, batch_size=4, sampler=sampler, collate_fn=collate)
        ids = _ids(loader)
        assert ids == list(sampler)
        seen.append(ids)
    assert len(seen[0]) == len(seen[1]) == COUNT // 2
    assert sorted(seen[0] + seen[1]) == list(range(COUNT))


# ------------------------------------------------------------------ Grain


def test_grain_source(path: str) -> None:
    src = DataSource(path)
    sequential = list(ssnp.load(path))
    assert len(src) == COUNT
    assert [canon(src[i]) for i in range(COUNT)] == [canon(e) for e in sequential]
    assert [canon(src[np.int64(i)]) for i in (3, -1)] == [canon(src[3]), canon(src[COUNT - 1])]
    keys = [7, 0, 7, -2]
    want = [canon(sequential[k]) for k in keys]
    assert [canon(e) for e in src.__getitems__(keys)] == want
    assert [canon(e) for e in src._getitems(keys)] == want
    # Grain's source wrapper takes the batched read.
    assert [canon(e) for e in grain.MapDataset.source(src)._getitems(keys)] == want
    with pytest.raises(IndexError, match=f"got {COUNT}"):
        src[COUNT]
    assert isinstance(src, grain.sources.RandomAccessDataSource)
    assert (
        repr(src) == repr(pickle.loads(pickle.dumps(src))) == f"DataSource({path!r}, 24 elements)"
    )
    # collate lays a batch out as get_batch does.
    assert canon(src.collate(src.__getitems__(keys))) == canon(ssnp.load(path).get_batch(keys))
    with pytest.raises(ValueError, match="does not fit"):
        src.collate([{"other": np.zeros(2)}])


def test_grain_map_dataset_pipeline(path: str) -> None:
    src = DataSource(path)

    def epoch(seed: int) -> list[int]:
        ds = grain.MapDataset.source(src).shuffle(seed=seed).batch(5, batch_fn=src.collate)
        assert len(ds) == 5
        return _ids(ds)

    ids = epoch(1)
    assert sorted(ids) == list(range(COUNT))
    assert ids != list(range(COUNT))
    assert epoch(1) == ids != epoch(2)

    # A checkpointable iterator: the state after k batches resumes with the rest, exactly.
    ds = grain.MapDataset.source(src).shuffle(seed=1).batch(5, batch_fn=src.collate)
    it = iter(ds.to_iter_dataset())
    head = [_ids([next(it)]) for _ in range(2)]
    state = it.get_state()
    resumed = iter(ds.to_iter_dataset())
    resumed.set_state(state)
    assert [i for b in head for i in b] + _ids(resumed) == ids


def _loader(src: DataSource, workers: int) -> Any:
    return grain.DataLoader(
        data_source=src,
        sampler=grain.samplers.IndexSampler(
            len(src), grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=5
        ),
        operations=[grain.transforms.Batch(4, batch_fn=src.collate)],
        worker_count=workers,
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_grain_data_loader_and_checkpoint(path: str, workers: int) -> None:
    src = DataSource(path)
    batches = list(_loader(src, workers))
    ids = _ids(batches)
    assert sorted(ids) == list(range(COUNT))
    assert ids != list(range(COUNT))
    if isinstance(batches[0], dict):
        assert np.asarray(batches[0]["img"]).shape == (4, 2, 3)
        assert isinstance(batches[0]["seq"], list)

    for k in (1, 3) if workers == 0 else (3,):  # (each worker_count=2 loader spawns 2 processes)
        it = iter(_loader(src, workers))
        head = _ids([next(it) for _ in range(k)])
        state = it.get_state()
        assert json.loads(state)["data_source"] == repr(src)
        # As after a restart: a new source of the same dataset takes the checkpoint.
        resumed = iter(_loader(DataSource(path), workers))
        resumed.set_state(state)
        assert head + _ids(resumed) == ids


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_dataset_reads_by_position(tmp_path: Any, compression: str) -> None:
    out = _save(tmp_path, _dict, compression=compression, num_shards=2)
    plain = ssnp.load(out)
    want = [plain[i] for i in range(len(plain))]
    for make in (MapDataset, DataSource):
        ds = make(out)
        assert len(ds) == len(want)
        for i in (0, len(want) // 2, len(want) - 1):
            assert int(ds[i]["id"]) == int(want[i]["id"])


def test_dataset_without_index_is_refused(tmp_path: Any) -> None:
    out = _save(tmp_path, _dict, num_shards=2)
    # As a dataset written before indexes existed: no index files, none in the header.
    header_file = os.path.join(out, layout.HEADER_FILE)
    with open(header_file) as f:
        header = json.load(f)
    for shard in header["shards"]:
        os.remove(os.path.join(out, shard.pop("index")["file"]))
    with open(header_file, "w") as f:
        json.dump(header, f)
    assert len(list(ssnp.load(out))) == COUNT  # still reads sequentially
    for make in (MapDataset, DataSource):
        with pytest.raises(UnsupportedError, match="superserial index"):
            make(out)


def test_import_superserial_imports_no_framework(path: str) -> None:
    src = textwrap.dedent(
        """
        import sys
        import superserial
        loaded = {"grain", "torch", "tensorflow"} & set(sys.modules)
        assert not loaded, f"import superserial imported {sorted(loaded)}"
        sys.modules["tensorflow"] = None  # any import of TensorFlow now fails
        from superserial.grain import DataSource
        assert "grain" not in sys.modules and "torch" not in sys.modules
        from superserial.torch import MapDataset
        for e in (DataSource(sys.argv[1])[3], MapDataset(sys.argv[1])[-1]):
            print(int(e["id"] if isinstance(e, dict) else e[0]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", src, path], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["3", str(COUNT - 1)]

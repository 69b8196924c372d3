"""``open_dataset``: the one opening sequence (header, select, host shards, cache, counts).

Nothing of superserial is patched: the order shows in which error comes
first, and that every reader opens through it shows in what it leaves
behind (the header of a cache view, where an idle host's warning points)
and in equal results of ``select`` + ``shard`` + cache across readers.
"""

from __future__ import annotations

import ast
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from superserial.errors import CorruptDataError, DatasetNotFoundError, IdleReaderWarning
from superserial.format.layout import read_header
from superserial.read.opening import OpenedDataset, open_dataset
from superserial.read.selection import select_header

torch = pytest.importorskip("torch")
pytest.importorskip("grain")
fsspec = pytest.importorskip("fsspec")

from superserial.grain import DataSource  # noqa: E402
from superserial.torch import MapDataset, TorchDataset  # noqa: E402

N, SHARDS = 30, 6
SELECT = ["id", "meta/tag"]


def _element(i: tf.Tensor) -> dict[str, Any]:
    return {
        "id": i,
        "x": tf.fill([i % 3 + 1], tf.cast(i, tf.float32)),
        "meta": {"tag": tf.strings.as_string(i * 7), "w": tf.cast(i, tf.float64) / 2},
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> str:
    path = str(tmp_path_factory.mktemp("opening") / "ds")
    superserial.save(tf.data.Dataset.range(N).map(_element), path, num_shards=SHARDS)
    return path


@pytest.fixture
def remote(saved: str) -> Iterator[str]:
    """The dataset copied to a memory:// URL (a remote path: the cache applies)."""
    mem = fsspec.filesystem("memory")
    url = f"memory://opening-{uuid.uuid4().hex[:8]}"
    for name in os.listdir(saved):
        mem.pipe(f"{url}/{name}", Path(saved, name).read_bytes())
    yield url
    mem.rm(url, recursive=True)


def _copy(saved: str, tmp_path: Path) -> str:
    dst = tmp_path / "copy"
    dst.mkdir()
    for name in os.listdir(saved):
        (dst / name).write_bytes(Path(saved, name).read_bytes())
    return str(dst)


def _ids(elements: Any) -> list[int]:
    return [int(e["id"]) for e in elements]


# ------------------------------------------------------------ open_dataset itself


def test_results_of_select_shard_and_counts(saved: str) -> None:
    header = read_header(saved)
    opened = open_dataset(saved, select=SELECT, shard=(1, 4))
    assert isinstance(opened, OpenedDataset)
    assert opened.path == saved and opened.root == saved and opened.lease is None
    assert opened.header == header
    assert opened.selected == select_header(header, SELECT) != header
    assert [leaf.name for leaf in opened.selected.leaves] == ["id", "meta/tag"]
    assert opened.shards == (1, 5)
    assert opened.files == tuple(os.path.join(saved, header.shards[k].file) for k in (1, 5))
    assert opened.counts == tuple(header.shards[k].records for k in (1, 5))
    assert opened.count == sum(opened.counts) > 0
    whole = open_dataset(Path(saved))  # a PathLike too
    assert whole.path == saved and whole.selected is whole.header == header
    assert whole.shards == tuple(range(SHARDS)) and whole.count == N
    with pytest.raises(AttributeError):
        whole.path = "elsewhere"  # type: ignore[misc]  # frozen


def test_select_comes_before_host_shards_before_the_files(saved: str, tmp_path: Path) -> None:
    path = _copy(saved, tmp_path)
    os.remove(os.path.join(path, read_header(path).shards[0].file))
    with pytest.raises(CorruptDataError, match="found no file"):
        open_dataset(path)
    # A bad select= is said first: before the host's shards and before any file is touched.
    with pytest.raises(ValueError, match="unknown 'nope'") as e:
        open_dataset(path, select=["nope"], shard=(7, 2))
    assert not isinstance(e.value, CorruptDataError)
    # Then a bad shard=, still before the files.
    with pytest.raises(ValueError, match=r"shard=\(i, n\) with 0 <= i < n, got \(7, 2\)"):
        open_dataset(path, select=SELECT, shard=(7, 2))
    # Only the picked shards' files are opened... but the cheap check sees the whole directory.
    with pytest.raises(CorruptDataError, match="found no file"):
        open_dataset(path, shard=(1, 2))


def test_a_given_header_is_not_read_again(saved: str, tmp_path: Path) -> None:
    path = _copy(saved, tmp_path)
    header = read_header(path)
    os.remove(os.path.join(path, "header.json"))
    with pytest.raises(DatasetNotFoundError):
        open_dataset(path)
    opened = open_dataset(path, header=header, select=["id"])
    assert opened.header is header and opened.count == N
    assert _ids(ssnp.NumpyDataset.from_opened(opened)) == list(range(N))


def test_unchecked_files_are_only_named(saved: str, tmp_path: Path) -> None:
    path = _copy(saved, tmp_path)
    header = read_header(path)
    os.remove(os.path.join(path, header.shards[2].file))
    opened = open_dataset(path, check_files=False)
    assert opened.files == tuple(os.path.join(path, s.file) for s in header.shards)
    report = superserial.verify(path, progress=False)  # which opens it so, and reports
    assert not report.ok and "found no file" in report.summary()
    with pytest.raises(ValueError, match="expected cache_dir=None and cache_limit=None"):
        open_dataset(path, check_files=False, cache_dir=str(tmp_path / "c"))


def test_only_the_opening_localizes_and_picks_host_shards() -> None:
    """No module but read/opening.py calls the steps it makes one sequence of."""
    src = Path(superserial.__file__).parent
    callers: dict[str, set[str]] = {"localize": set(), "host_shards": set()}
    for file in src.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in callers:
                    callers[name].add(file.relative_to(src).as_posix())
    assert callers == {"localize": {"read/opening.py"}, "host_shards": {"read/opening.py"}}


# ------------------------------------------------------------ every reader opens through it


def _cached_readers(url: str, cdir: str) -> tuple[dict[str, Any], list[Any]]:
    """Each reader of ``url`` with select= and a cache: the lease of its view, and the readers.

    Keep the readers while looking at the views: a view goes with its reader.
    """
    kw: dict[str, Any] = {"select": SELECT, "cache_dir": cdir}
    tf_ds = superserial.load(url, **kw)
    tf_shuffled = superserial.load(url, shuffle=True, seed=3, **kw)
    np_ds = ssnp.load(url, **kw)
    torch_ds = TorchDataset(url, **kw)
    map_ds = MapDataset(url, **kw)
    grain_ds = DataSource(url, **kw)
    leases = {
        "tf": tf_ds._superserial_cache_lease,
        "tf-shuffle": tf_shuffled._superserial_cache_lease,
        "numpy": np_ds.cache_lease,
        "torch": torch_ds._all.cache_lease,
        "torch-map": map_ds.source.cache_lease,
        "grain": grain_ds.source.cache_lease,
    }
    return leases, [tf_ds, tf_shuffled, np_ds, torch_ds, map_ds, grain_ds]


def test_every_cached_view_holds_the_whole_header(remote: str, tmp_path: Path) -> None:
    """select= prunes what is decoded, never the dataset a cache view copies."""
    want = json.loads(read_header(remote).to_json())
    leases, readers = _cached_readers(remote, str(tmp_path / "cache"))
    assert len({lease.view for lease in leases.values()}) == len(leases)  # a view each
    for name, lease in leases.items():
        assert lease is not None and lease.view is not None, name
        with open(os.path.join(lease.view, "header.json"), encoding="utf-8") as f:
            assert json.load(f) == want, name
        assert superserial.verify(lease.view, progress=False).ok, name
    del readers


def test_select_shard_and_cache_agree_across_readers(remote: str, tmp_path: Path) -> None:
    kw: dict[str, Any] = {"select": SELECT, "cache_dir": str(tmp_path / "cache")}
    opened = open_dataset(remote, shard=(1, 3), **kw)
    want = [int(i) for k in opened.shards for i in _shard_ids(remote, k)]
    assert len(want) == opened.count
    got = {
        "tf": [int(e["id"]) for e in superserial.load(remote, shard=(1, 3), **kw)],
        "numpy": _ids(ssnp.load(remote, shard=(1, 3), **kw)),
        "torch": _ids(TorchDataset(remote, rank=1, world_size=3, convert=False, **kw)),
        "torch-map": _ids(MapDataset(remote, shard=(1, 3), **kw)),
    }
    assert got == {name: want for name in got}
    elements = {
        "tf": next(iter(superserial.load(remote, shard=(1, 3), **kw))),
        "numpy": ssnp.load(remote, shard=(1, 3), **kw)[0],
        "torch-map": MapDataset(remote, shard=(1, 3), **kw)[0],
    }
    for name, e in elements.items():
        assert sorted(e) == ["id", "meta"] and sorted(e["meta"]) == ["tag"], name
        assert bytes(np.asarray(e["meta"]["tag"]).item()) == str(want[0] * 7).encode(), name
    # No shard= (Grain, the shuffled order): every element once.
    grain_ds = DataSource(remote, **kw)
    assert sorted(_ids(grain_ds[i] for i in range(len(grain_ds)))) == list(range(N))
    shuffled = superserial.load(remote, shuffle=True, seed=5, **kw)
    assert sorted(int(e["id"]) for e in shuffled) == list(range(N))


def _shard_ids(url: str, k: int) -> np.ndarray:
    """The ids of shard ``k``, read from the uncached URL by its own file alone."""
    opened = open_dataset(url, select=["id"])
    one = ssnp.NumpyDataset(opened.root, opened.selected, [opened.files[k]], [opened.counts[k]])
    return np.array(_ids(one))


@pytest.mark.parametrize("reader", ["tf", "numpy", "torch-map"])
def test_an_idle_host_warning_points_at_the_caller(saved: str, reader: str) -> None:
    make = {
        "tf": lambda: superserial.load(saved, shard=(7, 8)),
        "numpy": lambda: ssnp.load(saved, shard=(7, 8)),
        "torch-map": lambda: MapDataset(saved, shard=(7, 8)),
    }[reader]
    with pytest.warns(IdleReaderWarning, match="host 7 reads nothing") as caught:
        ds = make()
    assert len(ds) == 0
    idle = [w for w in caught if issubclass(w.category, IdleReaderWarning)]
    assert [w.filename for w in idle] == [__file__]

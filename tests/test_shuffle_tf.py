"""load(shuffle=True): the global shuffled order in tf.data, its passes, and exact resume."""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
from conftest import assert_same_value
from matrix import N as MATRIX_N
from matrix import leaf_kinds_dataset
from superserial.errors import IdleReaderWarning, UnsupportedError
from superserial.format import dtypes
from superserial.read.order import permutation
from superserial.tf.shuffled import pass_of, pass_tokens

SEED = 1234


def _save(path: Path, n: int, *, num_shards: int = 3, width: int = 2, **kw: Any) -> str:
    """``n`` elements ``{"i": i, "v": [i] * width}`` (the id is the index)."""
    ids = np.arange(n, dtype=np.int64)
    v = np.repeat(ids[:, None], width, axis=1).astype(np.int32)
    out = str(path)
    superserial.save(
        tf.data.Dataset.from_tensor_slices({"i": ids, "v": v}), out, num_shards=num_shards, **kw
    )
    return out


@pytest.fixture(scope="module")
def sets(tmp_path_factory: Any) -> dict[int, str]:
    """Datasets of n elements: empty, one, two, a prime, not a multiple of 2 or 3, larger."""
    base = tmp_path_factory.mktemp("shuf")
    return {n: _save(base / f"n{n}", n, num_shards=min(3, max(n, 1))) for n in (0, 1, 2, 97, 100)}


def _ids(ds: tf.data.Dataset) -> list[int]:
    return [int(e["i"]) for e in ds]


def _batch_ids(ds: tf.data.Dataset) -> list[list[int]]:
    return [e["i"].numpy().tolist() for e in ds]


@pytest.mark.parametrize("n", [0, 1, 2, 97, 100])
@pytest.mark.parametrize("epoch", [0, 5, 2**64 - 1])
def test_order_is_the_permutation(sets: dict[int, str], n: int, epoch: int) -> None:
    ds = superserial.load(sets[n], shuffle=True, seed=SEED, epoch=epoch)
    assert len(ds) == n
    assert ds.element_spec == superserial.load(sets[n]).element_spec
    assert _ids(ds) == permutation(n, SEED, epoch).tolist()


@pytest.mark.parametrize("batch_size", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batches_are_consecutive_positions(
    sets: dict[int, str], batch_size: int, drop_remainder: bool
) -> None:
    n = 97
    ds = superserial.load(
        sets[n], shuffle=True, seed=SEED, batch_size=batch_size, drop_remainder=drop_remainder
    )
    order = permutation(n, SEED).tolist()
    want = [order[a : a + batch_size] for a in range(0, n, batch_size)]
    if drop_remainder:
        want = [b for b in want if len(b) == batch_size]
    assert len(ds) == len(want)
    assert _batch_ids(ds) == want
    spec = superserial.load(sets[n], batch_size=batch_size, drop_remainder=drop_remainder)
    assert ds.element_spec == spec.element_spec


@pytest.mark.filterwarnings("ignore::superserial.errors.IdleReaderWarning")
@pytest.mark.parametrize("n", [1, 2, 97, 100])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [None, 5])
def test_workers_merge_to_the_global_order(
    sets: dict[int, str], n: int, k: int, batch_size: int | None
) -> None:
    order = permutation(n, SEED, 3)
    merged = np.full(n, -1)
    for i in range(k):
        ds = superserial.load(
            sets[n], shuffle=True, seed=SEED, epoch=3, shard=(i, k), batch_size=batch_size
        )
        got = _ids(ds.unbatch() if batch_size else ds)
        assert got == order[i::k].tolist()
        assert len(ds) == (len(got) if batch_size is None else -(-len(got) // batch_size))
        merged[i::k] = got
    assert merged.tolist() == order.tolist()


def test_more_workers_than_elements_warns(sets: dict[int, str]) -> None:
    with pytest.warns(IdleReaderWarning, match="readers 2..4 of 5 read nothing") as caught:
        ds = superserial.load(sets[2], shuffle=True, seed=SEED, shard=(3, 5))
    assert caught[0].filename == __file__
    assert _ids(ds) == []


def test_epochs_and_seeds_differ(sets: dict[int, str]) -> None:
    orders = {
        tuple(_ids(superserial.load(sets[100], shuffle=True, seed=s, epoch=e)))
        for s in (0, 1)
        for e in (0, 1, 2)
    }
    assert len(orders) == 6
    assert tuple(range(100)) not in orders


def test_seed_none_draws_a_logged_seed(sets: dict[int, str], caplog: Any) -> None:
    with caplog.at_level(logging.INFO, logger="superserial"):
        a = _ids(superserial.load(sets[100], shuffle=True))
        b = _ids(superserial.load(sets[100], shuffle=True))
    assert a != b and sorted(a) == sorted(b) == list(range(100))
    seeds = [int(s) for s in re.findall(r"drew seed=(\d+)", caplog.text)]
    assert len(seeds) == 2
    assert a == permutation(100, seeds[0]).tolist()
    assert b == permutation(100, seeds[1]).tolist()


def test_each_iteration_is_the_next_epoch(sets: dict[int, str]) -> None:
    n, e = 97, 10
    ds = superserial.load(sets[n], shuffle=True, seed=SEED, epoch=e)
    # The same dataset object goes on counting: a new iterator is the next pass...
    assert _ids(ds) == permutation(n, SEED, e).tolist()
    assert _ids(ds) == permutation(n, SEED, e + 1).tolist()
    # ... and so is each pass of a repeat.
    want = np.concatenate([permutation(n, SEED, e + k) for k in range(2, 5)]).tolist()
    assert _ids(ds.repeat(3)) == want
    # A new load starts again at its epoch.
    assert (
        _ids(superserial.load(sets[n], shuffle=True, seed=SEED, epoch=e))
        == permutation(n, SEED, e).tolist()
    )


def test_epoch_wraps_around(sets: dict[int, str]) -> None:
    ds = superserial.load(sets[100], shuffle=True, seed=SEED, epoch=2**64 - 1)
    assert _ids(ds.repeat(2))[100:] == permutation(100, SEED, 0).tolist()


def _save_ckpt(it: Any, directory: Path) -> tuple[str, int]:
    prefix = tf.train.Checkpoint(iterator=it).save(str(directory / "ckpt"))
    return prefix, sum(os.path.getsize(f) for f in glob.glob(prefix + "*"))


def _restore(ds: tf.data.Dataset, prefix: str) -> Any:
    it = iter(ds)
    tf.train.Checkpoint(iterator=it).restore(prefix).assert_consumed()
    return it


def _take(it: Any, m: int) -> list[int]:
    return [int(next(it)["i"]) for _ in range(m)]


@pytest.mark.parametrize("consumed", [0, 1, 40, 96])
def test_resume_mid_epoch(sets: dict[int, str], tmp_path: Path, consumed: int) -> None:
    n = 97

    def make() -> tf.data.Dataset:
        return superserial.load(sets[n], shuffle=True, seed=SEED, epoch=4)

    it = iter(make())
    first = _take(it, consumed)
    prefix, _ = _save_ckpt(it, tmp_path)
    rest = [int(e["i"]) for e in it]
    assert first + rest == permutation(n, SEED, 4).tolist()
    # In a new dataset, as after a restart: exactly the rest.
    assert [int(e["i"]) for e in _restore(make(), prefix)] == rest


@pytest.mark.parametrize("batch_size", [4, 64])
def test_resume_batches(sets: dict[int, str], tmp_path: Path, batch_size: int) -> None:
    def make() -> tf.data.Dataset:
        return superserial.load(sets[100], shuffle=True, seed=SEED, batch_size=batch_size)

    it = iter(make())
    next(it)
    prefix, _ = _save_ckpt(it, tmp_path)
    rest = [e["i"].numpy().tolist() for e in it]
    assert [e["i"].numpy().tolist() for e in _restore(make(), prefix)] == rest
    assert [i for b in rest for i in b] == permutation(100, SEED).tolist()[batch_size:]


@pytest.mark.parametrize("consumed", [97, 97 + 50, 2 * 97])
def test_resume_across_passes(sets: dict[int, str], tmp_path: Path, consumed: int) -> None:
    n = 97

    def make() -> tf.data.Dataset:
        return superserial.load(sets[n], shuffle=True, seed=SEED, epoch=7).repeat()

    want = np.concatenate([permutation(n, SEED, 7 + k) for k in range(5)]).tolist()
    it = iter(make())
    assert _take(it, consumed) == want[:consumed]
    prefix, _ = _save_ckpt(it, tmp_path)
    left = len(want) - consumed
    assert _take(_restore(make(), prefix), left) == want[consumed:]
    assert _take(it, left) == want[consumed:]


def test_resume_in_another_process(sets: dict[int, str], tmp_path: Path) -> None:
    n = 97
    it = iter(superserial.load(sets[n], shuffle=True, seed=SEED).repeat())
    _take(it, 2 * n + 3)
    prefix, _ = _save_ckpt(it, tmp_path)
    want = _take(it, n)
    code = textwrap.dedent(
        f"""
        import json, tensorflow as tf, superserial
        tf.random.set_seed(99)  # TF's global seed plays no part
        it = iter(superserial.load({sets[n]!r}, shuffle=True, seed={SEED}).repeat())
        tf.train.Checkpoint(iterator=it).restore({prefix!r}).assert_consumed()
        print(json.dumps([int(next(it)["i"]) for _ in range({n})]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == want


def test_checkpoint_holds_positions_not_records(tmp_path: Path) -> None:
    """Its size grows neither with the position nor with the records' size."""
    sizes: dict[tuple[int, int | None], list[int]] = {}
    # 3 parse chunks of 1,024 tiny records; 3 chunks of 20 records of 200 KB.
    for n, width in ((3000, 1), (60, 50_000)):
        path = _save(tmp_path / f"w{width}", n, width=width)
        for batch_size in (None, 8):
            ds = superserial.load(path, shuffle=True, seed=SEED, batch_size=batch_size)
            it, at = iter(ds), 0
            # Past the first chunk, at a third, two thirds and the end.
            for stop in (len(ds) // 2, 3 * len(ds) // 4, len(ds) - 1):
                for _ in range(stop - at):
                    next(it)
                at = stop
                d = tmp_path / f"c{width}-{batch_size}-{at}"
                sizes.setdefault((width, batch_size), []).append(_save_ckpt(it, d)[1])
    for row in sizes.values():
        assert max(row) - min(row) <= 64, sizes
        assert max(row) < 6 << 10, sizes  # a record of the wide set alone is 200 KB


def test_no_stateful_warnings(sets: dict[int, str], tmp_path: Path, capfd: Any) -> None:
    """No map function is stateful: TF would warn at every element (symbolic checkpoints)."""
    for batch_size in (None, 64):
        it = iter(superserial.load(sets[100], shuffle=True, seed=SEED, batch_size=batch_size))
        next(it)
        _save_ckpt(it, tmp_path / str(batch_size))
        list(it)
    assert "stateful" not in capfd.readouterr().err


def test_sequential_load_is_untouched(sets: dict[int, str]) -> None:
    assert not superserial.load(sets[100]).options().experimental_symbolic_checkpoint
    assert _ids(superserial.load(sets[100])) == list(range(100))


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_dataset_shuffles_at_load(tmp_path: Path, compression: str) -> None:
    path = _save(tmp_path / "c", 100, compression=compression)
    ds = superserial.load(path, shuffle=True, seed=1, epoch=3)
    assert _ids(ds) == permutation(100, 1, 3).tolist()
    windowed = superserial.load(path, shuffle=True, seed=1, epoch=3, shuffle_window=16)
    assert _ids(windowed) == permutation(100, 1, 3, window=16).tolist()


def test_dataset_without_index_is_refused_at_load(tmp_path: Path) -> None:
    path = _save(tmp_path / "u", 10)
    hpath = os.path.join(path, "header.json")
    obj = json.loads(Path(hpath).read_text())
    for s in obj["shards"]:
        os.remove(os.path.join(path, s.pop("index")["file"]))
    Path(hpath).write_text(json.dumps(obj))
    assert _ids(superserial.load(path)) == list(range(10))
    with pytest.raises(UnsupportedError, match=f"`superserial index {re.escape(path)}`"):
        superserial.load(path, shuffle=True, seed=1)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.0, "3", True, [1]])
def test_bad_seed(sets: dict[int, str], seed: Any) -> None:
    with pytest.raises(ValueError, match="expected seed to be an integer in"):
        superserial.load(sets[2], shuffle=True, seed=seed)


@pytest.mark.parametrize("epoch", [-1, 2**64, 0.5, False])
def test_bad_epoch(sets: dict[int, str], epoch: Any) -> None:
    with pytest.raises(ValueError, match="expected epoch to be an integer in"):
        superserial.load(sets[2], shuffle=True, seed=1, epoch=epoch)


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0), (True, 2), (0, 1.0), (0,)])
def test_bad_shard(sets: dict[int, str], shard: Any) -> None:
    with pytest.raises(ValueError, match=r"shard=|worker"):
        superserial.load(sets[2], shuffle=True, seed=1, shard=shard)


def test_other_arguments(sets: dict[int, str]) -> None:
    with pytest.raises(ValueError, match="epoch=0 without shuffle=True"):
        superserial.load(sets[2], epoch=1)
    with pytest.raises(ValueError, match="shuffle_files=False with shuffle=True"):
        superserial.load(sets[2], shuffle=True, shuffle_files=True)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        superserial.load(sets[2], shuffle=True, batch_size=0)
    with pytest.raises(UnsupportedError, match=r"super_serial 2\.0 pair"):
        superserial.load("old.tfrecord", "old.header", shuffle=True)
    ds = superserial.load(sets[97], shuffle=True, seed=SEED, assert_cardinality=False)
    assert ds.cardinality() == tf.data.UNKNOWN_CARDINALITY
    assert _ids(ds) == permutation(97, SEED).tolist()


# ------------------------------------------------------------------ the windowed order


@pytest.mark.filterwarnings("ignore::superserial.errors.IdleReaderWarning")
# Batches of 64 are read 64 positions at a time: W = 1 and 70 (for 2 and 3
# readers) are read by the batches that span them, 70 (1 reader) and 1,000
# (n < W) a window at a time.
@pytest.mark.parametrize("window", [1, 70, 1000])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_windowed_workers_merge_to_the_order(sets: dict[int, str], window: int, k: int) -> None:
    n = 97
    order = permutation(n, SEED, 3, window=window)
    merged = np.full(n, -1)
    for i in range(k):
        ds = superserial.load(
            sets[n],
            shuffle=True,
            seed=SEED,
            epoch=3,
            shard=(i, k),
            batch_size=64,
            shuffle_window=window,
        )
        got = [j for b in _batch_ids(ds) for j in b]
        assert got == order[i::k].tolist()
        merged[i::k] = got
    assert merged.tolist() == order.tolist()
    assert merged.tolist() != permutation(n, SEED, 3).tolist()


def test_windowed_passes_are_the_epochs(sets: dict[int, str]) -> None:
    ds = superserial.load(sets[100], shuffle=True, seed=SEED, epoch=4, shuffle_window=30)
    want = np.concatenate([permutation(100, SEED, 4 + k, window=30) for k in range(2)])
    assert _ids(ds.repeat(2)) == want.tolist()


@pytest.mark.parametrize("headless", [True, False])
def test_windowed_reads_each_group_once(tmp_path: Path, monkeypatch: Any, headless: bool) -> None:
    """Each group's records (5 windows, whole blocks) come in one batched read by offset."""
    from superserial.read import group_reads
    from superserial.read.random_access import RecordReader

    path = _save(tmp_path / "ds", 4000)
    calls: list[int] = []
    read_packed = RecordReader.read_packed

    def counted(self: Any, indices: np.ndarray, amplification: float | None = None) -> Any:
        calls.append(len(indices))
        return read_packed(self, indices, amplification)

    monkeypatch.setattr(RecordReader, "read_packed", counted)
    if not headless:
        monkeypatch.setattr(group_reads, "HEADLESS_BYTES", -1)
    ds = superserial.load(path, shuffle=True, seed=SEED, batch_size=64, shuffle_window=300)
    got = [i for b in _batch_ids(ds) for i in b]
    assert got == permutation(4000, SEED, window=300).tolist()
    # Groups of 1,500 (300 blocks of 5), two of them, and the rest of 1,000; 63 batches.
    # Above HEADLESS_BYTES, the first, cold, group's head (the first batch and the next
    # 448 positions) comes before it, so that the first batch does not wait for the group.
    assert sorted(calls) == ([] if headless else [512]) + [1000, 1500, 1500]


@pytest.mark.parametrize("consumed", [1, 3])  # mid-window; in the next pass
def test_windowed_resume_mid_window_by_batches(
    sets: dict[int, str], tmp_path: Path, consumed: int
) -> None:
    def make() -> tf.data.Dataset:
        # Batches of 64 of a group of 100 (the rest: 100 < 5 * 70): read at once.
        return superserial.load(
            sets[100], shuffle=True, seed=SEED, batch_size=64, shuffle_window=70
        ).repeat()

    want = np.concatenate([permutation(100, SEED, k, window=70) for k in range(3)]).tolist()
    it = iter(make())
    head = [i for _ in range(consumed) for i in next(it)["i"].numpy().tolist()]
    prefix, _ = _save_ckpt(it, tmp_path)
    resumed = _restore(make(), prefix)
    rest = [i for _ in range(4 - consumed) for i in next(resumed)["i"].numpy().tolist()]
    assert head + rest == want[:200]


@pytest.mark.parametrize("consumed", [3, 45, 100 + 17])  # mid-window; in the second; in pass 2
def test_windowed_resume_mid_window(sets: dict[int, str], tmp_path: Path, consumed: int) -> None:
    def make() -> tf.data.Dataset:
        return superserial.load(
            sets[100], shuffle=True, seed=SEED, epoch=2, shuffle_window=30
        ).repeat()

    want = np.concatenate([permutation(100, SEED, 2 + k, window=30) for k in range(3)]).tolist()
    it = iter(make())
    assert _take(it, consumed) == want[:consumed]
    prefix, _ = _save_ckpt(it, tmp_path)
    left = len(want) - consumed
    assert _take(_restore(make(), prefix), left) == want[consumed:]


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "8"])
def test_bad_shuffle_window(sets: dict[int, str], window: Any) -> None:
    with pytest.raises(ValueError, match="expected shuffle_window to be None or an integer in"):
        superserial.load(sets[2], shuffle=True, seed=1, shuffle_window=window)
    with pytest.raises(ValueError, match="shuffle_window=None without shuffle=True"):
        superserial.load(sets[2], shuffle_window=4)


def test_pass_tokens_map_back_to_passes() -> None:
    k = 5000  # past the first chunk the first load computes
    tokens = next(iter(pass_tokens().repeat(k + 1).batch(k + 1))).numpy()
    for p in (0, 1, 4095, 4096, k, 3, k - 1):
        assert pass_of(tokens[p]) == p
    # The sequence is the same whatever TF's global seed.
    tf.random.set_seed(5)
    again = next(iter(pass_tokens().repeat(3).batch(3))).numpy()
    assert again.tolist() == tokens[:3].tolist()


def test_foreign_pass_token_is_refused(monkeypatch: Any) -> None:
    import superserial.tf.shuffled as sr

    monkeypatch.setattr(sr, "MAX_PASSES", 8192)
    with pytest.raises(ValueError, match="expected a pass token of one of the first 8192"):
        pass_of(np.array([1, 2], dtype=np.int64))


@pytest.mark.parametrize("dtype", ["float32", "string", "bool"])
def test_every_leaf_kind(tmp_path: Path, dtype: str) -> None:
    entry = next(e for e in dtypes.DTYPES if e.name == dtype)
    path = str(tmp_path / dtype)
    superserial.save(leaf_kinds_dataset(entry), path, num_shards=2)
    in_order = superserial.load(path)  # one load for the elements and the spec (a load traces)
    sequential = list(in_order)
    for epoch in (0, 1):
        ds = superserial.load(path, shuffle=True, seed=SEED, epoch=epoch)
        assert ds.element_spec == in_order.element_spec
        got = list(ds)
        order = permutation(MATRIX_N, SEED, epoch)
        assert len(got) == MATRIX_N
        for pos, (element, index) in enumerate(zip(got, order, strict=True)):
            assert_same_value(sequential[index], element, where=f"{dtype} position {pos}")


# Both kinds of shuffled read in flight at exit, in one interpreter: element by element
# and in batches (each starts a TensorFlow in the child; one child for both halves the cost).
_EXIT_SCRIPT = """
import sys
import superserial
live = [iter(superserial.load(sys.argv[1], shuffle=True, seed=0, batch_size=b)) for b in (None, 64)]
for it in live:
    next(it)
print("read", flush=True)
"""


def test_process_exits_with_live_shuffled_iterators(tmp_path):
    """Iterators alive at exit must not hang the interpreter (numpy_function reads in flight)."""
    path = str(tmp_path / "ds")
    superserial.save(
        tf.data.Dataset.range(20000).map(lambda i: {"i": i, "v": tf.fill([20], i)}), path
    )
    # Three at once, not one after another: a hang is a race, and each child's wait
    # (TensorFlow's import, its exit) overlaps the others' instead of adding up.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _EXIT_SCRIPT, path],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(3)
    ]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and b"read" in out, err[-2000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

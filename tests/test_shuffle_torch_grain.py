"""The global shuffled order in PyTorch (superserial.torch.Sampler) and Grain (superserial.grain.dataset)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
grain = pytest.importorskip("grain")

import superserial  # noqa: E402
import superserial.numpy as snp  # noqa: E402
from superserial.grain import DataSource, dataset  # noqa: E402
from superserial.read.order import permutation  # noqa: E402
from superserial.torch import MapDataset, Sampler, collate  # noqa: E402

COUNT = 23  # prime: no number of replicas or batch size divides it
BATCH = 4  # 6 batches per epoch, the last of 3
SEED = 1234

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def _element(i: Any) -> Any:
    import tensorflow as tf

    return {"id": i, "x": tf.fill([2], tf.cast(i, tf.float32))}


def _save(root: Any, **kwargs: Any) -> str:
    import tensorflow as tf

    out = str(root / "ds")
    superserial.save(tf.data.Dataset.range(COUNT).map(_element), out, **kwargs)
    return out


@pytest.fixture(scope="module")
def path(tmp_path_factory: Any) -> str:
    """COUNT elements in 3 uncompressed shards."""
    return _save(tmp_path_factory.mktemp("shuffled"), num_shards=3)


def _order(n: int, seed: int, epoch: int) -> list[int]:
    return [int(i) for i in permutation(n, seed, epoch)]


# ------------------------------------------------------------------ Sampler


@pytest.mark.parametrize("n", [0, 1, 2, 23, 9001])  # 9001: prime, > 2 chunks of positions
@pytest.mark.parametrize("k", [1, 2, 3])
def test_sampler_ranks_merge_to_the_global_order(n: int, k: int) -> None:
    for epoch in (0, 5):
        order = _order(n, SEED, epoch)
        merged = [-1] * n
        for rank in range(k):
            sampler = Sampler(n, seed=SEED, num_replicas=k, rank=rank)
            sampler.set_epoch(epoch)
            got = list(sampler)
            assert got == order[rank::k]
            assert len(sampler) == len(got) == len(range(rank, n, k))
            assert all(type(i) is int for i in got[:3])
            merged[rank::k] = got
        assert merged == order


@pytest.mark.parametrize("k", [1, 3])
def test_sampler_without_shuffle_is_the_identity(k: int) -> None:
    for rank in range(k):
        sampler = Sampler(COUNT, seed=SEED, shuffle=False, num_replicas=k, rank=rank)
        sampler.set_epoch(3)
        assert list(sampler) == list(range(rank, COUNT, k))


def test_sampler_epochs_and_seeds_differ() -> None:
    sampler = Sampler(COUNT, seed=SEED)
    orders = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
        assert list(sampler) == orders[-1]  # an epoch is repeatable
    assert len({tuple(o) for o in orders}) == 4
    assert sorted(orders[0]) == list(range(COUNT))
    assert list(Sampler(COUNT, seed=SEED + 1)) != orders[0]


@pytest.mark.parametrize("seed", [-1, 2**64, 1.0, "1", None, True, [1]])
def test_sampler_bad_seed(seed: Any) -> None:
    with pytest.raises(ValueError, match="expected seed to be an integer in"):
        Sampler(COUNT, seed=seed)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": -1}, r"expected n to be an integer in \[0, 2\*\*62\], got -1"),
        ({"n": 2.0}, "expected n to be an integer, got float"),
        ({"num_replicas": 2, "rank": 2}, "expected 0 <= rank < num_replicas, got rank=2"),
        ({"num_replicas": 0}, "got rank=0 num_replicas=0"),
        ({"rank": -1}, "got rank=-1 num_replicas=1"),
        ({"rank": 1}, "got rank=1 num_replicas=1"),  # no process group: one replica
    ],
)
def test_sampler_bad_arguments(kwargs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sampler(**{"n": COUNT, "seed": SEED, **kwargs})


def test_sampler_bad_epoch() -> None:
    with pytest.raises(ValueError, match="expected epoch to be an integer"):
        Sampler(COUNT, seed=SEED).set_epoch(-1)


def test_sampler_state_dict_resumes_directly() -> None:
    sampler = Sampler(COUNT, seed=SEED, num_replicas=2, rank=1)
    sampler.set_epoch(2)
    it = iter(sampler)
    head = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    assert state == {
        "n": COUNT,
        "seed": SEED,
        "shuffle": True,
        "shuffle_window": None,
        "num_replicas": 2,
        "rank": 1,
        "epoch": 2,
        "yielded": 5,
    }
    again = Sampler(COUNT, seed=SEED, num_replicas=2, rank=1)
    again.set_epoch(2)
    again.load_state_dict(state)
    assert head + list(again) == _order(COUNT, SEED, 2)[1::2]
    assert again.state_dict()["yielded"] == len(again) == 11
    assert list(again) == _order(COUNT, SEED, 2)[1::2]  # a state applies to one iteration


def test_sampler_state_of_another_epoch() -> None:
    sampler = Sampler(COUNT, seed=SEED)
    sampler.set_epoch(1)
    it = iter(sampler)
    next(it)
    mid = sampler.state_dict()
    list(it)
    done = sampler.state_dict()
    again = Sampler(COUNT, seed=SEED)  # epoch 0: set_epoch(1) forgotten
    again.load_state_dict(mid)
    with pytest.raises(ValueError, match=r"resume epoch 1 .*got epoch 0: call set_epoch\(1\)"):
        iter(again)
    # A finished epoch's state leaves nothing to resume: another epoch starts afresh.
    again.load_state_dict(done)
    again.set_epoch(2)
    assert list(again) == _order(COUNT, SEED, 2)
    # ... and the finished epoch itself has nothing left.
    again.load_state_dict(done)
    again.set_epoch(1)
    assert list(again) == []
    # The state is of the latest iteration, even once set_epoch has moved on.
    sampler.set_epoch(2)
    assert sampler.state_dict() == done
    fresh = Sampler(COUNT, seed=SEED)
    assert fresh.state_dict()["epoch"] == fresh.state_dict()["yielded"] == 0
    fresh.set_epoch(4)
    assert fresh.state_dict()["epoch"] == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": SEED + 1}, "seed=1234 .* got seed=1235"),
        ({"rank": 1, "num_replicas": 2}, "num_replicas=1 .* got num_replicas=2"),
        ({"n": COUNT + 1}, "n=23 .* got n=24"),
        ({"shuffle": False}, "shuffle=True .* got shuffle=False"),
        ({"shuffle_window": 5}, "shuffle_window=None .* got shuffle_window=5"),
        ({"yielded": COUNT + 1}, r"yielded in \[0, 23\] .* got 24"),
        ({"epoch": -1}, "expected the state's epoch to be an integer"),
        ({"extra": 1}, "expected a Sampler state with keys"),
    ],
)
def test_sampler_refuses_a_foreign_state(change: Any, message: str) -> None:
    sampler = Sampler(COUNT, seed=SEED)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict({**sampler.state_dict(), **change})


@pytest.mark.timeout(120)
def test_sampler_defaults_from_torch_distributed(tmp_path: Any) -> None:
    # Two real processes in a gloo process group: rank and world size come from it.
    src = textwrap.dedent(
        """
        import json, sys
        import torch.distributed as dist
        from superserial.torch import Sampler
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank,
                                world_size=2)
        s = Sampler(23, seed=1234)
        print(json.dumps([s.rank, s.num_replicas, list(s)]), flush=True)
        dist.barrier()  # neither leaves while the other may still talk to it
        dist.destroy_process_group()
        """
    )
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", src, str(rank), store],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    results = [p.communicate(timeout=100) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, results, strict=True)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}: {out}\n{err[-3000:]}"
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    order = _order(COUNT, SEED, 0)
    assert got == [[0, 2, order[0::2]], [1, 2, order[1::2]]]


# ------------------------------------------------------------------ StatefulDataLoader


def _loader(path: str, num_workers: int, **kwargs: Any) -> tuple[Any, Sampler]:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    sampler = Sampler(COUNT, seed=SEED)
    loader = sdl.StatefulDataLoader(
        MapDataset(path),
        sampler=sampler,
        batch_size=BATCH,
        num_workers=num_workers,
        collate_fn=collate,
        **kwargs,
    )
    return loader, sampler


def _train(
    loader: Any,
    sampler: Sampler,
    *,
    start: int = 0,
    stop_in: tuple[int, int] | None = None,
    stop_after: int | None = None,
    stop_before: int | None = None,
) -> tuple[list[list[int]], Any]:
    """A training loop over epochs 0 and 1: the batches' ids, and a checkpoint where it stops.

    ``stop_in=(e, b)``: checkpoint inside the loop, after batch ``b`` of epoch
    ``e``; ``stop_after=e``: after epoch ``e``'s loop has ended;
    ``stop_before=e``: after ``set_epoch(e)``, before epoch ``e``'s loop.
    """
    seen = []
    for epoch in range(start, 2):
        sampler.set_epoch(epoch)
        if stop_before == epoch:
            return seen, loader.state_dict()
        for b, batch in enumerate(loader):
            seen.append([int(i) for i in batch["id"]])
            assert batch["x"].shape == (len(seen[-1]), 2)
            if stop_in == (epoch, b):
                return seen, loader.state_dict()
        if stop_after == epoch:
            return seen, loader.state_dict()
    return seen, None


def _batches(epoch: int) -> list[list[int]]:
    order = _order(COUNT, SEED, epoch)
    return [order[i : i + BATCH] for i in range(0, COUNT, BATCH)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("num_workers", "options"),
    [
        (0, {}),
        (2, {}),
        # Workers kept across epochs; the loader's own snapshot every 3 batches
        # (it replays the batches since).
        (2, {"persistent_workers": True, "snapshot_every_n_steps": 3}),
    ],
)
def test_stateful_dataloader_resumes_exactly(
    path: str, num_workers: int, options: dict[str, Any]
) -> None:
    expected = _batches(0) + _batches(1)
    full, _ = _train(*_loader(path, num_workers, **options))
    assert full == expected
    cuts: list[dict[str, Any]] = [
        {"stop_in": (0, 1)},  # mid-epoch (workers have prefetched beyond it)
        {"stop_in": (0, 5)},  # after the last batch, the loop not yet ended
        {"stop_after": 0},  # after the epoch's loop: the next epoch starts afresh
        {"stop_before": 1},  # ... also when set_epoch(1) came before the checkpoint
        {"stop_in": (1, 3)},  # mid-epoch in a later epoch
    ]
    for cut in cuts:
        head, state = _train(*_loader(path, num_workers, **options), **cut)
        loader, sampler = _loader(path, num_workers, **options)  # as in a new process
        loader.load_state_dict(state)
        epoch = cut["stop_in"][0] if "stop_in" in cut else 1
        tail, _ = _train(loader, sampler, start=epoch)
        assert head + tail == expected, cut
        assert tail, cut


def test_stateful_dataloader_refuses_a_forgotten_epoch(path: str) -> None:
    _, state = _train(*_loader(path, 0), stop_in=(1, 2))
    loader, _ = _loader(path, 0)
    loader.load_state_dict(state)
    with pytest.raises(ValueError, match=r"call set_epoch\(1\)"):
        next(iter(loader))


# ------------------------------------------------------------------ Grain


def _ids(elements: Any) -> list[int]:
    return [int(e["id"]) for e in elements]


@pytest.mark.parametrize("epoch", [0, 1, 7])
def test_grain_dataset_order(path: str, epoch: int) -> None:
    ds = dataset(path, seed=SEED, epoch=epoch)
    assert isinstance(ds, grain.MapDataset)
    assert len(ds) == COUNT
    order = _order(COUNT, SEED, epoch)
    assert _ids(ds) == order
    assert _ids(ds[i] for i in range(COUNT)) == order
    assert [int(b["id"][0]) for b in ds.batch(1)] == order
    # Grain's batched read, across passes too (what repeat() asks past n).
    picked = [5, 0, 5, COUNT + 2, 3 * COUNT - 1]
    assert _ids(ds._getitems(picked)) == [int(ds[i]["id"]) for i in picked]
    assert _ids(ds._getitems(picked)) == [
        _order(COUNT, SEED, epoch + i // COUNT)[i % COUNT] for i in picked
    ]
    assert ds._getitems([]) == []
    # Worker i of k takes ds[i::k], positions i, i+k, ... of the same order.
    for k in (2, 3):
        merged = [-1] * COUNT
        for i in range(k):
            merged[i::k] = _ids(ds[i::k])
        assert merged == order
    assert _ids(dataset(path, seed=SEED, shuffle=False, epoch=epoch)) == list(range(COUNT))


@pytest.mark.parametrize("n", [1, 1000, 70 * 256 + 3])  # several blocks; more than are kept
def test_grain_order_over_any_map_dataset(n: int) -> None:
    from superserial.integrations.grain.shuffle import ShuffledMapDataset

    ds = ShuffledMapDataset(grain.MapDataset.range(n), seed=SEED, epoch=4)
    order = _order(n, SEED, 4)
    assert [ds[i] for i in range(n)] == order
    if n < 2000:
        assert list(ds) == order  # through a Grain iterator (and its threads)
    rng = np.random.default_rng(0)
    picked = rng.integers(0, 3 * n, size=300).tolist()  # random access, across passes
    passes = [order, _order(n, SEED, 5), _order(n, SEED, 6)]
    expected = [passes[i // n][i % n] for i in picked]
    assert [ds[i] for i in picked] == expected
    assert list(ds._getitems(picked)) == expected


def test_grain_dataset_repeat_gives_later_epochs(path: str) -> None:
    ds = dataset(path, seed=SEED, epoch=2)
    assert _ids(ds.repeat(3)) == [i for e in (2, 3, 4) for i in _order(COUNT, SEED, e)]
    endless = ds.repeat()
    assert int(endless[5 * COUNT + 4]["id"]) == _order(COUNT, SEED, 7)[4]
    assert _ids(ds.repeat(2, reseed_each_epoch=False)) == _order(COUNT, SEED, 2) * 2


def test_grain_dataset_draws_a_seed(path: str) -> None:
    a, b = dataset(path), dataset(path)
    assert a.shuffle_seed != b.shuffle_seed
    assert _ids(a) == _order(COUNT, a.shuffle_seed, 0)
    assert dataset(path, seed=SEED).shuffle_seed == SEED


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "1", True])
def test_grain_dataset_bad_seed(path: str, seed: Any) -> None:
    with pytest.raises(ValueError, match="expected seed to be an integer in"):
        dataset(path, seed=seed)


def test_grain_dataset_bad_index(path: str) -> None:
    ds = dataset(path, seed=SEED)
    with pytest.raises(IndexError, match=r"non-negative indices into ShuffledMapDataset.* got -1"):
        ds[-1]
    with pytest.raises(IndexError, match="got -2"):
        ds._getitems([0, -2])
    with pytest.raises(ValueError, match="epoch"):
        dataset(path, seed=SEED, epoch=2**64 - 1)[COUNT]  # past the last epoch


def _pipeline(source: DataSource, batched: bool, repeat: bool) -> Any:
    ds = dataset(source, seed=SEED)
    if repeat:
        ds = ds.repeat(2)
    if batched:
        ds = ds.batch(BATCH, batch_fn=source.collate)
    return ds.to_iter_dataset()


def _flat_ids(items: list[Any], batched: bool) -> list[int]:
    if batched:
        return [int(i) for b in items for i in b["id"]]
    return _ids(items)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize(("repeat", "taken"), [(False, 3), (True, 4), (True, 7)])
def test_grain_iterator_resumes_exactly(path: str, batched: bool, repeat: bool, taken: int) -> None:
    # taken: elements (or batches) read before the checkpoint; with repeat(2),
    # 4 batches / 7 elements stop in epoch 0 and the rest crosses into epoch 1.
    source = DataSource(path)
    expected = _order(COUNT, SEED, 0) + (_order(COUNT, SEED, 1) if repeat else [])
    it = iter(_pipeline(source, batched, repeat))
    head = [next(it) for _ in range(taken)]
    state = it.get_state()
    rest = list(it)
    assert _flat_ids(head + rest, batched) == expected
    resumed = iter(_pipeline(DataSource(path), batched, repeat))  # as in a new process
    resumed.set_state(state)
    assert _flat_ids(head, batched) + _flat_ids(list(resumed), batched) == expected


# ------------------------------------------------------------------ the windowed order

WINDOW = 5  # windows of 5, 5, 5, 5 and 3 positions


def _windowed(n: int, seed: int, epoch: int, window: int = WINDOW) -> list[int]:
    return [int(i) for i in permutation(n, seed, epoch, window=window)]


@pytest.mark.parametrize(
    ("n", "window"), [(23, WINDOW), (23, 100), (9001, 8192)]
)  # 8192: runs of 2
@pytest.mark.parametrize("k", [1, 2, 3])
def test_windowed_sampler_ranks_merge_to_the_order(n: int, window: int, k: int) -> None:
    order = _windowed(n, SEED, 5, window)
    merged = [-1] * n
    for rank in range(k):
        sampler = Sampler(n, seed=SEED, shuffle_window=window, num_replicas=k, rank=rank)
        sampler.set_epoch(5)
        merged[rank::k] = list(sampler)
    assert merged == order
    assert order != _order(n, SEED, 5)


def test_windowed_sampler_resumes_mid_window() -> None:
    sampler = Sampler(COUNT, seed=SEED, shuffle_window=WINDOW, num_replicas=2, rank=1)
    sampler.set_epoch(2)
    it = iter(sampler)
    head = [next(it) for _ in range(4)]  # positions 1, 3, 5, 7: in the second window
    state = sampler.state_dict()
    assert state["shuffle_window"] == WINDOW and state["yielded"] == 4
    again = Sampler(COUNT, seed=SEED, shuffle_window=WINDOW, num_replicas=2, rank=1)
    again.set_epoch(2)
    again.load_state_dict(state)
    assert head + list(again) == _windowed(COUNT, SEED, 2)[1::2]
    # Another window (or none) would resume another order.
    for other in (None, WINDOW + 1):
        with pytest.raises(ValueError, match=f"shuffle_window={other!r} .* got shuffle_window=5"):
            Sampler(COUNT, seed=SEED, shuffle_window=other, num_replicas=2, rank=1).load_state_dict(
                state
            )
    # A state from before windowed orders is of the global order.
    old = {k: v for k, v in Sampler(COUNT, seed=SEED).state_dict().items() if k != "shuffle_window"}
    Sampler(COUNT, seed=SEED).load_state_dict(old)
    with pytest.raises(ValueError, match=r"shuffle_window=5 .* got shuffle_window=None"):
        Sampler(COUNT, seed=SEED, shuffle_window=WINDOW).load_state_dict(old)


def test_windowed_stateful_dataloader_resumes_mid_window(path: str) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        sampler = Sampler(COUNT, seed=SEED, shuffle_window=7)  # batches of 4 cut windows of 7
        sampler.set_epoch(1)
        return sdl.StatefulDataLoader(
            MapDataset(path), sampler=sampler, batch_size=BATCH, collate_fn=collate
        )

    loader = make()
    it = iter(loader)
    head = [int(i) for _ in range(2) for i in next(it)["id"]]  # 8 positions: mid-window
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [int(i) for b in resumed for i in b["id"]]
    assert head + rest == _windowed(COUNT, SEED, 1, 7)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"shuffle_window": 0},
            r"shuffle_window to be None or an integer in \[1, 2\*\*62\], got 0",
        ),
        ({"shuffle_window": 2.0}, "shuffle_window to be None or an integer"),
        ({"shuffle_window": True}, "shuffle_window to be None or an integer"),
        ({"shuffle_window": 4, "shuffle": False}, "shuffle_window=None with shuffle=False"),
    ],
)
def test_windowed_bad_arguments(path: str, kwargs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sampler(COUNT, seed=SEED, **kwargs)
    with pytest.raises(ValueError, match=message):
        dataset(path, seed=SEED, **kwargs)


def test_windowed_grain_dataset_order(path: str) -> None:
    ds = dataset(path, seed=SEED, epoch=1, shuffle_window=WINDOW)
    order = _windowed(COUNT, SEED, 1)
    assert _ids(ds) == order != _order(COUNT, SEED, 1)
    assert _ids(ds._getitems([3, 0, COUNT + 4])) == [
        order[3],
        order[0],
        _windowed(COUNT, SEED, 2)[4],
    ]
    for k in (1, 2, 3):
        merged = [-1] * COUNT
        for i in range(k):
            merged[i::k] = _ids(ds[i::k])
        assert merged == order
    assert _ids(ds.repeat(2)) == order + _windowed(COUNT, SEED, 2)


@pytest.mark.parametrize(("k", "i"), [(1, 0), (2, 1), (3, 2)])
def test_windowed_grain_worker_reads_its_own_share_of_each_group(path: str, k: int, i: int) -> None:
    # Grain's worker i of k asks for indices i, i + k, ... (of any pass): it learns
    # that step from them and reads only those positions of each group, so k
    # workers read each block's records once between them, not once each.
    from superserial.integrations.grain.shuffle import WorkerReads

    reads = WorkerReads(snp.load(path), COUNT, SEED, WINDOW)
    indices = np.arange(i, 3 * COUNT, k)
    assert reads.step(indices[:2]) == 0  # the first few are read by themselves
    assert reads.step(indices[2:]) == k
    for j in range(3):  # pass j's indices j * COUNT + p: positions p = i - j * COUNT (mod k)
        group = reads.reads(j)
        assert (group.start, group.step) == ((i - j * COUNT) % k, k)
        mine = indices[(indices >= j * COUNT) & (indices < (j + 1) * COUNT)] - j * COUNT
        assert mine.tolist() == list(range(group.start, COUNT, k))
    # An index off that step makes it smaller (a step only ever shrinks): new reads.
    if k > 1:
        assert reads.step(np.array([i + 1])) == 1
        assert (reads.reads(0).start, reads.reads(0).step) == (0, 1)


def test_windowed_grain_reads_follow_a_step_shrunk_by_another_thread(path: str) -> None:
    # Grain's prefetch threads ask for indices concurrently: one thread learns
    # step 4 from 0, 4, 8, ..., then another's index 1 shrinks it before the
    # first asks for its group reads. Those must serve the shrunk step (whose
    # share holds the first thread's positions), not fail (CI failed so once).
    from superserial.integrations.grain.shuffle import WorkerReads

    reads = WorkerReads(snp.load(path), COUNT, SEED, WINDOW)
    wide = np.arange(0, COUNT, 4)
    assert reads.step(wide) == 4
    assert reads.step(np.array([1])) == 1  # the other thread, in between
    group = reads.reads(0)
    assert (group.start, group.step) == (0, 1)
    records, elements = group.read_many(wide, 0)
    assert elements.tolist() == [_windowed(COUNT, SEED, 0)[p] for p in wide.tolist()]
    assert len(records) == len(wide)


@pytest.mark.parametrize("window", [None, WINDOW])
def test_grain_multiprocess_workers_give_the_order_exactly(path: str, window: Any) -> None:
    # Real worker processes (Grain's mp_prefetch): each slices the dataset and
    # learns its step; together they give the order, every element once.
    source = DataSource(path)
    ds = dataset(source, seed=SEED, epoch=1, shuffle_window=window).repeat(2)
    it = ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    want = _windowed(COUNT, SEED, 1) + _windowed(COUNT, SEED, 2)
    if window is None:
        want = _order(COUNT, SEED, 1) + _order(COUNT, SEED, 2)
    assert _ids(it) == want


@pytest.mark.parametrize("batched", [False, True])
def test_windowed_grain_iterator_resumes_mid_window(path: str, batched: bool) -> None:
    source = DataSource(path)

    def make() -> Any:
        ds = dataset(source, seed=SEED, shuffle_window=WINDOW).repeat(2)
        return (ds.batch(3, batch_fn=source.collate) if batched else ds).to_iter_dataset()

    it = iter(make())
    head = [next(it) for _ in range(3)]  # 9 or 3 positions: mid-window either way
    state = it.get_state()
    resumed = iter(make())
    resumed.set_state(state)
    got = _flat_ids(head, batched) + _flat_ids(list(resumed), batched)
    assert got == _windowed(COUNT, SEED, 0) + _windowed(COUNT, SEED, 1)


def test_windowed_order_is_the_same_in_tf_torch_and_grain(path: str) -> None:
    sampler = Sampler(COUNT, seed=SEED, shuffle_window=WINDOW)
    sampler.set_epoch(3)
    ds = MapDataset(path)
    torch_ids = [int(ds[i]["id"]) for i in sampler]
    grain_ids = _ids(dataset(path, seed=SEED, epoch=3, shuffle_window=WINDOW))
    loaded = superserial.load(path, shuffle=True, seed=SEED, epoch=3, shuffle_window=WINDOW)
    tf_ids = [int(e["id"]) for e in loaded]
    assert torch_ids == grain_ids == tf_ids == _windowed(COUNT, SEED, 3)


# ------------------------------------------------------------------ refusals, imports


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_dataset_shuffles_in_the_global_order(tmp_path: Any, compression: str) -> None:
    out = _save(tmp_path, compression=compression, num_shards=2)
    assert _ids(dataset(out, seed=SEED, epoch=2)) == _order(COUNT, SEED, 2)
    m = MapDataset(out)
    assert [int(m[i]["id"]) for i in range(COUNT)] == list(range(COUNT))


def test_grain_is_imported_only_by_dataset(path: str) -> None:
    src = textwrap.dedent(
        """
        import sys
        import superserial, superserial.grain, superserial.torch
        loaded = {"grain", "superserial.integrations.grain.shuffle", "tensorflow"} & set(sys.modules)
        assert not loaded, f"imported {sorted(loaded)}"
        sys.modules["grain"] = None  # Grain is not installed
        from superserial.grain import DataSource, dataset
        print(int(DataSource(sys.argv[1])[3]["id"]))
        try:
            dataset(sys.argv[1], seed=1)
        except ModuleNotFoundError as e:
            print("no grain:", e.name)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", src, path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["3", "no grain: grain"]


def test_same_order_in_torch_and_grain(path: str) -> None:
    sampler = Sampler(COUNT, seed=SEED)
    sampler.set_epoch(3)
    ds = MapDataset(path)
    torch_ids = [int(ds[i]["id"]) for i in sampler]
    assert torch_ids == _ids(dataset(path, seed=SEED, epoch=3)) == _order(COUNT, SEED, 3)
    assert np.array_equal(np.asarray(torch_ids), permutation(COUNT, SEED, 3))

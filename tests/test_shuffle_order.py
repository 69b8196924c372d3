"""The global shuffle order: a bijection, fixed by n, seed and epoch, the same for any worker count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import superserial
from superserial.read import order as order_module
from superserial.read.order import (
    SPREAD,
    indices_at,
    permutation,
    positions_of_worker,
    read_unit,
    run_length,
)

# The order is a format: these values must never change (docs/shuffle.md).
GOLDEN = {
    (10, 1, 0): [3, 0, 4, 7, 5, 6, 2, 9, 1, 8],
    (10, 1, 1): [7, 9, 3, 6, 8, 0, 2, 5, 4, 1],
    (10, 2, 0): [5, 7, 3, 6, 8, 1, 4, 2, 0, 9],
}


@pytest.mark.parametrize(("key", "want"), list(GOLDEN.items()))
def test_golden_orders(key: tuple[int, int, int], want: list[int]) -> None:
    n, seed, epoch = key
    assert superserial.permutation(n, seed, epoch).tolist() == want


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 16, 17, 97, 1000, 4096, 65537])
def test_bijection(n: int) -> None:
    p = permutation(n, 12345, 3)
    assert p.dtype == np.int64 and p.shape == (n,)
    assert np.array_equal(np.sort(p), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 3000),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**64 - 1),
)
def test_bijection_any_seed(n: int, seed: int, epoch: int) -> None:
    p = permutation(n, seed, epoch)
    assert np.array_equal(np.sort(p), np.arange(n))


def test_epochs_and_seeds_differ() -> None:
    n = 1000
    orders = {tuple(permutation(n, s, e)) for s in range(4) for e in range(4)}
    assert len(orders) == 16
    assert not np.array_equal(permutation(n, 0, 0), np.arange(n))


@pytest.mark.parametrize("n", [1, 2, 10, 97, 1000])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_workers_interleave_to_the_global_order(n: int, k: int) -> None:
    order = permutation(n, 9, 2)
    merged = np.empty(n, dtype=np.int64)
    for i in range(k):
        pos = np.array(positions_of_worker(n, i, k), dtype=np.int64)
        merged[pos] = indices_at(pos, n, 9, 2)
    assert np.array_equal(merged, order)


def test_huge_n_without_memory() -> None:
    n = 2**40 + 3
    pos = np.array([0, 1, n // 2, n - 1], dtype=np.int64)
    got = indices_at(pos, n, 5, 1)
    assert ((got >= 0) & (got < n)).all() and len(set(got.tolist())) == 4
    # Position by position and all at once agree.
    assert [int(indices_at([p], n, 5, 1)[0]) for p in pos] == got.tolist()


def test_shuffles_a_sorted_dataset_well() -> None:
    """The first 1,000 of 100,000 elements written in label order hold every label in proportion."""
    n, labels = 100_000, 10
    first = permutation(n, 0, 0)[:1000] * labels // n
    counts = np.bincount(first, minlength=labels)
    chi2 = float(((counts - 100) ** 2 / 100).sum())
    assert chi2 < 21.67, counts  # chi-square, 9 degrees of freedom, p = 0.01


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"n": 10, "seed": -1}, "seed"),
        ({"n": 10, "seed": 2**64}, "seed"),
        ({"n": 10, "seed": 1.0}, "seed"),
        ({"n": 10, "seed": "1"}, "seed"),
        ({"n": 10, "seed": True}, "seed"),
        ({"n": 10, "seed": 1, "epoch": -1}, "epoch"),
        ({"n": -1, "seed": 1}, "n"),
        ({"n": 2**62 + 1, "seed": 1}, "n"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        permutation(**kwargs)  # type: ignore[arg-type]


def test_positions_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"positions in \[0, 10\)"):
        indices_at([10], 10, 1)
    with pytest.raises(ValueError, match="worker"):
        positions_of_worker(10, 2, 2)


# ------------------------------------------------------------------ the windowed order

# Also a format (docs/shuffle.md): n, seed, epoch, window -> the order.
GOLDEN_WINDOWED = {
    (10, 1, 0, 3): [0, 5, 3, 7, 6, 2, 9, 1, 8, 4],
    (10, 1, 1, 3): [8, 0, 5, 2, 3, 7, 6, 4, 1, 9],
    (12, 2, 0, 2): [0, 5, 6, 1, 7, 2, 3, 8, 9, 4, 10, 11],
    (10, 1, 0, 100): [4, 6, 2, 1, 8, 9, 7, 3, 5, 0],
}


@pytest.mark.parametrize(("key", "want"), list(GOLDEN_WINDOWED.items()))
def test_windowed_golden_orders(key: tuple[int, int, int, int], want: list[int]) -> None:
    n, seed, epoch, window = key
    assert superserial.permutation(n, seed, epoch, window=window).tolist() == want


def test_windowed_golden_runs() -> None:
    # A window of 16,384: runs of 4 records, blocks of 20; 20,005 = 20 * 1,000 + a tail
    # of 5: no whole group (4,096 blocks), all is the rest.
    got = indices_at([0, 1, 2, 8191, 8192, 20004], 20_005, 3, 1, window=16_384)
    assert got.tolist() == [10429, 11954, 11625, 11875, 7945, 14872]


@pytest.mark.parametrize(
    ("n", "window"),
    [
        (0, 5),
        (1, 5),
        (2, 1),
        (97, 1),  # W = 1
        (97, 10),
        (97, 97),
        (97, 1000),  # n < W
        (20_005, 16_384),  # runs of 4, a short last run and a partial last window
        (40_001, 12_289),  # runs of 3, n not a multiple of them
        (30_000, 2**62),
    ],
)
def test_windowed_is_a_bijection(n: int, window: int) -> None:
    for seed, epoch in ((0, 0), (7, 3), (2**64 - 1, 2**64 - 1)):
        p = permutation(n, seed, epoch, window=window)
        assert p.dtype == np.int64 and p.shape == (n,)
        assert np.array_equal(np.sort(p), np.arange(n)), (seed, epoch)


def test_window_none_is_the_global_order() -> None:
    assert np.array_equal(permutation(1000, 5, 2, window=None), permutation(1000, 5, 2))
    assert not np.array_equal(permutation(1000, 5, 2, window=1000), permutation(1000, 5, 2))


def test_windowed_epochs_seeds_and_windows_differ() -> None:
    orders = {
        tuple(permutation(1000, s, e, window=w))
        for s in range(3)
        for e in range(3)
        for w in (7, 50)
    }
    assert len(orders) == 18


@pytest.mark.parametrize("k", [1, 2, 3])
def test_windowed_workers_interleave_to_the_order(k: int) -> None:
    n, window = 20_005, 16_384
    order = permutation(n, 9, 2, window=window)
    merged = np.empty(n, dtype=np.int64)
    for i in range(k):
        pos = np.array(positions_of_worker(n, i, k), dtype=np.int64)
        merged[pos] = indices_at(pos, n, 9, 2, window=window)
    assert np.array_equal(merged, order)
    # Position by position and all at once agree.
    some = [0, 5, 16_383, 16_384, n - 1]
    assert [int(indices_at([p], n, 9, 2, window=window)[0]) for p in some] == order[some].tolist()


def _runs(records: np.ndarray) -> int:
    """How many runs of consecutive integers ``records`` (sorted) make."""
    return 1 + int(np.count_nonzero(np.diff(records) != 1)) if len(records) else 0


def test_groups_read_whole_blocks_and_windows_one_run_of_each() -> None:
    n, window = 1_000_003, 40_960  # runs of 10, blocks of 50, groups of 4,096 blocks
    b = run_length(window)
    c = SPREAD * b
    group, rest = read_unit(n, window)
    assert (b, group, rest) == (10, 4096 * c, 4 * 4096 * c)
    order = permutation(n, 4, 0, window=window)
    full = n // c
    seen: set[int] = set()
    for lo in [*range(0, rest, group), rest]:
        hi = lo + group if lo < rest else n
        blocks, counts = np.unique(order[lo:hi] // c, return_counts=True)
        # A group (and the rest) reads whole blocks, each in one group only;
        # the tail (the last n % c records) is in the rest.
        whole = blocks[blocks < full]
        assert (counts[blocks < full] == c).all()
        assert not set(whole.tolist()) & seen
        seen |= set(whole.tolist())
        if lo < rest:
            # Each of its windows takes one run of b consecutive records of every block.
            for w in range(lo, hi, group // SPREAD):
                runs = np.sort(order[w : w + group // SPREAD])
                assert len(np.unique(runs // c)) == group // c
                assert (np.diff(runs.reshape(-1, b), axis=1) == 1).all()
    assert len(seen) == full


def _chi2_of_first(order_of_first: np.ndarray, n: int, labels: int = 10) -> float:
    """The labels' chi-square of the first positions of a dataset written in label order."""
    counts = np.bincount(order_of_first * labels // n, minlength=labels)
    expected = len(order_of_first) / labels
    return float(((counts - expected) ** 2 / expected).sum())


CRITICAL = 21.666  # chi-square, 9 degrees of freedom, p = 0.01


@pytest.mark.parametrize("n", [20_000, 200_000, 2_000_000])
def test_windowed_shuffles_a_sorted_dataset_well(n: int) -> None:
    """W = 5% of n: the first 1,000 positions' labels pass at p = 0.01 for 4 of 5 seeds or more."""
    window = n // 20
    first = np.arange(1000)
    stats = [_chi2_of_first(indices_at(first, n, s, 0, window=window), n) for s in range(5)]
    assert sum(x < CRITICAL for x in stats) >= 4, stats


def test_a_block_shuffle_fails_the_same_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs as long as the window (a plain block shuffle) hold one label per window."""
    n = 200_000
    window = n // 20
    monkeypatch.setattr(order_module, "RUNS_PER_WINDOW", 1)  # b = W: one run per window
    assert run_length(window) == window
    first = np.arange(1000)
    stats = [_chi2_of_first(indices_at(first, n, s, 0, window=window), n) for s in range(5)]
    assert all(x > CRITICAL for x in stats), stats


@pytest.mark.parametrize("window", [0, -1, 2**62 + 1, True, 1.5, "3", [4]])
def test_bad_window(window: object) -> None:
    with pytest.raises(
        ValueError, match=r"expected window to be None or an integer in \[1, 2\*\*62\]"
    ):
        permutation(10, 1, 0, window=window)  # type: ignore[arg-type]

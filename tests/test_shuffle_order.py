"""The global shuffle order: a bijection, fixed by n, seed and epoch, the same for any worker count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import superserial
from superserial.read.order import indices_at, permutation, positions_of_worker

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

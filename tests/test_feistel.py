"""The orders' Feistel networks in one C loop (read/_feistel.c), and without it.

Both ways give the same orders (the golden orders of test_shuffle_order.py hold
either to the orders of earlier releases), for one network for all positions or one
per position, and the C loop refuses positions it could walk from forever.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superserial.read import order


def test_the_extension_is_built_where_a_compiler_is() -> None:
    # This machine (and CI) has gcc and Python's headers: `pip install -e .` builds it,
    # so a build that silently fell back shows here.
    assert order.NATIVE, "superserial.read._feistel was not built"


def _numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(order, "_FEISTEL", None)


@settings(max_examples=80, deadline=None)
@given(
    n=st.one_of(st.integers(2, 5000), st.integers(2, order.MAX_N)),
    window=st.one_of(st.none(), st.integers(1, 10**6)),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**64 - 1),
    picks=st.lists(st.integers(0, 2**62), min_size=1, max_size=300),
)
def test_the_c_loop_gives_numpys_orders(
    n: int, window: int | None, seed: int, epoch: int, picks: list[int]
) -> None:
    positions = np.array([p % n for p in picks], dtype=np.int64)
    native = order.indices_at(positions, n, seed, epoch, window)
    with pytest.MonkeyPatch.context() as patch:
        _numpy(patch)
        assert order._FEISTEL is None
        expected = order.indices_at(positions, n, seed, epoch, window)
    assert native.tolist() == expected.tolist()


@pytest.mark.parametrize("window", [None, 1, 3000])
def test_a_whole_windowed_epoch_is_the_same_either_way(
    window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = order.permutation(60_000, 7, 3, window)
    _numpy(monkeypatch)
    assert np.array_equal(native, order.permutation(60_000, 7, 3, window))
    assert np.array_equal(np.sort(native), np.arange(60_000))


def _walk(x: list[int], size: int, bases: list[int], out: int | None = None) -> Any:
    assert order._FEISTEL is not None, "superserial.read._feistel was not built"
    xs = np.array(x, dtype=np.uint64)
    got = np.zeros(len(xs) if out is None else out, dtype=np.uint64)
    order._FEISTEL.walk(xs, size, np.array(bases, dtype=np.uint64), got)
    return got


@pytest.mark.parametrize(
    ("x", "size", "bases", "out", "text"),
    [
        ([5, 10], 10, [1], None, r"expected positions below 10, got 10 at 1"),
        ([1, 2, 3], 10, [1, 2], None, r"1 or len\(x\) bases"),
        ([1, 2], 10, [1], 3, r"expected x and out"),
        ([0], 1, [1], None, r"expected a size in \[2, 2\*\*62\], got 1"),
        ([0], 2**62 + 1, [1], None, r"expected a size in"),
    ],
    ids=["outside", "bases", "out", "small", "large"],
)
def test_the_c_loop_refuses_what_it_cannot_walk(
    x: list[int], size: int, bases: list[int], out: int | None, text: str
) -> None:
    # A position at or past size may sit on a cycle that never comes back below it.
    with pytest.raises(ValueError, match=text):
        _walk(x, size, bases, out)


def test_one_base_or_one_per_position() -> None:
    one = _walk([0, 1, 2, 3], 1000, [42])
    each = _walk([0, 1, 2, 3], 1000, [42, 42, 43, 43])
    assert one[:2].tolist() == each[:2].tolist()
    assert _walk([2, 3], 1000, [43]).tolist() == each[2:].tolist()
    assert one[2:].tolist() != each[2:].tolist()

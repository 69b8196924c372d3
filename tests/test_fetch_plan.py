"""``fetch.plan``: the range reads of a file's records, against the greedy it specifies.

The plan runs once per segment of touching records, not once per record; these
tests hold it to the record-by-record greedy its docstring states, on files of
gaps, neighbours, duplicates and overlaps, with ``RUN_MAX`` small enough to split
segments.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superserial.storage import fetch


def _greedy(lo: np.ndarray, hi: np.ndarray, amplification: float, run_max: int) -> list[int]:
    """The specification: each record joins the run before it while both bounds hold."""
    lo_l, hi_l = lo.tolist(), hi.tolist()
    firsts = [0]
    start, reach, useful = lo_l[0], hi_l[0], hi_l[0] - lo_l[0]
    for j in range(1, len(lo_l)):
        a, b = lo_l[j], hi_l[j]
        new = max(0, b - max(a, reach))  # the bytes not in the run already
        end = max(b, reach)
        if end - start <= min(amplification * (useful + new), run_max):
            reach, useful = end, useful + new
        else:
            firsts.append(j)
            start, reach, useful = a, b, b - a
    return firsts


def _file(gaps: list[int], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Records one after another, ``gaps[i]`` bytes before record ``i`` (negative: overlap)."""
    lo, hi, at = [], [], 0
    for gap, size in zip(gaps, sizes, strict=True):
        a = max(0, at + gap) if not lo else max(lo[-1], at + gap)  # sorted by start
        lo.append(a)
        hi.append(a + size)
        at = a + size
    return np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.just(0), st.integers(-40, 400)),  # touching, overlapping or apart
            st.integers(0, 300),  # empty records too
        ),
        min_size=1,
        max_size=200,
    ),
    st.sampled_from([64, 500, 4096]),
)
def test_plan_is_the_greedy_of_its_specification(
    records: list[tuple[int, int]], run_max: int
) -> None:
    lo, hi = _file([g for g, _ in records], [s for _, s in records])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fetch, "RUN_MAX", run_max)
        assert fetch.plan(lo, hi).tolist() == _greedy(lo, hi, fetch.AMPLIFICATION, run_max)


def test_a_whole_file_is_read_in_run_max_pieces() -> None:
    # 60,000 touching records of 838 bytes: one segment, split only by RUN_MAX.
    size, n = 838, 60_000
    lo = np.arange(n, dtype=np.int64) * size
    firsts = fetch.plan(lo, lo + size)
    assert firsts.tolist() == _greedy(lo, lo + size, fetch.AMPLIFICATION, fetch.RUN_MAX)
    assert len(firsts) == -(-n * size // fetch.RUN_MAX)


def test_scattered_records_coalesce_only_within_twice_their_bytes() -> None:
    rng = np.random.default_rng(3)
    lo = np.sort(rng.choice(10_000, 2_000, replace=False)).astype(np.int64) * 100
    hi = lo + 100
    firsts = fetch.plan(lo, hi)
    assert firsts.tolist() == _greedy(lo, hi, fetch.AMPLIFICATION, fetch.RUN_MAX)
    run_lo = lo[firsts]
    run_hi = np.maximum.accumulate(hi)[np.r_[firsts[1:], len(lo)] - 1]
    assert (run_hi - run_lo).sum() <= fetch.AMPLIFICATION * 100 * len(lo)
    assert 1 < len(firsts) < len(lo)


def test_no_records_no_runs() -> None:
    empty = np.zeros(0, dtype=np.int64)
    assert fetch.plan(empty, empty).tolist() == []

"""Streaming summaries of numbers and strings in bounded memory: the parts of ``superserial stats``.

Each summary takes its values a batch at a time (numpy arrays, vectorized),
keeps a state whose size does not grow with the number of values, and
gives a JSON-able dict. Merging batches is exact except where said:

* :class:`NumberSummary`: count, min, max, mean and std (per-batch moments
  merged with Chan et al.'s parallel update, in float64), NaN, +inf, -inf
  and zero counts, and a :class:`Histogram` whose bin counts are exact.
* :class:`Histogram`: at most :data:`BINS` bins of a power-of-two width,
  aligned on multiples of it; when a value falls outside, the width doubles
  and pairs of bins merge, which keeps every count exact (a value's bin at
  width ``2w`` is its bin at width ``w`` halved). The result spans the data
  with between ``BINS / 2`` and ``BINS`` bins.
* :class:`ValueCounts`: exact counts of distinct values, given up (and
  said so) past a limit of distinct values.
* :class:`HeavyHitters`: the most frequent values by the Misra-Gries
  summary (mergeable form): approximate, with a stated bound.

This module does not import TensorFlow.
"""

from __future__ import annotations

import base64
import heapq
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "BINS",
    "CHUNK",
    "COUNTERS",
    "DISTINCT_LIMIT",
    "HeavyHitters",
    "Histogram",
    "NumberSummary",
    "ValueCounts",
    "json_number",
    "json_value",
]

BINS = 128
"""The most bins a :class:`Histogram` keeps."""
DISTINCT_LIMIT = 1000
"""The most distinct values :class:`ValueCounts` counts before giving up."""
COUNTERS = 64
"""The counters of a :class:`HeavyHitters` summary (Misra-Gries ``k``)."""
TABLE_CHUNK = 1 << 20  # values per bincount of an 8/16-bit table (an 8 MB intp temporary)
CHUNK = 1 << 18
"""The most values a :class:`NumberSummary` works on at once."""


def json_number(x: Any) -> Any:
    """A number as JSON holds it: ints as ints, bools as bools, non-finite floats as strings."""
    if x is None or isinstance(x, bool | int):
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    f = float(x)
    return f if math.isfinite(f) else str(f)


def json_value(x: Any) -> Any:
    """A counted value: bytes as a UTF-8 string or ``{"base64": ...}``, numbers by :func:`json_number`."""
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(x).decode("ascii")}
    return json_number(x)


class Histogram:
    """Exact counts in at most :data:`BINS` aligned bins of width ``2**exp``; the width doubles as needed.

    Args:
        integer: The values are integers (bins of width >= 1, shifts instead of divisions).
    """

    def __init__(self, integer: bool) -> None:
        self.integer = integer
        self.exp: int | None = None
        self.k0 = 0  # the bin number (value // width) of counts[0]
        self.counts = np.zeros(BINS, np.int64)
        self.lo: Any = None
        self.hi: Any = None

    def _first_exp(self, lo: Any, hi: Any) -> int:
        if self.integer:
            return max(0, ((int(hi) - int(lo)) // BINS).bit_length() - 1)
        lo, hi = float(lo), float(hi)
        big = max(abs(lo), abs(hi))
        # Bin numbers stay below 2**53, where floats and int64 agree exactly.
        least = math.frexp(big)[1] - 52 if big else -30
        span = hi - lo
        return max(least, math.frexp(span / BINS)[1] - 1 if span > 0 else least)

    def _rebin(self, exp: int, k0: int) -> None:
        assert self.exp is not None
        new = np.zeros(BINS, np.int64)
        shift = exp - self.exp
        # At most BINS bins, a few dozen times per summary: Python ints, which
        # hold uint64 bin numbers past int64's range.
        for i in np.flatnonzero(self.counts).tolist():
            new[((self.k0 + i) >> shift) - k0] += self.counts[i]
        self.exp, self.k0, self.counts = exp, k0, new

    def add(self, x: np.ndarray, lo: Any, hi: Any, weights: np.ndarray | None = None) -> None:
        """Counts ``x`` (finite values; ``lo`` and ``hi`` their min and max), with ``weights`` if given."""
        if x.size == 0:
            return
        if self.exp is None:
            self.exp = self._first_exp(lo, hi)
            self.lo, self.hi = lo, hi
            self.k0 = self._floor_at(lo, self.exp)
        else:
            self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        exp = self.exp
        while self._floor_at(self.hi, exp) - self._floor_at(self.lo, exp) >= BINS:
            exp += 1
        klo, khi = self._floor_at(self.lo, exp), self._floor_at(self.hi, exp)
        if exp != self.exp or klo < self.k0 or khi >= self.k0 + BINS:
            self._rebin(exp, klo)  # every value seen lies in [klo, khi]: the window holds them
        if self.integer:
            k = (x >> exp) - x.dtype.type(self.k0)
        else:
            # float64 values scaled by a normal power of two are exact (float32 ones
            # cannot underflow), and so is one integer below 2**53 less another.
            x = x.astype(np.float64, copy=False)
            k = x * math.ldexp(1.0, -exp) if -1022 <= exp <= 1022 else np.ldexp(x, -exp)
            np.floor(k, out=k)
            k -= self.k0
        self.counts += np.bincount(k.astype(np.intp, copy=False), weights, BINS).astype(np.int64)

    def _floor_at(self, x: Any, exp: int) -> int:
        if self.integer:
            return int(x) >> exp
        return math.floor(math.ldexp(float(x), -exp))

    def to_dict(self) -> dict[str, Any]:
        """``{"bin_edges": [n + 1], "counts": [n]}``: bin i counts the values in ``[edge i, edge i+1)``."""
        nz = np.flatnonzero(self.counts)
        if self.exp is None or not nz.size:
            return {"bin_edges": [], "counts": []}
        first, last = int(nz[0]), int(nz[-1])
        ks = range(self.k0 + first, self.k0 + last + 2)
        if self.integer:
            edges: list[Any] = [k << self.exp for k in ks]
        else:
            edges = [math.ldexp(float(k), self.exp) for k in ks]
        return {"bin_edges": edges, "counts": self.counts[first : last + 1].tolist()}


def _table_size(dtype: np.dtype) -> int:
    """Values of a small integer dtype (bool, 8 and 16 bits), counted by value in a table; 0 otherwise."""
    if dtype == np.bool_:
        return 2
    if dtype.kind in "iu" and dtype.itemsize <= 2:
        return 1 << (8 * dtype.itemsize)
    return 0


class NumberSummary:
    """count, min, max, mean, std, NaN/inf/zero counts and a histogram of real numbers.

    bool and 8- and 16-bit integers are counted by value in a table (one
    ``bincount`` per batch), from which everything is exact. Other dtypes
    keep merged moments; float16 and bfloat16 are widened to float32 first.
    min and max are over the non-NaN values (so they may be infinite); mean,
    std (population, ``ddof=0``) and the histogram are over the finite values.

    Args:
        dtype: The numpy dtype of the values (real: bool, integer or float).
    """

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.integer = self.dtype == np.bool_ or self.dtype.kind in "iu"
        self.table_size = _table_size(self.dtype)
        self.table = np.zeros(self.table_size, np.int64) if self.table_size else None
        self.count = 0
        self.nan = self.posinf = self.neginf = self.zeros = 0
        self.lo: Any = None
        self.hi: Any = None
        self.n = 0  # finite values in the moments
        self.mean = 0.0
        self.m2 = 0.0
        self.hist = Histogram(self.integer)

    def add(self, x: np.ndarray) -> None:
        """Adds the values of ``x`` (any shape)."""
        x = np.ascontiguousarray(x).reshape(-1)
        if self.table is not None:
            # Counting needs no float temporaries: larger chunks, fewer calls.
            for i in range(0, x.size, TABLE_CHUNK):
                self._count(x[i : i + TABLE_CHUNK], self.table)
            return
        # Chunks bound the float64 temporaries whatever the batch.
        for i in range(0, x.size, CHUNK):
            self._add(x[i : i + CHUNK])

    def _count(self, x: np.ndarray, table: np.ndarray) -> None:
        """Adds ``x`` to the per-value ``table`` (bool and 8/16-bit integers)."""
        self.count += x.size
        if self.table_size != 256:  # bool (two values) and 16-bit integers
            view = x.view(np.uint8) if self.dtype.itemsize == 1 else x.view(np.uint16)
            table += np.bincount(view, minlength=self.table_size)
            return
        # Bytes counted two at a time: bincount converts every value to an intp
        # first, so half as many values is half that copy (images are most of a
        # dataset's values). A pair p counts byte p % 256 and byte p // 256.
        even = x.size & ~1
        both = np.bincount(x[:even].view(np.uint16), minlength=1 << 16).reshape(256, 256)
        table += both.sum(axis=0) + both.sum(axis=1)
        table += np.bincount(x[even:].view(np.uint8), minlength=256)

    def _add(self, x: np.ndarray) -> None:
        self.count += x.size
        if self.dtype.kind == "V" or (self.dtype.kind == "f" and self.dtype.itemsize < 4):
            x = x.astype(np.float32)  # float16 and bfloat16 (ml_dtypes) in float32
        elif self.dtype.kind not in "iuf":
            x = x.astype(np.float32)
        self.zeros += x.size - int(np.count_nonzero(x))
        lo, hi = x.min(), x.max()
        finite = x
        if not self.integer and not (np.isfinite(lo) and np.isfinite(hi)):
            nan = np.isnan(x)
            self.nan += int(np.count_nonzero(nan))
            pos, neg = int(np.count_nonzero(x == np.inf)), int(np.count_nonzero(x == -np.inf))
            self.posinf += pos
            self.neginf += neg
            finite = x[np.isfinite(x)]
            if finite.size:
                lo, hi = finite.min(), finite.max()
            self._extremes(-np.inf if neg else None, np.inf if pos else None)
        if not finite.size:
            return
        self._extremes(lo, hi)
        xf = finite.astype(np.float64, copy=False)
        self._moments(xf)
        if self.integer:  # uint64 stays uint64: its bin numbers may pass int64's range
            wide = finite if self.dtype == np.uint64 else finite.astype(np.int64, copy=False)
            self.hist.add(wide, int(lo), int(hi))
        else:
            self.hist.add(xf, float(lo), float(hi))

    def _extremes(self, lo: Any, hi: Any) -> None:
        if lo is not None:
            self.lo = lo if self.lo is None else min(self.lo, lo)
        if hi is not None:
            self.hi = hi if self.hi is None else max(self.hi, hi)

    def _moments(self, xf: np.ndarray) -> None:
        nb = xf.size
        mb = float(xf.sum()) / nb
        d = xf - mb
        self._merge(nb, mb, float(np.einsum("i,i->", d, d)))

    def _merge(self, nb: int, mb: float, m2b: float) -> None:
        """Chan et al.: the moments of the union from those of the parts."""
        n = self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / n
        self.m2 += m2b + delta * delta * self.n * nb / n
        self.n = n

    def _finish_table(self) -> None:
        """Turns the value table into the extremes, moments and histogram (once, at the end)."""
        table, self.table = self.table, None
        assert table is not None
        nz = np.flatnonzero(table)
        if not nz.size:
            return
        values = nz.astype(np.int64)
        if self.dtype.kind == "i":  # the table is indexed by the unsigned view
            values = np.where(values >= self.table_size // 2, values - self.table_size, values)
        counts = table[nz]
        order = np.argsort(values)
        values, counts = values[order], counts[order]
        self.zeros = int(counts[values == 0].sum())
        self.lo, self.hi = int(values[0]), int(values[-1])
        n = int(counts.sum())
        mean = float(np.dot(counts.astype(np.float64), values)) / n
        d = values - mean
        self._merge(n, mean, float(np.dot(counts.astype(np.float64), d * d)))
        self.hist.add(values, self.lo, self.hi, weights=counts.astype(np.float64))

    def value_table(self) -> tuple[np.ndarray, np.ndarray] | None:
        """For table-counted dtypes before :meth:`to_dict`: (values, counts) of the values seen."""
        if self.table is None:
            return None
        nz = np.flatnonzero(self.table)
        values = nz.astype(np.int64)
        if self.dtype.kind == "i":
            values = np.where(values >= self.table_size // 2, values - self.table_size, values)
        return values, self.table[nz]

    def to_dict(self) -> dict[str, Any]:
        if self.table is not None:
            self._finish_table()
        none = self.n == 0
        cast = bool if self.dtype == np.bool_ else (lambda v: v)
        return {
            "type": "number",
            "count": self.count,
            "min": None if self.lo is None else json_number(cast(self.lo)),
            "max": None if self.hi is None else json_number(cast(self.hi)),
            "mean": None if none else self.mean,
            "std": None if none else math.sqrt(max(self.m2, 0.0) / self.n),
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "zeros": self.zeros,
            "histogram": self.hist.to_dict(),
        }


class ValueCounts:
    """Exact counts of distinct values, until there are more than ``limit`` of them."""

    def __init__(self, limit: int = DISTINCT_LIMIT) -> None:
        self.limit = limit
        self.counts: dict[Any, int] | None = {}

    def add(self, x: np.ndarray) -> None:
        if self.counts is None or not x.size:
            return
        values, counts = np.unique(x.reshape(-1), return_counts=True)
        self.add_table(values, counts)

    def add_table(self, values: np.ndarray, counts: np.ndarray) -> None:
        """Adds ``counts[i]`` occurrences of ``values[i]``."""
        if self.counts is None:
            return
        if len(values) > self.limit:
            self.counts = None
            return
        mine = self.counts
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            mine[v] = mine.get(v, 0) + c
        if len(mine) > self.limit:
            self.counts = None

    def to_dict(self) -> dict[str, Any]:
        """``{"limit", "complete", "values": [[value, count], ...] by value}``; values [] if not complete."""
        items = sorted(self.counts.items()) if self.counts is not None else []
        return {
            "limit": self.limit,
            "complete": self.counts is not None,
            "values": [[json_value(v), c] for v, c in items],
        }


class HeavyHitters:
    """The most frequent values: a Misra-Gries summary of ``k`` counters, merged batch by batch.

    Each batch is counted exactly (``collections.Counter``) and merged:
    counters are added, and while more than ``k`` remain, the ``(k+1)``-th
    largest count is subtracted from all and those left at zero or below are
    dropped (Agarwal et al., *Mergeable summaries*). A kept count
    undercounts the truth by at most ``(n - sum of counts) / (k + 1)``
    (``max_undercount``, 0 while nothing was dropped), so every value
    occurring more than that is kept.
    """

    def __init__(self, k: int = COUNTERS) -> None:
        self.k = k
        self.n = 0
        self.counters: Counter[Any] = Counter()
        self.dropped = False

    def add(self, values: Iterable[Any]) -> None:
        batch = Counter(values)
        self.n += sum(batch.values())
        self.counters.update(batch)
        if len(self.counters) > self.k:
            cut = heapq.nlargest(self.k + 1, self.counters.values())[-1]
            self.counters = Counter({v: c - cut for v, c in self.counters.items() if c > cut})
            self.dropped = True

    def to_dict(self) -> dict[str, Any]:
        kept = sum(self.counters.values())
        items = sorted(self.counters.items(), key=lambda vc: (-vc[1], vc[0]))
        return {
            "method": "misra-gries",
            "counters": self.k,
            "approximate": self.dropped,
            "max_undercount": (self.n - kept) // (self.k + 1),
            "values": [[json_value(v), c] for v, c in items],
        }

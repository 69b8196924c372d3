"""``superserial.stats``: per-leaf statistics of a dataset, in one streaming pass, without TensorFlow.

    import superserial
    s = superserial.stats("/data/digits")            # or select=["label"]
    print(s)                                         # readable text
    s["label"]["value_counts"]                       # one leaf's dict
    s.to_dict()                                      # everything, JSON-able

The dataset is read once with the TF-free reader
(:meth:`superserial.numpy.NumpyDataset.batches`), up to :data:`BATCH` elements
(about :data:`BATCH_BYTES` stored bytes) at a time; each leaf's batch goes into bounded summaries
(:mod:`superserial.inspect.sketches`), so memory does not grow with the dataset.
Every element is counted. What a leaf gets:

* ``values``: over every value of every element (all positions of an
  array, the flat values of a ragged leaf, the stored values of a sparse
  one). Real numbers (and bool): a number summary (count, min, max, mean,
  std, NaN/inf/zero counts, an exact histogram). Complex numbers: a number
  summary of the real parts and one of the imaginary parts, and the count
  of zeros. Strings: a number summary of their lengths in bytes, and the
  most frequent strings (Misra-Gries, marked approximate once a value was
  dropped, with its error bound).
* ``value_counts``: for integer and bool scalars (labels), exact counts
  per value, given up past :data:`~superserial.inspect.sketches.DISTINCT_LIMIT`
  distinct values (``"complete": false``).
* ``dims``: for each dimension of unknown size (ragged rows, dense leaves of
  varying shape), a number summary of its sizes: for dimension 0 one size
  per element, for an inner ragged dimension one per row.
* ``nnz``: for sparse leaves, a number summary of the stored values per element.

An empty dataset gives counts of 0 and null min/max/mean/std.
The JSON schema is versioned by ``"schema"`` (:data:`SCHEMA`); see
``docs/cli.md``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from superserial.codec.numpy_decode import Ragged
from superserial.format.structure import DictNode, Leaf, Node
from superserial.inspect.sketches import HeavyHitters, NumberSummary, ValueCounts
from superserial.read import numpy_reader as ssnp
from superserial.read.opening import open_dataset

__all__ = ["BATCH", "BATCH_BYTES", "SCHEMA", "Stats", "stats"]

SCHEMA = "superserial.stats/1"
"""The ``"schema"`` of :meth:`Stats.to_dict`; its number changes when a key changes meaning."""
BATCH = 1024
"""The most elements decoded and summarized at a time."""
BATCH_BYTES = 16 << 20
"""About the most stored bytes of a batch: large elements come in smaller batches."""

_INT = np.dtype(np.int64)


def _flatten(node: Node, value: Any, out: list[Any]) -> None:
    """The leaves of a packed batch, in header order (the inverse of ``structure.pack``)."""
    if isinstance(node, Leaf):
        out.append(value)
    elif isinstance(node, DictNode):
        for key in sorted(node.items):
            _flatten(node.items[key], value[key], out)
    else:
        for item, v in zip(node.items, value, strict=True):
            _flatten(item, v, out)


def _concat(arrays: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    return np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, dtype)


class _Values:
    """The summary of a leaf's values, by dtype: number, complex or string."""

    def __init__(self, dtype: np.dtype) -> None:
        self.kind = "string" if dtype.kind == "O" else "complex" if dtype.kind == "c" else "number"
        self.dtype = dtype
        if self.kind == "number":
            self.number = NumberSummary(dtype)
        elif self.kind == "complex":
            part = np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
            self.real, self.imag = NumberSummary(part), NumberSummary(part)
            self.count = self.zeros = 0
        else:
            self.lengths = NumberSummary(_INT)
            self.top = HeavyHitters()
            self.count = 0

    def add(self, x: np.ndarray) -> None:
        x = x.reshape(-1)
        if self.kind == "number":
            self.number.add(x)
        elif self.kind == "complex":
            self.count += x.size
            self.zeros += x.size - int(np.count_nonzero(x))
            self.real.add(np.ascontiguousarray(x.real))
            self.imag.add(np.ascontiguousarray(x.imag))
        else:
            self.count += x.size
            self.lengths.add(np.fromiter(map(len, x), np.int64, x.size))
            self.top.add(x.tolist())

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "number":
            return self.number.to_dict()
        if self.kind == "complex":
            return {
                "type": "complex",
                "count": self.count,
                "zeros": self.zeros,
                "real": self.real.to_dict(),
                "imag": self.imag.to_dict(),
            }
        return {
            "type": "string",
            "count": self.count,
            "lengths": self.lengths.to_dict(),
            "top": self.top.to_dict(),
        }


class _LeafStats:
    """Everything summarized about one leaf."""

    def __init__(self, leaf: Leaf) -> None:
        self.leaf = leaf
        self.elements = 0
        self.values = _Values(leaf.entry.numpy)
        label = leaf.kind == "dense" and leaf.shape == () and leaf.entry.is_integer
        self.value_counts = ValueCounts() if label else None
        rank = leaf.ragged_rank or 0
        self.dims = {d: NumberSummary(_INT) for d, size in enumerate(leaf.shape) if size is None}
        if leaf.kind == "ragged":  # inner dimensions are uniform (the header says so)
            self.dims = {d: s for d, s in self.dims.items() if d <= rank}
        self.nnz = NumberSummary(_INT) if leaf.kind == "sparse" else None

    def add(self, batch: Any) -> None:
        dtype = self.leaf.entry.numpy
        if isinstance(batch, np.ndarray):  # fixed-shape dense: [B, *shape], vectorized
            self.elements += len(batch)
            self.values.add(batch)
            if self.value_counts is not None:
                self.value_counts.add(batch)
            return
        self.elements += len(batch)
        if self.leaf.kind == "sparse":
            assert self.nnz is not None
            self.values.add(_concat([s.values for s in batch], dtype))
            self.nnz.add(np.fromiter((len(s.values) for s in batch), np.int64, len(batch)))
            for d, summary in self.dims.items():
                summary.add(np.array([int(s.dense_shape[d]) for s in batch], np.int64))
            return
        ragged = [x for x in batch if isinstance(x, Ragged)]
        if ragged:  # ragged_rank >= 1
            self.values.add(_concat([r.flat_values for r in ragged], dtype))
            for d, summary in self.dims.items():
                if d == 0:
                    summary.add(np.fromiter(map(len, ragged), np.int64, len(ragged)))
                else:
                    summary.add(
                        _concat([np.diff(r.nested_row_splits[d - 1]) for r in ragged], _INT)
                    )
            return
        # dense of unknown shape, or ragged_rank 0: arrays of varying shape
        self.values.add(_concat(batch, dtype))
        for d, summary in self.dims.items():
            summary.add(np.fromiter((x.shape[d] for x in batch), np.int64, len(batch)))

    def to_dict(self) -> dict[str, Any]:
        leaf = self.leaf
        out: dict[str, Any] = {
            "kind": leaf.kind,
            "dtype": leaf.dtype,
            "shape": list(leaf.shape),
            "elements": self.elements,
            "values": self.values.to_dict(),
            "value_counts": None if self.value_counts is None else self.value_counts.to_dict(),
            "dims": {str(d): s.to_dict() for d, s in self.dims.items()},
            "nnz": None if self.nnz is None else self.nnz.to_dict(),
        }
        return out


class Stats:
    """The statistics of a dataset, as :func:`stats` gives them.

    Attributes:
        path: The dataset read.
        elements: How many elements were read.
        leaves: Each leaf's dict (see :meth:`to_dict`), by leaf name, in header order.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data
        self.path: str = data["path"]
        self.elements: int = data["elements"]
        self.leaves: dict[str, Any] = data["leaves"]

    def __getitem__(self, leaf: str) -> dict[str, Any]:
        """One leaf's dict, by its name."""
        try:
            return self.leaves[leaf]  # type: ignore[no-any-return]
        except KeyError:
            raise KeyError(
                f"expected one of the leaves {list(self.leaves)}, got {leaf!r}"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-able: ``{"schema", "path", "elements", "leaves": {name: {...}}}``.

        Non-finite floats are the strings ``"nan"``, ``"inf"``, ``"-inf"``;
        strings valid as UTF-8 are JSON strings, other bytes ``{"base64": ...}``.
        """
        return copy.deepcopy(self._data)

    def text(self) -> str:
        """A readable rendering, a few lines per leaf."""
        from superserial.inspect.stats_render import stats_text

        return stats_text(self._data)

    def plot(self, out: str | os.PathLike[str]) -> tuple[int, int]:
        """Writes one PNG with a panel per leaf (as ``stats --plot``); returns its size.

        Raises:
            UnsupportedError: matplotlib is not installed (``superserial[viz]``).
        """
        from superserial.inspect.stats_render import stats_png

        return stats_png(self._data, out)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Stats({self.path!r}, {self.elements} elements, {len(self.leaves)} leaves)"


def stats(
    path: str | os.PathLike[str],
    select: Iterable[str] | None = None,
    *,
    batch_size: int | None = None,
) -> Stats:
    """Reads a dataset once and summarizes each leaf; see :mod:`superserial.inspect.stats`.

    Args:
        path: The dataset directory or URL.
        select: Only these leaves (or inner nodes), as ``superserial.numpy.load`` takes it.
        batch_size: Elements decoded and summarized at a time; memory is
            about this many decoded elements. Default: :data:`BATCH`, fewer
            where the elements are large (about :data:`BATCH_BYTES` stored
            bytes a batch).

    Returns:
        A :class:`Stats`.

    Raises:
        DatasetNotFoundError, HeaderError, CorruptDataError: As the numpy reader.
        ValueError: ``select`` names no leaf.
    """
    ds = ssnp.NumpyDataset.from_opened(open_dataset(path, select=select))
    if batch_size is None:
        per_element = ds.header.total_bytes / max(ds.header.element_count, 1)
        batch_size = max(1, min(BATCH, int(BATCH_BYTES // max(per_element, 1))))
    structure = ds.header.structure
    leaves = [_LeafStats(leaf) for leaf in ds.header.leaves]
    elements = 0
    for batch in ds.batches(batch_size):
        flat: list[Any] = []
        _flatten(structure, batch, flat)
        for summary, value in zip(leaves, flat, strict=True):
            summary.add(value)
        elements += len(flat[0])
    return Stats(
        {
            "schema": SCHEMA,
            "path": os.fspath(path),
            "elements": elements,
            "leaves": {s.leaf.name: s.to_dict() for s in leaves},
        }
    )

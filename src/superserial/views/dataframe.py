"""Decoded leaves as a pandas DataFrame: :meth:`superserial.numpy.NumpyDataset.to_pandas`.

One row per element (index: the element's position, from 0), one column
per leaf, named as ``superserial inspect`` names the leaf (``image``,
``meta/id``), in the header's leaf order:

* dense scalars: a plain column of the leaf's dtype (bfloat16 as float32,
  which holds every bfloat16 exactly; pandas has no bfloat16); string scalars an
  ``object`` column of ``bytes``, as the numpy reader gives them;
* every other leaf (arrays, unknown shapes, ragged, sparse): an ``object``
  column holding the numpy reader's value of each element (``np.ndarray``,
  :class:`~superserial.codec.numpy_decode.Ragged`, :class:`~superserial.codec.numpy_decode.Sparse`).

pandas is the ``pandas`` extra; the error says how to install it when missing.

This module does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from superserial.errors import require
from superserial.format.structure import Leaf

__all__ = ["pandas", "to_pandas"]


def pandas() -> Any:
    """The ``pandas`` module, or an error saying which extra installs it.

    Raises:
        MissingDependencyError: pandas cannot be imported.
    """
    return require("pandas", extra="pandas", needed_for="to_pandas()")


def _objects(values: list[Any]) -> np.ndarray:
    # Filled one by one: numpy would make equal-shaped arrays one 2-D array.
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _column(leaf: Leaf, parts: list[Any]) -> np.ndarray:
    """One leaf's column from its per-batch values (stacked arrays or lists)."""
    if leaf.kind == "dense" and leaf.shape == ():
        column = np.concatenate(parts) if parts else np.zeros(0, leaf.entry.numpy)
        return column.astype(np.float32) if leaf.dtype == "bfloat16" else column
    values: list[Any] = []
    for part in parts:
        values.extend(part)  # a stacked [B, ...] array gives B views of its rows
    return _objects(values)


def to_pandas(leaves: tuple[Leaf, ...], batches: Iterable[list[Any]]) -> Any:
    """A DataFrame of decoded batches.

    Args:
        leaves: The leaves, in header order.
        batches: Flat decoded batches, as
            :meth:`superserial.codec.numpy_decode.RecordDecoder.decode` gives them
            (one value per leaf: a stacked array or a list of per-element values).

    Raises:
        MissingDependencyError: pandas is not installed.
    """
    pd = pandas()
    parts: list[list[Any]] = [[] for _ in leaves]
    for batch in batches:
        for column, value in zip(parts, batch, strict=True):
            column.append(value)
    data = {leaf.name: _column(leaf, column) for leaf, column in zip(leaves, parts, strict=True)}
    rows = len(next(iter(data.values()))) if data else 0
    return pd.DataFrame(data, index=pd.RangeIndex(rows), columns=[leaf.name for leaf in leaves])

"""The numpy reader's ways out: pandas, Arrow, Hugging Face ``datasets``, the notebook view.

:class:`Conversions` is a base class of :class:`superserial.read.numpy_reader.NumpyDataset`:
its methods are thin, reading flat decoded batches and handing them to the
views (:mod:`superserial.views.dataframe`, :mod:`superserial.views.arrow`,
:mod:`superserial.views.hf`, :mod:`superserial.views.notebook`), which know nothing of
files. Kept apart so that the reader module holds reading alone.

This module does not import TensorFlow.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from typing import Any

from superserial.codec.numpy_batch_decode import BatchDecoder
from superserial.codec.numpy_decode import RecordDecoder
from superserial.format.header import Header
from superserial.read.selection import select_header

__all__ = ["Conversions"]

# Records per Arrow batch by default: about this many bytes of them, at most _ROWS.
_BATCH_BYTES = 64 << 20
_ROWS = 65536


def _count(n: int | None) -> int | None:
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"expected n >= 0 elements or None (all), got {n!r}")
    return n


class Conversions:
    """The ways out of a :class:`~superserial.read.numpy_reader.NumpyDataset`."""

    header: Header
    path: str
    files: list[str]
    _decoder: RecordDecoder
    _fast: BatchDecoder

    def __len__(self) -> int:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        raise NotImplementedError

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _records(self, ahead: bool = True) -> Iterator[tuple[bytes, str]]:
        raise NotImplementedError

    def _chunks(self, size: int) -> Iterator[tuple[list[Any] | None, Iterator[tuple[bytes, str]]]]:
        raise NotImplementedError

    def _selected(self, select: Iterable[str] | None) -> Conversions:
        """This dataset, reading only the leaves ``select`` names (None: all)."""
        if select is None:
            return self
        # The pickled state (decoders dropped) rebuilt over the pruned header: the
        # cache lease, stream and pins are shared, the decoders made anew.
        state = self.__getstate__()
        state["header"] = select_header(self.header, select)
        state["_reader"] = None
        ds = object.__new__(type(self))
        ds.__setstate__(state)
        return ds

    def flat_batches(self, n: int | None, size: int = 1024) -> Iterator[list[Any]]:
        """The first ``n`` elements (None: all) as flat decoded batches of ``size`` elements.

        One value per leaf of :attr:`header`, in its leaf order: fixed-shape dense
        leaves stacked ``[B, *shape]``, the others a list of per-element values (as
        :meth:`superserial.codec.numpy_decode.RecordDecoder.decode` gives them).
        """
        if n is None and self._fast.supported:
            for leaves, pairs in self._chunks(size):
                if leaves is None:  # the vectorized decoder declined: per record
                    got = list(pairs)
                    leaves = self._decoder.decode([r for r, _ in got], [w for _, w in got])
                yield leaves
            return
        records: list[bytes] = []
        wheres: list[str] = []
        # A few rows need no read-ahead of whole shards.
        for record, where in itertools.islice(self._records(n is None or n > size), n):
            records.append(record)
            wheres.append(where)
            if len(records) == size:
                yield self._decoder.decode(records, wheres)
                records, wheres = [], []
        if records:
            yield self._decoder.decode(records, wheres)

    def _arrow_rows(self) -> int:
        size = self.header.total_bytes // max(self.header.element_count, 1)
        return max(1, min(_ROWS, _BATCH_BYTES // max(size, 1)))

    # -------------------------------------------------- pandas

    def to_pandas(self, n: int | None = None, select: Iterable[str] | None = None) -> Any:
        """The first ``n`` elements (None: all) as a pandas DataFrame, one column per leaf.

        Columns are named as ``superserial inspect`` names the leaves
        (``image``, ``meta/id``); dense scalars are plain typed columns (strings
        as ``bytes``), every other leaf an ``object`` column of the values
        iteration gives. See :mod:`superserial.views.dataframe`. Needs ``superserial[pandas]``.

        Args:
            n: How many elements, from the first; None: all.
            select: Only these leaves (names as for :func:`load`).

        Raises:
            MissingDependencyError: pandas is not installed.
            ValueError: ``n`` is negative, or ``select`` names no leaf.
        """
        from superserial.views import dataframe

        n = _count(n)
        dataframe.pandas()  # the missing extra is said before any reading
        ds = self._selected(select)
        return dataframe.to_pandas(ds.header.leaves, ds.flat_batches(n))

    # -------------------------------------------------- Arrow

    def iter_arrow(
        self, batch_size: int | None = None, *, select: Iterable[str] | None = None
    ) -> Iterator[Any]:
        """The elements as ``pyarrow.RecordBatch``es, in order; memory bounded by one batch.

        Types as :mod:`superserial.views.arrow` maps them (the Arrow schema kept
        in the header's metadata by a conversion, where there is one). Needs
        ``superserial[arrow]``.

        Args:
            batch_size: Rows per batch; None: about 64 MiB of records, at most 65536.
            select: Only these leaves (names as for :func:`load`).

        Raises:
            MissingDependencyError: pyarrow is not installed.
            UnsupportedError: A leaf has no Arrow form: sparse, bfloat16, complex (named).
            HeaderError: ``metadata["arrow_schema"]`` is garbage or does not fit.
        """
        from superserial.views import arrow

        arrow.pyarrow()
        ds = self._selected(select)
        rows = ds._arrow_rows() if batch_size is None else _rows(batch_size)
        arrow.table_schema(ds.header)  # a leaf with no Arrow form is said before any reading
        return arrow.record_batches(ds.header, ds.flat_batches(None, rows))

    def to_arrow_reader(
        self, batch_size: int | None = None, *, select: Iterable[str] | None = None
    ) -> Any:
        """The batches of :meth:`iter_arrow` as a ``pyarrow.RecordBatchReader`` (streaming)."""
        from superserial.views import arrow

        batches = self.iter_arrow(batch_size, select=select)
        schema = arrow.table_schema(self._selected(select).header)
        return arrow.pyarrow().RecordBatchReader.from_batches(schema, batches)

    def to_arrow(self, select: Iterable[str] | None = None) -> Any:
        """Every element as one ``pyarrow.Table``, a row per element (see :meth:`iter_arrow`)."""
        from superserial.views import arrow

        batches = list(self.iter_arrow(select=select))
        schema = arrow.table_schema(self._selected(select).header)
        return arrow.pyarrow().Table.from_batches(batches, schema=schema)

    # -------------------------------------------------- Hugging Face

    def to_hf(
        self,
        *,
        select: Iterable[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Any:
        """The elements as a Hugging Face ``datasets.Dataset``, one row per element.

        The Arrow batches of :meth:`iter_arrow`, with the features a conversion
        from Hugging Face kept (``metadata["hf_features"]``) or ``ClassLabel``
        features for ``metadata["class_names"]`` (see :mod:`superserial.views.hf`).
        Needs ``superserial[hf-datasets]``.

        Args:
            select: Only these leaves (names as for :func:`load`).
            cache_dir: None: the table is built in memory. A local directory:
                the batches are streamed into an Arrow file there (memory bounded
                by a batch) that the dataset maps, as ``datasets`` does its cache.

        Raises:
            MissingDependencyError: datasets or pyarrow is not installed.
            HeaderError: The kept features or schema are garbage or do not fit.
        """
        from superserial.views import hf

        hf.datasets()
        ds = self._selected(select)
        return hf.to_hf(ds.header, ds.iter_arrow(), None if cache_dir is None else str(cache_dir))

    # -------------------------------------------------- notebooks

    def _repr_html_(self) -> str:
        """The notebook view: summary, leaves, the first rows (image leaves as thumbnails)."""
        from superserial.views import notebook

        rows = [
            self._decoder.element(record, where)
            for record, where in itertools.islice(self._records(False), notebook.ROWS)
        ]
        return notebook.dataset_html(self.path, self.header, len(self.files), len(self), rows)


def _rows(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected batch_size >= 1 or None, got {value!r}")
    return value

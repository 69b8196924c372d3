"""Ray Data reads of superserial datasets, without TensorFlow.

    import ray
    import superserial.ray as ssr

    ds = ssr.read("/data/digits", select=["image", "label"])   # a ray.data.Dataset
    ds = ray.data.read_datasource(ssr.SuperserialDatasource("s3://bucket/ds"))

Read tasks: one per shard file, or, when there are fewer shards than the
parallelism Ray asks for (``override_num_blocks=`` or its own choice), the
shards are cut into ranges of consecutive records, each read through the
shard's record index (:mod:`superserial.read.random_access`). Compressed
shards, or shards without an index, are never cut: one task per shard. Each
task opens the dataset through the one opening sequence
(:mod:`superserial.read.opening`) for its shard alone, with the header the
driver read, and decodes with the TF-free reader
(:mod:`superserial.read.numpy_reader`); the task's row count is exact in its
metadata, and its size is the decoded size of its fixed-shape leaves plus the
record bytes of the others (an estimate).

Blocks, in Ray's native numpy-batch form (one column per leaf, named as
``superserial inspect`` names it, ``meta/id``; nested dicts flattened):

* fixed-shape dense leaves: one ``[rows, *shape]`` array (Ray tensor columns;
  scalar strings a ``binary`` column of ``bytes``);
* dense leaves with an unknown dimension: a Ray variable-shaped tensor column
  (``ArrowVariableShapedTensorArray``) in every block, also where a block's shapes
  agree; Ray's numpy batches give it as an ``object`` array of ``np.ndarray``
  values (string leaves: an ``object`` array of them, pickled);
* ragged and sparse leaves: an ``object`` array of the numpy reader's
  :class:`~superserial.numpy.Ragged` and :class:`~superserial.numpy.Sparse`
  values (Ray keeps them as pickled Python objects);
* leaves Arrow has no type for (bfloat16, complex, string arrays of rank >= 1):
  an ``object`` array of the elements' ``np.ndarray`` values (pickled too), so
  that their dtype survives.

Remote paths (``s3://``, ``gs://``, ``http(s)://``) work as for
:func:`superserial.numpy.load`; ``cache_dir=`` is each worker's local cache.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from superserial.errors import require
from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, Node
from superserial.read.numpy_reader import NumpyDataset
from superserial.read.opening import open_dataset
from superserial.storage import fs

require("ray.data", extra="ray", needed_for="superserial.ray", package="Ray Data")
pa = require("pyarrow", extra="ray", needed_for="superserial.ray")

from ray.data import Dataset, read_datasource  # noqa: E402
from ray.data.block import BlockAccessor, BlockMetadata  # noqa: E402
from ray.data.datasource import Datasource, ReadTask  # noqa: E402
from ray.data.extensions import ArrowVariableShapedTensorArray  # noqa: E402

__all__ = ["SuperserialDatasource", "read"]

# Decoded bytes a block aims at (Ray's blocks are at most 128 MiB by default).
_BLOCK_BYTES = 32 << 20
# dtypes Arrow holds as tensor values (the others travel as pickled ndarrays).
_NO_ARROW = ("bfloat16", "complex64", "complex128")


@dataclass(frozen=True)
class _Range:
    """Records ``start .. start + count - 1`` of shard ``shard``: one read task."""

    shard: int
    start: int
    count: int


def _row_bytes(header: Header) -> float:
    """About how many decoded bytes one row of ``header``'s leaves takes."""
    fixed = sum(
        leaf.num_values * leaf.entry.itemsize
        for leaf in header.leaves
        if leaf.fixed and leaf.dtype != "string"
    )
    others = any(not leaf.fixed or leaf.dtype == "string" for leaf in header.leaves)
    records = header.total_bytes / max(header.element_count, 1)
    return fixed + (records if others else 0.0)


def plan_ranges(header: Header, parallelism: int) -> list[_Range]:
    """The read tasks' ranges: one per non-empty shard, or shards cut to reach ``parallelism``.

    Shards are cut only when there are fewer than ``parallelism`` of them and
    every shard has an index (from which a task finds its first record; in a
    compressed shard, the restart block holding it); each is then cut into
    ranges of about ``total / parallelism`` records.
    """
    shards = [(k, s.records) for k, s in enumerate(header.shards) if s.records]
    cuttable = all(s.index is not None for s in header.shards)
    if len(shards) >= parallelism or not cuttable:
        return [_Range(k, 0, n) for k, n in shards]
    per_task = max(1, math.ceil(header.element_count / parallelism))
    out: list[_Range] = []
    for k, n in shards:
        pieces = max(1, math.ceil(n / per_task))
        edges = [n * j // pieces for j in range(pieces + 1)]
        out += [_Range(k, a, b - a) for a, b in itertools.pairwise(edges) if b > a]
    return out


def _flatten(node: Node, value: Any) -> list[Any]:
    """A packed batch's leaves in :func:`~superserial.format.structure.iter_leaves` order."""
    if isinstance(node, Leaf):
        return [value]
    if isinstance(node, DictNode):
        return [x for k in sorted(node.items) for x in _flatten(node.items[k], value[k])]
    return [x for n, v in zip(node.items, value, strict=True) for x in _flatten(n, v)]


def _objects(values: Iterable[Any], n: int) -> np.ndarray:
    # Filled one by one: numpy would make equal-shaped arrays one array.
    out = np.empty(n, dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _column(leaf: Leaf, value: Any) -> Any:
    """One leaf of a decoded batch as a column of a Ray block (see the module doc)."""
    if isinstance(value, np.ndarray):  # fixed-shape dense: [rows, *shape]
        if leaf.dtype in _NO_ARROW or (leaf.dtype == "string" and leaf.shape != ()):
            return _objects(value, len(value))
        return value
    # A ragged leaf of ragged_rank 0 is decoded as a dense array, as TensorFlow gives it.
    dense = leaf.kind == "dense" or (leaf.kind == "ragged" and not leaf.ragged_rank)
    if dense and leaf.dtype not in _NO_ARROW and leaf.dtype != "string":
        # Variable-shaped in every block, also where a block's shapes happen to agree
        # (Ray would make that block's column a fixed-shape one, unlike the others').
        return ArrowVariableShapedTensorArray.from_numpy(list(value))
    return _objects(value, len(value))


def _block(leaves: tuple[Leaf, ...], flat: list[Any]) -> Any:
    """A decoded batch's flat leaves as one Ray block (an Arrow table)."""
    columns = {leaf.name: _column(leaf, v) for leaf, v in zip(leaves, flat, strict=True)}
    tensors = {k: v for k, v in columns.items() if not isinstance(v, np.ndarray)}
    plain = {k: v for k, v in columns.items() if isinstance(v, np.ndarray)}
    if not plain:
        return pa.table(tensors)
    block = BlockAccessor.batch_to_block(plain)
    for name, array in tensors.items():
        block = block.append_column(name, array)
    return block.select([leaf.name for leaf in leaves])


class _ReadTask:
    """The read function of one task: its range of one shard, as blocks (picklable)."""

    def __init__(self, source: SuperserialDatasource, piece: _Range, rows: int) -> None:
        self._source, self._piece, self._rows = source, piece, rows

    def __call__(self) -> Iterator[Any]:
        src, piece = self._source, self._piece
        opened = open_dataset(
            src.path,
            header=src.full_header,
            select=src.select,
            shard=(piece.shard, len(src.full_header.shards)),
            cache_dir=src.cache_dir,
            cache_limit=src.cache_limit,
            stream=True,
        )
        if piece.start == 0 and piece.count == opened.count:
            ds = NumpyDataset.from_opened(opened)
        else:
            ds = NumpyDataset(
                opened.root,
                opened.selected,
                list(opened.files),
                [piece.count],
                starts=[piece.start],
            )
            ds.cache_lease = opened.lease
        leaves = ds.header.leaves
        for batch in ds.batches(self._rows):
            yield _block(leaves, _flatten(ds.header.structure, batch))


class SuperserialDatasource(Datasource):
    """A superserial dataset as a Ray Data ``Datasource``: ``ray.data.read_datasource(source)``.

    The header is read here (on the driver); the tasks open their shards
    themselves (see the module documentation).

    Args:
        path: The dataset directory (local, or a URL the workers reach).
        select: Read only these leaves, as :func:`superserial.numpy.load` takes it.
        cache_dir: For a URL: each worker's local cache directory for the
            shards it reads, as :func:`superserial.numpy.load` takes it.
        cache_limit: The most bytes ``cache_dir`` keeps.
        block_rows: Rows per block; None: about 32 MiB of decoded values each.

    Raises:
        DatasetNotFoundError, HeaderError: As :func:`superserial.numpy.load`.
        ValueError: ``select`` names no leaf, or a bad ``block_rows``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        select: Iterable[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        block_rows: int | None = None,
    ) -> None:
        super().__init__()
        if block_rows is not None and (
            isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1
        ):
            raise ValueError(f"expected block_rows >= 1 or None, got {block_rows!r}")
        self.path = os.fspath(path)
        self.select = None if select is None else list(select)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_limit = cache_limit
        # Header and select checked here, not in a worker; the files are checked by each task.
        opened = open_dataset(self.path, select=self.select, check_files=False)
        self.full_header: Header = opened.header
        self.header: Header = opened.selected
        self._row_bytes = _row_bytes(self.header)
        self.block_rows = block_rows or max(1, int(_BLOCK_BYTES // max(self._row_bytes, 1.0)))

    def get_name(self) -> str:
        return "Superserial"

    def estimate_inmemory_data_size(self) -> int | None:
        return int(self._row_bytes * self.header.element_count)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        """One task per shard, or per range of records when shards are fewer than ``parallelism``."""
        del data_context
        tasks = []
        for piece in plan_ranges(self.full_header, max(1, parallelism)):
            shard = self.full_header.shards[piece.shard]
            meta = BlockMetadata(
                num_rows=piece.count,
                size_bytes=int(self._row_bytes * piece.count),
                input_files=[fs.join(self.path, shard.file)],
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    _ReadTask(self, piece, self.block_rows),
                    meta,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks

    def __repr__(self) -> str:
        return f"SuperserialDatasource({self.path!r}, {self.header.element_count} elements)"


def read(
    path: str | os.PathLike[str],
    *,
    select: Iterable[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    block_rows: int | None = None,
    override_num_blocks: int | None = None,
    **read_args: Any,
) -> Dataset:
    """A superserial dataset as a ``ray.data.Dataset``, in its saved order.

    ``ray.data.read_datasource(SuperserialDatasource(path, ...), ...)``; see
    :class:`SuperserialDatasource` for the arguments and the module
    documentation for the columns.

    Args:
        path: The dataset directory or URL.
        select: Read only these leaves.
        cache_dir: For a URL: each worker's local cache directory.
        cache_limit: The most bytes ``cache_dir`` keeps.
        block_rows: Rows per block; None: about 32 MiB of decoded values each.
        override_num_blocks: The read parallelism Ray asks for: with fewer
            shards, shards are cut into ranges of records.
        read_args: Passed on to ``ray.data.read_datasource`` (``ray_remote_args``...).
    """
    source = SuperserialDatasource(
        path, select=select, cache_dir=cache_dir, cache_limit=cache_limit, block_rows=block_rows
    )
    return read_datasource(source, override_num_blocks=override_num_blocks, **read_args)

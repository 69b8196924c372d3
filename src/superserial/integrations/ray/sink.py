"""Ray Data writes of superserial datasets, without TensorFlow.

    import superserial.ray as ssr

    ssr.write(ds, "/data/out")                       # ds: a ray.data.Dataset
    ds.write_datasink(ssr.SuperserialDatasink("s3://bucket/out", compression="GZIP"))

The two-phase protocol of :mod:`superserial.tf.two_phase`, with Ray's write
tasks as its writers: task ``t`` writes part ``t`` into a fresh attempt
directory ``path/.staging/part-{t:05d}/attempt-<random>/`` through the one
write loop (:mod:`superserial.write.loop`, a
:class:`~superserial.write.targets.PartTarget`), and commits the part with its
manifest. A retried task writes a new attempt and replaces the manifest. Once
every task has succeeded, ``on_write_complete`` (on the driver) commits the
parts that Ray reports, in task order, with
:func:`superserial.write.parts.commit_parts` (what ``finalize`` does): their
files moved in as ``data-XXXXX-of-YYYYY.tfrecord``, ``header.json`` written
last, the staging area removed. Until then ``path`` holds no header, so a
failed or killed write never leaves a dataset that looks complete; the
manifests of its parts say ``num_parts`` 0 (no task knows how many there
are), so ``superserial.finalize`` refuses them too. A failed write's staging
area is removed by ``on_write_failed`` (best effort); what a dead driver left
there is removed by the next write's commit. ``path`` must hold no dataset: an
old one is never touched.

Structure: inferred by each task from its blocks' columns (Ray's numpy
batches): a column ``a/b`` is leaf ``b`` of dict ``a`` (names as
``superserial inspect`` spells them, so a dataset read with
:mod:`superserial.integrations.ray.source` is written back with its
structure). Every block of a task, and every task, must agree on it (a
mismatch is an error naming the column, or the parts). What a column may hold:

* numbers and bools of the dtypes of ``docs/format.md`` (a ``[rows, *shape]``
  array, Ray's tensor columns included): a dense leaf of that dtype and shape;
* ``str`` (as UTF-8) or ``bytes``: a ``string`` leaf;
* ``np.ndarray`` values of one shape and dtype (how the reader gives bfloat16,
  complex and string arrays): a dense leaf of that shape;
* Ray variable-shaped tensors, or ``np.ndarray`` values of one dtype and rank
  but varying shapes: a dense leaf of that rank with every dimension unknown;
* :class:`superserial.numpy.Ragged` values (as the reader gives ragged
  leaves) of one dtype, ragged rank and inner shape: a ragged leaf whose
  outer and ragged dimensions are unknown.

Ray makes a column of same-shaped arrays a fixed-shape tensor column, block by
block: a column whose shapes vary in some blocks only should be given as a
variable-shaped tensor column (``ray.data.extensions.ArrowVariableShapedTensorArray``)
in every block, as :mod:`~superserial.integrations.ray.source` gives one.
Sparse values are an :class:`~superserial.errors.UnsupportedError` naming the
column (the TF-free encoder has none); nulls are an error naming the column and
row, never a silent cast. Records are encoded by
:func:`superserial.codec.numpy_encode.frame_batch`: the bytes ``save`` writes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from superserial._version import __version__
from superserial.codec.numpy_encode import frame_batch
from superserial.errors import DatasetExistsError, UnsupportedError, require
from superserial.format import layout
from superserial.format.header import Header, Shard, normalize_compression
from superserial.format.structure import Leaf, Node, iter_leaves
from superserial.integrations.ray.columns import block_columns, structure_of
from superserial.storage import fs
from superserial.write.loop import Writing
from superserial.write.parts import Part, commit_parts
from superserial.write.targets import PartTarget

require("ray.data", extra="ray", needed_for="superserial.ray", package="Ray Data")

from ray.data import Dataset  # noqa: E402
from ray.data.block import BlockAccessor  # noqa: E402
from ray.data.datasource import Datasink  # noqa: E402

__all__ = ["SuperserialDatasink", "write"]

log = logging.getLogger("superserial")

_WRITER = f"superserial {__version__} (ray)"


class _PartWriter:
    """One write task's part: blocks in, encoded and written, then the part committed."""

    def __init__(
        self, path: str, index: int, compression: str | None, shard_size: int | None
    ) -> None:
        self.path, self.index, self.compression = path, index, compression
        self.shard_size = shard_size
        self.structure: Node | None = None
        self.leaves: tuple[Leaf, ...] = ()
        self.rows = 0

    def _header(self, shards: tuple[Shard, ...]) -> Header:
        if self.structure is None:  # a commit comes only after a block set the structure
            raise RuntimeError("expected the structure of a block before the commit")
        return Header.of_shards(self.structure, self.compression, shards, writer=_WRITER)

    def _batches(self, blocks: Iterable[Any]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for block in blocks:
            acc = BlockAccessor.for_block(block)
            if not acc.num_rows():
                continue
            columns = block_columns(block, self.rows)
            structure = structure_of({name: leaf for name, (leaf, _) in columns.items()})
            if self.structure is None:
                self.structure, self.leaves = structure, tuple(iter_leaves(structure))
            elif structure != self.structure:
                raise UnsupportedError(
                    f"expected every block of write task {self.index} to have the columns, "
                    f"dtypes and shapes of its first, got another at row {self.rows}:\n"
                    f"{_summary(self.structure)}\nthen\n{_summary(structure)}\n(a column of "
                    "arrays of varying shapes: give it as a variable-shaped tensor column in "
                    "every block)"
                )
            by_name = {leaf.name: col for leaf, col in columns.values()}
            encoded = frame_batch(
                self.leaves, [by_name[leaf.name] for leaf in self.leaves], count=acc.num_rows()
            )
            self.rows += acc.num_rows()
            yield encoded

    def write(self, blocks: Iterable[Any]) -> Part | None:
        """Writes the blocks as this part and commits it; None when they hold no row."""
        batches = self._batches(blocks)
        first = next(batches, None)
        if first is None:
            return None
        target = PartTarget(self.path, self.index, 0, self._header)
        writing: Writing[Part] = Writing(
            target, compression=self.compression, shard_size=self.shard_size
        )
        with writing:
            writing.write(*first)
            writing.write_all(batches)
            return writing.commit()


def _summary(node: Node) -> str:
    return ", ".join(
        f"{leaf.name}: {leaf.kind} {leaf.dtype}{list(leaf.shape)}" for leaf in iter_leaves(node)
    )


class SuperserialDatasink(Datasink):
    """A Ray Data ``Datasink`` writing a superserial dataset: ``ds.write_datasink(sink)``.

    See the module documentation for the protocol and the columns.

    Args:
        path: The dataset directory (local or a URL the workers reach); must
            hold no dataset.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        shard_size: Start a new file in a task's part after about this many
            bytes (default 128 MiB).

    Attributes:
        header: The header written, once the write has completed.

    Raises:
        DatasetExistsError: ``path`` holds a dataset.
        ValueError: A bad ``compression``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compression: str | None = None,
        shard_size: int | None = None,
    ) -> None:
        self.path = fs.dataset_path(os.fspath(path))
        self.compression = normalize_compression(compression)
        self.shard_size = shard_size
        self.header: Header | None = None
        self._check_free()

    def _check_free(self) -> None:
        if fs.exists(fs.join(self.path, layout.HEADER_FILE)):
            raise DatasetExistsError(
                f"expected no dataset at {self.path} to write into, found "
                f"{layout.HEADER_FILE}; remove it first"
            )

    def get_name(self) -> str:
        return "Superserial"

    def on_write_start(self, schema: Any = None) -> None:
        del schema  # each task infers the structure from its own blocks
        self._check_free()  # again: a dataset may have appeared since the sink was made

    def write(self, blocks: Iterable[Any], ctx: Any) -> Part | None:
        """Writes this task's blocks as part ``ctx.task_idx`` and commits it (in a worker)."""
        part = _PartWriter(self.path, ctx.task_idx, self.compression, self.shard_size)
        return part.write(blocks)

    def on_write_complete(self, write_result: Any) -> None:
        """Commits the parts the tasks reported, in task order (on the driver)."""
        parts = sorted((p for p in write_result.write_returns if p is not None), key=_index)
        if not parts:
            raise UnsupportedError(
                f"expected at least one row to write to {self.path}, got none (the structure "
                "comes from the rows)"
            )
        self.header = commit_parts(self.path, parts, writer=_WRITER)
        log.info(
            "ray write: %d elements in %d file(s) from %d task(s), %d bytes at %s",
            self.header.element_count,
            len(self.header.shards),
            len(parts),
            self.header.total_bytes,
            self.path,
        )

    def on_write_failed(self, error: Exception) -> None:
        """Removes the failed write's staging area (best effort: tasks may still be stopping)."""
        staging = fs.join(self.path, layout.STAGING_DIR)
        try:
            if fs.exists(staging):
                fs.rmtree(staging)
        except OSError as e:
            log.warning(
                "ray write to %s failed (%s); could not remove %s: %s", self.path, error, staging, e
            )


def _index(part: Part) -> int:
    return part.index


def write(
    ds: Dataset,
    path: str | os.PathLike[str],
    *,
    compression: str | None = None,
    shard_size: int | None = None,
    **write_args: Any,
) -> Header:
    """Writes a ``ray.data.Dataset`` as a superserial dataset at ``path``; returns its header.

    ``ds.write_datasink(SuperserialDatasink(path, ...), **write_args)``: one
    part per write task, committed once all have succeeded (see the module
    documentation). The element order is the order of Ray's write tasks, and of
    the blocks within each.

    Args:
        ds: The dataset.
        path: The dataset directory or URL; must hold no dataset.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        shard_size: Bytes per file within a task's part (default 128 MiB).
        write_args: Passed on to ``write_datasink`` (``ray_remote_args``, ``concurrency``).

    Raises:
        DatasetExistsError: ``path`` holds a dataset.
        UnsupportedError: A column superserial cannot store yet, a null, blocks
            or tasks that disagree on the columns (raised by Ray, from a task).
    """
    sink = SuperserialDatasink(path, compression=compression, shard_size=shard_size)
    ds.write_datasink(sink, **write_args)
    if sink.header is None:  # write_datasink returned, so on_write_complete ran
        raise RuntimeError(f"expected the header of the write to {sink.path}, got none")
    return sink.header

"""Many writers, one dataset: a two-phase protocol on plain files.

Phase 1, on every worker ``i`` of ``n`` (processes, machines, at the same time
or not)::

    superserial.save(ds_part_i, path, shard_index=i, num_shards=n)
    # or, element by element:
    with superserial.Writer(path, shard_index=i, num_shards=n, element_spec=spec) as w:
        for element in elements:
            w.write(element)

Each worker writes its shard files into a fresh attempt directory of its own
staging area, ``path/.staging/part-{i:05d}/attempt-<random>/``, encoded
exactly as :func:`superserial.save` encodes them (same code). Last, it writes
the part's manifest ``path/.staging/part-{i:05d}/manifest.json`` atomically (a
temporary file renamed over it): the manifest is the part's commit point. It
names the attempt directory and lists every file with its record count, size
and CRC-32C, with the element structure and compression. A worker that dies
before that rename leaves no manifest (or the previous one); restarting it
writes a new attempt and replaces the manifest, and files of dead attempts
are ignored and removed by ``finalize``. A writer that fails (an exception in
its ``with`` block) removes its attempt, and the directories it leaves empty.

On a local filesystem, a writer holds an advisory lock (``flock``) on
``attempt-<random>.lock`` beside its attempt directory until it commits or
aborts, so :func:`superserial.cleanup` can tell abandoned attempts (a killed
worker's) from live ones and remove only those.

Phase 2, once, after every worker has finished::

    header = superserial.finalize(path)

checks that all ``n`` parts are present, agree on structure and compression,
and that every listed file is there with the listed size (and CRC-32C with
``verify=True``), all before changing anything. It then moves the files into
``path`` as ``data-XXXXX-of-YYYYY.tfrecord``, numbered in part order (and in
file order within a part), writes ``header.json`` atomically (temporary file
and rename) and removes the staging area. The dataset is element-for-element
the concatenation of parts ``0, 1, ..., n-1``.

``finalize`` is idempotent: interrupted at any point, running it again
completes the job; run after success, it changes nothing and returns the
header. Part ``i``'s files are contiguous in the final layout, so with one
file per part ``load(path, shard=(i, n))`` reads back exactly part ``i``.

Only renames of single files are needed, so this also works on object stores
through ``tf.io.gfile`` (``gs://``, ``s3://``), where a rename is a copy.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import tensorflow as tf

from superserial._version import __version__
from superserial.codec.tf_records import ElementEncoder, framed_batches
from superserial.codec.tf_tensors import to_tensors
from superserial.errors import DatasetExistsError, UnsupportedError
from superserial.format.header import Header, Shard, normalize_compression
from superserial.format.layout import HEADER_FILE
from superserial.format.structure import Leaf
from superserial.storage import fs
from superserial.tf.writes import check_dataset, structure_of
from superserial.write.loop import Writing, check_shard_size
from superserial.write.parts import Part
from superserial.write.targets import PartTarget

__all__ = ["Writer", "save_part"]

log = logging.getLogger("superserial")

# Elements buffered by Writer.write before they are encoded together.
_FLUSH_ELEMENTS = 1024
_MAX_PARTS = 100_000


def _check_index(shard_index: Any, num_shards: Any) -> None:
    if (
        not isinstance(num_shards, int)
        or isinstance(num_shards, bool)
        or not 1 <= num_shards <= _MAX_PARTS
    ):
        raise ValueError(
            f"expected num_shards in [1, {_MAX_PARTS}] with shard_index, got {num_shards!r}"
        )
    if (
        not isinstance(shard_index, int)
        or isinstance(shard_index, bool)
        or not 0 <= shard_index < num_shards
    ):
        raise ValueError(f"expected 0 <= shard_index < {num_shards}, got {shard_index!r}")


class Writer:
    """Writes part ``shard_index`` of ``num_shards`` of the dataset at ``path``.

    Use as a context manager: the part is committed (its manifest written) on
    a clean exit and discarded on an exception. Several writers of different
    parts may run at once, in different processes or machines; then one
    :func:`finalize` assembles the dataset.

    Args:
        path: The dataset directory (created if needed; must not yet hold a
            finalized dataset).
        shard_index: This part's index ``i``, ``0 <= i < num_shards``.
        num_shards: The number of parts ``n``, the same for every worker.
        element_spec: The element spec; needed for :meth:`write`, taken from
            the dataset by :meth:`write_dataset` otherwise.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``; the same for every part.
        shard_size: Start a new file in this part after about this many bytes
            (default 128 MiB).

    Raises:
        DatasetExistsError: ``path`` already holds a finalized dataset.
    """

    def __init__(
        self,
        path: str,
        *,
        shard_index: int,
        num_shards: int,
        element_spec: Any = None,
        compression: str | None = None,
        shard_size: int | None = None,
    ) -> None:
        _check_index(shard_index, num_shards)
        check_shard_size(shard_size)
        self.path = fs.dataset_path(path)
        if fs.exists(fs.join(self.path, HEADER_FILE)):
            raise DatasetExistsError(
                f"expected no finalized dataset at {self.path} to write part {shard_index} into, "
                f"found {HEADER_FILE}; remove it first"
            )
        self.index, self.count = shard_index, num_shards
        self.compression = normalize_compression(compression)
        self._spec: Any = None
        self._leaves: tuple[Leaf, ...] = ()
        self._structure: Any = None
        self._buffer: list[Any] = []
        self._encoder: ElementEncoder | None = None
        self.part: Part | None = None
        if element_spec is not None:
            self._set_spec(element_spec)
        # The attempt directory, locked locally; the part's manifest is its commit point.
        self._target = PartTarget(self.path, shard_index, num_shards, self._part_header)
        self.attempt = self._target.attempt
        self._writing: Writing[Part] = Writing(
            self._target, compression=self.compression, shard_size=shard_size
        )

    def _part_header(self, shards: tuple[Shard, ...]) -> Header:
        return Header.of_shards(
            self._structure, self.compression, shards, writer=f"superserial {__version__}"
        )

    def _set_spec(self, element_spec: Any) -> None:
        if self._spec is not None:
            if element_spec != self._spec:
                raise UnsupportedError(
                    f"expected element_spec {self._spec}, got {element_spec} at part {self.index}"
                )
            return
        structure, leaves = structure_of(element_spec)
        self._spec, self._structure, self._leaves = element_spec, structure, leaves

    def _check_open(self) -> None:
        if self._writing.state != "open":
            raise ValueError(
                f"expected an open Writer, got a {self._writing.state} one at part {self.index}"
            )

    @property
    def element_count(self) -> int:
        """Elements written so far (buffered ones included)."""
        return self._writing.records + len(self._buffer)

    def write(self, element: Any) -> None:
        """Adds one element (numpy values or tensors; see :func:`to_tensors`).

        Elements are buffered and encoded in batches, as ``save`` encodes them.
        """
        self._check_open()
        if self._spec is None:
            raise ValueError("expected element_spec= on a Writer before write(), got none")
        self._buffer.append(to_tensors(element, self._spec))
        if len(self._buffer) >= _FLUSH_ELEMENTS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        buffered, self._buffer = self._buffer, []
        if self._encoder is None:
            self._encoder = ElementEncoder(self._spec, self._leaves)
        self._writing.write_all(self._encoder.encode_framed(buffered, converted=True))

    def write_dataset(self, dataset: tf.data.Dataset, *, progress: Any = False) -> int:
        """Appends all elements of a finite dataset; returns how many.

        Raises:
            UnsupportedError: ``dataset`` is not a ``tf.data.Dataset`` (also a
                ``TypeError``), its element_spec differs from the Writer's, or
                a leaf cannot be stored.
        """
        self._check_open()
        card = check_dataset(dataset)
        self._set_spec(dataset.element_spec)
        self._flush()
        from superserial.base.progress import make_progress

        bar = make_progress(
            progress, total=card if card >= 0 else None, desc=f"part {self.index} of {self.path}"
        )
        try:
            return self._writing.write_all(framed_batches(dataset, self._leaves), bar)
        finally:
            bar.close()

    def close(self) -> Part:
        """Flushes, closes the files and commits the part (writes its manifest).

        Returns:
            The committed part.
        """
        self._check_open()
        if self._spec is None:
            raise ValueError(
                "expected element_spec= or a write_dataset() before close(), got neither"
            )
        start = time.perf_counter()
        try:
            self._flush()
        except BaseException:
            self.abort()
            raise
        part = self._writing.commit()
        self.part = part
        log.info(
            "wrote part %d of %d of %s: %d elements in %d file(s), %d bytes, %.2fs",
            self.index,
            self.count,
            self.path,
            part.header.element_count,
            len(part.header.shards),
            part.header.total_bytes,
            time.perf_counter() - start,
        )
        return part

    def abort(self) -> None:
        """Discards this attempt; a previously committed part stays as it was."""
        self._writing.abort()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            try:
                self.close()
            except BaseException:
                self.abort()  # e.g. no element_spec: leave nothing behind
                raise
        else:
            self.abort()


def save_part(
    dataset: tf.data.Dataset,
    path: str,
    *,
    shard_index: int,
    num_shards: int,
    compression: str | None = None,
    shard_size: int | None = None,
    progress: Any = None,
) -> Header:
    """Writes ``dataset`` as part ``shard_index`` of ``num_shards`` (phase 1).

    What ``superserial.save(dataset, path, shard_index=i, num_shards=n)``
    does; see the module documentation for the protocol.

    Returns:
        The part's header (its files named inside the part's attempt directory).
    """
    w = Writer(
        path,
        shard_index=shard_index,
        num_shards=num_shards,
        compression=compression,
        shard_size=shard_size,
    )
    try:
        w.write_dataset(dataset, progress=progress)
    except BaseException:
        w.abort()
        raise
    return w.close().header

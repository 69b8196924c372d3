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
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from superserial._version import __version__
from superserial.codec.tf_records import ElementEncoder, record_batches
from superserial.codec.tf_spec import from_element_spec, not_a_dataset
from superserial.codec.tf_tensors import to_tensors
from superserial.errors import (
    DatasetExistsError,
    UnsupportedError,
)
from superserial.format import layout
from superserial.format.header import Header, normalize_compression
from superserial.format.layout import HEADER_FILE, MANIFEST_FILE, STAGING_DIR, part_dir
from superserial.format.structure import Leaf, iter_leaves
from superserial.storage import fs
from superserial.write.local_commit import lock_file, release_file
from superserial.write.parts import Part
from superserial.write.shard_writer import DEFAULT_SHARD_SIZE, ShardWriter

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
        if shard_size is not None and (not isinstance(shard_size, int) or shard_size < 1):
            raise ValueError(f"expected shard_size >= 1 byte, got {shard_size!r}")
        self.path = str(path).rstrip("/") or "/"
        if fs.exists(fs.join(self.path, HEADER_FILE)):
            raise DatasetExistsError(
                f"expected no finalized dataset at {self.path} to write part {shard_index} into, "
                f"found {HEADER_FILE}; remove it first"
            )
        self.index, self.count = shard_index, num_shards
        self.compression = normalize_compression(compression)
        self.dir = part_dir(self.path, shard_index)
        self._created = not fs.exists(self.path)
        self._lock: tuple[str, int] | None = None
        self.attempt = self._new_attempt()
        self._tmp = fs.join(self.dir, self.attempt)
        # The manifest is the part's commit point: files need no interim names.
        self._shards = ShardWriter(
            self._tmp,
            name=layout.done_shard_name,
            compression=self.compression,
            shard_size=shard_size or DEFAULT_SHARD_SIZE,
        )
        self._spec: Any = None
        self._leaves: tuple[Leaf, ...] = ()
        self._structure: Any = None
        self._buffer: list[Any] = []
        self._encoder: ElementEncoder | None = None
        self._total = 0
        self._state = "open"
        self.part: Part | None = None
        try:
            if element_spec is not None:
                self._set_spec(element_spec)
            fs.makedirs(self._tmp)
        except BaseException:
            self._release()
            self._remove_empty_dirs()
            raise

    def _new_attempt(self) -> str:
        """A fresh attempt name; locally, locked (``attempt-ID.lock``) until commit or abort.

        The lock tells :func:`superserial.cleanup` that the attempt is live.
        """
        for _ in range(100):
            attempt = layout.new_attempt_name()
            fs.makedirs(self.dir)
            if not fs.is_local(self.path):
                return attempt
            lpath = fs.join(self.dir, layout.attempt_lock_name(attempt)).removeprefix("file://")
            fd = lock_file(lpath, create=True)
            if fd is not None:
                self._lock = (lpath, fd)
                return attempt
            # A cleanup removed the directory, or saw the file before we locked it.
        raise OSError(f"expected to lock a new attempt in {self.dir}, failed 100 times")

    def _release(self) -> None:
        if self._lock is not None:
            lpath, fd = self._lock
            self._lock = None
            release_file(lpath, fd)

    def _remove_empty_dirs(self) -> None:
        """Removes the part and staging directories, and ``path`` if this Writer made it, while empty."""
        if not fs.is_local(self.path):
            return  # object stores have no empty directories
        dirs = [self.dir, fs.join(self.path, STAGING_DIR)] + ([self.path] if self._created else [])
        for d in dirs:
            try:
                os.rmdir(d.removeprefix("file://"))
            except OSError:  # not empty (another part, a dataset), or gone
                return

    def _set_spec(self, element_spec: Any) -> None:
        if self._spec is not None:
            if element_spec != self._spec:
                raise UnsupportedError(
                    f"expected element_spec {self._spec}, got {element_spec} at part {self.index}"
                )
            return
        structure = from_element_spec(element_spec)
        leaves = tuple(iter_leaves(structure))
        if not leaves:
            raise UnsupportedError(
                "expected at least one tensor in each element, got an empty structure"
            )
        self._spec, self._structure, self._leaves = element_spec, structure, leaves

    def _check_open(self) -> None:
        if self._state != "open":
            raise ValueError(
                f"expected an open Writer, got a {self._state} one at part {self.index}"
            )

    @property
    def element_count(self) -> int:
        """Elements written so far (buffered ones included)."""
        return self._total + len(self._buffer)

    def write(self, element: Any) -> None:
        """Adds one element (numpy values or tensors; see :func:`to_tensors`).

        Elements are buffered and encoded in batches, in graph.
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
        self._write_encoded(self._encoder.encode(buffered, converted=True))

    def _write_encoded(
        self,
        batches: Iterable[tuple[np.ndarray, np.ndarray]],
        bar: Callable[[int, int], None] | None = None,
    ) -> int:
        n = 0
        for recs, per_record in batches:
            nbytes = int(per_record.sum())
            self._shards.write(recs, per_record)
            n += len(recs)
            if bar is not None:
                bar(len(recs), nbytes)
        self._total += n
        return n

    def write_dataset(self, dataset: tf.data.Dataset, *, progress: Any = False) -> int:
        """Appends all elements of a finite dataset; returns how many.

        Raises:
            TypeError: ``dataset`` is not a ``tf.data.Dataset``.
            UnsupportedError: Its element_spec differs from the Writer's, or a
                leaf cannot be stored.
        """
        self._check_open()
        if not isinstance(dataset, tf.data.Dataset):
            raise not_a_dataset(dataset)
        if int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
            raise ValueError("expected a finite dataset, got one of infinite cardinality")
        self._set_spec(dataset.element_spec)
        self._flush()
        from superserial.progress import make_progress

        card = int(dataset.cardinality())
        bar = make_progress(
            progress, total=card if card >= 0 else None, desc=f"part {self.index} of {self.path}"
        )
        try:
            return self._write_encoded(record_batches(dataset, self._leaves), bar)
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
            shards = tuple(self._shards.finish())
        except BaseException:
            self.abort()
            raise
        header = Header(
            self._structure,
            self._total,
            self.compression,
            shards,
            writer=f"superserial {__version__}",
        )
        part = Part(self.index, self.count, self.attempt, header)
        try:
            fs.write_atomically(fs.join(self.dir, MANIFEST_FILE), part.to_json())
        except BaseException:
            self.abort()
            raise
        # Committed: only now may cleanup see the attempt unlocked.
        self._release()
        self._state = "committed"
        self.part = part
        log.info(
            "wrote part %d of %d of %s: %d elements in %d file(s), %d bytes, %.2fs",
            self.index,
            self.count,
            self.path,
            self._total,
            len(shards),
            header.total_bytes,
            time.perf_counter() - start,
        )
        return part

    def abort(self) -> None:
        """Discards this attempt; a previously committed part stays as it was."""
        if self._state == "open":
            self._state = "aborted"
            try:
                self._shards.abort()
                fs.rmtree(self._tmp)
            finally:
                self._release()
            self._remove_empty_dirs()

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
    with Writer(
        path,
        shard_index=shard_index,
        num_shards=num_shards,
        compression=compression,
        shard_size=shard_size,
    ) as w:
        w.write_dataset(dataset, progress=progress)
    assert w.part is not None
    return w.part.header

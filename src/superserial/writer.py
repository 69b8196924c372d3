"""``save``: a ``tf.data.Dataset`` to TFRecord shards plus a JSON header.

The dataset is iterated exactly once. Elements are encoded in batches inside
the ``tf.data`` graph (parallel ``map``), and the resulting records are
streamed to the shard files; no more than a few batches are in memory.

Everything is written into a hidden temporary sibling of ``path``; the header
is written last, and the directory is then renamed (or, when overwriting,
atomically exchanged) into place. A save that fails or is killed leaves no
directory at ``path`` that looks valid, and never damages the previous one.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import google_crc32c
import numpy as np
import tensorflow as tf

from superserial import __version__, codec, commit, fs
from superserial.errors import UnsupportedError
from superserial.header import (
    HEADER_FILE,
    Header,
    Shard,
    _node_to_json,
    iter_leaves,
    normalize_compression,
)
from superserial.layout import check_target
from superserial.spec import from_element_spec

__all__ = ["save", "shard_name"]

log = logging.getLogger("superserial")

DEFAULT_SHARD_SIZE = 128 << 20
# Encode batches of about this many bytes: large enough that per-op
# overheads vanish, small enough to keep memory bounded for big elements.
_BATCH_BYTES = 4 << 20
_MAX_BATCH = 1024


def shard_name(index: int, count: int, tag: str | None = None) -> str:
    """The file name of shard ``index`` of ``count``, with an optional per-save ``tag``."""
    if tag is None:
        return f"data-{index:05d}-of-{count:05d}.tfrecord"
    return f"data-{index:05d}-of-{count:05d}-{tag}.tfrecord"


def _element_bytes(leaves: Any) -> int:
    """A rough size of one element, guessing 16 for each unknown dimension."""
    total = 0
    for leaf in leaves:
        n = 1
        for d in leaf.shape:
            n *= 16 if d is None else d
        total += n * max(leaf.entry.itemsize, 8)
    return max(total, 1)


def file_crc32c(path: str) -> str:
    """CRC-32C of a whole file, as 8 hex digits."""
    crc = 0
    with fs.open_file(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = google_crc32c.extend(crc, chunk)
    return f"{crc:08x}"


class _ShardWriter:
    """Writes records to numbered shard files, rotating on a quota or a size."""

    def __init__(
        self, tmp: str, compression: str | None, quotas: list[int] | None, shard_size: int
    ):
        self.tmp, self.quotas, self.shard_size = tmp, quotas, shard_size
        self.options = tf.io.TFRecordOptions(compression_type=compression or "")
        self.counts: list[int] = []
        self.bytes = 0
        self.writer: Any = None

    def _part(self, i: int) -> str:
        return fs.join(self.tmp, f"data-{i:05d}.part.tfrecord")

    def _open_next(self) -> None:
        self.close()
        self.writer = tf.io.TFRecordWriter(self._part(len(self.counts)), self.options)
        self.counts.append(0)
        self.bytes = 0

    def _room(self) -> int:
        if self.quotas is not None:
            return self.quotas[len(self.counts) - 1] - self.counts[-1]
        return 1 << 62

    def write(self, records: Any, sizes: Any) -> None:
        """Writes a batch of records (numpy array of bytes) with their sizes."""
        start = 0
        ends = np.cumsum(sizes)
        while start < len(records):
            if self.writer is None or (
                self.quotas is None and self.bytes >= self.shard_size and self.counts[-1]
            ):
                self._open_next()
            while self._room() == 0:
                self._open_next()
            take = min(self._room(), len(records) - start)
            if self.quotas is None:
                # Stop at the record that fills the shard (at least one record).
                base = ends[start - 1] if start else 0
                fit = int(
                    np.searchsorted(ends[start:], base + self.shard_size - self.bytes, side="right")
                )
                take = min(take, max(fit, 1))
            # One C call per record, looped in C by deque: no Python bytecode per element.
            collections.deque(map(self.writer.write, records[start : start + take]), maxlen=0)
            self.counts[-1] += take
            self.bytes += int(ends[start + take - 1] - (ends[start - 1] if start else 0))
            start += take

    def finish(self) -> list[Shard]:
        """Closes the last file, creates missing empty shards, names them finally."""
        want = len(self.quotas) if self.quotas is not None else max(len(self.counts), 1)
        while len(self.counts) < want:
            self._open_next()
        self.close()
        shards = []
        for i, n in enumerate(self.counts):
            final = fs.join(self.tmp, shard_name(i, want))
            fs.rename(self._part(i), final)
            shards.append(Shard(shard_name(i, want), n, fs.size(final), file_crc32c(final)))
        return shards

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class _CommittingShardWriter(_ShardWriter):
    """A :class:`_ShardWriter` whose shards become complete files one by one.

    A shard is written as ``data-NNNNN.part.tfrecord``; once closed it is
    renamed to ``data-NNNNN.tfrecord`` and recorded in the save's manifest
    (``progress.json``), so an interrupted save can resume after it.
    """

    def __init__(
        self,
        tmp: str,
        compression: str | None,
        quotas: list[int] | None,
        shard_size: int,
        manifest: commit.Manifest,
    ):
        super().__init__(tmp, compression, quotas, shard_size)
        self.manifest = manifest
        self.counts = [s.records for s in manifest.shards]

    def _complete(self, i: int) -> str:
        return fs.join(self.tmp, f"data-{i:05d}.tfrecord")

    def close(self) -> None:
        """Closes the open shard, names it complete and records it in the manifest."""
        if self.writer is None:
            return
        super().close()
        i = len(self.counts) - 1
        done = self._complete(i)
        fs.rename(self._part(i), done)
        self.manifest.shards.append(
            Shard(f"data-{i:05d}.tfrecord", self.counts[i], fs.size(done), file_crc32c(done))
        )
        self.manifest.write(self.tmp)

    def abort(self) -> None:
        """Closes the open shard without completing it, and removes it."""
        if self.writer is not None:
            _ShardWriter.close(self)
            fs.remove(self._part(len(self.counts) - 1))

    def finish(self, taken: set[str] = frozenset()) -> list[Shard]:  # type: ignore[assignment]
        """Closes the last shard, adds missing empty ones, gives all their final names.

        Final names carry a tag unique to this save, never one of ``taken``
        (the files of the dataset being replaced), so that a reader still
        reading the old dataset by name never opens a file of the new one.
        """
        want = len(self.quotas) if self.quotas is not None else max(len(self.counts), 1)
        while len(self.counts) < want:
            self._open_next()
        self.close()
        while True:
            tag = uuid.uuid4().hex[:8]
            names = [shard_name(i, want, tag) for i in range(want)]
            if not taken.intersection(names):
                break
        shards = []
        for s, name in zip(self.manifest.shards, names, strict=True):
            fs.rename(fs.join(self.tmp, s.file), fs.join(self.tmp, name))
            shards.append(Shard(name, s.records, s.bytes, s.crc32c))
        return shards


def _quotas(num_shards: int | None, count: int) -> list[int] | None:
    if num_shards is None:
        return None
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"expected num_shards >= 1, got {num_shards!r}")
    if count < 0:
        raise ValueError(
            "expected a dataset of known cardinality with num_shards, got unknown cardinality; "
            "pass shard_size=<bytes> instead, or apply "
            "tf.data.experimental.assert_cardinality(n) to the dataset"
        )
    return [count // num_shards + (i < count % num_shards) for i in range(num_shards)]


def encoded_batches(dataset: tf.data.Dataset, leaves: tuple[Any, ...]) -> tf.data.Dataset:
    """The dataset as batches of serialized records and their byte totals."""
    ds = dataset
    if any(codec.needs_premap(leaf) for leaf in leaves):
        ds = ds.map(
            lambda *el: codec.split_element(leaves, tf.nest.flatten(el)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    ds = ds.batch(max(1, min(_MAX_BATCH, _BATCH_BYTES // _element_bytes(leaves))))
    encode = _batch_encoder(leaves, ds.element_spec)
    return ds.map(
        lambda *b: encode(*tf.nest.flatten(b, expand_composites=False)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    ).prefetch(2)


def iterate(dataset: tf.data.Dataset) -> Iterator[Any]:
    """Iterates ``dataset``; on any exception, Ctrl-C included, destroys its iterator at once.

    TensorFlow's iterator of a ``from_generator`` dataset deadlocks when it is
    destroyed during interpreter exit: its destructor waits for the generator
    thread, which waits for the GIL that the exiting main thread holds. A
    ``KeyboardInterrupt`` raised in ``next()`` keeps the iterator alive until
    exit (it is ``self`` in the frames of TensorFlow's ``__next__``, which the
    traceback holds), so the process hung after Ctrl-C. Clearing those
    frames' locals (TensorFlow's own; the caller's frames are not touched)
    and dropping the iterator here destroys it while the generator thread can
    still finish.
    """
    it = iter(dataset)
    try:
        yield from it
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        del it


@functools.lru_cache(maxsize=64)
def _batch_encoder_cached(leaves: tuple[Any, ...], flat_spec: tuple[Any, ...]) -> Any:
    @tf.function(input_signature=flat_spec)
    def encode(*flat: Any) -> Any:
        comps: list[Any] = []
        it = iter(flat)
        for leaf in leaves:
            n = codec.join_arity(leaf) if codec.needs_split(leaf) else 1
            comps.append(tuple(next(it) for _ in range(n)) if n > 1 else next(it))
        return codec.encode_batch(leaves, comps)

    return encode


def _batch_encoder(leaves: tuple[Any, ...], batch_spec: Any) -> Any:
    """The batch encoder, traced once per (leaves, batch spec) and reused.

    Tracing costs tens of milliseconds: as much as encoding 10,000 small
    elements, so repeated saves of one kind of dataset share it.
    """
    flat_spec = tuple(tf.nest.flatten(batch_spec, expand_composites=False))
    return _batch_encoder_cached(leaves, flat_spec)


def _save_locked(
    dataset: tf.data.Dataset,
    path: str,
    structure: Any,
    leaves: tuple[Any, ...],
    compression: str | None,
    quotas: list[int] | None,
    shard_size: int | None,
    overwrite: bool,
    resume: bool,
    fingerprint: dict[str, Any],
    cardinality: int,
    bar: Any,
) -> tuple[Header, tuple[Shard, ...], float]:
    """The part of :func:`save` that runs with the path's lock held."""
    check_target(path, overwrite)
    tmp, manifest = commit.prepare_work_dir(path, fingerprint, resume=resume, crc=file_crc32c)
    done = manifest.records
    writer = _CommittingShardWriter(
        tmp, compression, quotas, shard_size or DEFAULT_SHARD_SIZE, manifest
    )
    start = time.perf_counter()
    try:
        total = done
        if done:
            bar(done, sum(s.bytes for s in manifest.shards))
        for records, sizes in iterate(
            encoded_batches(dataset.skip(done) if done else dataset, leaves)
        ):
            recs, sizes = records.numpy(), sizes.numpy()
            writer.write(recs, sizes)
            total += len(recs)
            bar(len(recs), int(sizes.sum()))
        if quotas is not None and total != cardinality:
            raise UnsupportedError(
                f"expected {cardinality} elements as the dataset's cardinality says, got {total}"
            )
        taken = set(fs.listdir(path)) if fs.isdir(path) else set()
        shards = tuple(writer.finish(taken))
        header = Header(structure, total, compression, shards, writer=f"superserial {__version__}")
        fs.remove(fs.join(tmp, commit.PROGRESS_FILE))
        with fs.open_file(fs.join(tmp, HEADER_FILE), "wb") as f:
            f.write(header.to_json().encode("utf-8"))
        check_target(path, overwrite)
        old = fs.exchange_or_rename(tmp, path)
    except BaseException:
        writer.abort()
        if resume and fs.exists(fs.join(tmp, commit.PROGRESS_FILE)):
            log.info("save to %s interrupted; save(..., resume=True) continues from %s", path, tmp)
        else:
            fs.rmtree(tmp)
        raise
    finally:
        bar.close()
    if old is not None:
        fs.rmtree(old)
    return header, shards, start


def save(
    dataset: tf.data.Dataset,
    path: str,
    *,
    compression: str | None = None,
    num_shards: int | None = None,
    shard_size: int | None = None,
    overwrite: bool = False,
    progress: bool | Callable[[int, int], None] | None = None,
    resume: bool = False,
    shard_index: int | None = None,
) -> Header:
    """Saves a dataset as TFRecord shards plus a JSON header in directory ``path``.

    Args:
        dataset: Any finite ``tf.data.Dataset`` of tensors, ragged and sparse
            tensors, in dicts, tuples and namedtuples.
        path: The dataset directory to create (local, or any filesystem
            ``tf.io.gfile`` supports).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        num_shards: Split into this many files of near-equal record counts.
            Needs a dataset of known cardinality.
        shard_size: Otherwise, start a new file after about this many bytes
            (default 128 MiB).
        overwrite: Replace an existing dataset at ``path``. The old one stays
            intact until the new one is complete.
        progress: Show a progress bar (default: when stderr is a terminal),
            or a callable given (elements, bytes) after every batch.
        resume: Continue an interrupted save to ``path`` after its last
            complete shard instead of starting over. The dataset must yield
            the same elements in the same order as before (its element spec,
            cardinality, compression and sharding are checked; its values
            cannot be). Without it, an interrupted save's work is discarded.
            On an error, a ``resume=True`` save keeps its completed shards.
        shard_index: Write ``dataset`` as part ``shard_index`` of ``num_shards``
            of a dataset that many workers write at once, into ``path``'s
            staging area; ``superserial.finalize(path)`` then assembles it (see
            :mod:`superserial.distributed`). ``num_shards`` then counts parts,
            each split into files by ``shard_size``; returns the part's header.

    Returns:
        The header that was written.

    Raises:
        TypeError: ``dataset`` is not a ``tf.data.Dataset``.
        UnsupportedError: A leaf cannot be stored; the message names it.
        DatasetExistsError: ``path`` exists and ``overwrite`` is False.
        DatasetLockedError: Another process is saving to ``path`` (local paths).
        ResumeError: ``resume`` found an interrupted save of another dataset
            or with other options.
    """
    if shard_index is not None:
        if overwrite or resume:
            raise ValueError(
                "expected no overwrite/resume with shard_index, got one; "
                "a restarted part is simply written again"
            )
        from superserial.distributed import save_part

        return save_part(
            dataset,
            path,
            shard_index=shard_index,
            num_shards=num_shards,  # type: ignore[arg-type]
            compression=compression,
            shard_size=shard_size,
            progress=progress,
        )
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"expected a tf.data.Dataset, got {type(dataset).__module__}.{type(dataset).__qualname__}"
        )
    path = str(path).rstrip("/") or "/"
    structure = from_element_spec(dataset.element_spec)
    leaves = tuple(iter_leaves(structure))
    if not leaves:
        raise UnsupportedError(
            "expected at least one tensor in each element, got an empty structure"
        )
    compression = normalize_compression(compression)
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError("expected a finite dataset, got one of infinite cardinality")
    quotas = _quotas(num_shards, cardinality)
    if shard_size is not None and (not isinstance(shard_size, int) or shard_size < 1):
        raise ValueError(f"expected shard_size >= 1 byte, got {shard_size!r}")
    check_target(path, overwrite)

    from superserial.progress import make_progress

    fingerprint = {
        "structure": _node_to_json(structure),
        "compression": compression,
        "num_shards": num_shards,
        "shard_size": None if quotas is not None else shard_size or DEFAULT_SHARD_SIZE,
        "cardinality": cardinality,
    }
    lock = commit.SaveLock(path).acquire()
    try:
        header, shards, start = _save_locked(
            dataset,
            path,
            structure,
            leaves,
            compression,
            quotas,
            shard_size,
            overwrite,
            resume,
            fingerprint,
            cardinality,
            make_progress(
                progress, total=cardinality if cardinality >= 0 else None, desc=f"save {path}"
            ),
        )
    finally:
        lock.release()
    log.info(
        "saved %d elements to %s in %d shard(s), %d bytes, %.2fs",
        header.element_count,
        path,
        len(shards),
        header.total_bytes,
        time.perf_counter() - start,
    )
    return header

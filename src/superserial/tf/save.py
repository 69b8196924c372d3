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

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from superserial._version import __version__
from superserial.codec.tf_records import framed_batches
from superserial.codec.tf_spec import from_element_spec, not_a_dataset
from superserial.errors import UnsupportedError
from superserial.format import layout
from superserial.format.header import Header, Shard, normalize_compression
from superserial.format.structure import iter_leaves, node_to_obj
from superserial.storage import fs
from superserial.tf.two_phase import save_part
from superserial.write import local_commit, store_commit
from superserial.write.shard_writer import DEFAULT_SHARD_SIZE, ShardWriter, quotas

__all__ = ["save", "shard_plan", "write_shards"]

log = logging.getLogger("superserial")


def write_shards(
    dataset: tf.data.Dataset,
    path: str,
    leaves: tuple[Any, ...],
    *,
    fingerprint: dict[str, Any],
    compression: str | None,
    shard_quotas: list[int] | None,
    shard_size: int | None,
    resume: bool,
    bar: Any,
    finish: Callable[[str, list[Shard]], Header],
    in_place: bool = False,
) -> Header:
    """Writes ``dataset`` as new shards in the work directory of ``path``, then commits them.

    The one write loop of ``save`` and ``append``: call with the path's
    :class:`~superserial.write.local_commit.SaveLock` held. Opens (or, with ``resume``,
    reopens) the work directory, encodes the elements and writes them through
    a :class:`~superserial.write.shard_writer.ShardWriter` (each completed shard recorded
    for resume), then calls ``finish(work, shards)``, which makes the shards
    part of the dataset at ``path`` and returns its header. On any error the
    work directory is removed, unless ``resume`` keeps its completed shards.

    Args:
        dataset: The elements to write.
        path: The dataset path.
        leaves: The header leaves the records are encoded by.
        fingerprint: What a resume must match (see :func:`local_commit.prepare_work_dir`).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        shard_quotas: Records per shard, or None to split by ``shard_size``.
        shard_size: Bytes per shard when ``shard_quotas`` is None (None: the default).
        resume: Continue an interrupted write after its last complete shard.
        bar: The progress callback (``bar(elements, bytes)``, ``bar.close()``).
        finish: Commits the closed shards from the work directory.
        in_place: Write the shards straight to ``path`` under final, per-save
            tagged names, with no work directory (object stores, see
            :mod:`superserial.write.store_commit`); ``finish`` then gets ``path``.

    Returns:
        What ``finish`` returned.
    """
    name: Callable[[int], str]
    on_close: Callable[..., Any] | None
    if in_place:
        # Object stores: final, tagged names at once; no renames (each a full copy there).
        tmp, manifest = path, local_commit.Manifest(fingerprint)
        count = len(shard_quotas) if shard_quotas is not None else None
        name, on_close = store_commit.start_in_place(path, count), None
    else:
        tmp, manifest = local_commit.prepare_work_dir(
            path, fingerprint, resume=resume, crc=fs.file_crc32c
        )
        name, on_close = layout.open_shard_name, functools.partial(manifest.complete, tmp)
    done = manifest.records
    writer = ShardWriter(
        tmp,
        name=name,
        compression=compression,
        quotas=shard_quotas,
        shard_size=shard_size or DEFAULT_SHARD_SIZE,
        on_close=on_close,
        done=manifest.shards,
    )
    try:
        if done:
            bar(done, sum(s.bytes for s in manifest.shards))
        for framed, sizes in framed_batches(dataset.skip(done) if done else dataset, leaves):
            writer.write_framed(framed, sizes)
            bar(len(sizes), int(sizes.sum()))
        # With num_shards, finish() refuses a dataset shorter than its
        # cardinality (a longer one is refused by write()).
        return finish(tmp, writer.finish())
    except BaseException:
        writer.abort()
        if in_place:
            store_commit.remove_shards(path, writer.shards)
        elif resume and fs.exists(fs.join(tmp, layout.PROGRESS_FILE)):
            log.info("write to %s interrupted; resume=True continues from %s", path, tmp)
        else:
            fs.rmtree(tmp)
        raise
    finally:
        bar.close()


def shard_plan(
    dataset: tf.data.Dataset, num_shards: int | None, shard_size: int | None
) -> tuple[int, list[int] | None]:
    """(the dataset's cardinality, records per shard or None), with the checks of both.

    Raises:
        ValueError: An infinite dataset, a bad ``num_shards`` (or one with an
            unknown cardinality) or a bad ``shard_size``.
    """
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError("expected a finite dataset, got one of infinite cardinality")
    shard_quotas = quotas(num_shards, cardinality)
    if shard_size is not None and (not isinstance(shard_size, int) or shard_size < 1):
        raise ValueError(f"expected shard_size >= 1 byte, got {shard_size!r}")
    return cardinality, shard_quotas


def _save_locked(
    dataset: tf.data.Dataset,
    path: str,
    structure: Any,
    leaves: tuple[Any, ...],
    compression: str | None,
    shard_quotas: list[int] | None,
    shard_size: int | None,
    overwrite: bool,
    resume: bool,
    fingerprint: dict[str, Any],
    bar: Any,
) -> tuple[Header, tuple[Shard, ...], float]:
    """The part of :func:`save` that runs with the path's lock held."""
    layout.check_target(path, overwrite)
    start = time.perf_counter()

    in_place = store_commit.writes_in_place(path, resume=resume)

    def make_header(shards: tuple[Shard, ...]) -> Header:
        return Header.of_shards(structure, compression, shards, writer=f"superserial {__version__}")

    def finish(tmp: str, shards: list[Shard]) -> Header:
        if in_place:
            return store_commit.commit_in_place(path, shards, make_header, overwrite=overwrite)
        return local_commit.commit_dataset(path, tmp, shards, make_header, overwrite=overwrite)

    header = write_shards(
        dataset,
        path,
        leaves,
        fingerprint=fingerprint,
        compression=compression,
        shard_quotas=shard_quotas,
        shard_size=shard_size,
        resume=resume,
        bar=bar,
        finish=finish,
        in_place=in_place,
    )
    return header, header.shards, start


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
        path: The dataset directory to create: local, or a URL of any
            filesystem ``tf.io.gfile`` or fsspec reaches (``gs://``,
            ``s3://`` with s3fs...). On object stores the shards are written
            in place under per-save names and the header, put last, commits
            (see :mod:`superserial.write.store_commit`).
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
            :mod:`superserial.tf.two_phase`). ``num_shards`` then counts parts,
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
        return save_part(
            dataset,
            path,
            shard_index=shard_index,
            num_shards=num_shards,  # type: ignore[arg-type]  # None is refused inside, with a message
            compression=compression,
            shard_size=shard_size,
            progress=progress,
        )
    if not isinstance(dataset, tf.data.Dataset):
        raise not_a_dataset(dataset)
    path = str(path).rstrip("/") or "/"
    structure = from_element_spec(dataset.element_spec)
    leaves = tuple(iter_leaves(structure))
    if not leaves:
        raise UnsupportedError(
            "expected at least one tensor in each element, got an empty structure"
        )
    compression = normalize_compression(compression)
    cardinality, shard_quotas = shard_plan(dataset, num_shards, shard_size)
    layout.check_target(path, overwrite)

    from superserial.progress import make_progress

    fingerprint = {
        "structure": node_to_obj(structure),
        "compression": compression,
        "num_shards": num_shards,
        "shard_size": None if shard_quotas is not None else shard_size or DEFAULT_SHARD_SIZE,
        "cardinality": cardinality,
    }
    lock = local_commit.SaveLock(path).acquire()
    try:
        header, shards, start = _save_locked(
            dataset,
            path,
            structure,
            leaves,
            compression,
            shard_quotas,
            shard_size,
            overwrite,
            resume,
            fingerprint,
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

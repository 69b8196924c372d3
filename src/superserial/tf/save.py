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

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import tensorflow as tf

from superserial._version import __version__
from superserial.format import layout
from superserial.format.header import Header, Shard, normalize_compression
from superserial.format.structure import Leaf, node_to_obj
from superserial.storage import fs
from superserial.tf.two_phase import save_part
from superserial.tf.writes import check_dataset, shard_plan, structure_of, write_dataset
from superserial.write import local_commit
from superserial.write.shard_writer import DEFAULT_SHARD_SIZE
from superserial.write.targets import open_target

__all__ = ["save"]

log = logging.getLogger("superserial")


def _save_locked(
    dataset: tf.data.Dataset,
    path: str,
    structure: Any,
    leaves: tuple[Leaf, ...],
    compression: str | None,
    shard_quotas: list[int] | None,
    shard_size: int | None,
    overwrite: bool,
    resume: bool,
    fingerprint: dict[str, Any],
    bar: Any,
    metadata: dict[str, Any],
) -> tuple[Header, float]:
    """The part of :func:`save` that runs with the path's lock held."""
    layout.check_target(path, overwrite)
    start = time.perf_counter()

    def make_header(shards: tuple[Shard, ...]) -> Header:
        header = Header.of_shards(
            structure, compression, shards, writer=f"superserial {__version__}"
        )
        return replace(header, metadata=dict(metadata)) if metadata else header

    target = open_target(
        path,
        make_header,
        fingerprint=fingerprint,
        count=len(shard_quotas) if shard_quotas is not None else None,
        resume=resume,
        overwrite=overwrite,
    )
    header = write_dataset(
        dataset,
        target,
        leaves,
        compression=compression,
        shard_quotas=shard_quotas,
        shard_size=shard_size,
        bar=bar,
    )
    return header, start


def _check_metadata(metadata: Any) -> None:
    """Refuses metadata the header cannot hold, before anything is written."""
    if metadata is None:
        return
    try:
        ok = isinstance(metadata, dict) and bool(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"expected metadata of JSON values, got {e}") from e
    if not ok:
        raise ValueError(f"expected metadata as a dict, got {type(metadata).__name__}")


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
    metadata: dict[str, Any] | None = None,
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
            cannot be). A save that fails or is interrupted (Ctrl-C) keeps
            its completed shards beside ``path`` for this, with or without
            ``resume`` (unless the disk is full); a save without ``resume``
            discards what an interrupted one kept.
        shard_index: Write ``dataset`` as part ``shard_index`` of ``num_shards``
            of a dataset that many workers write at once, into ``path``'s
            staging area; ``superserial.finalize(path)`` then assembles it (see
            :mod:`superserial.tf.two_phase`). ``num_shards`` then counts parts,
            each split into files by ``shard_size``; returns the part's header.
        metadata: Facts about the data to keep in the header's ``metadata``
            (a JSON object: ``class_names``, a source's schema...); not with
            ``shard_index``.

    Returns:
        The header that was written.

    Raises:
        UnsupportedError: ``dataset`` is not a ``tf.data.Dataset`` (also a
            ``TypeError``), or a leaf cannot be stored; the message names it.
        DatasetExistsError: ``path`` exists and ``overwrite`` is False.
        DatasetLockedError: Another process is saving to ``path`` (local paths).
        ResumeError: ``resume`` found an interrupted save of another dataset
            or with other options.
    """
    if shard_index is not None:
        if metadata:
            raise ValueError("expected no metadata with shard_index, got some")
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
    check_dataset(dataset)
    _check_metadata(metadata)
    path = fs.dataset_path(path)
    structure, leaves = structure_of(dataset.element_spec)
    compression = normalize_compression(compression)
    cardinality, shard_quotas = shard_plan(dataset, num_shards, shard_size)
    layout.check_target(path, overwrite)

    from superserial.base.progress import make_progress

    fingerprint = {
        "structure": node_to_obj(structure),
        "compression": compression,
        "num_shards": num_shards,
        "shard_size": None if shard_quotas is not None else shard_size or DEFAULT_SHARD_SIZE,
        "cardinality": cardinality,
    }
    lock = local_commit.SaveLock(path).acquire()
    try:
        header, start = _save_locked(
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
            metadata or {},
        )
    finally:
        lock.release()
    log.info(
        "saved %d elements to %s in %d shard(s), %d bytes, %.2fs",
        header.element_count,
        path,
        len(header.shards),
        header.total_bytes,
        time.perf_counter() - start,
    )
    return header

"""What every conversion into superserial shares: framed batches -> a committed dataset.

A converter turns its source into a header structure and batches of framed
records (:func:`superserial.codec.numpy_encode.frame_batch`); :func:`write_framed`
checks the options and the header before anything is written, then streams the
batches through the one write loop (:mod:`superserial.write.loop`) into the
target :func:`~superserial.write.targets.open_target` picks, under the path's
lock, with a progress bar and the throughput logged, as ``save`` does. An error
of the source (a null, a value of another type) aborts the write: nothing that
looks like a dataset is left at the path.

This module does not import TensorFlow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from superserial._version import __version__
from superserial.base.progress import make_progress
from superserial.format import layout
from superserial.format.header import Header, Shard, normalize_compression
from superserial.format.structure import Node, node_to_obj
from superserial.storage import fs
from superserial.write import local_commit
from superserial.write.loop import check_shard_size, write_with_bar
from superserial.write.shard_writer import quotas
from superserial.write.targets import open_target

__all__ = ["SaveOptions", "check_options", "write_framed"]

log = logging.getLogger("superserial")

# The options of ``save`` that a conversion takes (resume is refused: a converter
# cannot promise the same rows in the same order a second time).
SaveOptions = ("compression", "num_shards", "shard_size", "overwrite", "progress")


def check_options(options: dict[str, Any], *, what: str) -> None:
    """Refuses options a conversion does not take, naming them and the ones it does.

    Raises:
        TypeError: An unknown option (``resume``, a typo).
    """
    unknown = sorted(set(options) - {*SaveOptions, "overwrite_hint"})
    if unknown:
        raise TypeError(
            f"expected save options among {', '.join(SaveOptions)} for {what}, "
            f"got {', '.join(map(repr, unknown))}"
        )


def write_framed(
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    path: str,
    structure: Node,
    *,
    metadata: dict[str, Any],
    num_rows: int | None,
    source: str,
    compression: str | None = None,
    num_shards: int | None = None,
    shard_size: int | None = None,
    overwrite: bool = False,
    progress: bool | Callable[[int, int], None] | None = None,
    overwrite_hint: str = "overwrite=True",
) -> Header:
    """Writes framed record batches as the dataset at ``path`` and commits it.

    Args:
        batches: (framed records, data sizes) per batch, in element order.
        path: The dataset directory to create (local or a URL).
        structure: The element structure the records were encoded by.
        metadata: The header's ``metadata`` (JSON values).
        num_rows: The element count, if known ahead (needed for ``num_shards``).
        source: What is converted, for the progress bar and the log.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        num_shards: Split into this many shards of near-equal counts.
        shard_size: Otherwise, start a new shard after about this many bytes.
        overwrite: Replace an existing dataset at ``path``.
        progress: As for ``save``: a bar, none, or a callable given (elements, bytes).
        overwrite_hint: How the caller's user asks for ``overwrite``, for messages.

    Returns:
        The header written.

    Raises:
        HeaderError: The structure or metadata cannot make a valid header
            (checked before anything is written).
        DatasetExistsError: ``path`` exists and ``overwrite`` is False.
        ValueError: ``num_shards`` without a known count, or a bad ``shard_size``.
    """
    path = fs.dataset_path(path)
    compression = normalize_compression(compression)
    check_shard_size(shard_size)
    shard_quotas = quotas(num_shards, -1 if num_rows is None else num_rows)
    writer = f"superserial {__version__} convert"

    def make_header(shards: tuple[Shard, ...]) -> Header:
        count = sum(s.records for s in shards)
        return Header(structure, count, compression, shards, writer, metadata=dict(metadata))

    # Every check of the header (limits, names, JSON metadata) before any file is written.
    Header.from_json(make_header(()).to_json(), source=f"the header for {path}")
    layout.check_target(path, overwrite, hint=overwrite_hint)
    start = time.perf_counter()
    with local_commit.SaveLock(path):
        layout.check_target(path, overwrite, hint=overwrite_hint)
        target = open_target(
            path,
            make_header,
            fingerprint={"convert": source, "structure": node_to_obj(structure)},
            count=len(shard_quotas) if shard_quotas is not None else None,
            overwrite=overwrite,
            hint=overwrite_hint,
            resumable=False,
        )
        header = write_with_bar(
            batches,
            target,
            compression=compression,
            quotas=shard_quotas,
            shard_size=shard_size,
            bar=make_progress(progress, total=num_rows, desc=f"convert {source}"),
        )
    seconds = time.perf_counter() - start
    log.info(
        "converted %s to %s: %d elements in %d shard(s), %d bytes, %.2fs (%.1f MB/s)",
        source,
        path,
        header.element_count,
        len(header.shards),
        header.total_bytes,
        seconds,
        header.total_bytes / 1e6 / max(seconds, 1e-9),
    )
    return header

"""``build_index``: gives every shard of a dataset its record index.

Datasets written before indexes existed (and any whose index is missing or
damaged) load sequentially as before; random access needs an index per
shard. :func:`build_index` adds the missing ones in place:

1. takes the dataset's save lock (:class:`superserial.write.local_commit.SaveLock`), so
   that it never runs alongside a save to the same path;
2. reads every shard (:func:`superserial.format.record_index.scan_offsets`): its size,
   CRC-32C and record count must match the header, its framing must hold;
3. keeps every index that checks out and agrees with the offsets just read,
   and writes the others to temporary files as it goes (one shard's offsets
   in memory at a time). A shard that does not match its header stops it:
   the temporary files are removed and nothing has changed;
4. renames the new indexes into place (under
   :func:`superserial.format.layout.index_name`), then replaces ``header.json``
   atomically with a header that lists them.

Index files are written before the header that names them, so a reader sees
the old header or the new one, each consistent with the files it lists. Run
again, it writes nothing and returns the same header.

This module does not import TensorFlow.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from superserial.base.progress import make_progress
from superserial.errors import CorruptDataError, UnsupportedError
from superserial.format import record_index
from superserial.format.header import Header, IndexFile, Shard
from superserial.format.layout import HEADER_FILE, index_name, read_header
from superserial.storage import fs
from superserial.write.local_commit import SaveLock

__all__ = ["IndexResult", "build_index", "index_dataset"]

log = logging.getLogger("superserial")


@dataclass(frozen=True)
class IndexResult:
    """What :func:`index_dataset` did.

    Attributes:
        path: The dataset directory.
        header: The dataset's header, as it is now.
        written: The shard files whose index was written (missing or damaged before).
        kept: The shard files whose index was already valid.
    """

    path: str
    header: Header
    written: tuple[str, ...]
    kept: tuple[str, ...]

    @property
    def changed(self) -> bool:
        """True if any index (and so the header) was written."""
        return bool(self.written)


def _existing(path: str, shard: Shard, offsets: np.ndarray) -> bool:
    """True if ``shard``'s listed index checks out and holds exactly ``offsets``."""
    if shard.index is None:
        return False
    try:
        listed = record_index.read_index(path, shard)
    except CorruptDataError as e:
        log.info("index: rebuilding the index of %s: %s", shard.file, e)
        return False
    if not np.array_equal(listed, offsets):
        log.info("index: rebuilding the index of %s: its offsets disagree with it", shard.file)
        return False
    return True


def _restarts_ok(path: str, header: Header, compression: str) -> bool:
    """True if every shard of a ``compression`` dataset has restart points that check out."""
    for shard in header.shards:
        if shard.index is None:
            return False
        try:
            record_index.read_restarts(path, shard, compression)
        except CorruptDataError as e:
            log.info("index: the restart points of %s do not check out: %s", shard.file, e)
            return False
    return True


def _scan(path: str, shard: Shard, bar: Callable[[int, int], None]) -> np.ndarray:
    """The record offsets of ``shard``, read from its file and checked against the header.

    Raises:
        CorruptDataError: The file is missing or does not match the header.
    """
    file = fs.join(path, shard.file)
    if not fs.exists(file):
        raise CorruptDataError(
            f"expected the shard {file} of {shard.records} records listed in the header, "
            "found no file"
        )
    offsets = record_index.scan_offsets(file, shard, lambda n: bar(0, n))
    bar(shard.records, 0)
    return offsets


def index_dataset(
    path: str, *, progress: bool | Callable[[int, int], None] | None = False
) -> IndexResult:
    """Like :func:`build_index`, but says which shards were indexed and which kept.

    Raises:
        See :func:`build_index`.
    """
    path = fs.dataset_path(path)
    with SaveLock(path):
        header = read_header(path)
        if header.compression is not None:
            if _restarts_ok(path, header, header.compression):
                log.info("index: every shard of %s already has valid restart points", path)
                return IndexResult(path, header, (), tuple(s.file for s in header.shards))
            # Restart points come with the stream: only a rewrite gives them.
            raise UnsupportedError(
                f"expected uncompressed shards to index, got {header.compression} shards at "
                f"{path} (the restart points of a compressed stream are set as it is written); "
                f"rewrite it with restart points, compressed alike, with `superserial convert "
                f"{shlex.quote(path)} -o NEW_PATH --compression {header.compression}`"
            )
        bar = make_progress(progress, total=header.element_count, desc=f"index {path}")
        # Every shard is read and checked before anything is changed: new
        # indexes go to temporary files (one shard's offsets in memory at a
        # time), renamed into place only once all shards have checked out.
        shards: list[Shard] = []
        temps: list[tuple[str, str]] = []
        try:
            try:
                for shard in header.shards:
                    shards.append(_plan(path, shard, bar, temps))
            finally:
                bar.close()
            _check_names(path, shards)
            for tmp, final in temps:
                fs.replace(tmp, final)
        except BaseException:
            for tmp, _ in temps:
                fs.remove(tmp)
            raise
        written = tuple(
            s.file for s, planned in zip(header.shards, shards, strict=True) if planned is not s
        )
        kept = tuple(s.file for s in header.shards if s.file not in written)
        if not written:
            log.info("index: every shard of %s already has a valid index", path)
            return IndexResult(path, header, (), kept)
        indexed = header.with_shards(tuple(shards), element_count=header.element_count)
        # The commit point: readers see the old header or this one.
        fs.write_atomically(fs.join(path, HEADER_FILE), indexed.to_json())
        log.info("index: wrote %d index file(s) of %s, kept %d", len(written), path, len(kept))
        return IndexResult(path, indexed, written, kept)


def _plan(
    path: str, shard: Shard, bar: Callable[[int, int], None], temps: list[tuple[str, str]]
) -> Shard:
    """Reads and checks ``shard``; returns it as is if its index is valid, else with a new one.

    A new index is written to a temporary file beside its final name; the
    pair is appended to ``temps``.

    Raises:
        CorruptDataError: The shard does not match the header.
    """
    try:
        offsets = _scan(path, shard, bar)
    except CorruptDataError as e:
        raise CorruptDataError(
            f"{e}; refusing to index {path}, whose shards must match its header "
            f"(nothing was changed; `superserial verify {shlex.quote(path)}` lists every problem)",
            reason=e.reason,
        ) from e
    if _existing(path, shard, offsets):
        return shard
    data = record_index.encode(offsets, shard.crc32c)
    ref = IndexFile(index_name(shard.file), len(data), f"{record_index.crc32c(data):08x}")
    final = fs.join(path, ref.file)
    tmp = fs.temp_sibling(final)
    temps.append((tmp, final))
    fs.write_bytes(tmp, data)
    return Shard(shard.file, shard.records, shard.bytes, shard.crc32c, ref)


def _check_names(path: str, shards: list[Shard]) -> None:
    """Refuses a new index whose name another file of the header already has.

    Only a hand-made header can list a file under the name of another
    shard's index; writing it would destroy that file.

    Raises:
        CorruptDataError: Two files of the new header would share a name.
    """
    seen: set[str] = set()
    for s in shards:
        for name, _, _ in s.files():
            if name in seen:
                raise CorruptDataError(
                    f"expected the index of a shard at {fs.join(path, name)}, found that name "
                    "taken by another file of the header; nothing was changed"
                )
            seen.add(name)


def build_index(path: str, *, progress: bool | Callable[[int, int], None] | None = False) -> Header:
    """Gives every shard of the dataset at ``path`` a valid record index, in place.

    For datasets written before indexes existed, and to repair a missing or
    damaged index. Reads every shard and checks it against the header first;
    writes the missing or damaged indexes, then replaces ``header.json``
    atomically (a reader sees the old header or the new one). Valid indexes
    are kept: run again, it changes nothing. Holds the dataset's save lock.

    Args:
        path: The dataset directory.
        progress: Show a progress bar (True; None: when stderr is a terminal),
            or a callable given (elements, bytes) as shards are read.

    Returns:
        The dataset's header, listing every shard's index.

    Raises:
        DatasetNotFoundError: There is no dataset at ``path``.
        UnsupportedError: The shards are compressed and some have no valid
            restart points (only a rewrite gives them: ``superserial convert``).
        CorruptDataError: A shard does not match its header (size, CRC-32C,
            record count, framing); nothing was changed.
        DatasetLockedError: A save to ``path`` is in progress.
    """
    return index_dataset(path, progress=progress).header

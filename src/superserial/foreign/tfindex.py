"""Record indexes other tools read: ``superserial index PATH --export tfindex``.

One plain-text file per shard, one line per record, ``"<offset> <length>\\n"`` in
decimal: the byte offset of the record's length field and the bytes of the whole
framed record (its 8-byte length, 4-byte length CRC, data and 4-byte data CRC),
exactly what vahidk/tfrecord's ``tfrecord2idx`` writes (it records ``tell()`` before
and after reading all four) and what its ``TFRecordDataset(path, index_path, ...)``
and NVIDIA DALI's ``readers.tfrecord(index_path=...)`` take.

The offsets come from each shard's own record index where it has one (read and
checked, the shard not read), else from a scan of the shard checked against the
header (size, CRC-32C, record count). The files are named by
:func:`superserial.format.layout.tfindex_name` and go next to the shards by default
(where those tools' examples look for them, and where ``tfrecord2idx DIR`` puts
them), or into another directory for a dataset one may not write to. Compressed
shards are an error: both tools want offsets in the file, which a deflated stream
has not.

This module does not import TensorFlow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from superserial.base.progress import make_progress
from superserial.errors import UnsupportedError
from superserial.format.layout import read_header, tfindex_name
from superserial.format.record_index import read_index, scan_offsets
from superserial.storage import fs

__all__ = ["TfindexResult", "export_tfindex", "tfindex_text"]


@dataclass(frozen=True)
class TfindexResult:
    """What :func:`export_tfindex` wrote.

    Attributes:
        path: The dataset.
        files: The index files written, one per shard, in shard order.
        scanned: The shards that had no record index of their own and were read.
    """

    path: str
    files: tuple[str, ...]
    scanned: tuple[str, ...]


def tfindex_text(offsets: np.ndarray) -> str:
    """The ``offset length`` lines of a shard whose records start at ``offsets[:-1]``.

    Args:
        offsets: ``N + 1`` offsets, the last the shard's size (a record index's form).
    """
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets.astype(np.int64))
    if not len(starts):
        return ""
    table = np.char.add(np.char.add(starts.astype(str), " "), lengths.astype(str))
    return "\n".join(table.tolist()) + "\n"


def export_tfindex(
    path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str] | None = None,
    *,
    progress: object = None,
) -> TfindexResult:
    """Writes a ``.tfindex`` file for every shard of the dataset at ``path``.

    Args:
        path: The dataset.
        output_dir: Where the files go; None: next to the shards.
        progress: As for :func:`superserial.save` (a bar, a callback, or nothing).

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        UnsupportedError: The shards are compressed.
        CorruptDataError: A shard or its index disagrees with the header.
    """
    root = fs.dataset_path(path)
    header = read_header(root)
    if header.compression:
        raise UnsupportedError(
            f"expected uncompressed shards for a tfindex (offsets in the file), found "
            f"{header.compression} shards in {root} (re-write them uncompressed: superserial "
            f"convert {root} -o OUT --compression none)"
        )
    out = root if output_dir is None else fs.dataset_path(output_dir)
    fs.makedirs(out)
    bar = make_progress(progress, total=header.element_count, desc="tfindex")
    files: list[str] = []
    scanned: list[str] = []
    try:
        for shard in header.shards:
            if shard.index is not None:
                offsets = read_index(root, shard)
            else:
                offsets = scan_offsets(fs.join(root, shard.file), shard)
                scanned.append(shard.file)
            file = fs.join(out, tfindex_name(shard.file))
            fs.write_atomically(file, tfindex_text(offsets))
            files.append(file)
            bar(shard.records, shard.bytes)
    finally:
        bar.close()
    return TfindexResult(root, tuple(files), tuple(scanned))

"""The one shard writer: batches of framed records -> numbered TFRecord files.

The write loop (:mod:`superserial.write.loop`) hands it batches of records
already in their TFRecord framing (one buffer per batch); it writes each
range of a batch that goes to one file with one call
(:class:`~superserial.write.record_file.RecordFileWriter`, through
:mod:`superserial.storage.fs`, counting the file's size and CRC-32C as it goes),
starts a new file on a per-shard record quota or after a byte size, writes
the record index of each shard beside it (:mod:`superserial.format.record_index`:
a compressed shard's with its restart points), and reports each file it closes (records, bytes,
CRC-32C of the whole file, its index) to an ``on_close`` hook: that is where
a save renames a completed shard and records it for resume. Its directory,
names and hook come from the write's :class:`~superserial.write.targets.Target`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from superserial.errors import CorruptDataError, UnsupportedError
from superserial.format import layout, record_index
from superserial.format.header import IndexFile, Shard
from superserial.storage import fs
from superserial.write.record_file import RecordFileWriter

__all__ = ["DEFAULT_SHARD_SIZE", "OnClose", "ShardWriter", "quotas"]

# Without a quota, a new file every 128 MiB: large enough for fast sequential
# reads, small enough to spread over readers.
DEFAULT_SHARD_SIZE = 128 << 20

# Called with (index, path, shard) once shard ``index`` is closed at ``path``;
# returns the Shard to report (e.g. under a new name after a rename).
OnClose = Callable[[int, str, Shard], Shard]

_NO_ROOM_LIMIT = 1 << 62


def quotas(num_shards: int | None, count: int) -> list[int] | None:
    """Record counts of ``num_shards`` near-equal shards of ``count`` records (None: by size).

    Raises:
        ValueError: ``num_shards`` is not >= 1, or ``count`` is unknown (< 0).
    """
    if num_shards is None:
        return None
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ValueError(f"expected num_shards >= 1, got {num_shards!r}")
    if count < 0:
        raise ValueError(
            "expected a dataset of known cardinality with num_shards, got unknown cardinality; "
            "pass shard_size=<bytes> instead, or apply "
            "tf.data.experimental.assert_cardinality(n) to the dataset"
        )
    return [count // num_shards + (i < count % num_shards) for i in range(num_shards)]


class ShardWriter:
    """Writes records to numbered shard files in one directory.

    Args:
        directory: Where the files go (it must exist).
        name: The file name of shard ``i`` while it is written.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        quotas: Records per shard: exactly ``len(quotas)`` shards are made,
            empty ones included. None: start a new shard after ``shard_size``
            bytes (at least one record per shard).
        shard_size: The byte size that closes a shard when ``quotas`` is None.
        on_close: See :data:`OnClose`; by default the shard keeps its name.
        done: Shards completed earlier (a resumed save): writing continues
            with shard ``len(done)``.
    """

    def __init__(
        self,
        directory: str,
        *,
        name: Callable[[int], str],
        compression: str | None,
        quotas: list[int] | None = None,
        shard_size: int = 1 << 62,
        on_close: OnClose | None = None,
        done: Sequence[Shard] = (),
    ) -> None:
        self._compression = compression
        self.directory, self.quotas, self.shard_size = directory, quotas, shard_size
        self._name = name
        self._indexed = True
        self._sizes: list[np.ndarray] = []  # record sizes in the open shard, for its index
        self._on_close = on_close
        self.shards: list[Shard] = list(done)
        self._count = 0  # records in the open shard
        self._bytes = 0  # record bytes (unframed) in the open shard
        self._writer: RecordFileWriter | None = None

    def _path(self, i: int) -> str:
        return fs.join(self.directory, self._name(i))

    def _open_next(self) -> None:
        self._close_open()
        path = self._path(len(self.shards))
        self._writer = RecordFileWriter(path, self._compression)
        self._count = self._bytes = 0
        self._sizes = []

    def _room(self) -> int:
        if self.quotas is None:
            return _NO_ROOM_LIMIT
        return self.quotas[len(self.shards)] - self._count

    def write(self, framed: np.ndarray, sizes: np.ndarray) -> None:
        """Writes a batch of framed records (one uint8 buffer) given their data sizes.

        Raises:
            UnsupportedError: More records than the quotas allow (a dataset
                yielding more elements than its cardinality said).
        """
        sizes = np.asarray(sizes, np.int64)
        start = 0
        ends = np.cumsum(sizes)
        framed_ends = ends + 16 * np.arange(1, len(sizes) + 1)
        while start < len(sizes):
            if self._writer is None or (
                self.quotas is None and self._bytes >= self.shard_size and self._count
            ):
                self._open_next()
            while self._room() == 0:
                if self.quotas is not None and len(self.shards) + 1 >= len(self.quotas):
                    raise UnsupportedError(
                        f"expected {sum(self.quotas)} elements as the dataset's cardinality "
                        "says, got more"
                    )
                self._open_next()
            take = min(self._room(), len(sizes) - start)
            base = int(ends[start - 1]) if start else 0
            if self.quotas is None:
                # Stop at the record that fills the shard (at least one record).
                fit = int(
                    np.searchsorted(
                        ends[start:], base + self.shard_size - self._bytes, side="right"
                    )
                )
                take = min(take, max(fit, 1))
            begin = int(framed_ends[start - 1]) if start else 0
            assert self._writer is not None  # opened above
            self._writer.write_framed(framed[begin : int(framed_ends[start + take - 1])])
            if self._indexed:
                self._sizes.append(sizes[start : start + take])
            self._count += take
            self._bytes += int(ends[start + take - 1]) - base
            start += take

    def _close_open(self) -> None:
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        writer.close()
        i = len(self.shards)
        path = self._path(i)
        # It counted what it wrote: no need to read the shard back.
        size, crc = writer.bytes, f"{writer.crc32c:08x}"
        shard = Shard(self._name(i), self._count, size, crc)
        if self._indexed:
            shard = self._write_index(path, shard, writer.restarts)
        self.shards.append(self._on_close(i, path, shard) if self._on_close else shard)

    def _write_index(
        self, path: str, shard: Shard, restarts: tuple[np.ndarray, np.ndarray] | None
    ) -> Shard:
        """Writes the index of the closed shard at ``path``; returns the shard with it.

        ``restarts``: a compressed shard's restart points
        (:attr:`~superserial.write.record_file.RecordFileWriter.restarts`).
        """
        offsets = record_index.offsets_from_sizes(self._sizes)
        self._sizes = []
        # The stream's size, from the records' sizes and from what was compressed.
        size = shard.bytes if restarts is None else int(restarts[1][-1])
        if int(offsets[-1]) != size:
            # The framing is TensorFlow's: this would mean it changed, and the index is wrong.
            raise CorruptDataError(
                f"expected {int(offsets[-1])} bytes in {path} from its records' sizes, got {size}"
            )
        if restarts is None:
            data = record_index.encode(offsets, shard.crc32c)
        else:
            data = record_index.encode_restarts(offsets, restarts[0], restarts[1], shard.crc32c)
        name = layout.index_name(shard.file)
        fs.write_bytes(fs.join(self.directory, name), data)
        crc = f"{record_index.crc32c(data):08x}"
        return Shard(
            shard.file, shard.records, shard.bytes, shard.crc32c, IndexFile(name, len(data), crc)
        )

    def finish(self) -> list[Shard]:
        """Closes the last shard, adds empty ones up to the quota count; returns all.

        Raises:
            UnsupportedError: Fewer records were written than the quotas ask for.
        """
        want = len(self.quotas) if self.quotas is not None else 1
        while len(self.shards) + (self._writer is not None) < want:
            self._open_next()
        self._close_open()
        if self.quotas is not None:
            got = [s.records for s in self.shards]
            if got != self.quotas:
                raise UnsupportedError(
                    f"expected {sum(self.quotas)} elements as the dataset's cardinality says, "
                    f"got {sum(got)}"
                )
        return list(self.shards)

    def abort(self) -> None:
        """Closes the open shard without reporting it, and removes its file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            fs.remove(self._path(len(self.shards)))
            self._sizes = []

"""The one write loop: framed record batches -> shard files -> a commit.

Every writer goes through :class:`Writing`: ``save`` (and ``upgrade``,
``convert``), ``save(shard_index=)`` and ``Writer``, ``append``, ``infer``
and Beam's workers. It takes batches of records already in their TFRecord
framing (one uint8 buffer and the records' data sizes, as
:func:`superserial.codec.tf_records.framed_batches` makes them from a
``tf.data`` dataset, using the fixed-shape numpy encoder wherever it
applies, and :func:`superserial.format.framing.frame_batches` from records),
writes them through the :class:`~superserial.write.shard_writer.ShardWriter`
that its :class:`~superserial.write.targets.Target` makes, and commits the
closed shards through that target; on any error, Ctrl-C included, it closes
the open shard and aborts the target (which removes the write, or keeps its
complete shards for a resume).

This module does not import TensorFlow: the records come in encoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from superserial.write.shard_writer import ShardWriter
from superserial.write.targets import Target

__all__ = ["Bar", "Progress", "Writing", "check_shard_size", "write_shards", "write_with_bar"]

R = TypeVar("R")

# Told (elements, bytes) after each batch written.
Progress = Callable[[int, int], None]


class Bar(Protocol):
    """A progress bar: told (elements, bytes) after each batch, closed at the end."""

    def __call__(self, elements: int, nbytes: int) -> None: ...

    def close(self) -> None: ...


def check_shard_size(shard_size: Any) -> None:
    """Refuses a ``shard_size`` that is not None or a positive number of bytes.

    Raises:
        ValueError: Naming the value given.
    """
    if shard_size is not None and (
        not isinstance(shard_size, int) or isinstance(shard_size, bool) or shard_size < 1
    ):
        raise ValueError(f"expected shard_size >= 1 byte, got {shard_size!r}")


class Writing(Generic[R]):
    """One write in progress: batches in, then :meth:`commit` or :meth:`abort`.

    As a context manager it aborts on an exception (a write that is neither
    committed nor aborted when the block ends is aborted too).

    Args:
        target: Where the shards go and how they are committed.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        quotas: Records per shard, or None to split by ``shard_size``.
        shard_size: Bytes per shard without quotas (None: 128 MiB).
    """

    def __init__(
        self,
        target: Target[R],
        *,
        compression: str | None,
        quotas: list[int] | None = None,
        shard_size: int | None = None,
    ) -> None:
        self.target = target
        self._shards: ShardWriter = target.shard_writer(
            compression=compression, quotas=quotas, shard_size=shard_size
        )
        self.records = 0  # written by this write (a resumed one's earlier shards not counted)
        self.state = "open"

    def write(self, framed: np.ndarray, sizes: np.ndarray) -> None:
        """Writes one batch: framed records (one uint8 buffer) and their data sizes.

        Raises:
            UnsupportedError: More records than the quotas allow.
        """
        self._check_open()
        try:
            self._shards.write(framed, sizes)
        except BaseException:
            self.abort()
            raise
        self.records += len(sizes)

    def write_all(
        self,
        batches: Iterable[tuple[np.ndarray, np.ndarray]],
        progress: Progress | None = None,
    ) -> int:
        """Writes every batch (see :meth:`write`); returns the records written.

        Args:
            batches: (framed records, data sizes) per batch.
            progress: Told (elements, bytes) after each batch.
        """
        before = self.records
        it = iter(batches)
        try:
            for framed, sizes in it:
                self.write(framed, sizes)
                if progress is not None:
                    progress(len(sizes), int(np.sum(sizes)))
        except BaseException:
            # A Ctrl-C here, between batches, leaves the source suspended; closed now,
            # its TensorFlow iterator is destroyed now. Left to the traceback, it was
            # destroyed at interpreter exit, where a from_generator iterator deadlocks.
            close = getattr(it, "close", None)
            try:
                if close is not None:
                    close()
            finally:
                self.abort()  # an error of the batches' source, too
            raise
        return self.records - before

    def commit(self) -> R:
        """Closes the last shard and commits every shard through the target.

        Raises:
            UnsupportedError: Fewer records than the quotas ask for.
        """
        self._check_open()
        try:
            shards = self._shards.finish()
            result = self.target.commit(shards)
        except BaseException:
            self.abort()
            raise
        self.state = "committed"
        return result

    def abort(self) -> None:
        """Discards the open shard and aborts the target; does nothing once committed or aborted."""
        if self.state != "open":
            return
        self.state = "aborted"
        try:
            self._shards.abort()
        finally:
            self.target.abort(self._shards.shards)

    def _check_open(self) -> None:
        if self.state != "open":
            raise ValueError(f"expected an open write, got a {self.state} one")

    def __enter__(self) -> Writing[R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()


def write_shards(
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    target: Target[R],
    *,
    compression: str | None,
    quotas: list[int] | None = None,
    shard_size: int | None = None,
    progress: Progress | None = None,
) -> R:
    """Writes all ``batches`` through ``target`` and commits them (see :class:`Writing`)."""
    with Writing(target, compression=compression, quotas=quotas, shard_size=shard_size) as w:
        w.write_all(batches, progress)
        return w.commit()


def write_with_bar(
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    target: Target[R],
    *,
    compression: str | None,
    quotas: list[int] | None,
    shard_size: int | None,
    bar: Bar,
) -> R:
    """:func:`write_shards` told to ``bar``, which is closed however the write ends.

    What ``save``, ``append``, the ``Writer`` and the converters share.
    """
    try:
        return write_shards(
            batches,
            target,
            compression=compression,
            quotas=quotas,
            shard_size=shard_size,
            progress=bar,
        )
    finally:
        bar.close()

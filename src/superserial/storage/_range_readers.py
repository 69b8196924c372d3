"""The range readers behind :mod:`superserial.storage.fs`: one open file, byte ranges read many times.

For :mod:`superserial.storage._backends`, whose backends make them: ``os``
(``pread``, or a map for many small slices), any file object (``tf.io.gfile``),
and fsspec (one request per range, retried; web files over plain connections
first, :mod:`superserial.storage._http`). Neither TensorFlow nor fsspec is
imported here.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from typing import Any

from superserial.errors import CorruptDataError
from superserial.storage import retry
from superserial.storage._http import PlainHttp

__all__ = ["FsspecRangeReader", "OsRangeReader", "RangeReader", "StreamRangeReader", "local_path"]

log = logging.getLogger("superserial")


def local_path(path: str) -> str:
    """A local path without its ``file://`` prefix."""
    path = str(path)
    return path[len("file://") :] if path.startswith("file://") else path


class RangeReader:
    """An open file for reading byte ranges, many times, without reopening it.

    Made by :func:`open_range_reader`; a context manager. Reads of whole
    ranges only: a range past the end of the file raises
    :class:`~superserial.errors.CorruptDataError`.

    Attributes:
        concurrent: Whether each :meth:`read` is a request of its own, with
            no state shared between reads (no file position), so that many
            threads may read at once and gain by it.
    """

    concurrent = False

    def __init__(self, path: str) -> None:
        self.path = path

    def _read(self, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def read(self, offset: int, length: int) -> bytes:
        """The ``length`` bytes at ``offset``.

        Raises:
            ValueError: ``offset`` or ``length`` is negative.
            CorruptDataError: The file ends before ``offset + length``.
        """
        self._check_range(offset, length)
        return self._whole(self._read(offset, length) if length else b"", offset, length)

    def _check_range(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0:
            raise ValueError(
                f"expected offset >= 0 and length >= 0, got {offset} and {length} for {self.path}"
            )

    def _whole(self, data: bytes, offset: int, length: int) -> bytes:
        """``data``, read for ``length`` bytes at ``offset``, if it has them all."""
        if len(data) != length:
            raise CorruptDataError(
                f"expected {length} bytes at offset {offset} of {self.path}, "
                f"got {len(data)} (the file ends first)"
            )
        return data

    def read_some(self, offset: int, length: int) -> bytes:
        """At most ``length`` bytes at ``offset``: fewer where the file ends first.

        Raises:
            ValueError: ``offset`` or ``length`` is negative.
            CorruptDataError: ``offset`` is past the end of the file (on some backends).
        """
        self._check_range(offset, length)
        return self._read(offset, length) if length else b""

    def view(self, end: int) -> mmap.mmap | None:
        """The whole file as a read-only buffer, if this backend can map it; else None.

        Slicing the buffer copies just the bytes sliced, with no call into the
        operating system: for many small reads of one file. The file's size is
        checked first to reach ``end``, so that slicing below ``end`` does not
        touch a page past the end of a truncated file (which would kill the
        process with SIGBUS); call it again before each batch of slices.

        Raises:
            CorruptDataError: The file ends before ``end``.
        """
        return None

    def loop(self) -> Any:
        """The event loop :meth:`read_async` runs on, or None: this reader has no ``read_async``."""
        return None

    async def read_async(self, offset: int, length: int) -> bytes:
        """:meth:`read` as a coroutine on :meth:`loop`, where that is not None."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases the file."""

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OsRangeReader(RangeReader):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._fd = os.open(local_path(path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._map: mmap.mmap | None = None
        self._unmappable = False

    def view(self, end: int) -> mmap.mmap | None:
        size = os.fstat(self._fd).st_size
        if size < end:
            raise CorruptDataError(
                f"expected at least {end} bytes in {self.path}, got {size} (the file ends first)"
            )
        mapped = self._map
        if mapped is None or len(mapped) < end:
            if not size or self._unmappable:
                return None  # an empty file cannot be mapped
            try:
                mapped = self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            except (OSError, OverflowError, ValueError):
                # No address space for it (a 32-bit process), or a file
                # system that cannot map: range reads instead.
                self._unmappable = True
                return None
        return mapped

    def _read(self, offset: int, length: int) -> bytes:
        data = os.pread(self._fd, length, offset)
        if len(data) == length or not data:
            return data
        # A regular file returns short only at its end or past ~2 GiB per call.
        parts = [data]
        got = len(data)
        while got < length:
            more = os.pread(self._fd, length - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def close(self) -> None:
        # The map is dropped, not closed: a thread still slicing it holds a
        # reference, and it is unmapped when the last one goes.
        self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class StreamRangeReader(RangeReader):
    """seek + read on any file object (``tf.io.gfile.GFile``)."""

    def __init__(self, path: str, file: Any, size: int) -> None:
        super().__init__(path)
        self._file, self._size = file, size
        # seek + read is two calls on one file position: threads sharing a
        # reader (a random-access dataset) must not interleave them.
        self._lock = threading.Lock()

    def _read(self, offset: int, length: int) -> bytes:
        if offset >= self._size:  # GFile refuses to seek past the end
            return b""
        with self._lock:
            self._file.seek(offset)
            return bytes(self._file.read(length))

    def close(self) -> None:
        self._file.close()


# Top-level packages of synchronous fsspec filesystems whose cat_file may be
# called from many threads at once.
_THREAD_SAFE = frozenset({"huggingface_hub"})


class FsspecRangeReader(RangeReader):
    """Byte-range requests (``cat_file``): one GET per range, retried (:mod:`.retry`)."""

    def __init__(self, path: str, fs: Any, fpath: str, plain: PlainHttp | None = None) -> None:
        super().__init__(path)
        self._fs, self._fpath = fs, fpath
        self._retry = not retry.own_retries(fs)
        # Blocking reads of a web file with no client options of the user's go
        # over plain connections that receive without the GIL (see _http.py).
        self._plain = plain
        self._warned = False
        # An async filesystem (s3fs, gcsfs, HTTP) runs each cat_file as its own
        # request on fsspec's event loop: safe from many threads; so does
        # huggingface_hub's (hf://), a file object and a GET of its own per call
        # over a thread-safe HTTP client. Others may share one connection or
        # file position between calls (SFTP, FTP).
        self.concurrent = (
            bool(getattr(fs, "async_impl", False)) or retry.package(fs) in _THREAD_SAFE
        )

    def _read(self, offset: int, length: int) -> bytes:
        plain = self._plain
        if plain is not None:
            got = retry.call(
                lambda: plain.get(offset, length),
                self.path,
                offset=offset,
                length=length,
                retry=self._retry,
            )
            if got is not None:
                return got
            self._plain = None  # the server answers otherwise than a plain range: fsspec's client
        data = retry.call(
            lambda: bytes(self._fs.cat_file(self._fpath, start=offset, end=offset + length)),
            self.path,
            offset=offset,
            length=length,
            retry=self._retry,
        )
        return self._in_range(data, offset, length)

    def _in_range(self, data: bytes, offset: int, length: int) -> bytes:
        """The asked-for range of an answer longer than asked: the whole file.

        fsspec's HTTP client hands back the body as it came, and a server that
        ignores ``Range`` answers ``200`` with the whole file, from byte 0.
        """
        if len(data) <= length:
            return data
        if not self._warned:
            self._warned = True
            log.warning(
                "%s answers range requests with the whole file (%d bytes for %d): "
                "each read downloads it all",
                self.path,
                len(data),
                length,
            )
        return data[offset : offset + length]

    def loop(self) -> Any:
        """An async filesystem's event loop (fsspec's), where a batch's reads run; else None."""
        return self._fs.loop if getattr(self._fs, "async_impl", False) else None

    async def read_async(self, offset: int, length: int) -> bytes:
        """:meth:`read` as a coroutine, on :meth:`loop` (retried alike, checked alike).

        Raises:
            CorruptDataError: The file ends before ``offset + length``.
        """
        if offset < 0 or length <= 0:
            return self.read(offset, length)  # the same checks; no request

        async def get() -> bytes:
            got = await self._fs._cat_file(self._fpath, start=offset, end=offset + length)
            return bytes(got)

        data = await retry.call_async(
            get, self.path, offset=offset, length=length, retry=self._retry
        )
        return self._whole(self._in_range(data, offset, length), offset, length)

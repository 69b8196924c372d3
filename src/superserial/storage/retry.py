"""The one retry policy of remote reads: what is worth retrying, how long, and the error after.

Every read the fsspec backend makes (byte ranges, whole files, sizes, streamed
reads) goes through :func:`call`. A transient failure (an HTTP 5xx or 429, S3's
``SlowDown``/"Please reduce your request rate", a dropped or refused connection,
a timeout) is retried with exponential backoff and full jitter, 50 ms doubling
up to 5 s between attempts, until the time budget is spent: 60 s from the first
attempt, or ``SUPERSERIAL_RETRY_SECONDS`` (0: no retries). Then, and at once for
a failure that retrying cannot mend (a 403, a 416), a
:class:`~superserial.errors.RemoteReadError` names the URL, the byte range, the
attempts and the last error. A missing file stays a ``FileNotFoundError`` and a
refused permission a ``PermissionError``, as callers expect.

A request that stops answering is a timeout too: HTTP(S) reads give up on a
server that sends nothing for ``SUPERSERIAL_REQUEST_TIMEOUT`` seconds (20; see
``request_timeout``), while connecting or between any two reads of the
answer, and are then retried like any other transient failure. A slow but
moving transfer is never cut.

Filesystems that retry by themselves (s3fs, with botocore below it; gcsfs) are
not retried again here, which would multiply their attempts by ours: their
final error is only named (see ``own_retries``).

This module imports neither TensorFlow nor fsspec.
"""

from __future__ import annotations

import asyncio
import errno
import io
import random
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from superserial.base import settings
from superserial.errors import RemoteReadError

__all__ = [
    "REQUEST_TIMEOUT_ENV",
    "RETRY_SECONDS_ENV",
    "RetryingFile",
    "budget",
    "call",
    "call_async",
    "own_retries",
    "package",
    "request_timeout",
    "transient",
]

T = TypeVar("T")

RETRY_SECONDS_ENV = "SUPERSERIAL_RETRY_SECONDS"
_DEFAULT_SECONDS = 60.0
REQUEST_TIMEOUT_ENV = "SUPERSERIAL_REQUEST_TIMEOUT"
# Well under the budget, so that a request that hangs is tried again; far over
# an object store's time to first byte (tens of ms, seconds at its worst).
_DEFAULT_TIMEOUT = 20.0
_FIRST_DELAY = 0.05
_MAX_DELAY = 5.0

# OSError numbers of failures that a later attempt may not meet (s3fs gives
# SlowDown and 503 as EBUSY).
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EBUSY,
        errno.EAGAIN,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
    }
)
_THROTTLED = ("reduce your request rate", "slowdown", "throttl", "too many requests")

# Top-level packages of fsspec filesystems with a retry loop of their own
# (huggingface_hub's: 5 retries of 5xx, 429 and dropped connections, 1-8 s apart).
_OWN_RETRIES = frozenset({"s3fs", "gcsfs", "huggingface_hub"})


def budget() -> float:
    """The seconds a read may spend retrying: ``SUPERSERIAL_RETRY_SECONDS``, else 60.

    Raises:
        ValueError: The variable is not a number >= 0.
    """
    return settings.seconds(RETRY_SECONDS_ENV, _DEFAULT_SECONDS)


def request_timeout() -> float:
    """Seconds a request may wait for a server that sends nothing: ``SUPERSERIAL_REQUEST_TIMEOUT``, else 20.

    Raises:
        ValueError: The variable is not a number > 0.
    """
    return settings.seconds(REQUEST_TIMEOUT_ENV, _DEFAULT_TIMEOUT, zero=False)


def package(fs: Any) -> str:
    """The top-level package of the fsspec filesystem ``fs`` (``"s3fs"``, ``"fsspec"``)."""
    return type(fs).__module__.split(".", 1)[0]


def own_retries(fs: Any) -> bool:
    """Whether the fsspec filesystem ``fs`` retries transient failures by itself."""
    return package(fs) in _OWN_RETRIES


def _status(e: BaseException) -> int | None:
    # aiohttp's ClientResponseError (fsspec's HTTP filesystem) carries the HTTP status;
    # requests' and httpx's errors (huggingface_hub's hf://) carry the response.
    status = getattr(e, "status", None)
    if status is None:
        status = getattr(getattr(e, "response", None), "status_code", None)
    return status if isinstance(status, int) and 100 <= status < 600 else None


def _aiohttp_transient(e: BaseException) -> bool:
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None:  # never imported: none of its errors can be here
        return False
    # Dropped, refused, reset connections and bodies cut short.
    return isinstance(e, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError)


def _untrusted(e: BaseException) -> bool:
    """Whether ``e`` says the server's TLS certificate did not verify (directly or in aiohttp's)."""
    aiohttp = sys.modules.get("aiohttp")
    cur: BaseException | None = e
    while cur is not None:
        if isinstance(cur, ssl.SSLCertVerificationError):
            return True
        if aiohttp is not None and isinstance(cur, aiohttp.ClientConnectorCertificateError):
            return True
        cur = cur.__cause__
    return False


def transient(e: BaseException) -> bool | None:
    """True if a later attempt may succeed, False if not, None if ``e`` is no remote failure.

    A ``FileNotFoundError`` fsspec raised from a failed request (its HTTP
    filesystem says so of a 503 on a HEAD) is judged by that request's error.
    """
    status = _status(e)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if _untrusted(e):
        return False  # the same certificate comes again: a CA bundle is missing, not luck
    if isinstance(e, TimeoutError | ConnectionError) or _aiohttp_transient(e):
        return True
    if isinstance(e, FileNotFoundError):
        cause = e.__cause__
        return bool(cause is not None and transient(cause))
    if isinstance(e, PermissionError | IsADirectoryError | NotADirectoryError):
        return False
    if isinstance(e, OSError):
        text = str(e).lower()
        return e.errno in _TRANSIENT_ERRNOS or any(t in text for t in _THROTTLED)
    name = type(e).__name__
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"):
        return True  # botocore's, when a client raises them unwrapped
    return None


def _where(url: str, offset: int | None, length: int | None) -> str:
    if offset is None:
        return url
    if length is None:
        return f"{url} (bytes {offset}-)"
    return f"{url} (bytes {offset}-{offset + length - 1})" if length else url


def call(
    fn: Callable[[], T],
    url: str,
    *,
    offset: int | None = None,
    length: int | None = None,
    retry: bool = True,
) -> T:
    """``fn()``, retried on transient failures within the time budget (see the module docstring).

    Args:
        fn: One request (a range read, a whole-file read, a size).
        url: The file it reads, for the error.
        offset: The first byte it reads, for the error; None: not a range.
        length: The bytes it reads, for the error; None: to the end.
        retry: False where the filesystem retried already: the first
            failure is final, though still named.

    Raises:
        RemoteReadError: A failure retrying cannot mend (a 403), or transient
            ones until the budget ran out.
        FileNotFoundError: No such file (nothing retried).
        PermissionError: Access refused (nothing retried).
    """
    state = _Attempts(url, offset, length, retry)
    while True:
        try:
            return fn()
        except Exception as e:
            pause = state.pause(e)
            if pause is None:
                raise  # not a failed request, or the OSError callers expect (404, 403 on S3)
        time.sleep(pause)


async def call_async(
    fn: Callable[[], Awaitable[T]],
    url: str,
    *,
    offset: int | None = None,
    length: int | None = None,
    retry: bool = True,
) -> T:
    """:func:`call` for a coroutine function: the same policy, waiting with ``asyncio.sleep``.

    For requests issued on an event loop (:mod:`superserial.storage.fetch`),
    which a blocking sleep would stall for every request on it.

    Raises:
        RemoteReadError, FileNotFoundError, PermissionError: As :func:`call`.
    """
    state = _Attempts(url, offset, length, retry)
    while True:
        try:
            return await fn()
        except Exception as e:
            pause = state.pause(e)
            if pause is None:
                raise  # as in call
        await asyncio.sleep(pause)


class _Attempts:
    """The attempts of one request so far: how long to wait before the next, or the error."""

    def __init__(self, url: str, offset: int | None, length: int | None, retry: bool) -> None:
        self.url, self.offset, self.length, self.retry = url, offset, length, retry
        self.seconds = budget() if retry else 0.0
        self.start = time.monotonic()
        self.delay = _FIRST_DELAY
        self.attempts = 0

    def pause(self, e: Exception) -> float | None:
        """The seconds to wait before retrying after ``e``; None: ``e`` is to be raised as it is.

        Raises:
            RemoteReadError: ``e`` is a failed request not to be tried again.
        """
        self.attempts += 1
        kind = transient(e)
        if kind is None or (kind is False and isinstance(e, OSError) and not _untrusted(e)):
            return None
        elapsed = time.monotonic() - self.start
        # Jitter: clients that failed together spread.
        pause = random.uniform(self.delay / 2, self.delay)
        if kind and elapsed + pause <= self.seconds:
            self.delay = min(self.delay * 2, _MAX_DELAY)
            return pause
        where = _where(self.url, self.offset, self.length)
        if not kind:
            why = "not retried: it is no transient failure"
        elif not self.retry:
            why = "after the filesystem's own retries (not retried again)"
        else:
            why = (
                f"after {self.attempts} attempt(s) in {elapsed:.1f} s, the retry budget of "
                f"{self.seconds:g} s ({RETRY_SECONDS_ENV}) spent"
            )
        raise RemoteReadError(
            f"expected to read {where}, got {type(e).__name__}: {e} ({why})"
        ) from e


class RetryingFile(io.RawIOBase):
    """A remote file read by retried range requests (:func:`call`), for ``open_file(..., "rb")``.

    Wrap it in an ``io.BufferedReader`` whose buffer is the bytes one request
    fetches. A failed request leaves the position where it was, so a retry
    reads the same bytes again.
    """

    def __init__(
        self, url: str, size: int, read: Callable[[int, int], bytes], *, retry: bool
    ) -> None:
        super().__init__()
        self.name = url
        self._size, self._read, self._retry = size, read, retry
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"expected a position >= 0 in {self.name}, got {base + offset}")
        self._pos = base + offset
        return self._pos

    def readall(self) -> bytes:
        # One request for the rest, not io's default of one per 8 KiB.
        out = bytearray(max(0, self._size - self._pos))
        got = 0
        while got < len(out) and (n := self.readinto(memoryview(out)[got:])):
            got += n
        return bytes(out[:got])

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self._size - self._pos)
        if n <= 0:
            return 0
        start = self._pos
        data = call(
            lambda: self._read(start, start + n),
            self.name,
            offset=start,
            length=n,
            retry=self._retry,
        )
        if len(data) > n:
            raise RemoteReadError(
                f"expected at most {n} bytes at offset {start} of {self.name}, got {len(data)} "
                "(does the server ignore range requests?)"
            )
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

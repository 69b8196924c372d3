"""Byte ranges of ``http(s)://`` files over plain keep-alive connections, one per thread.

For :mod:`superserial.storage._backends`, whose fsspec range reader asks here
first for its blocking reads (read-ahead blocks, windowed units, single
ranges); reads issued as coroutines stay on fsspec's event loop.

Why: fsspec's HTTP filesystem receives every body on its one event-loop
thread, in aiohttp, which holds the GIL while it parses and joins each chunk
of a large body. Read-ahead of 8 MiB blocks spent about 100 ms of an epoch of
50 MB there, serialized with the decode (py-spy, docs/performance.md).
``http.client`` reads a body of known length with one buffered read into the
result, the GIL released during each ``recv``: the same blocks took 0.01-0.03 s
of CPU against fsspec's 0.04-0.19 s (nginx behind the test proxy, 8 in flight).

Only what this client can read exactly is read here: a ``206 Partial
Content`` of the range asked for, with no content encoding. Any other answer
of a server that works (a redirect, a whole ``200`` from a server that ignores
ranges, a ``Content-Range`` elsewhere) makes :meth:`PlainHttp.get` return
None, and the caller reads with fsspec from then on. A 404 is a
``FileNotFoundError``; other statuses raise :class:`HttpStatusError`, whose
``status`` :mod:`superserial.storage.retry` judges, and failed connections a
``ConnectionError``, transient for it likewise: the one retry policy covers
both clients.

Connections are per thread and per origin, and never cross a fork: a forked
child opens its own (a socket shared with the parent would mix their answers).
"""

from __future__ import annotations

import errno
import http.client
import os
import ssl
import threading
import urllib.parse

from superserial.base import settings
from superserial.storage import retry

__all__ = ["PLAIN_HTTP_ENV", "HttpStatusError", "PlainHttp", "plain_client"]

# 0: every read of a web file through fsspec's client (aiohttp), none here.
PLAIN_HTTP_ENV = "SUPERSERIAL_PLAIN_HTTP"

# A connection the server closed while it idled fails on its next request
# before any answer: these say so, and a new connection is tried at once.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)

# Made once per CA bundle setting (loading the bundle takes milliseconds, more
# than a request here): SSL_CERT_FILE or SSL_CERT_DIR set later is honoured.
_contexts: dict[tuple[str | None, str | None], ssl.SSLContext] = {}
_local = threading.local()


class HttpStatusError(Exception):
    """A web server answered a range request with ``status``: judged by :mod:`.retry`."""

    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"HTTP {status} from {url}")
        self.status = status


def _ssl_context() -> ssl.SSLContext:
    trust = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    context = _contexts.get(trust)
    if context is None:
        context = _contexts[trust] = ssl.create_default_context()
    return context


def plain_client(url: str) -> PlainHttp | None:
    """A client for the web file ``url``, or None: fsspec's is to read it.

    None where ``SUPERSERIAL_PLAIN_HTTP`` is 0, or where fsspec's configuration
    gives the URL's filesystem options (headers, auth, a client): those only
    fsspec's client knows.

    Raises:
        ValueError: ``SUPERSERIAL_PLAIN_HTTP`` holds neither 1 nor 0.
    """
    if not settings.flag(PLAIN_HTTP_ENV, True):
        return None
    import fsspec

    if fsspec.core.url_to_fs(url)[0].storage_options:
        return None
    return PlainHttp(url)


class PlainHttp:
    """Range GETs of one ``http(s)://`` URL; :meth:`get` from any thread.

    Args:
        url: The file's URL (a query string is kept: signed URLs).
    """

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._origin = (parts.scheme, parts.hostname, parts.port)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection to the origin, and whether it has served a request."""
        conns: dict[tuple[object, ...], http.client.HTTPConnection] | None
        conns = getattr(_local, "conns", None)
        if conns is None or getattr(_local, "pid", None) != os.getpid():
            # A fork's child sees its parent's thread-locals: never its sockets.
            conns = _local.conns = {}
            _local.pid = os.getpid()
        conn = conns.get(self._origin)
        if conn is not None:
            return conn, True
        timeout = retry.request_timeout()
        if self._https:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=_ssl_context()
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        conns[self._origin] = conn
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        conns = getattr(_local, "conns", {})
        if conns.get(self._origin) is conn:
            del conns[self._origin]

    def get(self, offset: int, length: int) -> bytes | None:
        """At most ``length`` bytes at ``offset`` (fewer where the file ends); None: use fsspec.

        Raises:
            FileNotFoundError: The server has no such file (404).
            HttpStatusError: Any status but 206, 200, a redirect or 404.
            ConnectionError: The connection failed or the body was cut short.
            TimeoutError: The server sent nothing for the request timeout.
        """
        conn, reused = self._connection()
        try:
            try:
                return self._get(conn, offset, length)
            except _STALE:
                if not reused:
                    raise
                # The server closed the idle connection: a fresh one, at once.
                conn, _ = self._connection()
                return self._get(conn, offset, length)
        except http.client.HTTPException as e:
            if isinstance(e, ConnectionError):
                raise  # RemoteDisconnected: transient as it is
            # A bad status line, a body cut short: the connection failed.
            raise ConnectionError(f"{type(e).__name__} reading {self.url}: {e}") from e

    def _get(self, conn: http.client.HTTPConnection, offset: int, length: int) -> bytes | None:
        headers = {"Range": f"bytes={offset}-{offset + length - 1}", "Accept-Encoding": "identity"}
        try:
            conn.request("GET", self._target, headers=headers)
            resp = conn.getresponse()
        except BaseException:
            self._drop(conn)
            raise
        try:
            status = resp.status
            if status != 206:
                if status == 404:
                    raise FileNotFoundError(
                        errno.ENOENT, "no such file on the web server", self.url
                    )
                if status == 200 or 300 <= status < 400:
                    return None  # a whole file, or elsewhere: fsspec's client follows
                raise HttpStatusError(status, self.url)
            if not self._plain_range(resp, offset, length):
                return None
            return resp.read()  # one read into the result; short: IncompleteRead
        finally:
            if resp.status != 206 or not resp.isclosed():
                self._drop(conn)  # an answer not read to its end spoils the connection

    @staticmethod
    def _plain_range(resp: http.client.HTTPResponse, offset: int, length: int) -> bool:
        """Whether a 206 holds the bytes from ``offset`` as they are, at most ``length``."""
        if resp.getheader("Content-Encoding", "identity").lower() != "identity":
            return False
        size = resp.getheader("Content-Length")
        where = resp.getheader("Content-Range", "")
        unit, _, span = where.partition(" ")
        first = span.split("-", 1)[0]
        if unit != "bytes" or not first.isdigit() or int(first) != offset:
            return False
        return size is not None and size.isdigit() and int(size) <= length

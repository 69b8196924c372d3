"""A TCP proxy of our own on 127.0.0.1 in front of a real HTTP server: latency and faults.

    with NetProxy(("127.0.0.1", 8080), latency=0.05, fail=0.05, seed=1) as proxy:
        read(proxy.url + "/ds")          # every request held 50 ms; 5% fail

It sees HTTP request boundaries, also on keep-alive connections: it reads each
request's line, headers and ``Content-Length`` body, holds it for ``latency``
seconds (a stand-in for an object store's time to first byte), then either
forwards it upstream and relays the response (``Content-Length``, chunked, or
to the close; no body for HEAD, 1xx, 204, 304), or fails it. A failure is, by
the seeded generator, one of ``faults``: ``"503"`` (a ``503 Service
Unavailable`` with ``Connection: close``), ``"drop"`` (the connection closed
with no answer), ``"cut"`` (the response's head and half its body, then
the connection closed), or ``"stall"`` (no answer at all, the connection held
open until the client gives up or the proxy closes: a server that hangs).
``"stall"`` is only chosen when ``faults`` names it. ``fail=1.0`` fails every request. Requests are never
rewritten: a client's keep-alive connection stays one, upstream too.

It also counts what really crossed it: requests, the most in flight at once
(from the moment a request is read, latency included, until its answer starts
out) and the response body bytes the server sent (``max_in_flight``,
``body_bytes``; :meth:`NetProxy.reset` starts the counts again).

``hold`` (settable) is called with each request's head before it is
forwarded, in that request's own thread: a test may block there, to keep
chosen requests from being answered until it lets them go.

For tests and benchmarks (benchmarks put tests/ on ``sys.path``); traffic only
on the loopback, and every thread stops with :meth:`NetProxy.close`.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["NetProxy"]

_HEAD_LIMIT = 64 << 10
# Connections the proxy's listening socket queues before they are accepted.
_BACKLOG = 4096
# The most one recv reads into a body (large reads: fewer calls, each under the GIL).
_RECV = 1 << 20

_FAULTS = ("503", "drop", "cut")
_KNOWN = (*_FAULTS, "stall")
# A response body at least this large counts as large (NetProxy.large_bytes): a piece
# of a whole shard, as a cache fetches it (1 MiB or a shard's last part), not a range
# read of a few records.
LARGE = 256 << 10
_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 19\r\nConnection: close\r\n\r\nService Unavailable"
)


class _Closed(Exception):
    """The peer closed its side (between or inside a message)."""


class _Stream:
    """Buffered reads of one socket: lines, exact counts, the rest."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _more(self) -> bytes:
        data = self.sock.recv(1 << 16)
        if not data:
            raise _Closed
        return data

    def head(self) -> bytes:
        """Everything up to and including the blank line after the headers."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > _HEAD_LIMIT:
                raise _Closed
            self.buf += self._more()
        end = self.buf.index(b"\r\n\r\n") + 4
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self.buf += self._more()
        end = self.buf.index(b"\r\n") + 2
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def exactly(self, n: int) -> bytes:
        if len(self.buf) >= n:
            out, self.buf = self.buf[:n], self.buf[n:]
            return out
        # Received into one buffer of the right size: appending to bytes copied the
        # body so far at every recv, quadratic in its size (an 8 MiB body cost the
        # proxy ~0.1 s of CPU, which it took from the reader it was measuring).
        out_buf = bytearray(n)
        view = memoryview(out_buf)
        got = len(self.buf)
        view[:got] = self.buf
        self.buf = b""
        while got < n:
            k = self.sock.recv_into(view[got:], min(n - got, _RECV))
            if not k:
                raise _Closed
            got += k
        return bytes(out_buf)

    def rest(self) -> bytes:
        """Everything until the peer closes."""
        parts = [self.buf]
        self.buf = b""
        while data := self.sock.recv(1 << 16):
            parts.append(data)
        return b"".join(parts)


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)}


def _body(stream: _Stream, headers: dict[str, str]) -> bytes:
    """A message body framed by ``Transfer-Encoding: chunked`` or ``Content-Length``."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size_line = stream.line()
            parts.append(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while (trailer := stream.line()) != b"\r\n":
                    parts.append(trailer)
                parts.append(b"\r\n")
                return b"".join(parts)
            parts.append(stream.exactly(size + 2))
    return stream.exactly(int(headers.get("content-length", "0")))


class NetProxy:
    """The proxy (see the module docstring); a context manager. Settings may change while it runs.

    Attributes:
        url: ``http://127.0.0.1:PORT``, the address to use instead of the upstream's.
        requests: Requests seen so far.
        failed: Of those, the ones failed on purpose.
        max_in_flight: The most requests held or forwarded at once.
        body_bytes: Response body bytes relayed from the upstream.
        large_bodies, large_bytes: Of those, the responses of at least ``LARGE`` bytes
            (whole shards, as a cache fetches them) and their bytes.
        hold: Called with each request's head before it is forwarded (None: not).
    """

    def __init__(
        self,
        upstream: tuple[str, int] | str,
        *,
        latency: float = 0.0,
        fail: float = 0.0,
        faults: tuple[str, ...] = _FAULTS,
        seed: int = 0,
    ) -> None:
        unknown = set(faults) - set(_KNOWN)
        if unknown or not faults:
            raise ValueError(f"expected faults among {_KNOWN}, got {faults!r}")
        if isinstance(upstream, str):  # "http://host:port"
            host, _, port = upstream.split("//", 1)[-1].rstrip("/").rpartition(":")
            upstream = (host, int(port))
        self.upstream, self.latency, self.fail, self.faults = upstream, latency, fail, faults
        self.requests = self.failed = 0
        self.max_in_flight = self.body_bytes = self._in_flight = 0
        self.large_bodies = self.large_bytes = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.hold: Callable[[bytes], None] | None = None
        self._socks: set[socket.socket] = set()
        self._closing = False
        # A wide accept queue, as an object store's front end has: with Python's
        # default (128), a reader's first 256 connections at once overflowed it, and
        # the dropped connects came back after the kernel's 1 s retransmit.
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=_BACKLOG)
        self._listener.settimeout(0.1)  # close() from another thread does not wake accept()
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name="netproxy", daemon=True)
        self._thread.start()

    def __enter__(self) -> NetProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops accepting and closes every connection; the threads then end."""
        self._closing = True
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            self._shut(s)
        self._thread.join(5)

    def _shut(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # already closed by the peer
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        with self._lock:
            self._socks.discard(sock)

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            client.settimeout(None)
            with self._lock:
                self._socks.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def reset(self) -> None:
        """Starts the counts again."""
        with self._lock:
            self.requests = self.failed = self.max_in_flight = self.body_bytes = 0
            self.large_bodies = self.large_bytes = 0

    def _verdict(self) -> str | None:
        """The fault for the next request, or None to forward it (seeded: reproducible)."""
        with self._lock:
            self.requests += 1
            if self._rng.random() >= self.fail:
                return None
            self.failed += 1
            return self._rng.choice(self.faults)

    def _serve(self, client: socket.socket) -> None:
        up: _Stream | None = None
        try:
            stream = _Stream(client)
            while True:
                head = stream.head()
                request = head + _body(stream, _headers(head))
                method = head.split(b" ", 1)[0].upper()
                with self._lock:
                    self._in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self._in_flight)
                answered = False
                try:
                    up, reply, go_on = self._answer(client, request, method, up)
                    # The request leaves the count as its answer starts out, not once
                    # sendall has returned: by then the client may have read it all and
                    # sent its next request, which would be counted beside it.
                    with self._lock:
                        self._in_flight -= 1
                    answered = True
                    client.sendall(reply)
                finally:
                    if not answered:
                        with self._lock:
                            self._in_flight -= 1
                if not go_on:
                    return
        except (_Closed, OSError, ValueError, IndexError):
            return  # a peer went away, or sent what is no HTTP: end this connection
        finally:
            self._shut(client)
            if up is not None:
                self._shut(up.sock)

    def _connect(self) -> _Stream:
        sock = socket.create_connection(self.upstream)
        with self._lock:
            self._socks.add(sock)
        return _Stream(sock)

    def _forward(self, request: bytes, up: _Stream | None) -> tuple[_Stream, bytes]:
        """Sends ``request`` upstream; the connection used and the response's head.

        An idle keep-alive connection the server has closed meanwhile (nginx reuses
        its idle connections when it runs short) is replaced and the request sent
        once more, as a load balancer does for a request nothing was answered to.
        """
        if up is not None:
            try:
                up.sock.sendall(request)
                return up, up.head()
            except (_Closed, OSError):
                if up.buf:  # part of an answer came: not a stale connection
                    raise
                self._shut(up.sock)
        up = self._connect()
        up.sock.sendall(request)
        return up, up.head()

    def _answer(
        self, client: socket.socket, request: bytes, method: bytes, up: _Stream | None
    ) -> tuple[_Stream | None, bytes, bool]:
        """Holds, then fails or forwards one request.

        Returns:
            The upstream connection (opened on the first forwarded request), the bytes
            to send the client, and whether the client's connection goes on to another
            request.
        """
        if self.latency:
            time.sleep(self.latency)
        if self.hold is not None:
            self.hold(request)
        fault = self._verdict()
        if fault == "503":
            # A response to HEAD has no body, though it says how long one would be.
            return up, _UNAVAILABLE if method != b"HEAD" else _UNAVAILABLE[:-19], False
        if fault == "drop":
            return up, b"", False
        if fault == "stall":
            with contextlib.suppress(OSError):
                while client.recv(1 << 16):  # b"": the client hung up (or close() shut it)
                    pass
            return up, b"", False
        up, rhead = self._forward(request, up)
        while rhead.split(b" ", 2)[1].startswith(b"1"):  # 100 Continue: not the answer
            client.sendall(rhead)
            rhead = up.head()
        rheaders = _headers(rhead)
        status = int(rhead.split(b" ", 2)[1])
        framed = "content-length" in rheaders or "chunked" in rheaders.get("transfer-encoding", "")
        if method == b"HEAD" or status in (204, 304):
            body = b""
        elif framed:
            body = _body(up, rheaders)
        else:
            body = up.rest()  # to the close
        with self._lock:
            self.body_bytes += len(body)
            if len(body) >= LARGE:
                self.large_bodies += 1
                self.large_bytes += len(body)
        if fault == "cut":
            return up, rhead + body[: len(body) // 2], False
        if not framed and body:
            return up, rhead + body, False
        return up, rhead + body, "close" not in rheaders.get("connection", "").lower()

    def stats(self) -> dict[str, Any]:
        """Requests seen and failed so far."""
        with self._lock:
            return {"requests": self.requests, "failed": self.failed}

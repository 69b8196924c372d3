"""A small HTTP/1.1 proxy for tests: holds each request, counts requests in flight and bytes.

It stands between a client and a real server (moto's S3 server) and forwards
each request unchanged on its own upstream connection, after holding it for
``delay`` seconds (as a far-away object store would). It counts what really
crossed it: requests, the most in flight at once, and the response body
bytes the server sent. Not a general proxy: enough HTTP for S3's requests
(bodies by ``Content-Length`` or chunked; no body for HEAD, 1xx, 204, 304).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


def _read_head(sock: socket.socket, buf: bytearray) -> bytes | None:
    """The bytes up to and including the blank line ending an HTTP head; None at EOF."""
    while b"\r\n\r\n" not in buf:
        more = sock.recv(65536)
        if not more:
            return None
        buf += more
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    del buf[:end]
    return head


def _read_exact(sock: socket.socket, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        more = sock.recv(max(65536, n - len(buf)))
        if not more:
            raise ConnectionError(f"expected {n} bytes of a body, got {len(buf)} and EOF")
        buf += more
    out = bytes(buf[:n])
    del buf[:n]
    return out


def _read_line(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\r\n" not in buf:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("expected a chunk size line, got EOF")
        buf += more
    end = buf.index(b"\r\n") + 2
    line = bytes(buf[:end])
    del buf[:end]
    return line


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}


def _read_body(sock: socket.socket, buf: bytearray, headers: dict[str, str]) -> tuple[bytes, int]:
    """The raw body (as sent: chunk framing kept) and the count of its payload bytes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts, payload = [], 0
        while True:
            line = _read_line(sock, buf)
            size = int(line.split(b";")[0], 16)
            parts.append(line)
            parts.append(_read_exact(sock, buf, size + 2))
            payload += size
            if size == 0:
                return b"".join(parts), payload
    n = int(headers.get("content-length", "0"))
    return _read_exact(sock, buf, n), n


class CountingProxy:
    """A threaded proxy to ``upstream`` (``http://host:port``) on 127.0.0.1; a context manager.

    Attributes:
        url: Where to point the client.
        requests: Requests forwarded.
        max_in_flight: The most requests forwarded and not yet answered at once.
        body_bytes: Response body bytes the server sent back (GET payloads).
    """

    def __init__(self, upstream: str, delay: float = 0.0) -> None:
        host, port = upstream.split("://", 1)[1].rstrip("/").split(":")
        self._upstream = (host, int(port))
        self.delay = delay
        self._lock = threading.Lock()
        self._in_flight = 0
        self.requests = self.max_in_flight = self.body_bytes = 0
        self._server = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        """Starts the counts over."""
        with self._lock:
            self.requests = self.max_in_flight = self.body_bytes = 0

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self._upstream)
        cbuf, ubuf = bytearray(), bytearray()
        try:
            while True:
                head = _read_head(client, cbuf)
                if head is None:
                    return
                body, _ = _read_body(client, cbuf, _headers(head))
                method = head.split(b" ", 1)[0]
                with self._lock:
                    self.requests += 1
                    self._in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self._in_flight)
                rhead, payload = None, 0
                try:
                    time.sleep(self.delay)
                    upstream.sendall(head + body)
                    rhead = _read_head(upstream, ubuf)
                    if rhead is None:
                        return
                    status = int(rhead.split(b" ", 2)[1])
                    if method == b"HEAD" or status < 200 or status in (204, 304):
                        rbody, payload = b"", 0
                    else:
                        rbody, payload = _read_body(upstream, ubuf, _headers(rhead))
                    client.sendall(rhead + rbody)
                finally:
                    with self._lock:
                        self._in_flight -= 1
                        self.body_bytes += payload
        except (ConnectionError, OSError):
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

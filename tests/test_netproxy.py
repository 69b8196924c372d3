"""The test proxy itself: what a test measures through it must be the library's doing."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from netproxy import NetProxy


@pytest.fixture
def closing_server() -> Iterator[tuple[tuple[str, int], list[int]]]:
    """An HTTP server that answers one request per connection, then closes it unannounced.

    Its answers claim keep-alive, as nginx's do until it reuses an idle connection
    for another client. Yields its address and a list counting its connections.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    connections: list[int] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            connections.append(1)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(1 << 16)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname(), connections
    finally:
        done.set()
        thread.join(5)
        listener.close()


def test_an_upstream_connection_the_server_closed_is_replaced(
    closing_server: tuple[tuple[str, int], list[int]],
) -> None:
    address, connections = closing_server
    with NetProxy(address) as proxy:
        client = http.client.HTTPConnection(proxy.url.split("//")[1], timeout=10)
        try:
            for _ in range(3):  # one client connection, kept alive by the proxy
                client.request("GET", "/x")
                response = client.getresponse()
                assert (response.status, response.read()) == (200, b"ok")
        finally:
            client.close()
    assert proxy.requests == 3
    assert len(connections) == 3  # a new upstream connection for each request


@pytest.mark.parametrize("piece", [997, 1 << 16, 3 << 20])
def test_bodies_are_relayed_byte_for_byte_in_however_many_pieces_they_come(piece: int) -> None:
    # Bodies that arrive with their head, in small pieces and in large ones, two on
    # one kept-alive connection: the proxy's buffer must neither lose nor repeat a byte.
    bodies = [bytes(range(256)) * 12289, b"tail" * 17]  # 3 MiB + 256 B, then 68 B
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            for body in bodies:
                while b"\r\n\r\n" not in data:
                    data += conn.recv(1 << 16)
                data = data.split(b"\r\n\r\n", 1)[1]
                message = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                for at in range(0, len(message), piece):
                    conn.sendall(message[at : at + piece])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with NetProxy(listener.getsockname()) as proxy:
            client = http.client.HTTPConnection(proxy.url.split("//")[1], timeout=30)
            try:
                for body in bodies:
                    client.request("GET", "/x")
                    response = client.getresponse()
                    assert (response.status, response.read()) == (200, body)
            finally:
                client.close()
    finally:
        thread.join(10)
        listener.close()

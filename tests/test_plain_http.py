"""Blocking range reads of web files over plain connections (storage/_http.py), against real nginx.

Each test runs with the plain client on and off (``SUPERSERIAL_PLAIN_HTTP``): the
answers a reader gets must not depend on which client fetched them. nginx is set up
with locations that answer as other servers do: one ignores ranges (a whole
``200``), one redirects, one closes the connection after every answer, one closes
idle connections after a second.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import WebServer, assert_same_dataset, canon_np, serve_nginx
from netproxy import NetProxy
from superserial.errors import RemoteReadError
from superserial.storage import fs
from superserial.storage._http import PLAIN_HTTP_ENV

_LOCATIONS = """\
        location /norange/ {{ alias {root}/; max_ranges 0; }}
        location /moved/ {{ rewrite ^/moved/(.*)$ /$1 redirect; }}
        location /once/ {{ alias {root}/; keepalive_timeout 0; }}
        location /brief/ {{ alias {root}/; keepalive_timeout 1s; }}
"""


class _Tls:
    """A self-signed certificate for 127.0.0.1 and a free port for nginx to serve TLS on."""

    def __init__(self, where: Any) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        self.cert, self.key = str(where / "cert.pem"), str(where / "key.pem")
        with open(self.cert, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(self.key, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"

    def directives(self) -> str:
        return (
            f"        listen 127.0.0.1:{self.port} ssl;\n"
            f"        ssl_certificate {self.cert};\n"
            f"        ssl_certificate_key {self.key};\n"
        )


@pytest.fixture(scope="module")
def tls(tmp_path_factory: Any) -> _Tls:
    pytest.importorskip("cryptography")
    return _Tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any, tls: _Tls) -> Iterator[WebServer]:
    """nginx with the locations above, and TLS on a second port, for this module."""
    yield from serve_nginx(tmp_path_factory, "nginx-plain", _LOCATIONS + tls.directives())


@pytest.fixture(scope="module")
def dataset(server: WebServer) -> tuple[str, superserial.Header, bytes]:
    """A dataset of 2 indexed shards under nginx's root: (its name, its header, shard 0's bytes)."""
    rng = np.random.default_rng(3)
    n = 300
    data = tf.data.Dataset.from_tensor_slices(
        {
            "x": rng.integers(0, 255, (n, 40, 40), dtype=np.uint8),
            "s": [f"item-{i}".encode() * (i % 5) for i in range(n)],
        }
    )
    name = f"ds-{uuid.uuid4().hex[:8]}"
    header = superserial.save(data, f"{server.root}/{name}", num_shards=2)
    with open(f"{server.root}/{name}/{header.shards[0].file}", "rb") as f:
        shard0 = f.read()
    return name, header, shard0


@pytest.fixture(params=["1", "0"], ids=["plain", "fsspec"])
def client(request: Any, monkeypatch: Any) -> str:
    """Runs a test with the plain client on, then off."""
    monkeypatch.setenv(PLAIN_HTTP_ENV, request.param)
    return str(request.param)


@pytest.mark.parametrize("where", ["", "/norange", "/moved", "/once"])
def test_every_kind_of_server_reads_exactly(
    where: str, client: str, server: WebServer, dataset: tuple[str, Any, bytes]
) -> None:
    name, header, shard0 = dataset
    shard_url = f"{server.url}{where}/{name}/{header.shards[0].file}"
    # Single ranges, the first from a fresh reader, the rest on one reader.
    assert fs.read_range(shard_url, 100, 5000) == shard0[100:5100]
    with fs.open_range_reader(shard_url) as reader:
        for offset in (0, 7, len(shard0) - 300, 4096):
            assert reader.read(offset, 300) == shard0[offset : offset + 300]
        # Past the end: only what is there.
        assert reader.read_some(len(shard0) - 10, 100) == shard0[-10:]
    local = f"{server.root}/{name}"
    url = f"{server.url}{where}/{name}"
    assert [canon_np(e) for e in ssnp.load(url)] == [canon_np(e) for e in ssnp.load(local)]
    assert_same_dataset(superserial.load(local), superserial.load(url))


def test_a_connection_the_server_closed_while_idle_is_replaced(
    client: str, server: WebServer, dataset: tuple[str, Any, bytes]
) -> None:
    name, header, shard0 = dataset
    url = f"{server.url}/brief/{name}/{header.shards[0].file}"
    with fs.open_range_reader(url) as reader:
        assert reader.read(0, 1000) == shard0[:1000]
        time.sleep(1.5)  # nginx closes the idle connection after 1 s
        assert reader.read(2000, 1000) == shard0[2000:3000]


def test_a_missing_file_and_a_range_past_the_end(
    client: str, server: WebServer, dataset: tuple[str, Any, bytes]
) -> None:
    name, header, shard0 = dataset
    with pytest.raises(FileNotFoundError):
        fs.read_range(f"{server.url}/{name}/no-such-shard", 0, 10)
    url = f"{server.url}/{name}/{header.shards[0].file}"
    # A range wholly past the end is a 416 to both clients: not retried, the range named.
    with pytest.raises(RemoteReadError, match=rf"{url} \(bytes {len(shard0) + 5}-"):
        fs.read_range(url, len(shard0) + 5, 10)
    # A range that the file ends inside is short: an error naming what was expected.
    with pytest.raises(superserial.CorruptDataError, match="expected 100 bytes at offset"):
        fs.read_range(url, len(shard0) - 10, 100)


def test_the_plain_client_is_the_one_that_reads(
    server: WebServer, dataset: tuple[str, Any, bytes], monkeypatch: Any
) -> None:
    name, header, shard0 = dataset
    heads: list[bytes] = []
    lock = threading.Lock()

    def keep(head: bytes) -> None:
        with lock:
            heads.append(head)

    with NetProxy((server.host, server.port)) as proxy:
        proxy.hold = keep
        url = f"{proxy.url}/{name}/{header.shards[0].file}"
        for flag, by_aiohttp in (("1", False), ("0", True)):
            monkeypatch.setenv(PLAIN_HTTP_ENV, flag)
            heads.clear()
            assert fs.read_range(url, 50, 500) == shard0[50:550]
            ranged = [h for h in heads if b"range: bytes=50-549" in h.lower()]
            assert len(ranged) == 1, heads
            assert (b"aiohttp" in ranged[0]) == by_aiohttp, ranged[0]


def test_a_bad_setting_is_refused(
    server: WebServer, dataset: tuple[str, Any, bytes], monkeypatch: Any
) -> None:
    name, header, _ = dataset
    monkeypatch.setenv(PLAIN_HTTP_ENV, "sometimes")
    with pytest.raises(ValueError, match=rf"{PLAIN_HTTP_ENV}, got 'sometimes'"):
        fs.read_range(f"{server.url}/{name}/{header.shards[0].file}", 0, 10)


@pytest.mark.parametrize("client", ["1", "0"], ids=["plain", "fsspec"])
def test_an_untrusted_certificate_fails_at_once_naming_the_url(
    client: str, server: WebServer, tls: _Tls, dataset: tuple[str, Any, bytes], monkeypatch: Any
) -> None:
    name, header, _ = dataset
    url = f"{tls.url}/{name}/{header.shards[0].file}"
    monkeypatch.setenv(PLAIN_HTTP_ENV, client)
    start = time.monotonic()
    with pytest.raises(RemoteReadError, match=rf"{url} \(bytes 0-99\).*not retried") as e:
        fs.read_range(url, 0, 100)
    assert "certificate" in str(e.value).lower()
    assert time.monotonic() - start < 5  # a missing CA bundle is not retried for a minute


def test_https_reads_over_the_plain_client_where_the_certificate_is_trusted(
    server: WebServer, tls: _Tls, dataset: tuple[str, Any, bytes], monkeypatch: Any
) -> None:
    name, header, shard0 = dataset
    url = f"{tls.url}/{name}/{header.shards[0].file}"
    monkeypatch.setenv(PLAIN_HTTP_ENV, "1")
    # Trusted, as a CA bundle of the user's makes it, set after the first https read
    # (aiohttp's context, made when it was imported, does not see it: the range reads
    # are the plain client's alone).
    monkeypatch.setenv("SSL_CERT_FILE", tls.cert)
    with fs.open_range_reader(url) as reader:
        for offset in (0, 4096, len(shard0) - 500):
            assert reader.read(offset, 500) == shard0[offset : offset + 500]

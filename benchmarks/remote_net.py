"""The network side of benchmarks/remote.py: servers, latency proxies, plain-client ceilings.

moto's S3 server and each latency proxy (tests/netproxy.py) run in their own forked
process, so their Python threads never hold the reader's GIL: on a 2-core machine an
in-process proxy would be measured as part of the reader. Each proxy answers ``reset``
and ``counts`` (requests, response body bytes, most in flight) over a pipe.

The ceilings are what a plain client reaches through the same proxy: ``http.client``
threads for nginx and boto3 threads for moto (no superserial code):

* :func:`whole_files`: the shard files fetched whole, ``parallel`` at a time;
* :func:`ranges`: range GETs of one record's size at random offsets in the shards,
  ``in_flight`` threads each sending one after another for ``seconds``.
"""

from __future__ import annotations

import contextlib
import http.client
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

from netproxy import NetProxy
from servers import aws_env, find_nginx, start_moto, start_nginx, stop_nginx

__all__ = [
    "Moto",
    "Proxy",
    "aws_env",
    "find_nginx",
    "http_getter",
    "nginx_behind_proxy",
    "ranges",
    "s3_getter",
    "start_nginx",
    "stop_nginx",
    "whole_files",
]

_FORK = multiprocessing.get_context("fork")  # started before TensorFlow or torch is imported


def _moto_child(conn: Connection) -> None:
    server, endpoint = start_moto()
    conn.send(endpoint)
    with contextlib.suppress(EOFError):  # EOF: the parent went away
        conn.recv()
    server.stop()


class Moto:
    """moto's S3 server in a child process; ``endpoint`` is its URL."""

    def __init__(self) -> None:
        self._conn, child = _FORK.Pipe()
        self._proc = _FORK.Process(target=_moto_child, args=(child,), daemon=True)
        self._proc.start()
        self.endpoint: str = self._conn.recv()

    def close(self) -> None:
        self._conn.send("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()


def _proxy_child(conn: Connection, upstream: str, latency: float) -> None:
    with NetProxy(upstream, latency=latency) as p:
        conn.send(p.url)
        while True:
            try:
                cmd = conn.recv()
            except EOFError:
                return
            if cmd == "reset":
                p.reset()
                conn.send(None)
            elif cmd == "counts":
                conn.send(
                    {
                        "requests": p.requests,
                        "bytes": p.body_bytes,
                        "max_in_flight": p.max_in_flight,
                        "large_requests": p.large_bodies,
                        "large_bytes": p.large_bytes,
                    }
                )
            else:
                return


class Proxy:
    """tests/netproxy.py's proxy in a child process, holding each request ``latency`` s.

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        latency: As given, in seconds.
    """

    def __init__(self, upstream: str, latency: float) -> None:
        self.latency = latency
        self._conn, child = _FORK.Pipe()
        self._proc = _FORK.Process(
            target=_proxy_child, args=(child, upstream, latency), daemon=True
        )
        self._proc.start()
        self.url: str = self._conn.recv()

    def reset(self) -> None:
        self._conn.send("reset")
        self._conn.recv()

    def counts(self) -> dict[str, int]:
        """Requests, body bytes and the most in flight since the last :meth:`reset`."""
        self._conn.send("counts")
        out: dict[str, int] = self._conn.recv()
        return out

    def close(self) -> None:
        self._conn.send("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()


@contextlib.contextmanager
def nginx_behind_proxy(latency: float, prefix: str) -> Iterator[tuple[Proxy, str]]:
    """nginx serving a fresh directory behind a :class:`Proxy`: ``(proxy, that directory)``.

    Call before TensorFlow is imported (the proxy is forked). At exit the proxy and
    nginx stop and the directory, with nginx's files beside it, is removed.
    """
    nginx = find_nginx()
    if nginx is None:
        raise SystemExit("nginx is not installed: `make test-services` installs it")
    work = tempfile.mkdtemp(prefix=prefix)
    www, run = os.path.join(work, "www"), os.path.join(work, "run")
    os.makedirs(www)
    os.makedirs(run)
    try:
        proc, url = start_nginx(nginx, www, run, connections=1024)
        try:
            proxy = Proxy(url, latency)
            try:
                yield proxy, www
            finally:
                proxy.close()
        finally:
            stop_nginx(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ plain clients


def http_getter(url: str, prefix: str) -> Callable[[str, tuple[int, int] | None], int]:
    """A GET of ``url/prefix/name`` (whole, or bytes ``[start, end)``) with one keep-alive
    ``http.client`` connection per thread; returns the body's length."""
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    local = threading.local()

    def get(name: str, span: tuple[int, int] | None) -> int:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        headers = {} if span is None else {"Range": f"bytes={span[0]}-{span[1] - 1}"}
        conn.request("GET", f"/{prefix}/{name}", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status not in (200, 206):
            raise RuntimeError(f"expected 200 or 206 for GET {url}/{name}, got {resp.status}")
        return len(body)

    return get


def s3_getter(
    endpoint: str, bucket: str, pool: int, prefix: str
) -> Callable[[str, tuple[int, int] | None], int]:
    """The same GETs of ``prefix/key`` with one boto3 client (``pool`` connections)."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(max_pool_connections=pool, retries={"max_attempts": 1}),
    )

    def get(key: str, span: tuple[int, int] | None) -> int:
        kw: dict[str, Any] = {} if span is None else {"Range": f"bytes={span[0]}-{span[1] - 1}"}
        return len(client.get_object(Bucket=bucket, Key=f"{prefix}/{key}", **kw)["Body"].read())

    return get


def whole_files(
    get: Callable[[str, tuple[int, int] | None], int], names: list[str], parallel: int = 8
) -> dict[str, float]:
    """Every file in ``names`` fetched whole, ``parallel`` at a time: seconds and bytes."""
    t = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        got = sum(pool.map(lambda name: get(name, None), names))
    return {"seconds": time.perf_counter() - t, "bytes": got}


def ranges(
    get: Callable[[str, tuple[int, int] | None], int],
    files: list[tuple[str, int]],
    size: int,
    in_flight: int,
    seconds: float,
) -> dict[str, float]:
    """``in_flight`` threads sending range GETs of ``size`` bytes at random offsets of
    ``files`` (name, length) for ``seconds``: requests per second and bytes."""
    done = [0] * in_flight
    got = [0] * in_flight
    errors: list[BaseException] = []
    deadline = time.perf_counter() + seconds

    def run(k: int) -> None:
        rng = random.Random(k)
        try:
            while time.perf_counter() < deadline:
                name, length = files[rng.randrange(len(files))]
                start = rng.randrange(max(1, length - size))
                got[k] += get(name, (start, start + size))
                done[k] += 1
        except Exception as e:  # noqa: BLE001 - reported by the caller, the other threads go on
            errors.append(e)

    t = time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(in_flight)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    if errors and not sum(done):
        raise RuntimeError(f"every range GET failed: {errors[0]!r}") from errors[0]
    return {
        "seconds": elapsed,
        "requests": sum(done),
        "per_s": sum(done) / elapsed,
        "bytes": sum(got),
        "errors": len(errors),
    }

"""The sessions of fsspec's HTTP filesystems: wide, timed out, and safe across a fork.

For :mod:`superserial.storage._backends`. fsspec is not imported here (its loop is
found in ``sys.modules``); aiohttp only inside :func:`web_fs`, which fsspec's
HTTP filesystem has imported already.
"""

from __future__ import annotations

import os
import selectors
import sys
from typing import Any

from superserial.storage import retry

__all__ = ["S3_CONNECTIONS", "web_fs"]


# Connections of the s3fs client and of the HTTP session that range readers
# use (an upper bound: they are opened as requests need them).
S3_CONNECTIONS = 256


# fsspec's event loop as it was before a fork, for the child (see _forked).
_loop_at_fork: list[Any] = [None]


def _before_fork() -> None:
    asyn = sys.modules.get("fsspec.asyn")
    _loop_at_fork[0] = asyn.loop[0] if asyn is not None else None


def _forked() -> None:
    """In a forked child: the parent's fsspec loop gets a selector of its own (a new epoll).

    A child shares its parent's epoll instance and sockets. fsspec drops the
    parent's filesystems in the child (a new pid), and their finalizers close
    the parent's pooled connections on the parent's loop: each close removes
    the socket from the shared epoll, so the parent never hears its answers
    again and its next requests on those connections hang (measured: a read
    after a DataLoader worker had started hung until the timeout). On a
    selector of its own, the child's removals touch nothing of the parent's.

    And the loop is marked as not running, which in the child it is not (its
    thread was the parent's): a finalizer closing a session on a running loop
    waits for the loop to do it, and fsspec's wait gives up only after a whole
    second. It stalled whichever thread dropped the parent's filesystem (once,
    fsspec's new loop itself): a DataLoader worker's first batch took 1 s more.
    Seen as not running, the loop's sessions are closed at once, by their
    connectors.
    """
    loop, _loop_at_fork[0] = _loop_at_fork[0], None
    if loop is not None and hasattr(loop, "_selector"):
        loop._selector = selectors.DefaultSelector()
    if loop is not None and hasattr(loop, "_thread_id"):
        loop._thread_id = None  # what asyncio's is_running() reads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_forked)


def _own_client(options: dict[str, Any]) -> bool:
    """Whether fsspec's HTTP filesystem options make their own aiohttp session or connector."""
    return "get_client" in options or "connector" in options.get("client_kwargs", {})


async def _wide_client(**kwargs: Any) -> Any:
    """An aiohttp session of ``S3_CONNECTIONS`` connections (fsspec's ``get_client``)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=S3_CONNECTIONS)
    return aiohttp.ClientSession(connector=connector, **kwargs)


def web_fs(fs: Any) -> Any:
    """fsspec's HTTP filesystem ``fs`` with our session, unless its options bring their own.

    aiohttp's sessions keep 100 connections: requests beyond that wait for
    one (measured: 100 in flight of 256); ours keeps ``S3_CONNECTIONS``. And
    aiohttp's default timeout is 5 minutes for a whole request, so a server
    that stops answering held a read (and the epoch) that long before the
    first retry; ours gives up on silence (:func:`.retry.request_timeout`),
    never on a slow transfer. A ``timeout`` in ``client_kwargs`` is kept.
    """
    options = fs.storage_options
    if _own_client(options):
        return fs
    import aiohttp

    seconds = retry.request_timeout()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)
    # The timeout is one of the options, so fsspec's cache of filesystems
    # keys on it: a changed SUPERSERIAL_REQUEST_TIMEOUT gets a new session.
    client = {"timeout": timeout, **options.get("client_kwargs", {})}
    return type(fs)(**{**options, "get_client": _wide_client, "client_kwargs": client})

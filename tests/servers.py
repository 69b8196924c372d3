"""Real servers on 127.0.0.1 for tests and benchmarks: moto's S3 server and Debian's nginx.

    server, endpoint = start_moto()          # ThreadedMotoServer, "http://127.0.0.1:PORT"
    env = aws_env(endpoint)                  # the AWS settings that point boto3/s3fs at it
    proc, url = start_nginx(nginx, root, run) # nginx serving root, no directory listing

One copy of the start-up code: tests/conftest.py's fixtures and benchmarks/remote.py
(benchmarks put tests/ on ``sys.path``) both start their servers here. Nothing here
skips or fails a test: a missing nginx is ``None`` from :func:`find_nginx`, a server that
does not start a ``RuntimeError``; the callers decide what that means.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["AWS_ENV", "aws_env", "find_nginx", "start_moto", "start_nginx", "stop_nginx"]

AWS_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
)


def aws_env(endpoint: str) -> dict[str, str]:
    """The settings a user would export to point boto3/s3fs at ``endpoint`` (dummy keys).

    ``AWS_PROFILE`` must also be unset (a profile would win over the keys).
    """
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def start_moto() -> tuple[Any, str]:
    """Starts moto's S3 server on 127.0.0.1, on a port the OS picks.

    Returns:
        The running ``moto.server.ThreadedMotoServer`` (``.stop()`` it) and its endpoint URL.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


_NGINX_CONF = """\
daemon off;
worker_processes 1;
{user}pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {run}/body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    types {{ application/json json; }}
    default_type application/octet-stream;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        autoindex off;
{extra}    }}
}}
"""


def find_nginx() -> str | None:
    """The nginx executable (on ``PATH`` or in Debian's ``/usr/sbin``), or None."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def start_nginx(
    nginx: str,
    root: str | os.PathLike[str],
    run: str | os.PathLike[str],
    connections: int = 4096,
    extra: str = "",
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts nginx serving ``root`` on 127.0.0.1 with ``autoindex off``, as a CDN does.

    It runs as the current user in the foreground (``daemon off``); its config, pid, log
    and temp files go to the existing directory ``run``. ``keepalive_requests`` is
    unbounded (nginx closes a keep-alive connection after 1,000 requests by default,
    which a benchmark would measure as reconnects).

    Args:
        nginx: Its executable (:func:`find_nginx`).
        root: The directory it serves.
        run: A directory for its own files.
        connections: ``worker_connections`` of its one worker. The default is well
            above the 256 range requests a reader keeps in flight: at its limit nginx
            closes idle keep-alive connections to make room, and a test's proxy then
            found its upstream connection gone (CI saw a read fail 8 times so).
        extra: Directives added to the server block (``location`` blocks that
            answer otherwise than a plain static server).

    Returns:
        The process (stop it with :func:`stop_nginx`) and its URL, ``http://127.0.0.1:PORT``.

    Raises:
        RuntimeError: It did not start (its error log in the message).
    """
    # Root's workers would otherwise run as nobody, who cannot read a private temp dir.
    user = "user root;\n" if os.geteuid() == 0 else ""
    for _ in range(5):  # a port picked ahead may be taken before nginx binds it: pick again
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf = os.path.join(run, "nginx.conf")
        with open(conf, "w") as f:
            f.write(
                _NGINX_CONF.format(
                    user=user, run=run, port=port, root=root, connections=connections, extra=extra
                )
            )
        log = os.path.join(run, "error.log")
        proc = subprocess.Popen(
            [nginx, "-p", str(run), "-c", conf, "-e", log],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/", timeout=1)
            except urllib.error.HTTPError:
                return proc, url  # the 403 of a directory without listing: nginx is up
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            return proc, url
    text = ""
    if os.path.exists(log):
        with open(log) as f:
            text = f.read()
    raise RuntimeError(f"expected nginx to start, got exit code {proc.returncode}: {text}")


def stop_nginx(proc: subprocess.Popen[bytes]) -> None:
    """Stops an nginx :func:`start_nginx` started (killed if it takes over 10 s)."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

"""A Hugging Face Hub stand-in on 127.0.0.1: local directories served as dataset repos.

    with FakeHub(root) as hub:            # root/<namespace>/<name>/... are the repos
        hub.url                           # what huggingface_hub's ENDPOINT is set to

huggingface_hub's ``HfFileSystem`` (``hf://datasets/<namespace>/<name>/<path>``)
reads a repository through four routes of the Hub's HTTP API, which this server
answers from the files under ``root`` (as moto answers S3's API from memory):

- ``GET /api/datasets/<repo>[/revision/<rev>]``: the repo's info (does it exist);
- ``GET /api/datasets/<repo>/tree/<rev>[/<path>]``: a directory's entries
  (``recursive=true`` for all below it), each ``{"type", "path", "size", "oid"}``;
- ``POST /api/datasets/<repo>/paths-info/<rev>``: the entries of the paths named;
- ``GET``/``HEAD /datasets/<repo>/resolve/<rev>/<path>``: the file, with
  ``Range: bytes=a-b`` answered by a 206.

Every revision is the same single commit, and no entry has an ``xet_hash``, so the
client downloads over plain HTTP range requests. Unknown routes and missing files
are 404s with the Hub's JSON error body. For tests; put a ``NetProxy`` in front for
latency and faults.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeHub"]

COMMIT = "5eb1d7a1c0ffee5eb1d7a1c0ffee5eb1d7a1c0ff"
_REPO = r"/api/datasets/([^/]+/[^/]+)"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test output is not the place for an access log."""

    def _send(self, code: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(code)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, obj: Any, code: int = 200) -> None:
        self._send(code, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _missing(self, what: str, code: str = "EntryNotFound") -> None:
        # The Hub's error code header is what huggingface_hub turns into its exceptions.
        self._send(404, json.dumps({"error": what}).encode(), {"X-Error-Code": code})

    def _entry(self, repo: str, rel: str) -> dict[str, Any]:
        full = os.path.join(repo, rel)
        if os.path.isdir(full):
            return {"type": "directory", "path": rel, "oid": COMMIT}
        oid = hashlib.sha1(rel.encode()).hexdigest()
        return {"type": "file", "path": rel, "size": os.path.getsize(full), "oid": oid}

    def _repo(self, name: str) -> str | None:
        repo = os.path.join(self.root, name)
        return repo if os.path.isdir(repo) else None

    def do_HEAD(self) -> None:
        self._get(head=True)

    def do_GET(self) -> None:
        self._get(head=False)

    def _get(self, head: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        path, query = urllib.parse.unquote(url.path), urllib.parse.parse_qs(url.query)
        if m := re.fullmatch(_REPO + r"(?:/revision/[^/]+)?", path):
            if self._repo(m.group(1)) is None:
                return self._missing("Repository not found", "RepoNotFound")
            return self._json({"id": m.group(1), "sha": COMMIT, "private": False, "siblings": []})
        if m := re.fullmatch(_REPO + r"/tree/[^/]+(/.*)?", path):
            return self._tree(m.group(1), (m.group(2) or "").strip("/"), query)
        if m := re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path):
            return self._file(m.group(1), m.group(2), head)
        self._missing(f"no route {path}")

    def _tree(self, name: str, rel: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(name)
        if repo is None or not os.path.isdir(os.path.join(repo, rel)):
            return self._missing(f"no directory {rel!r}")
        entries = []
        for top, dirs, files in os.walk(os.path.join(repo, rel)):
            for n in sorted(dirs) + sorted(files):
                entries.append(self._entry(repo, os.path.relpath(os.path.join(top, n), repo)))
            if query.get("recursive", ["false"])[0].lower() != "true":
                break
        self._json(entries)

    def _file(self, name: str, rel: str, head: bool) -> None:
        repo = self._repo(name)
        full = os.path.join(repo, rel) if repo is not None else ""
        if not os.path.isfile(full):
            return self._missing(f"no file {rel!r}")
        size = os.path.getsize(full)
        start, end, code = 0, size - 1, 200
        headers = {"ETag": f'"{self._entry(repo or "", rel)["oid"]}"', "X-Repo-Commit": COMMIT}
        if m := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
            start, code = int(m.group(1)), 206
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size:
                return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head)
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        with open(full, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self._send(code, body, {**headers, "Accept-Ranges": "bytes"}, head)

    def do_POST(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        m = re.fullmatch(_REPO + r"/paths-info/[^/]+", path)
        repo = self._repo(m.group(1)) if m else None
        if repo is None:
            return self._missing(f"no route {path}")
        if "json" in self.headers.get("Content-Type", ""):
            paths = json.loads(body).get("paths", [])
        else:
            paths = urllib.parse.parse_qs(body).get("paths", [])
        rels = [p.strip("/") for p in paths]
        self._json([self._entry(repo, r) for r in rels if os.path.exists(os.path.join(repo, r))])


class FakeHub:
    """The stand-in, serving the repos under ``root`` at :attr:`url` until closed."""

    def __init__(self, root: str) -> None:
        handler = type("Handler", (_Handler,), {"root": str(root)})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.host, self.port = "127.0.0.1", int(self._server.server_address[1])
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> FakeHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

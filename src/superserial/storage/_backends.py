"""The filesystem backends behind :mod:`superserial.storage.fs`: ``os``, ``tf.io.gfile``, fsspec.

Use :mod:`superserial.storage.fs`, which picks one of these per path; this module only
says how each backend does each operation. Neither TensorFlow nor fsspec is
imported here until a backend that needs it is used.
"""

from __future__ import annotations

import errno
import glob as _pyglob
import io
import os
import shutil
from typing import Any

from superserial.errors import UnsupportedError
from superserial.storage import retry
from superserial.storage._http import plain_client
from superserial.storage._range_readers import (
    FsspecRangeReader,
    OsRangeReader,
    RangeReader,
    StreamRangeReader,
    local_path,
)
from superserial.storage._sessions import S3_CONNECTIONS, web_fs

__all__ = [
    "S3_CONNECTIONS",
    "Backend",
    "FsspecBackend",
    "GfileBackend",
    "OsBackend",
    "RangeReader",
    "local_path",
]


# The bytes one request of a streamed fsspec read fetches, unless the reader says.
_READ_BLOCK = 8 << 20


class Backend:
    """What a filesystem must do for superserial. Paths are full paths or URLs."""

    name = "?"

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def isdir(self, path: str) -> bool:
        raise NotImplementedError

    def lists(self, path: str) -> bool:
        """Whether :meth:`listdir` can tell what a directory holds (a web server cannot)."""
        return True

    def listdir(self, path: str) -> list[str]:
        raise NotImplementedError

    def makedirs(self, path: str) -> None:
        raise NotImplementedError

    def size(self, path: str) -> int:
        raise NotImplementedError

    def open(self, path: str, mode: str, buffering: int = -1) -> Any:
        raise NotImplementedError

    def rmtree(self, path: str) -> None:
        raise NotImplementedError

    def rename(self, src: str, dst: str, overwrite: bool) -> None:
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def glob(self, pattern: str) -> list[str]:
        raise NotImplementedError

    def range_reader(self, path: str) -> RangeReader:
        raise NotImplementedError

    def read_bytes(self, path: str, limit: int | None) -> bytes:
        """The file's contents, or its first ``limit`` bytes, as of one moment."""
        with self.open(path, "rb") as f:
            return bytes(f.read() if limit is None else f.read(limit))

    def version(self, path: str) -> str | None:
        """A token of the file's current contents for :meth:`put_if`; None if missing.

        Raises:
            UnsupportedError: This filesystem has no conditional writes.
        """
        raise UnsupportedError(f"expected a filesystem with conditional writes for {path}")

    def put_if(self, path: str, data: bytes, version: str | None) -> bool:
        """Writes ``data`` in one request if the file is still at ``version`` (None: absent).

        Returns:
            False if the condition failed (nothing was written).

        Raises:
            UnsupportedError: This filesystem has no conditional writes.
        """
        raise UnsupportedError(f"expected a filesystem with conditional writes for {path}")


class OsBackend(Backend):
    name = "os"

    def exists(self, path: str) -> bool:
        return os.path.lexists(local_path(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(local_path(path))

    def listdir(self, path: str) -> list[str]:
        return os.listdir(local_path(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(local_path(path), exist_ok=True)

    def size(self, path: str) -> int:
        return os.path.getsize(local_path(path))

    def open(self, path: str, mode: str, buffering: int = -1) -> Any:
        return open(local_path(path), mode, buffering=buffering)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(local_path(path))

    def rename(self, src: str, dst: str, overwrite: bool) -> None:
        (os.replace if overwrite else os.rename)(local_path(src), local_path(dst))

    def remove(self, path: str) -> None:
        os.unlink(local_path(path))

    def glob(self, pattern: str) -> list[str]:
        prefix = "file://" if str(pattern).startswith("file://") else ""
        return sorted(prefix + p for p in _pyglob.glob(local_path(pattern)))

    def range_reader(self, path: str) -> RangeReader:
        return OsRangeReader(path)


class GfileBackend(Backend):
    name = "gfile"

    @staticmethod
    def _g() -> Any:
        import tensorflow as tf

        return tf.io.gfile

    def exists(self, path: str) -> bool:
        return bool(self._g().exists(path))

    def isdir(self, path: str) -> bool:
        return bool(self._g().isdir(path))

    def listdir(self, path: str) -> list[str]:
        # Some TF filesystems list subdirectories with a trailing "/".
        return [p.rstrip("/") for p in self._g().listdir(path)]

    def makedirs(self, path: str) -> None:
        self._g().makedirs(path)

    def size(self, path: str) -> int:
        return int(self._g().stat(path).length)

    def open(self, path: str, mode: str, buffering: int = -1) -> Any:
        if mode.startswith("w") and str(path).startswith("ram://") and self._g().exists(path):
            # TensorFlow's ram:// appends on "w" instead of truncating (TF 2.21).
            self._g().remove(path)
        return self._g().GFile(path, mode)

    def rmtree(self, path: str) -> None:
        if self._g().exists(path):
            self._g().rmtree(path)

    def rename(self, src: str, dst: str, overwrite: bool) -> None:
        self._g().rename(src, dst, overwrite=overwrite)

    def remove(self, path: str) -> None:
        if self._g().exists(path):
            self._g().remove(path)

    def glob(self, pattern: str) -> list[str]:
        return sorted(self._g().glob(pattern))

    def range_reader(self, path: str) -> RangeReader:
        file = self._g().GFile(path, "rb")
        return StreamRangeReader(path, file, file.size())

    def read_bytes(self, path: str, limit: int | None) -> bytes:
        import tensorflow as tf

        try:
            return super().read_bytes(path, limit)
        except tf.errors.NotFoundError as e:
            # What callers of every other backend catch for a missing file.
            raise FileNotFoundError(errno.ENOENT, "expected a file, found none", path) from e


class FsspecBackend(Backend):
    name = "fsspec"

    @staticmethod
    def _fs(path: str) -> tuple[Any, str]:
        import fsspec

        fs, fpath = fsspec.core.url_to_fs(str(path))
        if FsspecBackend._web(fs):
            fs = web_fs(fs)
        return fs, fpath.rstrip("/") or fpath

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        if self._web(fs):
            # fsspec's HTTP exists() asks with a GET and takes a 503 for "no such
            # file": a retried size request instead.
            try:
                self.size(path)
            except FileNotFoundError:
                return False
            return True
        # fsspec caches listings with no expiry (s3fs, gcsfs), and answers
        # exists() from them: a dataset another process wrote since would be
        # missed. Existence and listings are always asked afresh; sizes then
        # come from the fresh listing.
        fs.invalidate_cache(p)
        return bool(fs.exists(p))

    def isdir(self, path: str) -> bool:
        fs, p = self._fs(path)
        fs.invalidate_cache(p)
        return bool(fs.isdir(p))

    @staticmethod
    def _web(fs: Any) -> bool:
        protocol = fs.protocol
        return bool({"http", "https"} & set((protocol,) if isinstance(protocol, str) else protocol))

    def lists(self, path: str) -> bool:
        return not self._web(self._fs(path)[0])

    def listdir(self, path: str) -> list[str]:
        fs, p = self._fs(path)
        if self._web(fs):
            # fsspec would list the links of the page the server answers with:
            # an index page's, or none where listing is off (nginx: a 403).
            raise UnsupportedError(
                f"expected a filesystem that lists directories for {path}, got a web server "
                "(http/https), whose pages are no listing; readers go by the header's list"
            )
        fs.invalidate_cache(p)
        if not fs.isdir(p):
            # fs.ls of a file lists the file itself; os.listdir refuses.
            what = "a file" if fs.exists(p) else "nothing"
            raise FileNotFoundError(errno.ENOENT, f"expected a directory, found {what}", path)
        names = (e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False))
        return [n for n in names if n and n != p.rsplit("/", 1)[-1]]

    def makedirs(self, path: str) -> None:
        fs, p = self._fs(path)
        fs.makedirs(p, exist_ok=True)

    def size(self, path: str) -> int:
        fs, p = self._fs(path)
        got = retry.call(lambda: fs.size(p), path, retry=not retry.own_retries(fs))
        if got is None:  # a web server that sends no Content-Length
            raise UnsupportedError(f"expected the size of {path} from the server, got none")
        return int(got)

    def open(self, path: str, mode: str, buffering: int = -1) -> Any:
        fs, p = self._fs(path)
        if mode == "rb":
            # Reads are range requests of a reader's buffer size (the bytes one
            # request fetches), each retried: fsspec's HTTP file objects retry nothing.
            raw = retry.RetryingFile(
                path,
                self.size(path),
                lambda start, end: bytes(fs.cat_file(p, start=start, end=end)),
                retry=not retry.own_retries(fs),
            )
            return io.BufferedReader(raw, buffering if buffering > 0 else _READ_BLOCK)
        return fs.open(p, mode)

    def rmtree(self, path: str) -> None:
        fs, p = self._fs(path)
        if fs.exists(p):
            fs.rm(p, recursive=True)

    def rename(self, src: str, dst: str, overwrite: bool) -> None:
        fs, s = self._fs(src)
        _, d = self._fs(dst)
        if not overwrite and fs.exists(d):
            raise FileExistsError(errno.EEXIST, "expected no file at the rename target", dst)
        # Object stores have no rename: this is a copy and a delete.
        fs.mv(s, d, recursive=fs.isdir(s))

    def remove(self, path: str) -> None:
        fs, p = self._fs(path)
        if fs.exists(p):
            fs.rm_file(p)

    def glob(self, pattern: str) -> list[str]:
        fs, p = self._fs(pattern)
        scheme, rest = str(pattern).split("://", 1)
        if "::" in scheme:
            return sorted(fs.unstrip_protocol(m) for m in fs.glob(p))
        # Give matches back in the pattern's own spelling (memory://b/x, not memory:///b/x).
        return sorted(
            f"{scheme}://{m if rest.startswith('/') else m.lstrip('/')}" for m in fs.glob(p)
        )

    def range_reader(self, path: str) -> RangeReader:
        fs, p = self._fs(path)
        if hasattr(fs, "call_s3") and "max_pool_connections" not in fs.config_kwargs:
            # botocore keeps 10 connections per client: 10 range requests in
            # flight, where the readers ask for SUPERSERIAL_REMOTE_CONCURRENCY
            # (64). The same filesystem with a larger pool (fsspec caches it);
            # a pool the user configured is kept.
            kwargs = fs.storage_options
            config = {**kwargs.get("config_kwargs", {}), "max_pool_connections": S3_CONNECTIONS}
            fs = type(fs)(**{**kwargs, "config_kwargs": config})
        return FsspecRangeReader(path, fs, p, plain_client(path) if self._web(fs) else None)

    def read_bytes(self, path: str, limit: int | None) -> bytes:
        # One GET: an object store replaces a file whole, so this is one version
        # of it. (A file object pins the version it saw when opened, and its
        # read fails if the file was replaced in between: s3fs's FileExpired.)
        fs, p = self._fs(path)
        return retry.call(
            lambda: bytes(fs.cat_file(p, start=0, end=limit)),
            path,
            offset=0,
            length=limit,
            retry=not retry.own_retries(fs),
        )

    @classmethod
    def _s3(cls, path: str) -> tuple[Any, str, str]:
        """(s3fs filesystem, bucket, key); UnsupportedError for other fsspec filesystems."""
        fs, p = cls._fs(path)
        if not hasattr(fs, "call_s3"):
            raise UnsupportedError(
                f"expected a filesystem with conditional writes for {path}, got {type(fs).__name__}"
            )
        bucket, key, _ = fs.split_path(p)
        return fs, bucket, key

    def version(self, path: str) -> str | None:
        fs, bucket, key = self._s3(path)
        try:
            head = fs.call_s3("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        return str(head["ETag"])

    def put_if(self, path: str, data: bytes, version: str | None) -> bool:
        # S3 conditional writes (2024): If-None-Match: * creates only, If-Match
        # replaces only the version read; a 412 reaches us as FileExistsError.
        fs, bucket, key = self._s3(path)
        cond = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **cond)
        except FileExistsError:  # s3fs's word for a failed If-None-Match
            return False
        except OSError as e:
            # A failed If-Match: s3fs keeps S3's error code only in the cause.
            code = getattr(e.__cause__, "response", {}).get("Error", {}).get("Code")
            if code == "PreconditionFailed":
                return False
            if not isinstance(e, FileNotFoundError):
                raise
            # If-Match on a file removed meanwhile: S3 answers 404, not 412.
            if version is None:
                raise
            return False
        finally:
            fs.invalidate_cache(f"{bucket}/{key}")
        return True

"""Filesystem helpers: local paths through ``os``, others through ``tf.io.gfile``.

Local paths get the strongest guarantees this platform offers (an atomic
exchange of the old and the new dataset directory on Linux). Other
filesystems (``gs://``, ``s3://``, ``ram://``) go through ``tf.io.gfile``,
imported lazily so that this module stays importable without TensorFlow.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import uuid
from typing import Any

__all__ = [
    "TMP_MARK",
    "exchange_or_rename",
    "exists",
    "is_local",
    "isdir",
    "join",
    "listdir",
    "makedirs",
    "open_file",
    "remove",
    "replace",
    "rmtree",
    "size",
    "temp_sibling",
]

log = logging.getLogger("superserial")

# Temporary directories of unfinished saves carry this mark in their name;
# they never look like datasets, and ``superserial.cleanup`` removes them.
TMP_MARK = ".superserial-tmp-"


def is_local(path: str) -> bool:
    """True for plain local paths (no ``scheme://``)."""
    return "://" not in str(path) or str(path).startswith("file://")


def _local(path: str) -> str:
    path = str(path)
    return path[len("file://") :] if path.startswith("file://") else path


def _gfile() -> Any:
    import tensorflow as tf

    return tf.io.gfile


def join(*parts: str) -> str:
    """Joins path parts; URLs keep their ``/``."""
    if is_local(parts[0]):
        return os.path.join(*parts)
    return "/".join([parts[0].rstrip("/"), *(p.strip("/") for p in parts[1:])])


def exists(path: str) -> bool:
    """True if ``path`` exists."""
    return os.path.lexists(_local(path)) if is_local(path) else _gfile().exists(path)


def isdir(path: str) -> bool:
    """True if ``path`` is a directory."""
    return os.path.isdir(_local(path)) if is_local(path) else _gfile().isdir(path)


def listdir(path: str) -> list[str]:
    """Names in a directory."""
    return (
        os.listdir(_local(path))
        if is_local(path)
        else [p.rstrip("/") for p in _gfile().listdir(path)]
    )


def makedirs(path: str) -> None:
    """Creates a directory and its parents."""
    if is_local(path):
        os.makedirs(_local(path), exist_ok=True)
    else:
        _gfile().makedirs(path)


def size(path: str) -> int:
    """Size of a file in bytes."""
    return os.path.getsize(_local(path)) if is_local(path) else _gfile().stat(path).length


def open_file(path: str, mode: str = "rb") -> Any:
    """Opens a file for binary reading or writing."""
    return open(_local(path), mode) if is_local(path) else _gfile().GFile(path, mode)


def rmtree(path: str) -> None:
    """Removes a directory tree; a missing one is fine."""
    try:
        if is_local(path):
            shutil.rmtree(_local(path))
        elif _gfile().exists(path):
            _gfile().rmtree(path)
    except FileNotFoundError:
        pass


def rename(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst``; fails if ``dst`` exists (as a non-empty dir)."""
    if is_local(src):
        os.rename(_local(src), _local(dst))
    else:
        _gfile().rename(src, dst, overwrite=False)


def replace(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst``, replacing a file at ``dst`` (atomically on local paths)."""
    if is_local(src):
        os.replace(_local(src), _local(dst))
    else:
        _gfile().rename(src, dst, overwrite=True)


def remove(path: str) -> None:
    """Removes a file; a missing one is fine."""
    try:
        if is_local(path):
            os.unlink(_local(path))
        elif _gfile().exists(path):
            _gfile().remove(path)
    except FileNotFoundError:
        pass


def temp_sibling(path: str) -> str:
    """A fresh temporary name beside ``path``, in the same directory (and filesystem)."""
    path = str(path).rstrip("/")
    if is_local(path):
        parent, base = os.path.split(os.path.abspath(_local(path)))
        return os.path.join(parent, f".{base}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    parent, _, base = path.rpartition("/")
    return f"{parent}/.{base}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}"


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2_exchange(a: str, b: str) -> bool:
    """Atomically exchanges two paths (Linux ``renameat2``). False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, f"renameat2 exchange failed: {os.strerror(err)}", b)


def exchange_or_rename(new: str, path: str) -> str | None:
    """Puts the directory ``new`` at ``path``.

    If ``path`` exists, the two are exchanged atomically where the platform
    allows (Linux), so a reader sees either the old or the new directory;
    elsewhere the old one is moved aside first. Returns the name now holding
    the old directory (to be removed by the caller), or None.
    """
    if not is_local(path):
        _move_files(new, path)
        return None
    if not exists(path):
        rename(new, path)
        return None
    if _renameat2_exchange(_local(new), _local(path)):
        return new
    aside = temp_sibling(path)
    rename(path, aside)
    try:
        rename(new, path)
    except BaseException:
        rename(aside, path)
        raise
    log.debug("replaced %s non-atomically (no exchange on this filesystem)", path)
    return aside


def _move_files(new: str, path: str, commit_file: str = "header.json") -> None:
    """Moves the files of ``new`` into ``path`` one by one, ``commit_file`` last.

    For object stores and other filesystems without an atomic directory rename
    (``gs://``, ``s3://``, ``ram://``): the commit point is the single write of
    ``commit_file``, which replaces the old one; files the old dataset used and
    the new one does not are removed after it. New shard names carry a per-save
    tag, so they never clash with the old dataset's files.
    """
    gfile = _gfile()
    gfile.makedirs(path)
    before = set(listdir(path))
    names = sorted(listdir(new), key=lambda n: n == commit_file)
    for name in names:
        gfile.rename(join(new, name), join(path, name), overwrite=name == commit_file)
    for name in sorted(before - set(names)):
        gfile.remove(join(path, name))
    rmtree(new)


def file_crc32c(path: str) -> str:
    """CRC-32C of a whole file, as 8 hex digits."""
    import google_crc32c

    crc = 0
    with open_file(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = google_crc32c.extend(crc, chunk)
    return f"{crc:08x}"

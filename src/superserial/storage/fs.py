"""The one filesystem layer of superserial, with TensorFlow or without.

Every reader and writer reaches files through the functions of this module
(``exists``, ``listdir``, ``size``, ``open_file``, ``read_range``,
``write_atomically``, ``replace``, ``remove``...). Each function picks a
*backend* from the path's URL scheme and from what is installed:

1. Local paths (no ``scheme://``) and ``file://`` URLs: ``os``. They get the
   strongest guarantees this platform offers (``pread``, an atomic exchange of
   the old and the new dataset directory on Linux).
2. Otherwise, if TensorFlow is already imported and registers the scheme
   (``ram://``, ``gs://``, whatever ``tf.io.gfile`` knows): ``tf.io.gfile``.
3. Else, if fsspec is installed and has an importable implementation for the
   scheme (``memory://``, ``s3://`` with s3fs, ``gs://`` with gcsfs...): fsspec.
4. Else, if TensorFlow is importable and registers the scheme once imported:
   ``tf.io.gfile``.
5. Else :class:`~superserial.errors.UnsupportedError`, naming the scheme and
   what to install.

Schemes listed in ``SUPERSERIAL_FSSPEC_SCHEMES`` (comma-separated), and
``gs://`` while ``STORAGE_EMULATOR_HOST`` is set (TensorFlow's GCS client
cannot be pointed at an emulator), always go to fsspec.

So a process that already uses TensorFlow keeps reading and writing through
TensorFlow's filesystems, and a TF-free reader never imports TensorFlow unless
only TensorFlow can reach the path. Neither TensorFlow nor fsspec is imported
when this module is. The choice is made once per scheme (and again after
TensorFlow gets imported); ``backend_name(path)`` says which one a path uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

import google_crc32c

from superserial.errors import UnsupportedError
from superserial.storage._backends import (
    Backend,
    FsspecBackend,
    GfileBackend,
    OsBackend,
    RangeReader,
    local_path,
)

__all__ = [
    "TMP_MARK",
    "Backend",
    "RangeReader",
    "backend_name",
    "basename",
    "copy_file",
    "dataset_path",
    "exchange_or_rename",
    "exists",
    "file_crc32c",
    "glob",
    "is_local",
    "isdir",
    "join",
    "link_tree",
    "listdir",
    "lists",
    "makedirs",
    "open_file",
    "open_range_reader",
    "put_if",
    "read_bytes",
    "read_range",
    "remove",
    "rename",
    "replace",
    "rmtree",
    "size",
    "temp_sibling",
    "tensorflow_reaches",
    "version",
    "write_atomically",
    "write_bytes",
]

log = logging.getLogger("superserial")

# Temporary directories of unfinished saves carry this mark in their name;
# they never look like datasets, and ``superserial.cleanup`` removes them.
TMP_MARK = ".superserial-tmp-"

# Whole-file reads (CRCs, copies) go in chunks this big: large enough that the
# per-call overhead vanishes, small enough to stay out of the way in memory.
_CHUNK = 8 << 20

# What to install for the schemes people ask about most, for when fsspec
# itself is missing and cannot tell us.
_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "hf": "huggingface_hub",
    "http": "aiohttp",
    "https": "aiohttp",
}


def is_local(path: str) -> bool:
    """True for plain local paths (no ``scheme://``) and ``file://`` URLs."""
    return "://" not in str(path) or str(path).startswith("file://")


def _scheme(path: str) -> str:
    # fsspec chains protocols ("simplecache::s3://b/k"); the outermost decides.
    return str(path).split("://", 1)[0].split("::", 1)[0]


_OS, _GFILE, _FSSPEC = OsBackend(), GfileBackend(), FsspecBackend()

# (scheme, TensorFlow imported?, fsspec preferred?) -> backend. Keyed on the import state so that
# a scheme chosen before TensorFlow was imported is looked at again after.
_CHOSEN: dict[tuple[str, bool, bool], Backend] = {}


def _tf_registers(scheme: str) -> bool:
    import tensorflow as tf

    schemes = getattr(tf.io.gfile, "get_registered_schemes", None)
    if schemes is not None:
        return scheme in schemes()
    try:  # TensorFlow before get_registered_schemes: ask and see.
        tf.io.gfile.exists(f"{scheme}://")
    except tf.errors.UnimplementedError:
        return False
    except tf.errors.OpError:
        return True  # registered, though the bare root is not a valid path
    return True


def _fsspec_status(scheme: str) -> tuple[bool, str, str]:
    """(fsspec can open ``scheme://`` here, why not, what to pip install)."""
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError as e:
        why = f"fsspec cannot be imported ({e})"
        return False, why, f"fsspec {_PACKAGES.get(scheme, '')}".strip()
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        return False, "fsspec has no implementation of it", ""
    except ImportError as e:
        known = str(known_implementations.get(scheme, {}).get("class", ""))
        pkg = known.split(".", 1)[0] if known else _PACKAGES.get(scheme, "")
        return False, f"fsspec cannot load its implementation ({e})", pkg
    return True, "", ""


def _tf_imported() -> bool:
    # A None entry means imports of TensorFlow are blocked, not that it is loaded.
    return sys.modules.get("tensorflow") is not None


# Schemes always served by fsspec, even where TensorFlow registers them
# (comma-separated), e.g. SUPERSERIAL_FSSPEC_SCHEMES=gs to use gcsfs for gs://.
FSSPEC_SCHEMES_ENV = "SUPERSERIAL_FSSPEC_SCHEMES"
_GCS_SCHEMES = ("gs", "gcs")


def _prefers_fsspec(scheme: str) -> bool:
    """Whether fsspec must serve ``scheme`` though TensorFlow may register it.

    TensorFlow's GCS client has its endpoint built in: pointed at a GCS
    emulator (``STORAGE_EMULATOR_HOST``, which gcsfs and Google's clients
    honour), it would still talk to the real service, so gcsfs serves gs:// then.
    """
    forced = {s.strip() for s in os.environ.get(FSSPEC_SCHEMES_ENV, "").split(",")}
    return scheme in forced or (
        scheme in _GCS_SCHEMES and bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    )


def _select(path: str, scheme: str, tf_imported: bool, prefer_fsspec: bool = False) -> Backend:
    if prefer_fsspec:
        ok, why, package = _fsspec_status(scheme)
        if ok:
            return _FSSPEC
        raise UnsupportedError(
            f"expected fsspec to serve {scheme}:// (for {path}), as {FSSPEC_SCHEMES_ENV} or "
            f"STORAGE_EMULATOR_HOST asks, found it cannot: {why}"
            + (f"; to use it, pip install {package}" if package else "")
        )
    if tf_imported and _tf_registers(scheme):
        return _GFILE
    ok, why, package = _fsspec_status(scheme)
    if ok:
        return _FSSPEC
    todo = [f"pip install {package}"] if package else []
    if tf_imported:
        why += "; TensorFlow does not register it"
    else:
        try:
            import tensorflow  # noqa: F401  (rule 4: only TensorFlow may reach it)
        except ImportError as e:
            why += f"; TensorFlow cannot be imported ({e})"
            todo.append("TensorFlow (pip install tensorflow), if it provides this filesystem")
        else:
            if _tf_registers(scheme):
                return _GFILE
            why += "; TensorFlow does not register it"
    advice = f"; to use it, {' or '.join(todo)}" if todo else ""
    raise UnsupportedError(
        f"expected a filesystem that handles {scheme}:// (for {path}), found none: {why}{advice}"
    )


def _backend(path: str) -> Backend:
    if is_local(path):
        return _OS
    scheme = _scheme(path)
    key = (scheme, _tf_imported(), _prefers_fsspec(scheme))
    backend = _CHOSEN.get(key)
    if backend is None:
        backend = _CHOSEN[key] = _select(str(path), scheme, key[1], key[2])
    return backend


def tensorflow_reaches(path: str) -> bool:
    """Whether TensorFlow's own file readers and writers can open ``path``.

    Not so where fsspec serves it (``s3://`` in TensorFlow 2.21): TFRecord
    files there are written and read through this module instead.
    """
    return _backend(path) is not _FSSPEC


def backend_name(path: str) -> str:
    """Which backend serves ``path``: ``"os"``, ``"gfile"`` or ``"fsspec"``.

    Raises:
        UnsupportedError: Nothing installed can reach ``path``.
    """
    return _backend(path).name


# ------------------------------------------------------------------ operations


def basename(path: str) -> str:
    """The last part of a path or URL (a shard's name as the header lists it), either slash."""
    return path.replace("\\", "/").rpartition("/")[2]


def join(*parts: str) -> str:
    """Joins path parts; URLs keep their ``/``."""
    if is_local(parts[0]):
        return os.path.join(*parts)
    return "/".join([parts[0].rstrip("/"), *(p.strip("/") for p in parts[1:])])


def exists(path: str) -> bool:
    """True if ``path`` exists (a dangling local symlink counts)."""
    return _backend(path).exists(path)


def isdir(path: str) -> bool:
    """True if ``path`` is a directory."""
    return _backend(path).isdir(path)


def listdir(path: str) -> list[str]:
    """Names (not paths) in a directory.

    Raises:
        UnsupportedError: The filesystem cannot list (``http(s)://``): see :func:`lists`.
    """
    return _backend(path).listdir(path)


def lists(path: str) -> bool:
    """Whether :func:`listdir` can tell what the directory ``path`` holds.

    Not on ``http(s)://``: a web server answers a directory with a page (or a
    403), not a listing. Readers then go by the files the header names.
    """
    return _backend(path).lists(path)


def makedirs(path: str) -> None:
    """Creates a directory and its parents; an existing one is fine."""
    _backend(path).makedirs(path)


def size(path: str) -> int:
    """Size of a file in bytes."""
    return _backend(path).size(path)


def glob(pattern: str) -> list[str]:
    """The paths matching a glob pattern, sorted, in the pattern's scheme."""
    return _backend(pattern).glob(pattern)


def open_file(path: str, mode: str = "rb", buffering: int = -1) -> Any:
    """Opens a file for binary reading or writing (``"rb"``, ``"wb"``).

    ``buffering`` is the buffer size of local files (as for ``open``) and the
    block size of fsspec reads (the bytes one request fetches); ``tf.io.gfile``
    buffers as it sees fit.
    """
    return _backend(path).open(path, mode, buffering)


def open_range_reader(path: str) -> RangeReader:
    """Opens a file for many :meth:`RangeReader.read` calls (``pread`` locally).

    Use it where one file is read at many offsets; it holds the file open (a
    descriptor, a ``GFile``, or an fsspec filesystem) until closed. There is no
    process-wide cache of open files: an overwritten dataset swaps in new files
    under the same names, and a cached descriptor would then read the old ones.
    """
    return _backend(path).range_reader(path)


def read_range(path: str, offset: int, length: int) -> bytes:
    """The ``length`` bytes of a file at ``offset``.

    Locally an ``os.pread``; on fsspec one byte-range request; on
    ``tf.io.gfile`` a seek and a read.

    Raises:
        ValueError: ``offset`` or ``length`` is negative.
        CorruptDataError: The file ends before ``offset + length``; a short
            read is never returned, since the caller would misparse it.
    """
    with open_range_reader(path) as reader:
        return reader.read(offset, length)


def read_bytes(path: str, limit: int | None = None) -> bytes:
    """The contents of a file, or only its first ``limit`` bytes."""
    return _backend(path).read_bytes(path, limit)


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path``, replacing it (not atomically: see :func:`write_atomically`)."""
    with open_file(path, "wb") as f:
        f.write(data)


def write_atomically(path: str, data: bytes | str) -> None:
    """Writes ``data`` (``str`` as UTF-8) to a temporary file beside ``path``, then
    replaces ``path`` with it.

    Readers see the old file or the new one, never a partial one: atomically
    on local paths (``os.replace``) and on filesystems whose rename is a single
    object write. A failed write removes its temporary file.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = f"{str(path).rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        write_bytes(tmp, data)
        replace(tmp, path)
    except BaseException:
        remove(tmp)
        raise


def version(path: str) -> str | None:
    """A token of a file's current contents (its ETag on S3) for :func:`put_if`; None if missing.

    Raises:
        UnsupportedError: The filesystem has no conditional writes (only S3 has, for now).
    """
    return _backend(path).version(path)


def put_if(path: str, data: bytes, version: str | None) -> bool:
    """Writes ``data`` to ``path`` in one request if the file is still at ``version``.

    ``version`` None means: only if no file is there (S3's ``If-None-Match: *``);
    otherwise only if its contents are still those :func:`version` named
    (``If-Match``). Two writers racing never both succeed.

    Returns:
        False if the condition did not hold; nothing was written then.

    Raises:
        UnsupportedError: The filesystem has no conditional writes.
    """
    return _backend(path).put_if(path, data, version)


def file_crc32c(path: str, on_chunk: Callable[[int], None] | None = None) -> str:
    """CRC-32C of a whole file, as 8 lowercase hex digits (read in 8 MiB chunks).

    Args:
        path: The file.
        on_chunk: Called with the size of each chunk read (for progress bars).
    """
    crc = 0
    with open_file(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = google_crc32c.extend(crc, chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return f"{crc:08x}"


def copy_file(src: str, dst: str) -> tuple[int, str]:
    """Copies ``src`` to ``dst`` (any two filesystems) in 8 MiB chunks.

    Returns:
        The number of bytes copied and their CRC-32C as 8 lowercase hex digits.
    """
    crc, n = 0, 0
    with open_file(src, "rb") as fin, open_file(dst, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            crc = google_crc32c.extend(crc, chunk)
            n += len(chunk)
            fout.write(chunk)
    return n, f"{crc:08x}"


def link_tree(src: str, dst: str, *, skip: frozenset[str] = frozenset()) -> None:
    """Makes every entry of the local directory ``src`` appear in ``dst`` (which exists).

    Files get hard links (the same inode: same bytes, same mtime, nothing
    copied), or a copy with its metadata where the filesystem refuses links;
    symbolic links are linked as links, never followed; directories are
    made anew and filled the same way. ``src`` is not changed.

    Args:
        src: The directory whose entries to link.
        dst: The directory to link them into; a name already there is an error.
        skip: Names at the top of ``src`` to leave out.

    Raises:
        UnsupportedError: ``src`` or ``dst`` is not a local path.
        FileExistsError: An entry of ``src`` already exists in ``dst``.
    """
    if not (is_local(src) and is_local(dst)):
        raise UnsupportedError(f"expected local directories to link, got {src} and {dst}")
    import shutil

    with os.scandir(local_path(src)) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name in skip:
                continue
            target = os.path.join(local_path(dst), entry.name)
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(target)
                link_tree(entry.path, target)
                continue
            try:
                os.link(entry.path, target, follow_symlinks=False)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EMLINK, errno.EXDEV, errno.ENOTSUP):
                    raise
                shutil.copy2(entry.path, target, follow_symlinks=False)


def _same_backend(src: str, dst: str) -> Backend:
    backend = _backend(src)
    if _backend(dst) is not backend:
        raise UnsupportedError(
            f"expected {src} and {dst} on one filesystem, got {backend.name} "
            f"and {_backend(dst).name}"
        )
    return backend


def rmtree(path: str) -> None:
    """Removes a directory tree; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        _backend(path).rmtree(path)


def rename(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst``; fails if ``dst`` exists (locally: as a non-empty dir)."""
    _same_backend(src, dst).rename(src, dst, overwrite=False)


def replace(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst``, replacing a file at ``dst`` (atomically on local paths)."""
    _same_backend(src, dst).rename(src, dst, overwrite=True)


def remove(path: str) -> None:
    """Removes a file; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        _backend(path).remove(path)


def dataset_path(path: Any) -> str:
    """The one spelling of a dataset path a writer or reader was given: no trailing slash.

    ``"/data/ds/"`` and ``"/data/ds"`` name one dataset (and one lock, one
    work directory); the root stays ``"/"``.
    """
    return str(path).rstrip("/") or "/"


def temp_sibling(path: str) -> str:
    """A fresh temporary name beside ``path``, in the same directory (and filesystem)."""
    path = str(path).rstrip("/")
    if is_local(path):
        parent, base = os.path.split(os.path.abspath(local_path(path)))
        return os.path.join(parent, f".{base}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    parent, _, base = path.rpartition("/")
    return f"{parent}/.{base}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------------------ directory swap

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


def exchange_or_rename(new: str, path: str, *, commit_file: str) -> str | None:
    """Puts the directory ``new`` at ``path``.

    If ``path`` exists, the two are exchanged atomically where the platform
    allows (Linux), so a reader sees either the old or the new directory;
    elsewhere the old one is moved aside first. Where directories cannot be
    renamed (object stores), files move one by one and ``commit_file`` (the
    file whose presence makes ``path`` valid) last. Returns the name now
    holding the old directory (to be removed by the caller), or None.
    """
    if not is_local(path):
        _move_files(new, path, commit_file)
        return None
    if not exists(path):
        rename(new, path)
        return None
    if _renameat2_exchange(local_path(new), local_path(path)):
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


def _move_files(new: str, path: str, commit_file: str) -> None:
    """Moves the files of ``new`` into ``path`` one by one, ``commit_file`` last.

    For object stores and other filesystems without an atomic directory rename
    (``gs://``, ``s3://``, ``ram://``, ``memory://``): the commit point is the
    single write of ``commit_file``, which replaces the old one; files the old
    dataset used and the new one does not are removed after it. New shard
    names carry a per-save tag, so they never clash with the old dataset's files.
    """
    backend = _same_backend(new, path)
    backend.makedirs(path)
    # An object store has no empty directories: nothing there yet lists as nothing.
    before = set(backend.listdir(path)) if backend.isdir(path) else set()
    names = sorted(backend.listdir(new), key=lambda n: n == commit_file)
    for name in names:
        backend.rename(join(new, name), join(path, name), overwrite=name == commit_file)
    for name in sorted(before - set(names)):
        backend.remove(join(path, name))
    rmtree(new)

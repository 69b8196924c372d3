"""How ``save`` commits a dataset safely: a lock, a resumable work directory, cleanup.

For a local ``path``, every save:

1. takes an exclusive advisory lock (``fcntl.flock``) on the sibling file
   ``.NAME.superserial-lock``, so two saves to one path never interleave;
   the second fails at once with :class:`~superserial.errors.DatasetLockedError`;
2. writes into the sibling work directory ``.NAME.superserial-partial``:
   each shard is written as ``data-NNNNN.part.tfrecord``, renamed to
   ``data-NNNNN.tfrecord`` once closed, and then recorded (records, bytes,
   CRC-32C) in ``progress.json`` together with the dataset's fingerprint
   (element structure, compression, sharding, cardinality);
3. at the end (:func:`commit_dataset`) renames the shards to their final
   names, removes ``progress.json``, writes ``header.json`` last, and renames
   (or atomically exchanges) the work directory into place.

``save`` and ``superserial infer`` both commit this way.

A save that is killed leaves at most the work directory, which ``load``
never reads. ``save(..., resume=True)`` continues from its last complete
shard; :func:`cleanup` removes it. Remote paths (``gs://``...) get no lock:
their work directory is a unique temporary name unless ``resume=True``.

This module does not import TensorFlow.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from superserial.base.processes import pid_alive
from superserial.errors import DatasetLockedError, HeaderError, ResumeError
from superserial.format.header import Header, Shard
from superserial.format.layout import (
    HEADER_FILE,
    LOCK_SUFFIX,
    MANIFEST_FILE,
    PARTIAL_SUFFIX,
    PROGRESS_FILE,
    STAGING_DIR,
    attempt_lock_name,
    attempt_of,
    check_target,
    done_shard_name,
    move_shard,
    new_save_tag,
    part_index,
    shard_name,
    sibling,
)
from superserial.storage import fs
from superserial.write.parts import read_part

__all__ = [
    "ProgressFile",
    "SaveLock",
    "cleanup",
    "commit_dataset",
    "lock_file",
    "name_shards",
    "prepare_work_dir",
    "release_file",
]

log = logging.getLogger("superserial")


def lock_file(lock_path: str, *, create: bool = False) -> int | None:
    """Takes an exclusive advisory lock (``flock``) on ``lock_path``, without waiting.

    Like :class:`SaveLock`, the lock counts only while the file at
    ``lock_path`` is the one locked: a holder that is done removes the file
    (:func:`release_file`), so a locker that opened it just before must not
    believe it holds it.

    Args:
        lock_path: A local file.
        create: Create the file if it is missing.

    Returns:
        The open, locked file descriptor; None if another process holds the
        lock, or the file (or, with ``create``, its directory) is gone.
    """
    import fcntl

    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(lock_path, flags, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
    except (BlockingIOError, FileNotFoundError):
        same = False
    except BaseException:
        os.close(fd)
        raise
    if not same:
        os.close(fd)
        return None
    return fd


def release_file(lock_path: str, fd: int) -> None:
    """Removes the lock file taken by :func:`lock_file`, then releases the lock."""
    try:
        os.unlink(lock_path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


class SaveLock:
    """An exclusive, non-blocking advisory lock on the sibling ``.NAME.superserial-lock``.

    Only for local paths (a no-op for others). The lock file is removed on
    release; acquiring checks that the locked file is still the one at the
    lock path, so removal never lets two holders in at once.
    """

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self.lock_path = sibling(path, LOCK_SUFFIX)
        self.fd: int | None = None

    def acquire(self) -> SaveLock:
        """Takes the lock.

        Raises:
            DatasetLockedError: Another process holds it.
        """
        if not fs.is_local(self.path):
            return self
        import fcntl

        os.makedirs(os.path.dirname(self.lock_path), exist_ok=True)
        for _ in range(100):
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DatasetLockedError(
                    f"expected no other save to {self.path} in progress, got one holding "
                    f"the lock {self.lock_path}"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                try:
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()}\n".encode())
                except OSError:  # a full disk must not stop a lock; the pid is informational
                    pass
                return self
            os.close(fd)  # the holder removed the file as we opened it: retry
        raise DatasetLockedError(f"expected to lock {self.lock_path}, got contention 100 times")

    def release(self) -> None:
        """Removes the lock file and releases the lock."""
        if self.fd is None:
            return
        try:
            os.unlink(self.lock_path)
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> SaveLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class ProgressFile:
    """``progress.json``: the fingerprint of a save and its completed shards.

    Attributes:
        fingerprint: What must match for a resume: element structure,
            compression, sharding and cardinality.
        shards: Completed shards, in order, under their intermediate names
            (``data-NNNNN.tfrecord``).
    """

    fingerprint: dict[str, Any]
    shards: list[Shard] = field(default_factory=list)

    @property
    def records(self) -> int:
        """Elements in the completed shards."""
        return sum(s.records for s in self.shards)

    def to_json(self) -> str:
        """``progress.json`` as JSON text."""
        return json.dumps(
            {
                "fingerprint": self.fingerprint,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "shards": [s.to_obj() for s in self.shards],
            },
            sort_keys=True,
        )

    def write(self, work: str) -> None:
        """Replaces ``progress.json`` in ``work`` atomically (write, then rename)."""
        fs.write_atomically(fs.join(work, PROGRESS_FILE), self.to_json())

    def complete(self, work: str, index: int, path: str, shard: Shard) -> Shard:
        """A shard writer's close hook: names shard ``index`` complete and records it.

        Renames the closed file at ``path`` to its completed name in ``work``
        and rewrites ``progress.json``, so that a resumed save continues after it.
        """
        del path  # the shard writer writes in ``work``: the shard is ``work/shard.file``
        done = move_shard(shard, work, work, done_shard_name(index))
        self.shards.append(done)
        self.write(work)
        return done

    @classmethod
    def read(cls, work: str) -> ProgressFile | None:
        """The ``progress.json`` in ``work``, or None if it is missing or unreadable."""
        p = fs.join(work, PROGRESS_FILE)
        if not fs.exists(p):
            return None
        try:
            with fs.open_file(p, "rb") as f:
                obj = json.loads(f.read(64 << 20))
            shards = []
            for i, s in enumerate(obj["shards"]):
                if s["file"] != done_shard_name(i):
                    raise ValueError(f"expected {done_shard_name(i)}, got {s['file']!r}")
                shards.append(Shard.from_obj(s, source=p))
            if not isinstance(obj["fingerprint"], dict):
                raise ValueError("expected an object as fingerprint")
            return cls(obj["fingerprint"], shards)
        except (ValueError, KeyError, TypeError, HeaderError) as e:
            log.warning("ignoring unreadable %s: %s", p, e)
            return None


def _diff(want: dict[str, Any], got: dict[str, Any]) -> str:
    keys = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    return ", ".join(f"{k}: expected {want.get(k)!r}, got {got.get(k)!r}" for k in keys)


def _valid_prefix(work: str, progress: ProgressFile, crc: Callable[[str], str]) -> list[Shard]:
    """The leading shards of ``progress`` whose files are intact in ``work``."""
    good: list[Shard] = []
    for s in progress.shards:
        for name, size, want in s.files():
            p = fs.join(work, name)
            if not fs.exists(p) or fs.size(p) != size or crc(p) != want:
                log.warning("resume: %s is missing or damaged; rewriting from there", p)
                return good
        good.append(s)
    return good


def prepare_work_dir(
    path: str, fingerprint: dict[str, Any], *, resume: bool, crc: Callable[[str], str]
) -> tuple[str, ProgressFile]:
    """Creates (or, with ``resume``, reopens) the work directory of a save to ``path``.

    Call with the :class:`SaveLock` of ``path`` held.

    Args:
        path: The dataset path being saved.
        fingerprint: JSON-able description of the save; a resume needs an
            exact match.
        resume: Continue an interrupted save found in the work directory.
        crc: ``crc(file) -> 8 hex digits`` to check completed shards.

    Returns:
        The work directory and its ``progress.json`` (with the completed shards kept).

    Raises:
        ResumeError: ``resume`` and the interrupted save was of another
            dataset or used other options.
    """
    if not fs.is_local(path) and not resume:
        work = fs.temp_sibling(path)
        fs.makedirs(work)
        return work, ProgressFile(fingerprint)
    work = sibling(path, PARTIAL_SUFFIX)
    progress = ProgressFile(fingerprint)
    if fs.exists(work):
        old = ProgressFile.read(work) if resume and fs.isdir(work) else None
        if old is not None and old.fingerprint != fingerprint:
            raise ResumeError(
                f"expected the interrupted save in {work} to be of the same dataset and options, "
                f"got a difference: {_diff(old.fingerprint, fingerprint)}; save without resume=True "
                f"to start over, or call superserial.cleanup({path!r})"
            )
        if old is None:
            left = None if resume else ProgressFile.read(work) if fs.isdir(work) else None
            if resume:
                log.info("resume: nothing resumable in %s; starting over", work)
            elif left is not None and left.shards:
                log.warning(
                    "discarding the %d complete shard(s) of an interrupted save in %s; "
                    "resume=True would have continued it",
                    len(left.shards),
                    work,
                )
            else:
                log.info("removing the leftover of an interrupted save: %s", work)
            fs.rmtree(work) if fs.isdir(work) else fs.remove(work)
        else:
            progress.shards = _valid_prefix(work, old, crc)
            keep = {f[0] for s in progress.shards for f in s.files()} | {PROGRESS_FILE}
            for name in fs.listdir(work):
                if name not in keep:
                    p = fs.join(work, name)
                    fs.rmtree(p) if fs.isdir(p) else fs.remove(p)
            log.info(
                "resuming the save to %s after %d complete shard(s), %d elements",
                path,
                len(progress.shards),
                progress.records,
            )
    fs.makedirs(work)
    progress.write(work)
    return work, progress


def name_shards(
    work: str, shards: Sequence[Shard], taken: set[str], *, plain: bool = False
) -> tuple[Shard, ...]:
    """Gives a save's completed shards in ``work`` their final names.

    Final names carry a tag unique to this save, never one of ``taken`` (the
    files of the dataset being replaced), so that a reader still reading the
    old dataset by name never opens a file of the new one (and a filesystem
    without directory renames never overwrites an old file before the
    header). With ``plain``, the names are untagged (``data-NNNNN-of-NNNNN``)
    unless one of them is taken.
    """

    def names_of(tag: str | None) -> list[str]:
        return [shard_name(i, len(shards), tag) for i in range(len(shards))]

    names = names_of(None) if plain else None
    while names is None or taken.intersection(names):
        names = names_of(new_save_tag())
    return tuple(move_shard(s, work, work, name) for s, name in zip(shards, names, strict=True))


def commit_dataset(
    path: str,
    work: str,
    shards: Sequence[Shard],
    make_header: Callable[[tuple[Shard, ...]], Header],
    *,
    overwrite: bool,
    hint: str = "overwrite=True",
    plain_names: bool = False,
) -> Header:
    """Makes the finished work directory ``work`` the dataset at ``path``.

    Call with the :class:`SaveLock` of ``path`` held, once every shard in
    ``work`` is closed. Names the shards (:func:`name_shards`), removes
    ``progress.json``, writes ``header.json`` last, checks ``path`` again
    (something may have appeared there meanwhile), renames or exchanges
    ``work`` into place and removes the dataset it replaced. On an error,
    ``work`` is left for the caller to remove (or keep, to resume).

    Args:
        path: The dataset path.
        work: The work directory holding the shards.
        shards: The closed shards, in order, under their names in ``work``.
        make_header: Builds the header from the shards under their final names.
        overwrite: Whether an existing dataset at ``path`` may be replaced.
        hint: How the caller's user asks for overwriting, for the message.
        plain_names: Untagged shard names where they clash with nothing.

    Returns:
        The header written.

    Raises:
        DatasetExistsError: ``path`` may not be replaced.
    """
    taken = set(fs.listdir(path)) if fs.isdir(path) else set()
    header = make_header(name_shards(work, shards, taken, plain=plain_names))
    progress = fs.join(work, PROGRESS_FILE)
    if fs.exists(progress):
        fs.remove(progress)
    fs.write_bytes(fs.join(work, HEADER_FILE), header.to_json().encode("utf-8"))
    check_target(path, overwrite, hint=hint)
    old = fs.exchange_or_rename(work, path, commit_file=HEADER_FILE)
    if old is not None:
        fs.rmtree(old)
    return header


def _writer_alive(tmp_suffix: str) -> bool:
    """Whether the process that made a temporary name (``PID-HEX`` after the mark) still runs."""
    m = re.match(r"(\d+)-", tmp_suffix)
    pid = int(m.group(1)) if m else None
    return pid is not None and (pid == os.getpid() or pid_alive(pid))


def _remove(full: str, removed: list[str]) -> None:
    log.info("cleanup: removing %s", full)
    fs.rmtree(full) if os.path.isdir(full) and not os.path.islink(full) else os.unlink(full)
    removed.append(full)


def _committed_attempt(pdir: str) -> str | None:
    """The attempt a part's manifest names; None if it has no manifest.

    Raises:
        HeaderError: The manifest is unreadable (:func:`~superserial.write.parts.read_part`).
    """
    if not fs.exists(fs.join(pdir, MANIFEST_FILE)):
        return None
    return read_part(pdir).attempt


def _rmdir_empty(dirs: list[str]) -> list[str]:
    """Removes each directory in turn while it is empty; returns those removed."""
    removed = []
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:  # not empty (a writer started meanwhile), or gone
            break
        removed.append(d)
    return removed


def _clean_staging(path: str) -> list[str]:
    """Removes the staging attempts of ``path`` that no live writer holds, and no manifest names.

    A writer holds the lock ``attempt-ID.lock`` beside its attempt
    directory from start to commit or abort, and commits by writing the
    part's manifest before releasing the lock; so an attempt found unlocked,
    and not named by the manifest read after that, is abandoned for good.
    Committed parts are kept: they wait for ``finalize``. Parts, and the
    staging directory, left empty are removed too.
    """
    staging = os.path.join(path, STAGING_DIR)
    removed: list[str] = []
    try:
        parts = sorted(n for n in os.listdir(staging) if part_index(n) is not None)
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for part in parts:
        pdir = os.path.join(staging, part)
        try:
            names = os.listdir(pdir)
        except (FileNotFoundError, NotADirectoryError):
            continue
        attempts = sorted({a for a in map(attempt_of, names) if a is not None})
        for attempt in attempts:
            lpath = os.path.join(pdir, attempt_lock_name(attempt))
            fd = lock_file(lpath)
            if fd is None and os.path.exists(lpath):
                continue  # a live writer's
            try:
                # Read after taking the lock: a writer commits before releasing it.
                try:
                    committed = _committed_attempt(pdir)
                except (OSError, HeaderError) as e:
                    log.warning("cleanup: keeping %s: unreadable manifest (%s)", pdir, e)
                    break
                if attempt == committed:
                    continue
                adir = os.path.join(pdir, attempt)
                if os.path.isdir(adir) and not os.path.islink(adir):
                    log.info("cleanup: removing %s, an abandoned attempt", adir)
                    fs.rmtree(adir)
                    removed.append(adir)
            finally:
                if fd is not None:
                    release_file(lpath, fd)
        removed.extend(_rmdir_empty([pdir]))
    removed.extend(_rmdir_empty([staging]))
    return removed


def cleanup(path: str) -> list[str]:
    """Removes what interrupted saves and writers left at and beside ``path`` (a local path).

    Removes the temporary siblings ``.NAME.superserial-tmp-PID-*`` whose
    process is no longer alive, and, when no save to ``path`` is running,
    the resumable work directory ``.NAME.superserial-partial`` (so a later
    ``save(..., resume=True)`` starts over) and a stale lock file. Inside
    ``path``, removes the staging attempts of :class:`superserial.Writer`
    that no live writer holds and no part manifest names (what a killed or
    failed writer left); committed parts are kept for ``finalize``, and
    ``path`` is removed if that leaves it empty. A finalized dataset is never
    touched. Safe to call at any time.

    Args:
        path: The dataset path whose leftovers to remove.

    Returns:
        The paths removed.

    Raises:
        ValueError: ``path`` is not a local path.
    """
    path = str(path).rstrip("/")
    if not fs.is_local(path):
        raise ValueError(f"expected a local path, got {path!r}")
    parent, base = os.path.split(os.path.abspath(path.removeprefix("file://")))
    removed: list[str] = []
    lock: SaveLock | None
    try:
        lock = SaveLock(path).acquire()
    except DatasetLockedError:
        lock = None  # a save is running: leave its work directory alone
    try:
        prefix = f".{base}{fs.TMP_MARK}"
        names = os.listdir(parent) if os.path.isdir(parent) else []
        for name in sorted(names):
            full = os.path.join(parent, name)
            if name.startswith(prefix):
                if _writer_alive(name[len(prefix) :]):
                    continue
            elif not (lock is not None and name == f".{base}{PARTIAL_SUFFIX}"):
                continue
            _remove(full, removed)
        local = os.path.join(parent, base)
        if lock is not None and os.path.isdir(local):
            # Temporary files inside the dataset (an index or header being
            # replaced by a process that died before its rename).
            for name in sorted(os.listdir(local)):
                head, mark, rest = name.partition(fs.TMP_MARK)
                if mark and head.startswith(".") and not _writer_alive(rest):
                    _remove(os.path.join(local, name), removed)
    finally:
        if lock is not None:
            lock.release()  # removes the lock file
    local = os.path.abspath(path.removeprefix("file://"))
    if os.path.isdir(os.path.join(local, STAGING_DIR)):
        removed.extend(_clean_staging(local))
        removed.extend(_rmdir_empty([local]))
    return removed

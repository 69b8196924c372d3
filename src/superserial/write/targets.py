"""The one commit interface: where a write's shards go, and how they become a dataset.

Every writer hands its shards to a :class:`Target` and goes through the one
write loop (:mod:`superserial.write.loop`): the target makes the
:class:`~superserial.write.shard_writer.ShardWriter` (which directory, which
names while writing, what happens as each shard closes), then either
commits the closed shards or aborts. One implementation per kind of write:

==========================  ==================================================  ======================
target                      where the shards are written; the commit point      used by
==========================  ==================================================  ======================
:class:`WorkDirTarget`      a work directory beside ``path`` (resumable);        ``save``, ``infer``,
                            ``header.json``, then a rename or exchange of the    ``upgrade``,
                            directory (:mod:`~superserial.write.local_commit`)   ``convert``
:class:`InPlaceTarget`      object stores: in place under per-save tagged        the same, on ``s3://``,
                            names; one put of ``header.json``                    ``gs://``...
                            (:mod:`~superserial.write.store_commit`)
:class:`AppendTarget`       a work directory; the old files linked beside the    ``append``
                            new ones and exchanged (local), or the new shards
                            moved in and the header put (object stores)
:class:`PartTarget`         a part's attempt directory in ``.staging``; the      ``Writer``,
                            part's ``manifest.json``                             ``save(shard_index=)``
:class:`StagedShardTarget`  one staged file of a Beam run; none (the run's        Beam's workers
                            commit, ``parts.assemble``, comes later)
==========================  ==================================================  ======================

:func:`open_target` is the one place that picks a work directory or a write
in place by the storage kind; the one commit of shards
staged by many writers (``finalize`` and Beam's last step) is
:func:`superserial.write.parts.assemble`.
"""

from __future__ import annotations

import abc
import errno
import functools
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from superserial.errors import CorruptDataError
from superserial.format import layout
from superserial.format.header import Header, Shard
from superserial.storage import fs
from superserial.write import local_commit, store_commit
from superserial.write.parts import MakeHeader, Part
from superserial.write.shard_writer import DEFAULT_SHARD_SIZE, OnClose, ShardWriter

__all__ = [
    "AppendTarget",
    "InPlaceTarget",
    "PartTarget",
    "StagedShardTarget",
    "Target",
    "WorkDirTarget",
    "open_target",
]

log = logging.getLogger("superserial")

R = TypeVar("R")


class Target(abc.ABC, Generic[R]):
    """Where one write's shards go and how they are committed (see the module doc).

    Attributes:
        path: The dataset path written to.
        directory: Where the shard files are written.
        done: Shards completed by an earlier, interrupted write that this one
            resumes; writing continues with shard ``len(done)``.
    """

    path: str
    directory: str
    done: Sequence[Shard] = ()

    @abc.abstractmethod
    def shard_name(self, index: int) -> str:
        """The name of shard ``index`` while it is written."""

    def on_close(self) -> OnClose | None:
        """The shard writer's hook as each shard closes (None: the shard keeps its name)."""
        return None

    def shard_writer(
        self,
        *,
        compression: str | None,
        quotas: list[int] | None = None,
        shard_size: int | None = None,
    ) -> ShardWriter:
        """The shard writer of this write.

        Args:
            compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
            quotas: Records per shard, or None to split by ``shard_size``.
            shard_size: Bytes per shard without quotas (None: the default, 128 MiB).
        """
        return ShardWriter(
            self.directory,
            name=self.shard_name,
            compression=compression,
            quotas=quotas,
            shard_size=shard_size or DEFAULT_SHARD_SIZE,
            on_close=self.on_close(),
            done=self.done,
        )

    @abc.abstractmethod
    def commit(self, shards: list[Shard]) -> R:
        """Makes the closed ``shards`` (in order) part of the dataset; returns what was committed.

        On an error nothing was committed; the caller then calls :meth:`abort`.
        """

    @abc.abstractmethod
    def abort(self, shards: Sequence[Shard]) -> None:
        """Removes what this write left (``shards``: those closed so far), or keeps it to resume."""


class WorkDirTarget(Target[Header]):
    """A save into a work directory beside ``path``, committed by a rename or an exchange.

    Call with the :class:`~superserial.write.local_commit.SaveLock` of ``path`` held.
    Each closed shard is renamed complete and recorded in ``progress.json``,
    so that a ``resume`` continues after it; at the commit the shards get
    their final names, ``header.json`` is written last and the directory
    replaces ``path`` (:func:`~superserial.write.local_commit.commit_dataset`).

    Args:
        path: The dataset path.
        make_header: Builds the header from the shards under their final names.
        fingerprint: What a resume must match (see :func:`local_commit.prepare_work_dir`).
        resume: Reopen an interrupted write's work directory and keep its
            complete shards.
        overwrite: Whether a dataset at ``path`` may be replaced.
        hint: How the caller's user asks for overwriting, for messages.
        plain_names: Untagged final shard names where they clash with nothing.
        resumable: Whether the caller can resume; if so, a write that fails or
            is interrupted keeps its complete shards for ``resume=True``
            (see :meth:`abort`).
    """

    def __init__(
        self,
        path: str,
        make_header: MakeHeader,
        *,
        fingerprint: dict[str, Any],
        resume: bool = False,
        overwrite: bool = False,
        hint: str = "overwrite=True",
        plain_names: bool = False,
        resumable: bool = True,
    ) -> None:
        self.path, self.make_header = path, make_header
        self.resume, self.overwrite, self.hint, self.plain_names = (
            resume,
            overwrite,
            hint,
            plain_names,
        )
        # Only the sibling work directory outlives the process: a remote save
        # without resume works in a uniquely named temporary one.
        self.resumable = resumable and (resume or fs.is_local(path))
        self.directory, self.progress = local_commit.prepare_work_dir(
            path, fingerprint, resume=resume, crc=fs.file_crc32c
        )
        self.done = self.progress.shards

    def shard_name(self, index: int) -> str:
        return layout.open_shard_name(index)

    def on_close(self) -> OnClose:
        return functools.partial(self.progress.complete, self.directory)

    def commit(self, shards: list[Shard]) -> Header:
        return local_commit.commit_dataset(
            self.path,
            self.directory,
            shards,
            self.make_header,
            overwrite=self.overwrite,
            hint=self.hint,
            plain_names=self.plain_names,
        )

    def abort(self, shards: Sequence[Shard]) -> None:
        """Keeps the complete shards for a resume, or removes the work directory.

        An interrupted or failed write loses no finished work: its complete
        shards stay in the work directory (which no reader takes for a
        dataset) for ``resume=True``, unless there are none, the caller cannot
        resume, or the disk is full (keeping them would keep it full).
        """
        del shards  # all of them are in the work directory
        error = sys.exception()
        full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
        done = self.progress.shards
        if self.resumable and done and not (full and not self.resume):
            kept = (
                f"superserial: the write to {self.path} stopped after {len(done)} complete "
                f"shard(s), {self.progress.records:,} element(s); they are kept in "
                f"{self.directory}: run it again with resume=True (--resume on the command "
                f"line) to continue, or superserial.cleanup({self.path!r}) to remove them"
            )
            log.warning("%s", kept)
            if error is not None:  # the library logs nowhere by default: the traceback tells
                error.add_note(kept)
        else:
            fs.rmtree(self.directory)


class InPlaceTarget(Target[Header]):
    """A save on an object store: shards in place under tagged names, the header put last.

    See :mod:`superserial.write.store_commit`: no renames (each is a copy of
    every byte there), and no name of the current dataset is reused.

    Args:
        path: The dataset path (an object store).
        make_header: Builds the header from the shards.
        count: The number of shards, if known ahead (it is part of the names).
        overwrite: Whether a dataset at ``path`` may be replaced.
        hint: How the caller's user asks for overwriting, for messages.
    """

    def __init__(
        self,
        path: str,
        make_header: MakeHeader,
        *,
        count: int | None,
        overwrite: bool = False,
        hint: str = "overwrite=True",
    ) -> None:
        self.path = self.directory = path
        self.make_header, self.overwrite, self.hint = make_header, overwrite, hint
        self._name = store_commit.start_in_place(path, count)

    def shard_name(self, index: int) -> str:
        return self._name(index)

    def commit(self, shards: list[Shard]) -> Header:
        return store_commit.commit_in_place(
            self.path, shards, self.make_header, overwrite=self.overwrite, hint=self.hint
        )

    def abort(self, shards: Sequence[Shard]) -> None:
        store_commit.remove_shards(self.path, shards)


def open_target(
    path: str,
    make_header: MakeHeader,
    *,
    fingerprint: dict[str, Any],
    count: int | None,
    resume: bool = False,
    overwrite: bool = False,
    hint: str = "overwrite=True",
    plain_names: bool = False,
    resumable: bool = True,
) -> WorkDirTarget | InPlaceTarget:
    """The target of a new dataset at ``path``, by its storage kind.

    Object stores without ``resume`` write in place
    (:func:`~superserial.write.store_commit.writes_in_place`); everything else,
    and a resumable write anywhere (its work must outlive the process), goes
    through a work directory. Call with the ``SaveLock`` of ``path`` held.

    Args:
        path: The dataset path.
        make_header: Builds the header of the committed shards.
        fingerprint: What a resume must match.
        count: The number of shards if known ahead (None: split by size).
        resume: Continue an interrupted write.
        overwrite: Whether a dataset at ``path`` may be replaced.
        hint: How the caller's user asks for overwriting, for messages.
        plain_names: Untagged final names in a work directory where possible.
        resumable: Whether the caller can resume (see :class:`WorkDirTarget`).
    """
    if store_commit.writes_in_place(path, resume=resume):
        return InPlaceTarget(path, make_header, count=count, overwrite=overwrite, hint=hint)
    return WorkDirTarget(
        path,
        make_header,
        fingerprint=fingerprint,
        resume=resume,
        overwrite=overwrite,
        hint=hint,
        plain_names=plain_names,
        resumable=resumable,
    )


class AppendTarget(WorkDirTarget):
    """New shards after those of the dataset ``base`` at ``path``, never changing its files.

    The shards are written (resumably) in a work directory. At the commit they
    get names no file at ``path`` has; locally the old files are hard-linked
    beside them with the new header and the directory is exchanged with
    ``path``; on an object store the new shards are moved in and the header,
    put last, commits. An empty append commits nothing and returns ``base``.

    Args:
        path: The dataset path (resolved: not a symlink).
        base: The header of the dataset being appended to, read under the lock.
        fingerprint: What a resume must match.
        resume: Continue an interrupted append.
    """

    def __init__(
        self, path: str, base: Header, *, fingerprint: dict[str, Any], resume: bool = False
    ) -> None:
        super().__init__(path, self._header, fingerprint=fingerprint, resume=resume)
        self.base = base

    def _header(self, named: tuple[Shard, ...]) -> Header:
        base = self.base
        return base.with_shards(base.shards + named)

    def commit(self, shards: list[Shard]) -> Header:
        path, work = self.path, self.directory
        if not any(s.records for s in shards):
            fs.rmtree(work)
            log.info("append: no elements to add to %s; nothing changed", path)
            return self.base
        if layout.read_header(path) != self.base:
            raise CorruptDataError(
                f"expected the dataset at {path} unchanged while appending to it, found another "
                "header (another writer without the lock, e.g. on an object store); nothing was "
                "appended"
            )
        named = local_commit.name_shards(work, shards, set(fs.listdir(path)))
        fs.remove(fs.join(work, layout.PROGRESS_FILE))
        header = self._header(named)
        if fs.is_local(path):
            fs.link_tree(path, work, skip=frozenset({layout.HEADER_FILE}))
            fs.write_bytes(fs.join(work, layout.HEADER_FILE), header.to_json().encode("utf-8"))
            old = fs.exchange_or_rename(work, path, commit_file=layout.HEADER_FILE)
            if old is not None:
                fs.rmtree(old)
            return header
        for s in named:
            layout.move_shard(s, work, path, s.file)
        # The commit point on an object store: one write of the header.
        fs.write_atomically(fs.join(path, layout.HEADER_FILE), header.to_json())
        fs.rmtree(work)
        return header


class PartTarget(Target[Part]):
    """Part ``index`` of ``count`` of a two-phase write: a fresh attempt directory in ``.staging``.

    The files get their names at once (nothing reads an attempt's files
    before its manifest names them); the commit writes the part's
    ``manifest.json`` atomically, the part's commit point. Locally the
    attempt is locked (``attempt-ID.lock``) until it commits or aborts, so
    that :func:`superserial.cleanup` can tell a live attempt from a killed one.

    Args:
        path: The dataset directory (created if needed).
        index: The part's index.
        count: The number of parts.
        make_header: Builds the part's header from its shards.
    """

    def __init__(self, path: str, index: int, count: int, make_header: MakeHeader) -> None:
        self.path, self.index, self.count, self.make_header = path, index, count, make_header
        self.part_dir = layout.part_dir(path, index)
        self._created = not fs.exists(path)
        self._lock: tuple[str, int] | None = None
        self.attempt = self._new_attempt()
        self.directory = fs.join(self.part_dir, self.attempt)
        try:
            fs.makedirs(self.directory)
        except BaseException:
            self.abort(())
            raise

    def _new_attempt(self) -> str:
        """A fresh attempt name; locally, locked until commit or abort."""
        for _ in range(100):
            attempt = layout.new_attempt_name()
            fs.makedirs(self.part_dir)
            if not fs.is_local(self.path):
                return attempt
            lpath = fs.join(self.part_dir, layout.attempt_lock_name(attempt))
            lpath = lpath.removeprefix("file://")
            fd = local_commit.lock_file(lpath, create=True)
            if fd is not None:
                self._lock = (lpath, fd)
                return attempt
            # A cleanup removed the directory, or saw the file before we locked it.
        raise OSError(f"expected to lock a new attempt in {self.part_dir}, failed 100 times")

    def shard_name(self, index: int) -> str:
        return layout.attempt_shard_name(index)

    def commit(self, shards: list[Shard]) -> Part:
        part = Part(self.index, self.count, self.attempt, self.make_header(tuple(shards)))
        fs.write_atomically(fs.join(self.part_dir, layout.MANIFEST_FILE), part.to_json())
        # Committed: only now may cleanup see the attempt unlocked.
        self._release()
        return part

    def abort(self, shards: Sequence[Shard]) -> None:
        del shards  # all of them are in the attempt directory
        try:
            if fs.exists(self.directory):
                fs.rmtree(self.directory)
        finally:
            self._release()
        self._remove_empty_dirs()

    def _release(self) -> None:
        if self._lock is not None:
            lpath, fd = self._lock
            self._lock = None
            local_commit.release_file(lpath, fd)

    def _remove_empty_dirs(self) -> None:
        """Removes the part and staging directories, and ``path`` if this made it, while empty."""
        if not fs.is_local(self.path):
            return  # object stores have no empty directories
        dirs = [self.part_dir, fs.join(self.path, layout.STAGING_DIR)]
        for d in dirs + ([self.path] if self._created else []):
            try:
                os.rmdir(d.removeprefix("file://"))
            except OSError:  # not empty (another part, a dataset), or gone
                return


class StagedShardTarget(Target[Shard]):
    """Shard ``index`` of a Beam run, written by one try as one staged file of ``run_dir``.

    Every try gets its own file name, so a retried or duplicated worker never
    writes over a file another try reported; the run's last step commits the
    reported files with :func:`~superserial.write.parts.assemble`.
    """

    def __init__(self, run_dir: str, index: int) -> None:
        self.path = self.directory = run_dir
        self._name = layout.staged_shard_name(index, layout.new_attempt_name())
        fs.makedirs(run_dir)

    def shard_name(self, index: int) -> str:
        del index  # one shard per target
        return self._name

    def commit(self, shards: list[Shard]) -> Shard:
        (shard,) = shards
        return shard

    def abort(self, shards: Sequence[Shard]) -> None:
        del shards  # the shard writer removed the open file; closed ones are another try's
        return

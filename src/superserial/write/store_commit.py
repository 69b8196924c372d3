"""How ``save`` commits on an object store (``s3://``, ``gs://``...): the header is the commit point.

An object store has no rename (a "rename" is a copy of every byte) and no
directories to exchange, so a save there does not write into a work
directory. Instead:

1. it picks a per-save tag and writes every shard (and its index) in place,
   under its final, tagged name (``data-00000-of-00004-TAG.tfrecord``, or
   ``data-00000-TAG.tfrecord`` when the shard count is not known ahead);
   no name of the current dataset is ever reused, so readers of it never
   open a file of the new one, and readers ignore unlisted tagged files
   (:func:`superserial.format.layout.shard_paths`);
2. it puts ``header.json`` last, in one request: the commit point. Where the
   store has conditional writes (S3), the put is conditional: only if no
   header is there (``If-None-Match: *``), or, when overwriting, only if the
   header is still the one this save is replacing (``If-Match`` its ETag).
   Of two saves racing to commit at one path, one wins and the other fails
   with :class:`~superserial.errors.DatasetExistsError` (the path was empty)
   or :class:`~superserial.errors.DatasetLockedError` (it replaced the same
   dataset) and removes its shards: never a header listing another save's files;
3. it removes the files of the dataset it replaced (those of the header it
   read, nothing else: another save's shards in flight are left alone).

A reader sees the old dataset or the new one, or, if it read the old header
just before the old files went, a :class:`~superserial.errors.CorruptDataError`
(``found no file``); never a mix. A save that is killed leaves tagged shard
files that readers ignore; the next save to the path removes none of them
(they may be another save's), so they stay until deleted by hand.

This module does not import TensorFlow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from superserial.errors import (
    DatasetExistsError,
    DatasetLockedError,
    DatasetNotFoundError,
    HeaderError,
    UnsupportedError,
)
from superserial.format.header import Header, Shard
from superserial.format.layout import HEADER_FILE, new_save_tag, read_header, shard_name
from superserial.storage import fs

__all__ = ["commit_in_place", "new_tag", "remove_shards", "start_in_place", "writes_in_place"]

log = logging.getLogger("superserial")


def writes_in_place(path: str, *, resume: bool) -> bool:
    """Whether a save to ``path`` writes its shards in place (object stores, without ``resume``).

    A resumable save keeps its work directory beside ``path`` (it must
    outlive the process), and commits as on any filesystem.
    """
    return not fs.is_local(path) and not resume


def new_tag(path: str) -> str:
    """A per-save tag that no file name at ``path`` carries yet."""
    names = fs.listdir(path) if fs.isdir(path) else []
    while True:
        tag = new_save_tag()
        if not any(tag in n for n in names):
            return tag


def start_in_place(path: str, count: int | None) -> Callable[[int], str]:
    """Prepares ``path`` for a save in place; returns the final name of its shard ``i``.

    The names carry a tag no file at ``path`` has yet (``count`` None: the
    shard count is not known yet). ``path`` is created where the filesystem
    has directories (``ram://``); on S3 that is a no-op.
    """
    fs.makedirs(path)
    tag = new_tag(path)

    def name(i: int) -> str:
        return shard_name(i, count, tag)

    return name


def _files(shards: Iterable[Shard]) -> set[str]:
    return {f[0] for s in shards for f in s.files()}


def remove_shards(path: str, shards: Sequence[Shard]) -> None:
    """Removes shard files (and their indexes) a failed save wrote at ``path``."""
    for name in sorted(_files(shards)):
        fs.remove(fs.join(path, name))


def _conditional(hpath: str) -> tuple[bool, str | None]:
    """(the store has conditional writes, the header's current version token)."""
    try:
        return True, fs.version(hpath)
    except UnsupportedError:
        return False, None


def commit_in_place(
    path: str,
    shards: Sequence[Shard],
    make_header: Callable[[tuple[Shard, ...]], Header],
    *,
    overwrite: bool,
    hint: str = "overwrite=True",
) -> Header:
    """Puts the header of ``shards`` (written in place at ``path``), then removes the old files.

    Args:
        path: The dataset path (an object store).
        shards: The closed shards, in order, under their final names in ``path``.
        make_header: Builds the header from the shards.
        overwrite: Whether an existing dataset at ``path`` may be replaced.
        hint: How the caller's user asks for overwriting, for the message.

    Returns:
        The header written.

    Raises:
        DatasetExistsError: A dataset is at ``path`` and ``overwrite`` is
            False, or another save created one while this one committed.
        DatasetLockedError: Another save replaced the dataset at ``path``
            while this one committed. Either way nothing was committed; the
            caller removes ``shards``.
    """
    hpath = fs.join(path, HEADER_FILE)
    conditional, token = _conditional(hpath)
    # Read after the version token: if the header changes in between, the
    # conditional put fails, so the files removed below are always the replaced header's.
    try:
        old: Header | None = read_header(path)
    except DatasetNotFoundError:
        old = None
    except HeaderError as e:
        log.warning("replacing %s, whose header is unreadable (%s); its files stay", hpath, e)
        old = None
    except OSError as e:
        # s3fs pins a file's ETag when it opens it: a header replaced between
        # that and the read fails the read (FileExpired). Another save committed.
        if conditional and fs.version(hpath) != token:
            raise _lost_race(hpath, token) from e
        raise
    exists = old is not None or (conditional and token is not None) or fs.exists(hpath)
    if exists and not overwrite:
        raise DatasetExistsError(
            f"expected no dataset at {path}, found one (committed while this save ran?); "
            f"pass {hint} to replace it"
        )
    header = make_header(tuple(shards))
    data = header.to_json().encode("utf-8")
    if conditional:
        if not fs.put_if(hpath, data, token):
            raise _lost_race(hpath, token)
    else:
        # No conditional write here: two saves racing end with the last header put.
        fs.write_bytes(hpath, data)
    if old is not None:
        _remove_replaced(path, _files(old.shards) - _files(header.shards))
    return header


def _lost_race(hpath: str, token: str | None) -> DatasetExistsError | DatasetLockedError:
    """The error of a save whose header put lost to another save's."""
    what = "no header" if token is None else f"the header this save replaces ({token})"
    error = DatasetExistsError if token is None else DatasetLockedError
    return error(
        f"expected {what} at {hpath} as this save committed, found another save's "
        "header (two saves to one path at once): this one committed nothing and "
        "left the other's dataset as it is"
    )


def _remove_replaced(path: str, names: set[str]) -> None:
    """Removes the replaced dataset's files; a failure leaves garbage, never a broken dataset."""
    for name in sorted(names):
        try:
            fs.remove(fs.join(path, name))
        except OSError as e:
            log.warning("could not remove %s of the replaced dataset: %s", fs.join(path, name), e)

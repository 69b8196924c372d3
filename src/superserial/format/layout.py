"""Every name superserial gives a file or directory, and cheap checks of a dataset's files.

This module alone knows the layout; no TensorFlow needed::

    PATH/                              the dataset
        header.json                    HEADER_FILE, written last: the commit point
        data-00000-of-00004[-TAG].tfrecord   shard_name(0, 4, tag)
        data-00000-of-00004[-TAG].tfrecord.index   index_name(shard): its record index
        .staging/part-00003/           part_dir(PATH, 3): a distributed Writer's part
            manifest.json              MANIFEST_FILE: the part's commit point
            attempt-<hex>/             new_attempt_name(): one try at writing the part
            attempt-<hex>.lock         attempt_lock_name(): held by its live writer
        .staging/beam-<hex>/           new_beam_run_dir(PATH): one WriteToSuperSerial run
            data-00003.attempt-<hex>.tfrecord   staged_shard_name(3, attempt)
    .PATH.superserial-lock             sibling(PATH, LOCK_SUFFIX): a save's lock
    .PATH.superserial-partial/         sibling(PATH, PARTIAL_SUFFIX): a save's work dir
        progress.json                  PROGRESS_FILE: completed shards, for resume
        data-00000.part.tfrecord       open_shard_name(0): a shard being written
        data-00000.tfrecord            done_shard_name(0): a completed shard

Every shard file, wherever it is, has its index (if any) beside it under
:func:`index_name`; :func:`move_shard` moves the two together.
A reader reads ``header.json`` and the files it lists; nothing else.
"""

from __future__ import annotations

import os
import re
import uuid
import warnings

from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetNotFoundError,
    HeaderError,
    IdleReaderWarning,
)
from superserial.format.framing import masked_crc
from superserial.format.header import LIMITS, Header, IndexFile, Shard
from superserial.storage import fs

__all__ = [
    "HEADER_FILE",
    "LOCK_SUFFIX",
    "MANIFEST_FILE",
    "PARTIAL_SUFFIX",
    "PROGRESS_FILE",
    "STAGING_DIR",
    "attempt_lock_name",
    "attempt_of",
    "attempt_shard_name",
    "check_target",
    "done_shard_name",
    "extra_shard_files",
    "host_shards",
    "index_name",
    "is_attempt_name",
    "is_shard_file",
    "is_tagged_shard_file",
    "move_shard",
    "new_attempt_name",
    "new_beam_run_dir",
    "new_save_tag",
    "open_shard_name",
    "part_dir",
    "part_index",
    "read_header",
    "shard_name",
    "shard_paths",
    "sibling",
    "staged_shard_name",
    "tfindex_name",
    "webdataset_shard_name",
]

HEADER_FILE = "header.json"
STAGING_DIR = ".staging"
MANIFEST_FILE = "manifest.json"
PROGRESS_FILE = "progress.json"
LOCK_SUFFIX = ".superserial-lock"
PARTIAL_SUFFIX = ".superserial-partial"

_PART_RE = re.compile(r"^part-(\d{5,})$")
_ATTEMPT_RE = re.compile(r"^attempt-[0-9a-f]{8,64}$")
# A shard (or its index) named with a per-save tag: data-00000-of-00004-TAG or data-00000-TAG.
_TAGGED_RE = re.compile(r"^data-\d{5,}(-of-\d{5,})?-([0-9a-f]{8})\.tfrecord(\.index)?$")


def shard_name(index: int, count: int | None, tag: str | None = None) -> str:
    """The file name of shard ``index`` of ``count``, with an optional per-save ``tag``.

    ``count`` None (a save to an object store that does not know its shard
    count yet: it writes shards under their final names) gives
    ``data-NNNNN-TAG.tfrecord``; it needs a ``tag``.
    """
    if count is None:
        if tag is None:
            raise ValueError("expected a tag for a shard name without a count")
        return f"data-{index:05d}-{tag}.tfrecord"
    if tag is None:
        return f"data-{index:05d}-of-{count:05d}.tfrecord"
    return f"data-{index:05d}-of-{count:05d}-{tag}.tfrecord"


def is_shard_file(name: str) -> bool:
    """True for a name that a reader would take for a shard (``data-*.tfrecord``).

    Deliberately loose: any such file in a dataset directory that the header
    does not list is an error, never silently ignored.
    """
    return name.startswith("data-") and name.endswith(".tfrecord")


def new_save_tag() -> str:
    """A fresh per-save tag for shard names (8 hex digits)."""
    return uuid.uuid4().hex[:8]


def is_tagged_shard_file(name: str) -> bool:
    """True for a shard or index name that carries a per-save tag (see :func:`shard_name`).

    On object stores a save writes such files in place before its header; a
    reader takes unlisted ones for another save's (running or killed), not
    for damage.
    """
    return bool(_TAGGED_RE.match(name))


def index_name(shard_file: str) -> str:
    """The name of the index file of the shard file named ``shard_file``."""
    return shard_file + ".index"


def tfindex_name(shard_file: str) -> str:
    """The name of the plain-text ``offset length`` index of ``shard_file``, for other tools.

    ``data-00000-of-00004.tfrecord`` -> ``data-00000-of-00004.tfindex``: the name
    vahidk/tfrecord's ``tfrecord2idx DIR`` gives it (the extension swapped), which
    NVIDIA DALI's examples pair with the shard.
    """
    return shard_file.removesuffix(".tfrecord") + ".tfindex"


def webdataset_shard_name(index: int) -> str:
    """The name of tar shard ``index`` of a WebDataset export (``data-{00000..N}.tar``)."""
    return f"data-{index:05d}.tar"


def move_shard(shard: Shard, src_dir: str, dst_dir: str, name: str) -> Shard:
    """Moves a shard file (and its index) to ``name`` in ``dst_dir``; returns it renamed.

    Replaces files of those names. A file already moved (missing at the
    source, present at the destination with its size: a move interrupted
    and run again) is taken as it is.

    Raises:
        CorruptDataError: A file is at neither place (or of another size).
    """
    index, moves = None, []
    if shard.index is not None:
        index = IndexFile(index_name(name), shard.index.bytes, shard.index.crc32c)
        # The index first: a shard found moved implies its index was too.
        moves.append((shard.index.file, index.file, index.bytes))
    moves.append((shard.file, name, shard.bytes))
    for old, new, size in moves:
        src, dst = fs.join(src_dir, old), fs.join(dst_dir, new)
        if fs.exists(src):
            fs.replace(src, dst)
        elif not (fs.exists(dst) and fs.size(dst) == size):
            raise CorruptDataError(
                f"expected {src} ({size} bytes) of shard {shard.file} ({shard.records} records), "
                "found no file"
            )
    return Shard(name, shard.records, shard.bytes, shard.crc32c, index)


def open_shard_name(index: int) -> str:
    """The name of shard ``index`` while a save is writing it."""
    return f"data-{index:05d}.part.tfrecord"


def done_shard_name(index: int) -> str:
    """The name of shard ``index`` once a save has completed it (before its final name)."""
    return f"data-{index:05d}.tfrecord"


def attempt_shard_name(index: int) -> str:
    """The name of shard ``index`` in a part's attempt directory, from its first byte on.

    Nothing reads an attempt's files before the part's manifest names them
    (the part's commit point), so they need no name while being written.
    """
    return f"data-{index:05d}.tfrecord"


def part_dir(path: str, index: int) -> str:
    """The staging directory of part ``index`` of the dataset at ``path``."""
    return fs.join(str(path).rstrip("/"), STAGING_DIR, f"part-{index:05d}")


def part_index(name: str) -> int | None:
    """The part index of a staging directory name (``part-00003`` -> 3), else None."""
    m = _PART_RE.match(name)
    return int(m.group(1)) if m else None


def new_attempt_name() -> str:
    """A fresh attempt directory name for a part's files."""
    return f"attempt-{uuid.uuid4().hex[:16]}"


def is_attempt_name(name: str) -> bool:
    """True for a name :func:`new_attempt_name` could have made."""
    return bool(_ATTEMPT_RE.match(name))


def attempt_lock_name(attempt: str) -> str:
    """The lock file a live writer holds beside its attempt directory ``attempt``."""
    return attempt + ".lock"


def attempt_of(name: str) -> str | None:
    """The attempt an entry of a part directory belongs to (its directory or lock), else None."""
    base = name.removesuffix(".lock")
    return base if is_attempt_name(base) else None


def new_beam_run_dir(path: str) -> str:
    """A fresh staging directory for one Beam ``WriteToSuperSerial`` run into ``path``.

    Beside the distributed Writer's ``part-*`` directories, which it never
    takes for one of theirs.
    """
    return fs.join(str(path).rstrip("/"), STAGING_DIR, f"beam-{uuid.uuid4().hex[:16]}")


def staged_shard_name(index: int, attempt: str) -> str:
    """The name of shard ``index`` as written by one ``attempt`` (see :func:`new_attempt_name`).

    Every try at writing a shard gets its own file, so a retried or duplicated
    worker never writes over the file another try reported.
    """
    return f"data-{index:05d}.{attempt}.tfrecord"


def sibling(path: str, suffix: str) -> str:
    """The hidden name ``.BASE<suffix>`` beside ``path``, in the same directory."""
    path = str(path).rstrip("/")
    if fs.is_local(path):
        parent, base = os.path.split(os.path.abspath(path.removeprefix("file://")))
        return os.path.join(parent, f".{base}{suffix}")
    parent, _, base = path.rpartition("/")
    return f"{parent}/.{base}{suffix}"


def read_header(path: str) -> Header:
    """Reads and validates the header of the dataset at ``path``, reading no records.

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        HeaderError: The header is malformed or of an unknown version.
    """
    path = str(path)
    hpath = fs.join(path, HEADER_FILE)
    local = fs.is_local(path)
    if local and not fs.exists(hpath):
        raise _not_found(path)
    if local and os.path.dirname(os.path.realpath(hpath)) != os.path.realpath(path):
        raise HeaderError(f"expected {hpath} inside {path}, found a link pointing out of it")
    # One read (one GET on object stores, so one version of a header being
    # replaced; no HEAD before it, nor any listing, which web servers refuse),
    # one byte past the limit so an oversized header is caught unparsed.
    try:
        text = fs.read_bytes(hpath, LIMITS.header_bytes + 1)
    except FileNotFoundError as e:
        if isinstance(e, DatasetNotFoundError) or local:
            raise
        raise _not_found(path) from e
    return Header.from_json(text, source=hpath)


def _not_found(path: str) -> DatasetNotFoundError:
    if not fs.lists(path):
        what = f"no {HEADER_FILE}"  # a web server's directory is no file to look for
    else:
        what = "no such directory" if not fs.exists(path) else f"no {HEADER_FILE}"
    return DatasetNotFoundError(
        f"expected a superserial dataset at {path}, found {what}{_raw_records_hint(path)}"
    )


_PROBE_FILES = 20


def _is_tfrecord_start(head: bytes) -> bool:
    """True if ``head`` (a file's first 12 bytes) is a TFRecord length with its masked CRC."""
    if len(head) < 12:
        return False
    return masked_crc(head[:8]) == int.from_bytes(head[8:12], "little")


def _raw_records_hint(path: str) -> str:
    """A hint to run ``superserial infer`` when ``path`` is a directory of TFRecord files.

    Probes a few files only (by name, or by their first 12 bytes), so that a
    "not found" error stays cheap; an unreadable file is simply not counted.
    """
    if not fs.is_local(path):
        return ""
    try:
        if not fs.isdir(path):
            return ""
        names = sorted(fs.listdir(path))[:_PROBE_FILES]
        found = []
        for name in names:
            file = fs.join(path, name)
            if fs.isdir(file):
                continue
            if ".tfrec" in name.lower():
                found.append(name)
                continue
            with fs.open_file(file, "rb") as f:
                head = f.read(12)
            if head[:2] == b"\x1f\x8b" or _is_tfrecord_start(head):
                found.append(name)
    except OSError:
        return ""
    if not found:
        return ""
    pattern = fs.join(path, "*")
    return (
        f"; it holds TFRecord files ({found[0]}...) but no header: to make a dataset of "
        f"tf.train.Example records, run `superserial infer '{pattern}' -o NEW_DIR`"
    )


def extra_shard_files(path: str, header: Header, names: set[str]) -> list[str]:
    """The names among ``names`` (the files at ``path``) that look like shards the header does not list.

    On object stores, saves write tagged shards in place before their header
    (:mod:`superserial.write.store_commit`): unlisted tagged ones there belong to
    another save, running or killed, not to this dataset, and are not counted.
    """
    listed = {s.file for s in header.shards}
    in_place = not fs.is_local(path)
    return sorted(
        n
        for n in names
        if is_shard_file(n) and n not in listed and not (in_place and is_tagged_shard_file(n))
    )


def shard_paths(path: str, header: Header, *, check_sizes: bool = True) -> list[str]:
    """The shard files of a dataset, checked cheaply against the header.

    Raises:
        CorruptDataError: A shard is missing, of the wrong size, an unlisted
            shard is present, or a shard is a link pointing out of the dataset.
    """
    path = str(path)
    files = [fs.join(path, s.file) for s in header.shards]
    if not fs.lists(path):
        _check_sizes_unlisted(header, files)
        return files
    present = set(fs.listdir(path))
    extra = extra_shard_files(path, header, present)
    if extra:
        raise CorruptDataError(
            f"expected only the header's shards in {path}, found extra file {extra[0]}"
        )
    real_dir = os.path.realpath(path) if fs.is_local(path) else None
    for shard, file in zip(header.shards, files, strict=True):
        if shard.file not in present:
            raise CorruptDataError(
                f"expected shard {file} ({shard.records} records), found no file"
            )
        if real_dir is not None and os.path.dirname(os.path.realpath(file)) != real_dir:
            raise CorruptDataError(
                f"expected shard {file} inside {path}, found a link pointing out of it"
            )
        if check_sizes:
            try:
                got = fs.size(file)
            except FileNotFoundError as e:
                # Listed a moment ago: the dataset was overwritten meanwhile.
                raise CorruptDataError(
                    f"expected shard {file} ({shard.records} records), found no file (removed "
                    "while loading: was the dataset overwritten?)"
                ) from e
            if got != shard.bytes:
                raise CorruptDataError(f"expected {shard.bytes} bytes in {file}, found {got}")
    return files


def _check_sizes_unlisted(header: Header, files: list[str]) -> None:
    """:func:`shard_paths` where nothing lists (a web server): one size request per shard.

    The header is the listing then: files it does not name go unseen. The
    requests go out together, since one at a time costs one round trip each.
    """
    from concurrent.futures import ThreadPoolExecutor

    def size(file: str) -> int | None:
        try:
            return fs.size(file)
        except FileNotFoundError:
            return None

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(files)))) as pool:
        sizes = list(pool.map(size, files))
    for shard, file, got in zip(header.shards, files, sizes, strict=True):
        if got is None:
            raise CorruptDataError(
                f"expected shard {file} ({shard.records} records), found no file"
            )
        if got != shard.bytes:
            raise CorruptDataError(f"expected {shard.bytes} bytes in {file}, found {got}")


def host_shards(
    path: str, num_files: int, shard: tuple[int, int], *, stacklevel: int = 3
) -> list[int]:
    """The shard indices host ``i`` of ``n`` reads for ``shard=(i, n)``: ``i, i+n, ...``.

    With fewer shard files than hosts, some hosts read nothing; every host
    then warns (an :class:`~superserial.errors.IdleReaderWarning`, so that
    the host whose log is watched tells about the idle ones too), pointing
    at ``stacklevel`` as ``warnings.warn`` counts it (3: the caller's caller).

    Raises:
        ValueError: ``shard`` is not ``(i, n)`` with ``0 <= i < n``.
    """
    i, n = shard
    if not (isinstance(i, int) and isinstance(n, int) and 0 <= i < n):
        raise ValueError(f"expected shard=(i, n) with 0 <= i < n, got {shard!r}")
    if num_files < n:
        idle = f"host {i} reads nothing" if i >= num_files else f"host {i} reads shard {i}"
        others = f"hosts {num_files}..{n - 1}" if num_files < n - 1 else f"host {n - 1}"
        warnings.warn(
            f"shard={shard!r}: the dataset at {path} has {num_files} shard file(s) for {n} hosts, "
            f"so {others} of {n} read nothing ({idle}); save it with num_shards= a multiple "
            f"of the number of readers (hosts x DataLoader workers) to give every host a share",
            IdleReaderWarning,
            stacklevel=stacklevel,
        )
    return list(range(i, num_files, n))


def check_target(path: str, overwrite: bool, *, hint: str = "overwrite=True") -> None:
    """Checks that a dataset may be written at ``path``.

    Nothing may be there, unless ``overwrite`` and it is a superserial dataset
    (or an empty directory): anything else is never deleted.

    Args:
        path: Where the dataset goes.
        overwrite: Whether an existing dataset may be replaced.
        hint: How the caller's user asks for overwriting, for the message.

    Raises:
        DatasetExistsError: Something is at ``path`` that may not be replaced.
    """
    if not fs.exists(path):
        return
    if not fs.is_local(path) and fs.isdir(path):
        # Object stores: tagged shards of other saves (killed, or running) are not a dataset.
        names = [n for n in fs.listdir(path) if not is_tagged_shard_file(n)]
        if not names:
            return
    if not fs.isdir(path):
        # Overwriting replaces only datasets: suggesting it here would not help.
        raise DatasetExistsError(
            f"expected no file or directory at {path}, found a file; overwriting replaces only "
            "a dataset directory, so move or delete the file, or choose another path"
        )
    if not overwrite:
        raise DatasetExistsError(
            f"expected no file or directory at {path}, found one; pass {hint} to replace a dataset"
        )
    names = fs.listdir(path)
    if names and HEADER_FILE not in names:
        raise DatasetExistsError(
            f"expected a superserial dataset at {path} to overwrite, found a directory without "
            f"{HEADER_FILE}; refusing to delete it"
        )

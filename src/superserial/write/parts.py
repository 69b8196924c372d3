"""Parts of a write staged by many writers: their manifests, and the commit that assembles them.

Phase 2 of the two-phase protocol described in :mod:`superserial.tf.two_phase`: a part
is committed by its manifest (:class:`Part`); ``finalize`` checks every part
before changing anything, then moves the files into place and writes the
header last.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from superserial._version import __version__
from superserial.errors import CorruptDataError, DatasetNotFoundError, HeaderError
from superserial.format import layout
from superserial.format.header import Header, Shard
from superserial.format.layout import HEADER_FILE, MANIFEST_FILE, STAGING_DIR, part_dir
from superserial.storage import fs

__all__ = ["MakeHeader", "Part", "assemble", "commit_parts", "finalize", "read_part"]

# Builds the header of the written shards, under the names they are committed with.
MakeHeader = Callable[[tuple[Shard, ...]], Header]

log = logging.getLogger("superserial")

_PART_KIND = "superserial-part"


# ------------------------------------------------------------- manifests


@dataclass(frozen=True)
class Part:
    """A committed part: what its manifest says.

    Attributes:
        index: The part's index ``i``.
        count: How many parts the dataset has (``n``).
        attempt: The attempt directory holding its files, inside the part's
            staging directory.
        header: The part's files (names inside the attempt directory), their
            counts, sizes and CRC-32C, with structure and compression.
    """

    index: int
    count: int
    attempt: str
    header: Header

    def to_json(self) -> str:
        """The manifest text."""
        obj = {
            "kind": _PART_KIND,
            "part": self.index,
            "num_parts": self.count,
            "attempt": self.attempt,
            "header": self.header.to_obj(),
        }
        return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str) -> Part:
        """Parses and checks a manifest.

        Raises:
            HeaderError: The manifest is malformed.
        """
        try:
            obj = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise HeaderError(f"{source}: expected JSON, got unparsable text ({e})") from e
        if not isinstance(obj, dict) or obj.get("kind") != _PART_KIND:
            raise HeaderError(f"{source}: expected a superserial part manifest, got something else")
        for key in ("part", "num_parts"):
            v = obj.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise HeaderError(f"{source}: expected an integer >= 0, got {v!r} at {key}")
        attempt = obj.get("attempt")
        if not isinstance(attempt, str) or not layout.is_attempt_name(attempt):
            raise HeaderError(
                f"{source}: expected an attempt directory name, got {attempt!r} at attempt"
            )
        header = Header.from_obj(obj.get("header"), source=f"{source} header")
        return cls(obj["part"], obj["num_parts"], attempt, header)


# ------------------------------------------------------------- finalize


def read_part(pdir: str) -> Part:
    """The committed part whose staging directory is ``pdir`` (see :func:`layout.part_dir`).

    Raises:
        HeaderError: Its manifest is malformed.
    """
    mpath = fs.join(pdir, MANIFEST_FILE)
    return Part.from_json(fs.read_bytes(mpath, limit=64 << 20), source=mpath)


def _read_parts(path: str, num_shards: int | None) -> list[Part]:
    staging = fs.join(path, STAGING_DIR)
    names = sorted(fs.listdir(staging)) if fs.isdir(staging) else []
    found: dict[int, str] = {}
    for name in names:
        i = layout.part_index(name)
        if i is not None:
            found[i] = fs.join(staging, name)
    parts: dict[int, Part] = {}
    for i, pdir in sorted(found.items()):
        if fs.exists(fs.join(pdir, MANIFEST_FILE)):
            part = read_part(pdir)
            if part.index != i:
                raise HeaderError(
                    f"{pdir}: expected part {i} in its manifest, got {part.index} at part"
                )
            parts[i] = part
    if not parts:
        raise DatasetNotFoundError(
            f"expected committed parts in {staging} (written by superserial.Writer or "
            f"save(shard_index=...)), found none"
        )
    counts = {p.count for p in parts.values()}
    if len(counts) != 1:
        raise HeaderError(
            f"expected the same num_shards in every part, got {sorted(counts)} in {staging}"
        )
    n = counts.pop()
    if n == 0:
        # What commit_parts' callers write: their parts are known to their driver only.
        raise HeaderError(
            f"expected parts of a two-phase write in {staging}, got parts with num_parts 0: "
            "left by a Ray Data write that did not complete (its driver commits them, "
            f"never finalize); write again (its commit removes them) or remove {staging}"
        )
    if num_shards is not None and num_shards != n:
        raise HeaderError(f"expected {num_shards} parts, got parts written for {n} at {staging}")
    stray = sorted(i for i in found if i >= n)
    if stray:
        raise HeaderError(f"expected parts 0..{n - 1}, found part {stray[0]} at {found[stray[0]]}")
    missing = [i for i in range(n) if i not in parts]
    if missing:
        i = missing[0]
        what = "no directory" if i not in found else f"no {MANIFEST_FILE} (never committed)"
        raise DatasetNotFoundError(
            f"expected all {n} parts, part {i} is missing: expected "
            f"{fs.join(part_dir(path, i), MANIFEST_FILE)}, found {what}"
            + (f" ({len(missing)} parts missing: {missing[:10]})" if len(missing) > 1 else "")
        )
    return [parts[i] for i in range(n)]


def _check_same(parts: list[Part]) -> None:
    first = parts[0].header
    i = parts[0].index
    for p in parts[1:]:
        if p.header.structure != first.structure:
            raise HeaderError(
                f"expected the structure of part {i} in every part, got another at part "
                f"{p.index}:\npart {i}:\n{first.summary()}\npart {p.index}:\n{p.header.summary()}"
            )
        if p.header.compression != first.compression:
            raise HeaderError(
                f"expected compression {first.compression} as in part {i}, got "
                f"{p.header.compression} at part {p.index}"
            )


def finalize(path: str, *, num_shards: int | None = None, verify: bool = False) -> Header:
    """Assembles the parts written by all workers into one dataset (phase 2).

    Checks everything first: all parts present, same structure and
    compression, every file there with its listed size (and CRC-32C with
    ``verify``). Then moves the files into ``path`` as
    ``data-XXXXX-of-YYYYY.tfrecord`` in part order, writes ``header.json``
    atomically and removes the staging area. Run it once all workers have
    finished; run again, it is a no-op returning the header.

    Args:
        path: The dataset directory the workers wrote into.
        num_shards: The number of parts expected; by default, what the
            parts' manifests say.
        verify: Also recompute every file's CRC-32C (reads all the data).

    Returns:
        The dataset's header.

    Raises:
        DatasetNotFoundError: No parts, or a part is missing (named).
        HeaderError: Parts disagree on structure, compression or count.
        CorruptDataError: A listed file is missing, or of the wrong size or
            checksum.
    """
    path = fs.dataset_path(path)
    staging = fs.join(path, STAGING_DIR)
    hpath = fs.join(path, HEADER_FILE)
    if fs.exists(hpath):
        header = layout.read_header(path)
        if fs.exists(staging):  # a finalize stopped after its commit point
            fs.rmtree(staging)
        return header
    if not fs.exists(staging):
        raise DatasetNotFoundError(
            f"expected parts to finalize in {staging} or a finalized dataset at {path}, found neither"
        )
    start = time.perf_counter()
    parts = _read_parts(path, num_shards)
    header = commit_parts(path, parts, verify=verify)
    log.info(
        "finalized %s: %d parts, %d elements in %d file(s), %d bytes, %.2fs",
        path,
        len(parts),
        header.element_count,
        len(header.shards),
        header.total_bytes,
        time.perf_counter() - start,
    )
    return header


def commit_parts(
    path: str,
    parts: Sequence[Part],
    *,
    verify: bool = False,
    writer: str = f"superserial {__version__}",
) -> Header:
    """Commits the given committed parts, in this order, as the dataset at ``path``.

    The work of :func:`finalize` once it has found the parts; also the commit
    of a write whose parts are known from their writers' reports rather than
    from a count (a Ray Data write, whose number of tasks nobody knows ahead):
    other parts in the staging area are not taken, and are removed with it.

    Args:
        path: The dataset directory the parts were written into.
        parts: The parts, in dataset order (at least one).
        verify: Also recompute every file's CRC-32C.
        writer: The header's ``writer``.

    Returns:
        The header written.

    Raises:
        HeaderError: Parts disagree on structure or compression.
        CorruptDataError: A listed file is missing, or of the wrong size or checksum.
    """
    staging = fs.join(path, STAGING_DIR)
    _check_same(list(parts))
    total_files = sum(len(p.header.shards) for p in parts)
    plan: list[tuple[str, str, Shard]] = []
    for p in parts:
        src_dir = fs.join(part_dir(path, p.index), p.attempt)
        for s in p.header.shards:
            plan.append((src_dir, layout.shard_name(len(plan), total_files), s))
    # Check all before moving any: a failed finalize changes nothing.
    for src_dir, dst, s in plan:
        final_names = [dst] + ([layout.index_name(dst)] if s.index is not None else [])
        for (name, size, crc32c), final_name in zip(s.files(), final_names, strict=True):
            src, final = fs.join(src_dir, name), fs.join(path, final_name)
            if fs.exists(src):
                where = src
            elif fs.exists(final) and fs.size(final) == size:
                where = final  # moved by an interrupted finalize
            else:
                raise CorruptDataError(
                    f"expected {src} ({size} bytes) of a shard of {s.records} records, found no file"
                )
            got = fs.size(where)
            if got != size:
                raise CorruptDataError(f"expected {size} bytes in {where}, got {got}")
            if verify:
                crc = fs.file_crc32c(where)
                if crc != crc32c:
                    raise CorruptDataError(f"expected crc32c {crc32c} of {where}, got {crc}")
    planned = {dst for _, dst, _ in plan}
    for name in fs.listdir(path):
        if layout.is_shard_file(name) and name not in planned:
            log.warning("finalize: removing %s, left by an earlier finalize of other parts", name)
            fs.remove(fs.join(path, name))
    first = parts[0].header
    header = assemble(
        path,
        plan,
        lambda shards: Header.of_shards(first.structure, first.compression, shards, writer=writer),
    )
    fs.rmtree(staging)
    return header


def assemble(path: str, moves: Sequence[tuple[str, str, Shard]], make_header: MakeHeader) -> Header:
    """Commits shards staged by many writers: moves them in, then writes ``header.json``.

    The commit of a write in parts (``finalize``) and of a Beam run. Safe to
    run again after an interruption: a shard already moved to its final name
    (with the size written) is taken as it is
    (:func:`~superserial.format.layout.move_shard`).

    Args:
        path: The dataset directory.
        moves: (the staging directory, the final name, the shard as staged), in order.
        make_header: Builds the header from the shards under their final names.

    Returns:
        The header written.
    """
    shards = tuple(layout.move_shard(s, src_dir, path, dst) for src_dir, dst, s in moves)
    header = make_header(shards)
    fs.write_atomically(fs.join(path, layout.HEADER_FILE), header.to_json())
    return header

"""Many writers, one dataset: a two-phase protocol on plain files.

Phase 1, on every worker ``i`` of ``n`` (processes, machines, at the same time
or not)::

    superserial.save(ds_part_i, path, shard_index=i, num_shards=n)
    # or, element by element:
    with superserial.Writer(path, shard_index=i, num_shards=n, element_spec=spec) as w:
        for element in elements:
            w.write(element)

Each worker writes its shard files into a fresh attempt directory of its own
staging area, ``path/.staging/part-{i:05d}/attempt-<random>/``, encoded
exactly as :func:`superserial.save` encodes them (same code). Last, it writes
the part's manifest ``path/.staging/part-{i:05d}/manifest.json`` atomically (a
temporary file renamed over it): the manifest is the part's commit point. It
names the attempt directory and lists every file with its record count, size
and CRC-32C, with the element structure and compression. A worker that dies
before that rename leaves no manifest (or the previous one); restarting it
writes a new attempt and replaces the manifest, and files of dead attempts
are ignored and removed by ``finalize``.

Phase 2, once, after every worker has finished::

    header = superserial.finalize(path)

checks that all ``n`` parts are present, agree on structure and compression,
and that every listed file is there with the listed size (and CRC-32C with
``verify=True``), all before changing anything. It then moves the files into
``path`` as ``data-XXXXX-of-YYYYY.tfrecord``, numbered in part order (and in
file order within a part), writes ``header.json`` atomically (temporary file
and rename) and removes the staging area. The dataset is element-for-element
the concatenation of parts ``0, 1, ..., n-1``.

``finalize`` is idempotent: interrupted at any point, running it again
completes the job; run after success, it changes nothing and returns the
header. Part ``i``'s files are contiguous in the final layout, so with one
file per part ``load(path, shard=(i, n))`` reads back exactly part ``i``.

Only renames of single files are needed, so this also works on object stores
through ``tf.io.gfile`` (``gs://``, ``s3://``), where a rename is a copy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from superserial import __version__, fs, layout
from superserial.encoder import ElementEncoder, record_batches
from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetNotFoundError,
    HeaderError,
    UnsupportedError,
)
from superserial.header import Header, Shard, normalize_compression
from superserial.layout import HEADER_FILE, MANIFEST_FILE, STAGING_DIR, part_dir
from superserial.shards import DEFAULT_SHARD_SIZE, ShardWriter
from superserial.spec import from_element_spec, not_a_dataset
from superserial.structure import Leaf, iter_leaves
from superserial.tensors import to_tensors

__all__ = ["Part", "Writer", "finalize", "read_part", "save_part"]

log = logging.getLogger("superserial")

_PART_KIND = "superserial-part"
# Elements buffered by Writer.write before they are encoded together.
_FLUSH_ELEMENTS = 1024
_MAX_PARTS = 100_000


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


def _check_index(shard_index: Any, num_shards: Any) -> None:
    if (
        not isinstance(num_shards, int)
        or isinstance(num_shards, bool)
        or not 1 <= num_shards <= _MAX_PARTS
    ):
        raise ValueError(
            f"expected num_shards in [1, {_MAX_PARTS}] with shard_index, got {num_shards!r}"
        )
    if (
        not isinstance(shard_index, int)
        or isinstance(shard_index, bool)
        or not 0 <= shard_index < num_shards
    ):
        raise ValueError(f"expected 0 <= shard_index < {num_shards}, got {shard_index!r}")


class Writer:
    """Writes part ``shard_index`` of ``num_shards`` of the dataset at ``path``.

    Use as a context manager: the part is committed (its manifest written) on
    a clean exit and discarded on an exception. Several writers of different
    parts may run at once, in different processes or machines; then one
    :func:`finalize` assembles the dataset.

    Args:
        path: The dataset directory (created if needed; must not yet hold a
            finalized dataset).
        shard_index: This part's index ``i``, ``0 <= i < num_shards``.
        num_shards: The number of parts ``n``, the same for every worker.
        element_spec: The element spec; needed for :meth:`write`, taken from
            the dataset by :meth:`write_dataset` otherwise.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``; the same for every part.
        shard_size: Start a new file in this part after about this many bytes
            (default 128 MiB).

    Raises:
        DatasetExistsError: ``path`` already holds a finalized dataset.
    """

    def __init__(
        self,
        path: str,
        *,
        shard_index: int,
        num_shards: int,
        element_spec: Any = None,
        compression: str | None = None,
        shard_size: int | None = None,
    ) -> None:
        _check_index(shard_index, num_shards)
        if shard_size is not None and (not isinstance(shard_size, int) or shard_size < 1):
            raise ValueError(f"expected shard_size >= 1 byte, got {shard_size!r}")
        self.path = str(path).rstrip("/") or "/"
        if fs.exists(fs.join(self.path, HEADER_FILE)):
            raise DatasetExistsError(
                f"expected no finalized dataset at {self.path} to write part {shard_index} into, "
                f"found {HEADER_FILE}; remove it first"
            )
        self.index, self.count = shard_index, num_shards
        self.compression = normalize_compression(compression)
        self.attempt = layout.new_attempt_name()
        self.dir = part_dir(self.path, shard_index)
        self._tmp = fs.join(self.dir, self.attempt)
        # The manifest is the part's commit point: files need no interim names.
        self._shards = ShardWriter(
            self._tmp,
            name=layout.done_shard_name,
            compression=self.compression,
            shard_size=shard_size or DEFAULT_SHARD_SIZE,
        )
        self._spec: Any = None
        self._leaves: tuple[Leaf, ...] = ()
        self._structure: Any = None
        self._buffer: list[Any] = []
        self._encoder: ElementEncoder | None = None
        self._total = 0
        self._state = "open"
        self.part: Part | None = None
        if element_spec is not None:
            self._set_spec(element_spec)
        fs.makedirs(self._tmp)

    def _set_spec(self, element_spec: Any) -> None:
        if self._spec is not None:
            if element_spec != self._spec:
                raise UnsupportedError(
                    f"expected element_spec {self._spec}, got {element_spec} at part {self.index}"
                )
            return
        structure = from_element_spec(element_spec)
        leaves = tuple(iter_leaves(structure))
        if not leaves:
            raise UnsupportedError(
                "expected at least one tensor in each element, got an empty structure"
            )
        self._spec, self._structure, self._leaves = element_spec, structure, leaves

    def _check_open(self) -> None:
        if self._state != "open":
            raise ValueError(
                f"expected an open Writer, got a {self._state} one at part {self.index}"
            )

    @property
    def element_count(self) -> int:
        """Elements written so far (buffered ones included)."""
        return self._total + len(self._buffer)

    def write(self, element: Any) -> None:
        """Adds one element (numpy values or tensors; see :func:`to_tensors`).

        Elements are buffered and encoded in batches, in graph.
        """
        self._check_open()
        if self._spec is None:
            raise ValueError("expected element_spec= on a Writer before write(), got none")
        self._buffer.append(to_tensors(element, self._spec))
        if len(self._buffer) >= _FLUSH_ELEMENTS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        buffered, self._buffer = self._buffer, []
        if self._encoder is None:
            self._encoder = ElementEncoder(self._spec, self._leaves)
        self._write_encoded(self._encoder.encode(buffered, converted=True))

    def _write_encoded(
        self,
        batches: Iterable[tuple[np.ndarray, np.ndarray]],
        bar: Callable[[int, int], None] | None = None,
    ) -> int:
        n = 0
        for recs, per_record in batches:
            nbytes = int(per_record.sum())
            self._shards.write(recs, per_record)
            n += len(recs)
            if bar is not None:
                bar(len(recs), nbytes)
        self._total += n
        return n

    def write_dataset(self, dataset: tf.data.Dataset, *, progress: Any = False) -> int:
        """Appends all elements of a finite dataset; returns how many.

        Raises:
            TypeError: ``dataset`` is not a ``tf.data.Dataset``.
            UnsupportedError: Its element_spec differs from the Writer's, or a
                leaf cannot be stored.
        """
        self._check_open()
        if not isinstance(dataset, tf.data.Dataset):
            raise not_a_dataset(dataset)
        if int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
            raise ValueError("expected a finite dataset, got one of infinite cardinality")
        self._set_spec(dataset.element_spec)
        self._flush()
        from superserial.progress import make_progress

        card = int(dataset.cardinality())
        bar = make_progress(
            progress, total=card if card >= 0 else None, desc=f"part {self.index} of {self.path}"
        )
        try:
            return self._write_encoded(record_batches(dataset, self._leaves), bar)
        finally:
            bar.close()

    def close(self) -> Part:
        """Flushes, closes the files and commits the part (writes its manifest).

        Returns:
            The committed part.
        """
        self._check_open()
        if self._spec is None:
            raise ValueError(
                "expected element_spec= or a write_dataset() before close(), got neither"
            )
        start = time.perf_counter()
        try:
            self._flush()
            shards = tuple(self._shards.finish())
        except BaseException:
            self.abort()
            raise
        header = Header(
            self._structure,
            self._total,
            self.compression,
            shards,
            writer=f"superserial {__version__}",
        )
        part = Part(self.index, self.count, self.attempt, header)
        fs.write_atomically(fs.join(self.dir, MANIFEST_FILE), part.to_json())
        self._state = "committed"
        self.part = part
        log.info(
            "wrote part %d of %d of %s: %d elements in %d file(s), %d bytes, %.2fs",
            self.index,
            self.count,
            self.path,
            self._total,
            len(shards),
            header.total_bytes,
            time.perf_counter() - start,
        )
        return part

    def abort(self) -> None:
        """Discards this attempt; a previously committed part stays as it was."""
        if self._state == "open":
            self._shards.abort()
            fs.rmtree(self._tmp)
            self._state = "aborted"

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def save_part(
    dataset: tf.data.Dataset,
    path: str,
    *,
    shard_index: int,
    num_shards: int,
    compression: str | None = None,
    shard_size: int | None = None,
    progress: Any = None,
) -> Header:
    """Writes ``dataset`` as part ``shard_index`` of ``num_shards`` (phase 1).

    What ``superserial.save(dataset, path, shard_index=i, num_shards=n)``
    does; see the module documentation for the protocol.

    Returns:
        The part's header (its files named inside the part's attempt directory).
    """
    with Writer(
        path,
        shard_index=shard_index,
        num_shards=num_shards,
        compression=compression,
        shard_size=shard_size,
    ) as w:
        w.write_dataset(dataset, progress=progress)
    assert w.part is not None
    return w.part.header


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
    for p in parts[1:]:
        if p.header.structure != first.structure:
            raise HeaderError(
                f"expected the structure of part 0 in every part, got another at part {p.index}:\n"
                f"part 0:\n{first.summary()}\npart {p.index}:\n{p.header.summary()}"
            )
        if p.header.compression != first.compression:
            raise HeaderError(
                f"expected compression {first.compression} as in part 0, got "
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
    path = str(path).rstrip("/") or "/"
    staging = fs.join(path, STAGING_DIR)
    hpath = fs.join(path, HEADER_FILE)
    if fs.exists(hpath):
        from superserial.layout import read_header

        header = read_header(path)
        if fs.exists(staging):  # a finalize stopped after its commit point
            fs.rmtree(staging)
        return header
    if not fs.exists(staging):
        raise DatasetNotFoundError(
            f"expected parts to finalize in {staging} or a finalized dataset at {path}, found neither"
        )
    start = time.perf_counter()
    parts = _read_parts(path, num_shards)
    _check_same(parts)
    total_files = sum(len(p.header.shards) for p in parts)
    plan: list[tuple[str, str, Shard]] = []
    for p in parts:
        src_dir = fs.join(part_dir(path, p.index), p.attempt)
        for s in p.header.shards:
            plan.append((fs.join(src_dir, s.file), layout.shard_name(len(plan), total_files), s))
    # Check all before moving any: a failed finalize changes nothing.
    for src, dst, s in plan:
        final = fs.join(path, dst)
        if fs.exists(src):
            where = src
        elif fs.exists(final) and fs.size(final) == s.bytes:
            where = final  # moved by an interrupted finalize
        else:
            raise CorruptDataError(
                f"expected {src} ({s.records} records, {s.bytes} bytes), found no file"
            )
        got = fs.size(where)
        if got != s.bytes:
            raise CorruptDataError(f"expected {s.bytes} bytes in {where}, got {got}")
        if verify:
            crc = fs.file_crc32c(where)
            if crc != s.crc32c:
                raise CorruptDataError(f"expected crc32c {s.crc32c} of {where}, got {crc}")
    planned = {dst for _, dst, _ in plan}
    for name in fs.listdir(path):
        if layout.is_shard_file(name) and name not in planned:
            log.warning("finalize: removing %s, left by an earlier finalize of other parts", name)
            fs.remove(fs.join(path, name))
    shards = []
    for src, dst, s in plan:
        if fs.exists(src):
            fs.replace(src, fs.join(path, dst))
        shards.append(Shard(dst, s.records, s.bytes, s.crc32c))
    first = parts[0].header
    header = Header(
        first.structure,
        sum(s.records for s in shards),
        first.compression,
        tuple(shards),
        writer=f"superserial {__version__}",
    )
    fs.write_atomically(hpath, header.to_json())
    fs.rmtree(staging)
    log.info(
        "finalized %s: %d parts, %d elements in %d file(s), %d bytes, %.2fs",
        path,
        len(parts),
        header.element_count,
        len(shards),
        header.total_bytes,
        time.perf_counter() - start,
    )
    return header

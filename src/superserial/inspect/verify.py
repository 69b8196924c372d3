"""``verify``: read every record of a dataset and check it against its header.

Checks, per shard: the file exists, its size and whole-file CRC-32C match the
header, every record's framing (length and data CRCs) holds, the record count
matches; its record index, if the header lists one, checks out
(:func:`superserial.format.record_index.read_index`) and holds the offsets of the records
just read (checked only for shards otherwise intact), and a compressed
shard's restart points agree with its stream: each block inflates on its own
to the bytes its index says (:func:`superserial.read.blocks.check_blocks`); then every element is decoded by the TF-free decoder of
:mod:`superserial.codec.numpy_decode`, whose checks are those of :func:`superserial.load`
(value ranges, byte sizes, shapes, row lengths, sparse indices). Problems are
collected, not raised, each naming the file, and where known the record index
and the leaf. TensorFlow is not needed (nor imported) for local paths.

Shards are checked in two passes: first all files and their framing, then
decoding, shard by shard, in batches. A shard whose framing is broken (or
whose record count is wrong) is not decoded; within a shard, decoding stops
at the first bad record, whose exact index is then found by decoding one
record at a time, and goes on with the next shard.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from superserial.codec.numpy_decode import RecordDecoder
from superserial.errors import CorruptDataError, DatasetNotFoundError, SuperserialError
from superserial.format import record_index
from superserial.format.framing import read_records
from superserial.format.header import Header, Shard
from superserial.format.layout import HEADER_FILE, extra_shard_files
from superserial.read.blocks import check_blocks
from superserial.read.opening import open_dataset
from superserial.storage import fs

__all__ = ["Problem", "ShardReport", "VerifyReport", "verify"]

log = logging.getLogger("superserial")

_READ_BATCH = 4096
_DECODE_BATCH = 256


@dataclass(frozen=True)
class Problem:
    """One thing found wrong.

    Attributes:
        file: The file at fault (a path), or None for the dataset as a whole.
        message: What was expected and what was found.
        record: The index of the bad record within ``file``, where known.
        leaf: The leaf (feature) at fault, where known.
    """

    file: str | None
    message: str
    record: int | None = None
    leaf: str | None = None

    def __str__(self) -> str:
        where = [self.file or "<dataset>"]
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.leaf is not None:
            where.append(f"leaf {self.leaf}")
        return f"{', '.join(where)}: {self.message}"


@dataclass
class ShardReport:
    """What was found in one shard file.

    Attributes:
        file: The shard's path.
        records_expected: Its record count according to the header.
        bytes_expected: Its size according to the header.
        crc32c_expected: Its CRC-32C according to the header.
        records_read: Records whose framing was read intact.
        bytes_found: Its size on disk (None if missing).
        crc32c_found: Its CRC-32C on disk (None if missing).
        elements_decoded: Elements decoded without error.
        ok: True if nothing was wrong with it.
        index_file: The path of its record index, if the header lists one.
        index_ok: Whether its index checked out; None if it has none or the
            shard itself was damaged (its index then was not checked).
    """

    file: str
    records_expected: int
    bytes_expected: int
    crc32c_expected: str
    records_read: int = 0
    bytes_found: int | None = None
    crc32c_found: str | None = None
    elements_decoded: int = 0
    ok: bool = True
    index_file: str | None = None
    index_ok: bool | None = None


@dataclass
class VerifyReport:
    """The result of :func:`verify`.

    Attributes:
        path: The dataset directory.
        element_count: The header's element count (None if the header is bad).
        shards: One report per shard listed in the header.
        problems: Everything found wrong; empty if the dataset is intact.
        seconds: How long the check took.
    """

    path: str
    element_count: int | None = None
    shards: list[ShardReport] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True if no problem was found."""
        return not self.problems

    @property
    def records_read(self) -> int:
        """Records read with intact framing, over all shards."""
        return sum(s.records_read for s in self.shards)

    @property
    def elements_decoded(self) -> int:
        """Elements decoded without error, over all shards."""
        return sum(s.elements_decoded for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-compatible data."""
        return {
            "path": self.path,
            "ok": self.ok,
            "element_count": self.element_count,
            "records_read": self.records_read,
            "elements_decoded": self.elements_decoded,
            "seconds": round(self.seconds, 3),
            "shards": [asdict(s) for s in self.shards],
            "problems": [asdict(p) for p in self.problems],
        }

    def summary(self) -> str:
        """A few human-readable lines."""
        if self.ok:
            return (
                f"OK: {self.path}: {self.elements_decoded:,} elements in {len(self.shards)} "
                f"shard(s) read and decoded ({self.seconds:.2f}s)"
            )
        lines = [f"FAILED: {self.path}: {len(self.problems)} problem(s)"]
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


# ------------------------------------------------------------------ helpers


def _read_records(
    file: str, compression: str | None, bar: Any, sizes: list[np.ndarray] | None
) -> tuple[int, str | None]:
    """Counts a file's records; (count read intact, what was wrong or None).

    With ``sizes``, appends the records' data sizes to it (for their offsets).
    """
    n, nbytes = 0, 0
    batch: list[int] = []

    def flush() -> None:
        nonlocal nbytes
        bar(len(batch), nbytes)
        if sizes is not None:
            sizes.append(np.array(batch, dtype=np.int64))
        batch.clear()
        nbytes = 0

    try:
        with fs.open_file(file, "rb") as f:
            for record in read_records(f, compression):
                n += 1
                batch.append(len(record))
                nbytes += len(record)
                if len(batch) == _READ_BATCH:
                    flush()
        return n, None
    except CorruptDataError as e:
        return n, e.reason
    finally:
        flush()


def _first_bad(
    decoder: RecordDecoder, file: str, records: list[bytes], start: int, error: CorruptDataError
) -> Problem:
    """The first record of a batch that failed with ``error`` that fails on its own.

    A batch checks one leaf across all its records before the next leaf, so
    its error may be of a later record than the first bad one.
    """
    for i, record in enumerate(records, start):
        try:
            decoder.decode([record], [f"{file} record {i}"])
        except CorruptDataError as e:
            return Problem(file, e.reason, i, e.leaf)
    return Problem(file, error.reason, None, error.leaf)


def _decode_shard(
    decoder: RecordDecoder, sr: ShardReport, compression: str | None, bar: Any
) -> Problem | None:
    """Decodes every record of one shard, in batches; the first problem, or None."""
    file, done = sr.file, 0
    batch: list[bytes] = []

    def flush() -> Problem | None:
        nonlocal done, batch
        wheres = [f"{file} record {i}" for i in range(done, done + len(batch))]
        try:
            decoder.decode(batch, wheres)
        except CorruptDataError as e:
            log.debug("decoding failed in %s after record %d; locating it", file, done)
            problem = _first_bad(decoder, file, batch, done, e)
            sr.elements_decoded = problem.record if problem.record is not None else done
            return problem
        done += len(batch)
        sr.elements_decoded = done
        bar(len(batch), 0)
        batch = []
        return None

    try:
        with fs.open_file(file, "rb") as f:
            for record in read_records(f, compression):
                batch.append(record)
                if len(batch) == _DECODE_BATCH and (problem := flush()):
                    return problem
    except CorruptDataError as e:  # the file changed since its framing was checked
        return Problem(file, e.reason, done + len(batch))
    return flush() if batch else None


def _decode(header: Header, shards: list[ShardReport], bar: Any) -> list[Problem]:
    """Decodes the records of ``shards`` as the readers do; one problem per bad shard."""
    try:
        decoder = RecordDecoder(header)
    except SuperserialError as e:
        return [Problem(None, f"expected a decodable dataset, got: {e}")]
    problems = []
    for sr in shards:
        problem = _decode_shard(decoder, sr, header.compression, bar)
        if problem is not None:
            sr.ok = False
            problems.append(problem)
    return problems


# ------------------------------------------------------------------ verify


def verify(path: str, *, progress: bool | Callable[[int, int], None] | None = None) -> VerifyReport:
    """Reads every record of the dataset at ``path`` and checks it against the header.

    Args:
        path: The dataset directory.
        progress: Show a progress bar (default: when stderr is a terminal), or
            a callable given (elements, bytes) as records are read and decoded.

    Returns:
        A report; ``report.ok`` is True if nothing was wrong, otherwise
        ``report.problems`` says what and where (file, record index, leaf).
        A malformed header is reported as a problem of ``header.json``.

    Raises:
        DatasetNotFoundError: There is no dataset directory at ``path``.
    """
    from superserial.base.progress import make_progress

    start = time.perf_counter()
    path = fs.dataset_path(path)
    report = VerifyReport(path)
    try:
        # Every shard, unchecked: this checks each file itself, and reports what is wrong.
        opened = open_dataset(path, check_files=False)
    except DatasetNotFoundError:
        raise
    except SuperserialError as e:
        report.problems.append(Problem(fs.join(path, HEADER_FILE), str(e)))
        report.seconds = time.perf_counter() - start
        return report
    header = opened.header
    report.element_count = header.element_count
    compression = header.compression
    listed = set(fs.listdir(path)) if fs.lists(path) else set()  # a web server lists nothing
    for name in extra_shard_files(path, header, listed):
        report.problems.append(
            Problem(fs.join(path, name), "expected only the header's shards, found this extra file")
        )

    # Pass 1: files, sizes, checksums, framing and record counts.
    bar = make_progress(progress, total=header.element_count, desc=f"verify {path}: read")
    intact: list[int] = []
    try:
        for i, (shard, file) in enumerate(zip(header.shards, opened.files, strict=True)):
            sr = ShardReport(file, shard.records, shard.bytes, shard.crc32c)
            report.shards.append(sr)
            sizes: list[np.ndarray] | None = [] if shard.index is not None else None
            problems = _check_shard_file(sr, compression, bar, sizes)
            if sr.records_read == shard.records and not any(p.record is not None for p in problems):
                intact.append(i)
            if shard.index is not None:
                sr.index_file = fs.join(path, shard.index.file)
                if not problems and sizes is not None:
                    problems = _check_index(path, shard, sizes, compression)
                    sr.index_ok = not problems
            sr.ok = not problems
            report.problems.extend(problems)
    finally:
        bar.close()

    # Pass 2: decode every element of the shards whose framing is intact.
    todo = [report.shards[i] for i in intact]
    bar = make_progress(
        progress, total=sum(s.records_expected for s in todo), desc=f"verify {path}: decode"
    )
    try:
        report.problems.extend(_decode(header, todo, bar))
    finally:
        bar.close()
    report.seconds = time.perf_counter() - start
    log.info("verified %s: %s", path, "ok" if report.ok else f"{len(report.problems)} problem(s)")
    return report


def _check_index(
    path: str, shard: Shard, sizes: list[np.ndarray], compression: str | None
) -> list[Problem]:
    """Checks the index of an intact ``shard`` whose records have data ``sizes``.

    A compressed shard's restart points are checked against its stream.
    """
    if shard.index is None:
        return []
    file = fs.join(path, shard.index.file)
    try:
        if compression is None:
            listed = record_index.read_index(path, shard)
        else:
            table = record_index.read_restarts(path, shard, compression)
            listed = table.offsets
    except CorruptDataError as e:
        hint = record_index.rebuild_hint(path, compression)
        return [Problem(file, f"{e.reason}; rebuild it with {hint}")]
    if compression is not None:
        bad = check_blocks(fs.join(path, shard.file), table)
        if bad is not None:
            j, found = bad
            return [
                Problem(
                    file,
                    f"expected block {j} of {shard.file} at compressed byte offset "
                    f"{int(table.packed[j])} to inflate on its own to "
                    f"{int(table.plain[j + 1] - table.plain[j])} bytes as the index says, got "
                    f"{found} (its restart points disagree with the stream); rebuild it with "
                    + record_index.rebuild_hint(path, compression),
                )
            ]
    actual = record_index.offsets_from_sizes(sizes).astype(np.int64)
    wrong = np.flatnonzero(listed != actual)
    if len(wrong):
        k = int(wrong[0])
        return [
            Problem(
                file,
                f"expected record {k} of {shard.file} at byte offset {int(actual[k])}, got "
                f"{int(listed[k])} in its index; rebuild it with {record_index.rebuild_hint(path, compression)}",
                k,
            )
        ]
    return []


def _check_shard_file(
    sr: ShardReport, compression: str | None, bar: Any, sizes: list[np.ndarray] | None = None
) -> list[Problem]:
    file = sr.file
    if not fs.exists(file):
        return [Problem(file, f"expected a shard of {sr.records_expected} records, found no file")]
    problems = []
    sr.crc32c_found, sr.bytes_found = fs.file_crc32c(file), fs.size(file)
    if sr.bytes_found != sr.bytes_expected:
        problems.append(Problem(file, f"expected {sr.bytes_expected} bytes, got {sr.bytes_found}"))
    if sr.crc32c_found != sr.crc32c_expected:
        problems.append(
            Problem(file, f"expected file crc32c {sr.crc32c_expected}, got {sr.crc32c_found}")
        )
    sr.records_read, error = _read_records(file, compression, bar, sizes)
    if error is not None:
        problems.append(Problem(file, error, sr.records_read))
    elif sr.records_read != sr.records_expected:
        problems.append(
            Problem(file, f"expected {sr.records_expected} records, got {sr.records_read}")
        )
    return problems

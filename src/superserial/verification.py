"""``verify``: read every record of a dataset and check it against its header.

Checks, per shard: the file exists, its size and whole-file CRC-32C match the
header, every record's framing CRCs hold (``TFRecordDataset`` checks them),
the record count matches; then every element is decoded by the pipeline
:func:`superserial.load` builds (``reader._records_to_dataset``, used
directly so that one shard of the wrong size does not stop the others from
being decoded), which runs all of the decoder's checks (value ranges, byte
sizes, shapes, row lengths, sparse indices). Problems are
collected, not raised, each naming the file, and where known the record index
and the leaf.

Shards are checked in two passes: first all files and their framing, then
decoding, in one pipeline over all shards. A shard whose framing is broken
(or whose record count is wrong) is not decoded; within a shard, decoding
stops at the first bad record, whose exact index is then found by decoding
one record at a time, and goes on with the next shard.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from superserial import fs
from superserial.errors import DatasetNotFoundError, SuperserialError
from superserial.header import Header
from superserial.layout import HEADER_FILE

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

_TF_NOISE = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$")
# The codec's assertion messages: "superserial: <what> at <leaf>", inside
# "[...] [Condition ...]" in graph errors.
_OUR_MSGS = (
    re.compile(r"assertion failed: \[superserial: (.*) at (.*)\]\s*$", re.M),
    re.compile(r"superserial: (.*) at (.*?)\] \[Condition"),
    re.compile(r"superserial: (.*) at (\S.*?)\s*$", re.M),
)
_FEATURE_MSG = re.compile(r"(?:Key|Feature):? ([^\s,]+?)[.,]?\s")


def _clean(message: str) -> str:
    """The informative line(s) of a TensorFlow error message, without graph noise."""
    lines = []
    for line in message.splitlines():
        line = _TF_NOISE.sub("", line).strip()
        if not line or line.startswith(
            ("File ", "[[", "Graph execution error", "Detected at node")
        ):
            continue
        lines.append(line)
    text = " ".join(lines) if lines else message.strip()
    return text.replace("Name: <unknown>, ", "")


def _describe(header: Header, message: str) -> tuple[str, str | None]:
    """(message, leaf) of a decoding error, the leaf found in the message."""
    for pattern in _OUR_MSGS:
        m = pattern.search(message)
        if m:
            return m.group(1), m.group(2)
    owner = {name: leaf.name for leaf in header.leaves for name in leaf.feature_names()}
    for m in _FEATURE_MSG.finditer(message):
        if m.group(1) in owner:
            return _clean(message), owner[m.group(1)]
    return _clean(message), None


def _crc_and_size(path: str) -> tuple[str, int]:

    return fs.file_crc32c(path), fs.size(path)


def _read_records(tf: Any, file: str, compression: str, bar: Any) -> tuple[int, str | None]:
    """Counts a file's records; (count read intact, error message or None)."""
    n = 0
    try:
        for batch in tf.data.TFRecordDataset(file, compression).batch(_READ_BATCH):
            records = batch.numpy()
            n += len(records)
            bar(len(records), sum(map(len, records)))
        return n, None
    except tf.errors.OpError as e:
        first = _clean(e.message)
    # Find the exact record: skip the intact batches, then read one by one.
    exact = n
    try:
        for _ in tf.data.TFRecordDataset(file, compression).skip(n):
            exact += 1
    except tf.errors.OpError as e:
        first = _clean(e.message)
    return exact, first


def _record_checker(tf: Any, header: Header) -> Callable[[Any], Any]:
    """A function decoding a batch of one record, raising what ``load`` would."""
    from superserial import codec, codec_decode

    leaves = header.leaves
    spec = codec_decode.parse_spec(leaves)

    @tf.function(input_signature=[tf.TensorSpec([1], tf.string)])
    def check(serialized: Any) -> Any:
        parsed = tf.io.parse_example(serialized, spec)
        comps = codec_decode.decode_batch(leaves, parsed)
        joined = []
        for leaf, comp in zip(leaves, comps, strict=True):
            if codec.needs_join(leaf):
                one = tuple(c[0] for c in comp) if isinstance(comp, tuple) else comp[0]
                joined.append(codec.join_element((leaf,), [one])[0])
            else:
                joined.append(comp)
        # Return every component: anything not returned could be pruned, checks included.
        return tf.nest.flatten(joined, expand_composites=True)

    return check


def _find_bad_record(
    tf: Any, header: Header, shards: list[ShardReport], start: int
) -> tuple[int, int, str, str | None] | None:
    """Decodes records one by one from ``start`` in ``shards[0]`` on.

    Returns:
        (shard position in ``shards``, record index, message, leaf) of the
        first bad record, or None.
    """
    check = _record_checker(tf, header)
    for pos, sr in enumerate(shards):
        records = tf.data.TFRecordDataset(sr.file, header.compression or "")
        begin = start if pos == 0 else 0
        for i, rec in enumerate(records.skip(begin)):
            try:
                check(rec[None])
            except tf.errors.OpError as e:
                message, leaf = _describe(header, e.message)
                return pos, begin + i, message, leaf
    return None


def _decode(tf: Any, header: Header, shards: list[ShardReport], bar: Any) -> list[Problem]:
    """Decodes the records of ``shards`` as ``load`` does; one problem per bad shard.

    One pipeline reads all the shards; after a failure, the bad record is
    found by decoding one record at a time, and a new pipeline goes on with
    the next shard.
    """
    from superserial.reader import records_to_dataset as _records_to_dataset

    problems: list[Problem] = []
    while shards:
        count = sum(s.records_expected for s in shards)
        try:
            ds = _records_to_dataset(header, [s.file for s in shards], count)
        except SuperserialError as e:
            problems.append(Problem(None, f"expected a loadable dataset, got: {e}"))
            return problems
        # Every element is produced (and so fully decoded and checked)
        # upstream; only a count comes out, in batches.
        ds = ds.map(lambda *el: tf.constant(1, tf.int8)).batch(_DECODE_BATCH)
        decoded = 0
        try:
            for batch in ds:
                k = int(batch.shape[0])
                decoded += k
                bar(k, 0)
            for s in shards:
                s.elements_decoded = s.records_expected
            return problems
        except tf.errors.OpError as e:
            first_message, first_leaf = _describe(header, e.message)
        # The bad record is at or after ``decoded`` (batches come in order).
        pos = 0
        while decoded >= shards[pos].records_expected:
            shards[pos].elements_decoded = shards[pos].records_expected
            decoded -= shards[pos].records_expected
            pos += 1
        log.debug("decoding failed in %s after record %d; locating it", shards[pos].file, decoded)
        found = _find_bad_record(tf, header, shards[pos:], decoded)
        if found is None:
            bad, record, message, leaf = pos, None, first_message, first_leaf
        else:
            step, record, message, leaf = found
            bad = pos + step
        for s in shards[pos:bad]:
            s.elements_decoded = s.records_expected
        shards[bad].elements_decoded = record if record is not None else decoded
        shards[bad].ok = False
        problems.append(Problem(shards[bad].file, message, record, leaf))
        shards = shards[bad + 1 :]
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
    import tensorflow as tf

    from superserial.layout import read_header
    from superserial.progress import make_progress

    start = time.perf_counter()
    path = str(path).rstrip("/") or "/"
    report = VerifyReport(path)
    try:
        header = read_header(path)
    except DatasetNotFoundError:
        raise
    except SuperserialError as e:
        report.problems.append(Problem(fs.join(path, HEADER_FILE), str(e)))
        report.seconds = time.perf_counter() - start
        return report
    report.element_count = header.element_count
    compression = header.compression or ""
    listed = {s.file for s in header.shards}
    for name in sorted(fs.listdir(path)):
        if name.startswith("data-") and name.endswith(".tfrecord") and name not in listed:
            report.problems.append(
                Problem(
                    fs.join(path, name), "expected only the header's shards, found this extra file"
                )
            )

    # Pass 1: files, sizes, checksums, framing and record counts.
    bar = make_progress(progress, total=header.element_count, desc=f"verify {path}: read")
    intact: list[int] = []
    try:
        for i, shard in enumerate(header.shards):
            file = fs.join(path, shard.file)
            sr = ShardReport(file, shard.records, shard.bytes, shard.crc32c)
            report.shards.append(sr)
            problems = _check_shard_file(tf, sr, compression, bar)
            sr.ok = not problems
            report.problems.extend(problems)
            if sr.records_read == shard.records and not any(p.record is not None for p in problems):
                intact.append(i)
    finally:
        bar.close()

    # Pass 2: decode every element of the shards whose framing is intact.
    todo = [report.shards[i] for i in intact]
    bar = make_progress(
        progress, total=sum(s.records_expected for s in todo), desc=f"verify {path}: decode"
    )
    try:
        report.problems.extend(_decode(tf, header, todo, bar))
    finally:
        bar.close()
    report.seconds = time.perf_counter() - start
    log.info("verified %s: %s", path, "ok" if report.ok else f"{len(report.problems)} problem(s)")
    return report


def _check_shard_file(tf: Any, sr: ShardReport, compression: str, bar: Any) -> list[Problem]:
    file = sr.file
    if not fs.exists(file):
        return [Problem(file, f"expected a shard of {sr.records_expected} records, found no file")]
    problems = []
    sr.crc32c_found, sr.bytes_found = _crc_and_size(file)
    if sr.bytes_found != sr.bytes_expected:
        problems.append(Problem(file, f"expected {sr.bytes_expected} bytes, got {sr.bytes_found}"))
    if sr.crc32c_found != sr.crc32c_expected:
        problems.append(
            Problem(file, f"expected file crc32c {sr.crc32c_expected}, got {sr.crc32c_found}")
        )
    sr.records_read, error = _read_records(tf, file, compression, bar)
    if error is not None:
        problems.append(Problem(file, f"expected an intact record, got: {error}", sr.records_read))
    elif sr.records_read != sr.records_expected:
        problems.append(
            Problem(file, f"expected {sr.records_expected} records, got {sr.records_read}")
        )
    return problems

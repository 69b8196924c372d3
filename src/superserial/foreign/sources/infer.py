"""``infer``: a dataset of TFRecord files of ``tf.train.Example`` written elsewhere.

The records are scanned (all, or the first ``sample``) for feature names,
kinds and lengths, a header structure is inferred from them, and the records
are written into the dataset through the one shard writer, one shard per
input file, in the compression of the inputs. Uncompressed, the shard files
are byte for byte the input files (TFRecord framing is deterministic);
compressed, they hold the same records, compressed anew. Other containers of
Examples (ArrayRecord files, :mod:`superserial.foreign.sources.array_record`) come
in through :func:`infer_records` with a reader of their own: the scan, the
inference and the copy are these. The dataset is
committed as ``save`` commits: under the path's lock, in the work
directory, header last (:func:`superserial.write.local_commit.commit_dataset`).

Inference rules: ``int64_list`` -> int64, ``float_list`` -> float32,
``bytes_list`` -> string; a length always 1 -> a scalar, always n -> shape
[n]; varying, sometimes missing or always empty -> a ragged leaf of shape
[None]. Names with "/" become nested dicts.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from superserial._version import __version__
from superserial.base.progress import make_progress
from superserial.errors import CorruptDataError, DatasetNotFoundError, HeaderError
from superserial.format import layout
from superserial.format.framing import frame_batches, read_records
from superserial.format.header import Header, Shard
from superserial.format.structure import DictNode, Leaf, leaf_name
from superserial.format.wire import parse_features
from superserial.storage import fs
from superserial.write import local_commit
from superserial.write.loop import write_shards
from superserial.write.parts import MakeHeader
from superserial.write.targets import open_target

__all__ = ["InferReport", "InferredFeature", "ReadRecords", "infer", "infer_records"]

log = logging.getLogger("superserial")

_GLOB_CHARS = frozenset("*?[")
_DTYPE_OF_KIND = {"int64_list": "int64", "float_list": "float32", "bytes_list": "string"}
# Records handed to the shard writer at once: by count, and by bytes for large records.
_BATCH_RECORDS = 1024
_BATCH_BYTES = 64 << 20

ReadRecords = Callable[[str], Iterator[bytes]]
"""The records of one input file, in order; errors name the file and the record."""


@dataclass(frozen=True)
class InferredFeature:
    """What ``infer`` made of one feature.

    Attributes:
        feature: The feature name in the records.
        kind: ``int64_list``, ``float_list`` or ``bytes_list``.
        dtype: The leaf's dtype.
        leaf_kind: ``dense`` or ``ragged``.
        shape: The leaf's shape (None: a ragged dimension).
        lengths: The (shortest, longest) value list seen.
        present_in: How many scanned records have the feature.
        ragged_because: Why a ragged leaf is ragged, else None.
    """

    feature: str
    kind: str
    dtype: str
    leaf_kind: str
    shape: tuple[int | None, ...]
    lengths: tuple[int, int]
    present_in: int
    ragged_because: str | None

    def to_obj(self) -> dict[str, Any]:
        """A JSON-able dict of the fields."""
        return {
            "feature": self.feature,
            "kind": self.kind,
            "dtype": self.dtype,
            "leaf_kind": self.leaf_kind,
            "shape": list(self.shape),
            "lengths": list(self.lengths),
            "present_in": self.present_in,
            "ragged_because": self.ragged_because,
        }


@dataclass(frozen=True)
class InferReport:
    """What ``infer`` scanned and inferred (the header has the rest).

    Attributes:
        path: The dataset written.
        files: The input files, in the order written (globs sorted).
        element_count: Records in all files (the dataset's elements).
        records_scanned: Records the structure was inferred from.
        compression: Of the inputs and the dataset: None, "GZIP" or "ZLIB".
        features: One entry per feature, sorted by name.
        note: A warning when only some records were scanned, else None.
    """

    path: str
    files: list[str]
    element_count: int
    records_scanned: int
    compression: str | None
    features: list[InferredFeature]
    note: str | None

    def to_obj(self) -> dict[str, Any]:
        """A JSON-able dict of the fields (``superserial infer --json``)."""
        return {
            "path": self.path,
            "files": self.files,
            "element_count": self.element_count,
            "records_scanned": self.records_scanned,
            "compression": self.compression,
            "features": [f.to_obj() for f in self.features],
            "note": self.note,
        }


def _expand_inputs(patterns: Sequence[str]) -> list[str]:
    """The input files: globs expanded and sorted, duplicates dropped, order kept."""
    files: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matches = fs.glob(pattern)
            if not matches:
                raise DatasetNotFoundError(f"expected files matching {pattern}, found none")
        else:
            if not fs.exists(pattern):
                raise DatasetNotFoundError(f"expected a TFRecord file at {pattern}, found none")
            matches = [pattern]
        for m in matches:
            if fs.isdir(m):
                raise CorruptDataError(f"expected a TFRecord file, got a directory at {m}")
            if m not in files:
                files.append(m)
    return files


def _records(file: str, compression: str | None) -> Iterator[bytes]:
    """The records of ``file``, framing checked; errors name the file and record."""
    n = 0
    try:
        with fs.open_file(file, "rb") as f:
            for record in read_records(f, compression):
                yield record
                n += 1
    except CorruptDataError as e:
        raise CorruptDataError(
            f"expected intact TFRecord framing, got a fault in {file} record {n}: {e.reason}",
            reason=e.reason,
        ) from e


def _detect_compression(file: str) -> str | None:
    """The compression of a TFRecord file: None, "GZIP" or "ZLIB"."""
    with fs.open_file(file, "rb") as f:
        magic = f.read(2)
    if not magic:
        return None
    if magic == b"\x1f\x8b":
        return "GZIP"
    for candidate in (None, "ZLIB"):
        try:
            next(_records(file, candidate), None)
            return candidate
        except CorruptDataError:
            continue
    raise CorruptDataError(
        f"expected a TFRecord file (uncompressed, GZIP or ZLIB), got unreadable data at {file}"
    )


def _input_compression(files: list[str], compression: str | None) -> str | None:
    choice = (compression or "none").upper()
    if choice == "AUTO":
        # An empty file reads as empty under any compression: it does not vote.
        found = {_detect_compression(f) or "none" for f in files if fs.size(f) > 0}
        if len(found) > 1:
            raise CorruptDataError(
                f"expected input files of one compression, got {' and '.join(sorted(found))}"
            )
        return None if found in (set(), {"none"}) else found.pop()
    if choice not in ("NONE", "GZIP", "ZLIB"):
        raise ValueError(
            f"expected compression 'auto', None, 'GZIP' or 'ZLIB', got {compression!r}"
        )
    return None if choice == "NONE" else choice


class _FeatureStats:
    """What the scanned records say about one feature."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.lengths: set[int] = set()
        self.present = 0


def _scan_file(
    file: str,
    read: ReadRecords,
    limit: int | None,
    stats: dict[str, _FeatureStats],
    bar: Callable[[int, int], None],
) -> tuple[int, int]:
    """Scans up to ``limit`` records of ``file`` into ``stats``; (scanned, total records)."""
    records = read(file)
    scanned = 0
    while True:
        want = _BATCH_RECORDS if limit is None else min(_BATCH_RECORDS, limit - scanned)
        batch = list(itertools.islice(records, want))
        if not batch:
            break
        for rec in batch:
            for name, feature in parse_features(rec, f"{file} record {scanned}").items():
                s = stats.get(name)
                if s is None:
                    s = stats[name] = _FeatureStats()
                kind = feature.WhichOneof("kind")
                s.present += 1
                if kind is None:
                    s.lengths.add(0)
                else:
                    s.kinds.add(kind)
                    s.lengths.add(len(getattr(feature, kind).value))
            scanned += 1
        bar(len(batch), sum(map(len, batch)))
    return scanned, scanned + sum(1 for _ in records)


def _infer_structure(
    stats: dict[str, _FeatureStats], scanned: int
) -> tuple[DictNode, list[InferredFeature]]:
    """The header structure for the scanned features, and a description per leaf."""
    if not stats:
        raise HeaderError("expected records with at least one feature, got none")
    tree: dict[str, Any] = {}
    described = []
    for name in sorted(stats):
        s = stats[name]
        if "~" in name:
            raise HeaderError(
                f"expected feature names without '~' (superserial reserves it), got {name!r}"
            )
        if len(s.kinds) > 1:
            raise HeaderError(
                f"expected one kind per feature, got {' and '.join(sorted(s.kinds))} at {name!r}"
            )
        if not s.kinds:
            raise HeaderError(
                f"expected a feature with a kind (int64_list, float_list, bytes_list), "
                f"got none set in every scanned record at {name!r}"
            )
        kind = next(iter(s.kinds))
        dtype = _DTYPE_OF_KIND[kind]
        # Always empty says nothing about a length: ragged is safe for any.
        fixed = s.present == scanned and len(s.lengths) == 1 and 0 not in s.lengths
        path = tuple(name.split("/"))
        lname = leaf_name(path)
        why: str | None
        if fixed:
            n = next(iter(s.lengths))
            leaf = Leaf(lname, "dense", dtype, () if n == 1 else (n,))
            why = None
        else:
            leaf = Leaf(lname, "ragged", dtype, (None,), ragged_rank=0, row_splits_dtype="int64")
            # A ragged leaf of one length puzzles; say what made it ragged.
            if s.present < scanned:
                why = f"missing in {scanned - s.present:,} of {scanned:,} scanned records"
            elif len(s.lengths) > 1:
                why = "lengths vary"
            else:
                why = "always empty"
        node = tree
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise HeaderError(
                    f"expected feature names that form a tree, got {'/'.join(path[: i + 1])!r} "
                    f"both as a feature and as a prefix of {name!r}"
                )
            node = child
        if path[-1] in node:
            raise HeaderError(
                f"expected feature names that form a tree, got {name!r} both as a feature "
                f"and as a prefix of other features"
            )
        node[path[-1]] = leaf
        lengths = sorted(s.lengths)
        described.append(
            InferredFeature(
                feature=name,
                kind=kind,
                dtype=dtype,
                leaf_kind=leaf.kind,
                shape=tuple(leaf.shape),
                lengths=(lengths[0], lengths[-1]),
                present_in=s.present,
                ragged_because=why,
            )
        )

    def build(d: dict[str, Any]) -> DictNode:
        return DictNode({k: v if isinstance(v, Leaf) else build(v) for k, v in sorted(d.items())})

    return build(tree), described


def _batches(records: Iterator[bytes]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Records in batches for the shard writer: (array of bytes, their sizes)."""
    batch: list[bytes] = []
    size = 0
    for record in itertools.chain(records, [None]):
        if record is not None:
            batch.append(record)
            size += len(record)
        if batch and (record is None or len(batch) == _BATCH_RECORDS or size >= _BATCH_BYTES):
            recs = np.empty(len(batch), dtype=object)
            recs[:] = batch
            yield recs, np.fromiter(map(len, batch), np.int64, len(batch))
            batch, size = [], 0


def _copied(
    files: list[str], counts: list[int], read: ReadRecords
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The records of ``files`` in framed batches, each file checked to hold its scanned count.

    Raises:
        CorruptDataError: A file holds another number of records than scanned.
    """
    for file, count in zip(files, counts, strict=True):
        n = 0
        for framed, sizes in frame_batches(_batches(read(file))):
            n += len(sizes)
            yield framed, sizes
        if n != count:
            raise CorruptDataError(
                f"expected {count} records in {file} as scanned, got {n}; was it changed meanwhile?"
            )


def _write_locked(
    files: list[str],
    counts: list[int],
    read: ReadRecords,
    output: str,
    compression: str | None,
    make_header: MakeHeader,
    overwrite: bool,
    hint: str,
    progress: bool | Callable[[int, int], None] | None,
    label: str,
) -> Header:
    """Writes and commits the dataset, one shard per input file; call with the output's SaveLock held."""
    layout.check_target(output, overwrite, hint=hint)
    target = open_target(
        output,
        make_header,
        fingerprint={"infer": files, "compression": compression, "counts": counts},
        count=len(counts),
        overwrite=overwrite,
        hint=hint,
        plain_names=True,
        resumable=False,  # infer has no resume: a failed copy starts over
    )
    bar = make_progress(progress, total=sum(counts), desc=f"{label}: copy")
    try:
        return write_shards(
            _copied(files, counts, read),
            target,
            compression=compression,
            quotas=counts,
            progress=bar,
        )
    finally:
        bar.close()


def _check_sample(sample: Any) -> None:
    if sample is not None and (
        isinstance(sample, bool) or not isinstance(sample, int) or sample < 1
    ):
        raise ValueError(f"expected sample >= 1 or None, got {sample!r}")


def infer(
    inputs: Sequence[str],
    output: str,
    *,
    sample: int | None = None,
    compression: str | None = "auto",
    overwrite: bool = False,
    progress: bool | Callable[[int, int], None] | None = None,
    overwrite_hint: str = "overwrite=True",
) -> tuple[Header, InferReport]:
    """Makes a dataset at ``output`` of TFRecord files of ``tf.train.Example``.

    The input files are never modified. All records are counted, also with
    ``sample``. A feature that is missing or of another length in a record
    that was not scanned makes loading fail at that record; one first seen
    there is ignored.

    Args:
        inputs: TFRecord files or glob patterns (each glob's matches sorted);
            written in this order, one shard per file.
        output: The dataset directory to create.
        sample: Infer from the first ``sample`` records only.
        compression: Of the input files (and the dataset): ``"auto"``
            (detected), None/``"none"``, ``"GZIP"`` or ``"ZLIB"``.
        overwrite: Replace an existing dataset at ``output``.
        progress: As for ``save``: a bar, none, or a callable given
            (elements, bytes) per batch, once for the scan, once for the writing.
        overwrite_hint: How the caller's user asks for ``overwrite``, for messages.

    Returns:
        The header written, and what was scanned and inferred.

    Raises:
        DatasetNotFoundError: An input or glob names no file.
        CorruptDataError: An input is no TFRecord file, has damaged framing
            or a record that is no ``tf.train.Example``, inputs differ in
            compression, or none has a record.
        HeaderError: The features cannot form a header (mixed kinds, a
            name with "~", names that are not a tree...).
        DatasetExistsError: ``output`` exists and ``overwrite`` is False.
        DatasetLockedError: Another process is saving to ``output``.
    """
    _check_sample(sample)
    output = fs.dataset_path(output)
    files = _expand_inputs(inputs)
    layout.check_target(output, overwrite, hint=overwrite_hint)
    comp = _input_compression(files, compression)

    def read(file: str) -> Iterator[bytes]:
        return _records(file, comp)

    return infer_records(
        files,
        read,
        output,
        compression=comp,
        sample=sample,
        overwrite=overwrite,
        progress=progress,
        overwrite_hint=overwrite_hint,
    )


def infer_records(
    files: list[str],
    read: ReadRecords,
    output: str,
    *,
    compression: str | None = None,
    sample: int | None = None,
    overwrite: bool = False,
    progress: bool | Callable[[int, int], None] | None = None,
    overwrite_hint: str = "overwrite=True",
    label: str = "infer",
    metadata: dict[str, Any] | None = None,
) -> tuple[Header, InferReport]:
    """Makes a dataset at ``output`` of the ``tf.train.Example`` records ``read`` gives.

    What :func:`infer` does once its TFRecord files are found: every file's
    records scanned (or the first ``sample``) and counted, a structure
    inferred, then each file copied into one shard. Without ``sample`` every
    record is parsed before anything is written, so a record that is no
    Example fails with nothing written.

    Args:
        files: The input files, in the order written.
        read: The records of one file, in order; called twice per file
            (scan, copy).
        output: The dataset directory to create.
        compression: Of the dataset's shards: None, ``"GZIP"`` or ``"ZLIB"``.
        sample: Infer from the first ``sample`` records only.
        overwrite: Replace an existing dataset at ``output``.
        progress: As for :func:`infer`.
        overwrite_hint: How the caller's user asks for ``overwrite``, for messages.
        label: The name of the operation in progress bars and the header's writer.
        metadata: The header's ``metadata`` object.

    Returns:
        The header written, and what was scanned and inferred.

    Raises:
        CorruptDataError: A record is no ``tf.train.Example`` (the message
            names its file and index), a file changed between the scan and
            the copy, or no file has a record.
        HeaderError: The features cannot form a header.
        DatasetExistsError: ``output`` exists and ``overwrite`` is False.
        DatasetLockedError: Another process is saving to ``output``.
    """
    _check_sample(sample)
    output = fs.dataset_path(output)
    layout.check_target(output, overwrite, hint=overwrite_hint)

    stats: dict[str, _FeatureStats] = {}
    counts: list[int] = []
    scanned = 0
    bar = make_progress(progress, total=sample, desc=f"{label}: scan")
    try:
        for f in files:
            limit = None if sample is None else sample - scanned
            n_scanned, n_total = _scan_file(f, read, limit, stats, bar)
            scanned += n_scanned
            counts.append(n_total)
    finally:
        bar.close()
    total = sum(counts)
    if scanned == 0:
        raise CorruptDataError(
            f"expected at least one record to infer from, got none in {len(files)} file(s)"
        )
    structure, features = _infer_structure(stats, scanned)
    writer = f"superserial {__version__} {label}"

    def make_header(shards: tuple[Shard, ...]) -> Header:
        header = Header(
            structure, total, compression, shards, writer=writer, metadata=dict(metadata or {})
        )
        Header.from_json(header.to_json(), source=f"inferred header for {output}")  # all checks
        return header

    with local_commit.SaveLock(output):
        header = _write_locked(
            files,
            counts,
            read,
            output,
            compression,
            make_header,
            overwrite,
            overwrite_hint,
            progress,
            label,
        )
    log.info(
        "inferred %s from %d file(s), %d records (%d scanned)", output, len(files), total, scanned
    )
    note = None
    if scanned < total:
        note = (
            f"inferred from the first {scanned:,} of {total:,} records: a feature missing or of "
            "another length in a later record fails at load; features first seen later are ignored. "
            f"Run `superserial verify {output}` to check every record."
        )
    return header, InferReport(output, files, total, scanned, compression, features, note)

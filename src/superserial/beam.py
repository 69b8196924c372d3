"""Apache Beam transforms: write and read superserial datasets in a pipeline.

    import apache_beam as beam
    import superserial.beam as ssb

    with beam.Pipeline(options=options) as p:
        (p | beam.Create(elements)          # nested numpy structures
           | ssb.WriteToSuperSerial("gs://bucket/ds", element_spec))
    with beam.Pipeline(options=options) as p:
        elements = p | ssb.ReadFromSuperSerial("gs://bucket/ds")

Writing: elements are grouped with ``beam.BatchElements``, each batch is
encoded with TensorFlow (eager) by the very function ``superserial.save``
uses, so the records are byte for byte those ``save`` writes for the same
elements. The records go to Beam's own TFRecord sink
(``beam.io.WriteToTFRecord``), which writes ``data-SSSSS-of-NNNNN.tfrecord``
in the dataset directory with its usual temporary-file-and-rename commit.
Then every written file is read once, in parallel, for its record count, size
and CRC-32C, and a last singleton step writes ``header.json`` atomically
(temporary file and rename). The dataset is valid only once the header is
there.

Element order: a ``PCollection`` has none. The dataset's order is the order
Beam produced: shard files in shard-number order, records in file order. A
second run may order elements differently; counts are exact (taken from the
files as written). To keep an order, put a key (an index) in each element.

Reading: one work item per shard file (redistributed with
``beam.Reshuffle``), decoded by the TensorFlow-free reader
:mod:`superserial.numpy`; elements come out as it yields them (dense leaves
as ``np.ndarray``, ragged as :class:`superserial.numpy.Ragged`, sparse as
:class:`superserial.numpy.Sparse`, namedtuples rebuilt from the header).

Every kind of leaf superserial stores is supported (dense, ragged, sparse;
every dtype; dicts, tuples, namedtuples). Input values are converted as
:func:`superserial.distributed.to_tensors` describes; a value that does not
match ``element_spec`` fails the pipeline with an
:class:`~superserial.errors.UnsupportedError` naming the leaf.

The same pipeline runs on Dataflow, Flink or Spark by changing only the
pipeline options (``--runner``, project, temp location...); the workers need
``superserial[beam]`` and TensorFlow installed (writing; reading needs no
TensorFlow).

This module imports ``apache_beam``; ``import superserial`` does not.
"""

from __future__ import annotations

import copyreg
import io
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import google_crc32c
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from superserial import __version__, fs
from superserial.errors import CorruptDataError, DatasetExistsError
from superserial.header import Header, Shard, normalize_compression
from superserial.layout import HEADER_FILE
from superserial.structure import DictNode, NamedTupleNode, TupleNode

__all__ = ["ReadFromSuperSerial", "WriteToSuperSerial"]

log = logging.getLogger("superserial")

# Beam's names for the compressions superserial writes. Beam's DEFLATE is a
# zlib stream (RFC 1950), which is what TensorFlow calls ZLIB.
_BEAM_COMPRESSION = {
    None: CompressionTypes.UNCOMPRESSED,
    "GZIP": CompressionTypes.GZIP,
    "ZLIB": CompressionTypes.DEFLATE,
}
_PREFIX, _SUFFIX, _TEMPLATE = "data", ".tfrecord", "-SSSSS-of-NNNNN"
_NAME_RE = re.compile(r"^data-(\d{5,})-of-(\d{5,})\.tfrecord$")


def _template_json(structure: Any, compression: str | None) -> str:
    """A header without shards: how workers learn the structure, as plain JSON."""
    return Header(structure, 0, compression, (), writer="").to_json()


class _EncodeBatch(beam.DoFn):
    """A batch of numpy elements -> their serialized records, as ``save`` makes them."""

    def __init__(self, template: str) -> None:
        self._template = template
        self._encoder: Any = None

    def setup(self) -> None:
        from superserial.encoder import ElementEncoder
        from superserial.spec import to_element_spec

        header = Header.from_json(self._template, source="WriteToSuperSerial")
        # Built once per DoFn instance (Beam gives each thread its own).
        self._encoder = ElementEncoder(to_element_spec(header.structure), header.leaves)

    def process(self, batch: list[Any]) -> Iterator[bytes]:
        if self._encoder is None:
            self.setup()
        for records, _ in self._encoder.encode(batch):
            yield from records.tolist()


class _CrcTee(io.RawIOBase):
    """Reads a raw file, keeping its CRC-32C and size."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.crc, self.size = raw, 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.raw.read(len(b))
        n = len(data)
        b[:n] = data
        self.crc = google_crc32c.extend(self.crc, data)
        self.size += n
        return n


def _stat_shard(file: str, compression: str | None) -> Shard:
    """Counts the records of one written file (checking their framing), with size and CRC."""
    from superserial.numpy import read_records

    name = file.rstrip("/").rsplit("/", 1)[-1]
    if not _NAME_RE.match(name):
        raise CorruptDataError(
            f"expected a shard named data-SSSSS-of-NNNNN.tfrecord, got {name!r} at {file}"
        )
    with FileSystems.open(file, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        tee = _CrcTee(raw)
        stream = io.BufferedReader(tee, 1 << 20)
        records = sum(1 for _ in read_records(stream, compression))
        while stream.read(1 << 20):  # whatever the record reader left unread
            pass
    return Shard(name, records, tee.size, f"{tee.crc:08x}")


def _write_header(shards: list[Shard], path: str, template: str) -> Header:
    """The last step: checks the shard set and writes ``header.json`` atomically."""
    base = Header.from_json(template, source="WriteToSuperSerial")
    shards = sorted(shards, key=lambda s: s.file)
    for k, s in enumerate(shards):
        m = _NAME_RE.match(s.file)
        if m is None or int(m.group(1)) != k or int(m.group(2)) != len(shards):
            raise CorruptDataError(
                f"expected shard {k} of {len(shards)} from Beam's sink, got {s.file} at {path}"
            )
    header = Header(
        base.structure,
        sum(s.records for s in shards),
        base.compression,
        tuple(shards),
        writer=f"superserial {__version__} (apache_beam)",
    )
    fs.write_atomically(fs.join(path, HEADER_FILE), header.to_json())
    log.info(
        "WriteToSuperSerial: %d elements in %d shard(s), %d bytes at %s",
        header.element_count,
        len(shards),
        header.total_bytes,
        path,
    )
    return header


class WriteToSuperSerial(beam.PTransform):
    """Writes a ``PCollection`` of nested numpy structures as a superserial dataset.

    Args:
        path: The dataset directory (local, ``gs://``..., any filesystem both
            Beam and TensorFlow's ``tf.io.gfile`` reach). Must hold no dataset.
        element_spec: The ``tf.data`` element spec the elements match: its
            structure (dicts, tuples, namedtuples), dtypes, shapes, ragged and
            sparse leaves.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        num_shards: The number of files; 0 lets the runner decide.
        min_batch_size: Fewest elements encoded together (``BatchElements``).
        max_batch_size: Most elements encoded together.

    The output is a ``PCollection`` holding the one :class:`~superserial.Header`
    written. Element order: see the module documentation.

    Raises:
        UnsupportedError: ``element_spec`` holds a leaf superserial cannot
            store (at construction); an element does not match it (when run).
        DatasetExistsError: ``path`` already holds a dataset or shard files.
    """

    def __init__(
        self,
        path: str,
        element_spec: Any,
        *,
        compression: str | None = None,
        num_shards: int = 0,
        min_batch_size: int = 1,
        max_batch_size: int = 1024,
    ) -> None:
        super().__init__()
        from superserial.spec import from_element_spec

        self.path = str(path).rstrip("/") or "/"
        structure = from_element_spec(element_spec)
        self.compression = normalize_compression(compression)
        self._template = _template_json(structure, self.compression)
        if not isinstance(num_shards, int) or num_shards < 0:
            raise ValueError(f"expected num_shards >= 0, got {num_shards!r}")
        if not 1 <= min_batch_size <= max_batch_size:
            raise ValueError(
                f"expected 1 <= min_batch_size <= max_batch_size, got {min_batch_size}, {max_batch_size}"
            )
        self.num_shards, self.min_batch_size, self.max_batch_size = (
            num_shards,
            min_batch_size,
            max_batch_size,
        )
        if fs.exists(self.path) and fs.isdir(self.path):
            taken = [n for n in fs.listdir(self.path) if n == HEADER_FILE or _NAME_RE.match(n)]
            if taken:
                raise DatasetExistsError(
                    f"expected no dataset at {self.path}, found {sorted(taken)[0]}; remove it first"
                )

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        files = (
            pcoll
            | "Batch"
            >> beam.BatchElements(
                min_batch_size=self.min_batch_size, max_batch_size=self.max_batch_size
            )
            | "Encode" >> beam.ParDo(_EncodeBatch(self._template))
            | "Write"
            >> beam.io.WriteToTFRecord(
                fs.join(self.path, _PREFIX),
                file_name_suffix=_SUFFIX,
                num_shards=self.num_shards,
                shard_name_template=_TEMPLATE,
                compression_type=_BEAM_COMPRESSION[self.compression],
            )
        )
        return (
            files
            | "Stat" >> beam.Map(_stat_shard, self.compression)
            | "Collect" >> beam.combiners.ToList()
            | "Header" >> beam.Map(_write_header, self.path, self._template)
        )


def _make_namedtuple(name: str, fields: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    from superserial import numpy as ssnp

    return ssnp._namedtuple(name, tuple(fields))(*values)


def _reduce_namedtuple(obj: Any) -> tuple[Any, ...]:
    return _make_namedtuple, (type(obj).__name__, tuple(obj._fields), tuple(obj))


def _register_namedtuples(node: Any) -> None:
    """Makes the reader's namedtuple classes picklable, for Beam's coders.

    They are made at run time from the header, so pickle cannot find them by
    name; they are pickled as (name, fields, values) instead.
    """
    from superserial import numpy as ssnp

    if isinstance(node, NamedTupleNode):
        copyreg.pickle(ssnp._namedtuple(node.name, node.fields), _reduce_namedtuple)
    if isinstance(node, DictNode):
        for child in node.items.values():
            _register_namedtuples(child)
    elif isinstance(node, TupleNode | NamedTupleNode):
        for child in node.items:
            _register_namedtuples(child)


class _ReadShard(beam.DoFn):
    """A shard index -> the elements of that shard file, as numpy values."""

    def __init__(self, path: str, header_json: str) -> None:
        self._path, self._header_json = path, header_json
        self._header: Header | None = None

    def setup(self) -> None:
        self._header = Header.from_json(self._header_json, source=fs.join(self._path, HEADER_FILE))
        _register_namedtuples(self._header.structure)

    def process(self, index: int) -> Iterator[Any]:
        from superserial import numpy as ssnp

        if self._header is None:
            self.setup()
        assert self._header is not None
        shard = self._header.shards[index]
        # One file: its framing, CRCs and record count are checked as it is read.
        data = ssnp.NumpyDataset(
            self._path, self._header, [fs.join(self._path, shard.file)], [shard.records]
        )
        yield from data


class ReadFromSuperSerial(beam.PTransform):
    """Reads a superserial dataset as a ``PCollection`` of numpy structures.

    One work item per shard file. The header is read when the pipeline is
    built. Elements come out as :mod:`superserial.numpy` yields them; their
    order, like any ``PCollection``'s, is not kept.

    Args:
        path: The dataset directory (local, or an ``fsspec`` URL on the
            workers: ``gs://``... needs ``fsspec`` and ``gcsfs``).

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        HeaderError: Its header is malformed.
        CorruptDataError: A shard file is missing or of the wrong size (when
            the pipeline is built); a record is damaged (when it runs).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = os.fspath(path)
        from superserial.layout import read_header, shard_paths

        self.header = read_header(self.path)
        shard_paths(self.path, self.header)  # all there, of the right sizes

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        count = len(self.header.shards)
        return (
            pbegin
            | "Shards" >> beam.Create(list(range(count)))
            | "Spread" >> beam.Reshuffle()
            | "Decode" >> beam.ParDo(_ReadShard(self.path, self.header.to_json()))
        )

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
elements. Each encoded batch is given a shard number (round robin within a
bundle, from a start taken from the batch's first record), the batches are
grouped by shard, and each shard is written as one file by the write loop
that ``save`` uses (:mod:`superserial.write.loop`, into a
:class:`~superserial.write.targets.StagedShardTarget`), in this run's
staging directory ``PATH/.staging/beam-<hex>/``. Every try at writing a shard
writes a file of its own name, so a retried or duplicated worker leaves no
duplicate: only the file whose description reached the last step is kept.
That last step (a singleton) renames the files to
``data-SSSSS-of-NNNNN.tfrecord`` in shard order, writes ``header.json``
atomically (temporary file and rename), as ``finalize`` does
(:func:`superserial.write.parts.assemble`), and removes the staging directory.
The dataset is valid only once the header is there; a failed run leaves no
header and its ``.staging/beam-*`` directory, which may be removed.

Shard count: ``num_shards=n`` gives exactly ``n`` files, empty ones included.
``num_shards=0`` gives one file per started 128 MiB of records (as ``save``
cuts its files), at least one: the byte total is summed before any file is
written.

Element order: a ``PCollection`` has none. The dataset's order is the order
Beam produced: shard files in shard-number order, records in the order the
shard's batches were grouped. A second run may order elements differently;
counts are exact (taken from the files as written). To keep an order, put a
key (an index) in each element.

Reading: one work item per shard file (redistributed with
``beam.Reshuffle``), decoded by the TensorFlow-free reader
:mod:`superserial.numpy`; elements come out as it yields them (dense leaves
as ``np.ndarray``, ragged as :class:`superserial.numpy.Ragged`, sparse as
:class:`superserial.numpy.Sparse`, namedtuples rebuilt from the header).
Neither building nor running a read imports TensorFlow: paths are reached
through :mod:`superserial.storage.fs` (fsspec for ``gs://``, ``s3://``... when
TensorFlow is not loaded).

Every kind of leaf superserial stores is supported (dense, ragged, sparse;
every dtype; dicts, tuples, namedtuples). Input values are converted as
:func:`superserial.codec.tf_tensors.to_tensors` describes; a value that does not
match ``element_spec`` fails the pipeline with an
:class:`~superserial.errors.UnsupportedError` naming the leaf.

The same pipeline runs on Dataflow, Flink or Spark by changing only the
pipeline options (``--runner``, project, temp location...); the workers need
``superserial[beam]`` and TensorFlow installed (writing; reading needs no
TensorFlow).

This module imports ``apache_beam``; ``import superserial`` does not.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np

from superserial._version import __version__
from superserial.errors import CorruptDataError, DatasetExistsError, require
from superserial.format import layout
from superserial.format.framing import frame_batches
from superserial.format.header import Header, Shard, normalize_compression
from superserial.format.layout import HEADER_FILE
from superserial.read.opening import open_dataset
from superserial.storage import fs
from superserial.write.loop import write_shards
from superserial.write.parts import assemble
from superserial.write.targets import StagedShardTarget

__all__ = ["ReadFromSuperSerial", "WriteToSuperSerial"]

log = logging.getLogger("superserial")

# With num_shards=0, one shard per this many record bytes (save's file size).
_DEFAULT_SHARD_BYTES = 128 << 20

# (records, sizes): a batch of serialized records and their byte sizes.
_Batch = tuple[np.ndarray, np.ndarray]


def _template_json(structure: Any, compression: str | None) -> str:
    """A header without shards: how workers learn the structure, as plain JSON."""
    return Header(structure, 0, compression, (), writer="").to_json()


def _empty_batch() -> _Batch:
    return np.array([], dtype=object), np.zeros(0, np.int64)


class _EncodeBatch(beam.DoFn):
    """A batch of numpy elements -> (records, sizes) batches, as ``save`` encodes them."""

    def __init__(self, template: str) -> None:
        self._template = template
        self._encoder: Any = None

    def setup(self) -> None:
        from superserial.codec.tf_records import ElementEncoder
        from superserial.codec.tf_spec import to_element_spec

        header = Header.from_json(self._template, source="WriteToSuperSerial")
        # Built once per DoFn instance (Beam gives each thread its own).
        self._encoder = ElementEncoder(to_element_spec(header.structure), header.leaves)

    def process(self, batch: list[Any]) -> Iterator[_Batch]:
        if self._encoder is None:
            self.setup()
        yield from self._encoder.encode(batch)


def _shard_count(total_bytes: int) -> int:
    """num_shards=0: one shard per started 128 MiB of records, at least one."""
    return max(1, -(-total_bytes // _DEFAULT_SHARD_BYTES))


class _AssignShard(beam.DoFn):
    """Keys each encoded batch by a shard number, round robin within a bundle.

    The first number of a bundle comes from its first record's CRC, so that
    bundles of one batch each still spread over all shards, and a retried
    bundle gets the same numbers.
    """

    def __init__(self) -> None:
        self._next: int | None = None

    def start_bundle(self) -> None:
        self._next = None

    def process(self, batch: _Batch, count: int) -> Iterator[tuple[int, _Batch]]:
        records = batch[0]
        if not len(records):
            return
        if self._next is None:
            self._next = zlib.crc32(records[0])
        yield self._next % count, batch
        self._next += 1


def _every_shard(count: int) -> Iterator[tuple[int, _Batch]]:
    """An empty batch for every shard number, so that each shard is written."""
    for i in range(count):
        yield i, _empty_batch()


class _WriteShard(beam.DoFn):
    """(shard number, batches) -> that shard written as one staged file, and its Shard."""

    def __init__(self, run_dir: str, compression: str | None) -> None:
        self._run_dir, self._compression = run_dir, compression

    def process(self, group: tuple[int, Iterable[_Batch]]) -> Iterator[tuple[int, Shard]]:
        index, batches = group
        shard = write_shards(
            frame_batches(batches),
            StagedShardTarget(self._run_dir, index),
            compression=self._compression,
        )
        yield index, shard


def _commit(
    written: list[tuple[int, Shard]], count: int, path: str, run_dir: str, template: str
) -> Header:
    """The last step: names the staged shards, writes ``header.json`` atomically, cleans up.

    Safe to run again after an interruption: a shard already moved to its
    final name (with the size written) is taken as it is.
    """
    base = Header.from_json(template, source="WriteToSuperSerial")
    written = sorted(written, key=lambda w: w[0])
    got = [i for i, _ in written]
    if got != list(range(count)):
        raise CorruptDataError(
            f"expected shards 0..{count - 1} once each from the write step, got {got} at {path}"
        )
    header = assemble(
        path,
        [(run_dir, layout.shard_name(i, count), s) for i, s in written],
        lambda shards: Header.of_shards(
            base.structure,
            base.compression,
            shards,
            writer=f"superserial {__version__} (apache_beam)",
        ),
    )
    # After the commit point: what is left are files of failed or duplicate tries.
    fs.rmtree(run_dir)
    staging = fs.join(path, layout.STAGING_DIR)
    if fs.isdir(staging) and not fs.listdir(staging):
        fs.rmtree(staging)
    log.info(
        "WriteToSuperSerial: %d elements in %d shard(s), %d bytes at %s",
        header.element_count,
        len(header.shards),
        header.total_bytes,
        path,
    )
    return header


class WriteToSuperSerial(beam.PTransform):
    """Writes a ``PCollection`` of nested numpy structures as a superserial dataset.

    Args:
        path: The dataset directory (local, ``gs://``..., any filesystem
            TensorFlow's ``tf.io.gfile`` reaches). Must hold no dataset.
        element_spec: The ``tf.data`` element spec the elements match: its
            structure (dicts, tuples, namedtuples), dtypes, shapes, ragged and
            sparse leaves.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        num_shards: The number of files (empty ones included); 0: one per
            started 128 MiB of records, at least one.
        min_batch_size: Fewest elements encoded together (``BatchElements``).
        max_batch_size: Most elements encoded together.

    The output is a ``PCollection`` holding the one :class:`~superserial.Header`
    written. Element order: see the module documentation.

    Raises:
        UnsupportedError: ``element_spec`` holds a leaf superserial cannot
            store (at construction); an element does not match it (when run).
        DatasetExistsError: ``path`` already holds a dataset or shard files.
        MissingDependencyError: TensorFlow is not installed.
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
        # The element spec is TensorFlow's (reading needs no TensorFlow, writing does).
        require("tensorflow", extra="tf", needed_for="WriteToSuperSerial", package="TensorFlow")
        from superserial.codec.tf_spec import from_element_spec

        self.path = fs.dataset_path(path)
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
            taken = [
                n for n in fs.listdir(self.path) if n == HEADER_FILE or layout.is_shard_file(n)
            ]
            if taken:
                found = HEADER_FILE if HEADER_FILE in taken else sorted(taken)[0]
                raise DatasetExistsError(
                    f"expected no dataset at {self.path}, found {found}; remove it first"
                )

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        # A fresh staging directory per pipeline built (the run's tries share it).
        run_dir = layout.new_beam_run_dir(self.path)
        batches = (
            pcoll
            | "Batch"
            >> beam.BatchElements(
                min_batch_size=self.min_batch_size, max_batch_size=self.max_batch_size
            )
            | "Encode" >> beam.ParDo(_EncodeBatch(self._template))
        )
        if self.num_shards:
            count = pcoll.pipeline | "Count" >> beam.Create([self.num_shards])
        else:
            count = (
                batches
                | "Bytes" >> beam.Map(lambda b: int(b[1].sum()))
                | "Total" >> beam.CombineGlobally(sum)
                | "Count" >> beam.Map(_shard_count)
            )
        n = beam.pvalue.AsSingleton(count)
        keyed = batches | "Key" >> beam.ParDo(_AssignShard(), n)
        every = count | "Every shard" >> beam.FlatMap(_every_shard)
        return (
            (keyed, every)
            | "Merge" >> beam.Flatten()
            | "Group" >> beam.GroupByKey()
            | "Write" >> beam.ParDo(_WriteShard(run_dir, self.compression))
            | "Collect" >> beam.combiners.ToList()
            | "Commit" >> beam.Map(_commit, n, self.path, run_dir, self._template)
        )


class _ReadShard(beam.DoFn):
    """A shard index -> the elements of that shard file, as numpy values."""

    def __init__(self, path: str, header_json: str) -> None:
        self._path, self._header_json = path, header_json
        self._header: Header | None = None

    def setup(self) -> None:
        # Namedtuple values pickle by name and fields (structure.namedtuple_type),
        # so they cross Beam's coders without their classes being registered.
        self._header = Header.from_json(self._header_json, source=fs.join(self._path, HEADER_FILE))

    def process(self, index: int) -> Iterator[Any]:
        from superserial.read import numpy_reader as ssnp

        if self._header is None:
            self.setup()
        header = self._header
        if header is None:  # setup() always sets it; this narrows the type
            raise RuntimeError("expected _ReadShard.setup() to read the header")
        shard = header.shards[index]
        # One file: its framing, CRCs and record count are checked as it is read.
        yield from ssnp.NumpyDataset(
            self._path, header, [fs.join(self._path, shard.file)], [shard.records]
        )


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
        # Through superserial.storage.fs: no TensorFlow needed, whatever the path's scheme.
        # Opened as every reader opens a dataset: its shards all there, of the right sizes.
        self.header = open_dataset(self.path).header

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        count = len(self.header.shards)
        return (
            pbegin
            | "Shards" >> beam.Create(list(range(count)))
            | "Spread" >> beam.Reshuffle()
            | "Decode" >> beam.ParDo(_ReadShard(self.path, self.header.to_json()))
        )

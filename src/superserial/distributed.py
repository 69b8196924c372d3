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
are ignored and removed by ``finalize``. A writer that fails (an exception in
its ``with`` block) removes its attempt, and the directories it leaves empty.

On a local filesystem, a writer holds an advisory lock (``flock``) on
``attempt-<random>.lock`` beside its attempt directory until it commits or
aborts, so :func:`superserial.cleanup` can tell abandoned attempts (a killed
worker's) from live ones and remove only those.

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
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from superserial import __version__, codec, fs
from superserial.commit import (
    ATTEMPT_LOCK_SUFFIX,
    MANIFEST_FILE,
    STAGING_DIR,
    lock_file,
    release_file,
)
from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetNotFoundError,
    HeaderError,
    UnsupportedError,
)
from superserial.header import (
    HEADER_FILE,
    Header,
    Leaf,
    Shard,
    iter_leaves,
    leaf_name,
    normalize_compression,
)
from superserial.spec import from_element_spec
from superserial.writer import (
    DEFAULT_SHARD_SIZE,
    _ShardWriter,
    encoded_batches,
    file_crc32c,
    iterate,
    shard_name,
)

__all__ = [
    "MANIFEST_FILE",
    "STAGING_DIR",
    "ElementEncoder",
    "Part",
    "Writer",
    "encode_elements",
    "finalize",
    "part_dir",
    "save_part",
    "to_tensors",
]

log = logging.getLogger("superserial")

_PART_KIND = "superserial-part"
_PART_RE = re.compile(r"^part-(\d{5,})$")
_ATTEMPT_RE = re.compile(r"^attempt-[0-9a-f]{8,64}$")
# Elements buffered by Writer.write before they are encoded together.
_FLUSH_ELEMENTS = 1024
_MAX_PARTS = 100_000


def part_dir(path: str, index: int) -> str:
    """The staging directory of part ``index`` of the dataset at ``path``."""
    return fs.join(str(path).rstrip("/"), STAGING_DIR, f"part-{index:05d}")


def _write_atomically(target: str, text: str) -> None:
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:12]}"
    with fs.open_file(tmp, "wb") as f:
        f.write(text.encode("utf-8"))
    fs.replace(tmp, target)


# ------------------------------------------------------------- conversion


def _where(path: tuple[Any, ...]) -> str:
    return leaf_name(path) if path else "<element>"


def _dense(spec: tf.TensorSpec, x: Any, where: str) -> tf.Tensor:
    if isinstance(x, tf.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        want = spec.dtype.as_numpy_dtype
        if spec.dtype == tf.string:
            if arr.dtype.kind not in ("O", "S", "U"):
                raise UnsupportedError(f"expected strings, got {arr.dtype} at {where}")
            if not isinstance(x, np.ndarray):
                # bytes and lists of bytes: numpy's "S" dtype drops trailing NULs.
                arr = np.asarray(x, dtype=object)
        elif arr.dtype != np.dtype(want):
            # Python scalars and lists are cast; numpy arrays must match exactly.
            if isinstance(x, np.ndarray | np.generic):
                raise UnsupportedError(f"expected {spec.dtype.name}, got {arr.dtype} at {where}")
            try:
                arr = np.asarray(x, dtype=want)
            except (OverflowError, TypeError, ValueError) as e:
                raise UnsupportedError(
                    f"expected {spec.dtype.name} values, got {x!r} ({e}) at {where}"
                ) from e
        t = tf.constant(arr, dtype=spec.dtype)
    if t.dtype != spec.dtype:
        raise UnsupportedError(f"expected {spec.dtype.name}, got {t.dtype.name} at {where}")
    if not spec.shape.is_compatible_with(t.shape):
        raise UnsupportedError(f"expected shape {spec.shape}, got {t.shape} at {where}")
    return t


def _nested_to_ragged(spec: tf.RaggedTensorSpec, x: Any, where: str) -> tf.RaggedTensor:
    """A ragged tensor from nested sequences (lists, object arrays of arrays)."""
    rank = spec.ragged_rank
    inner = tuple(spec.shape[rank + 1 :].as_list())
    np_dtype = spec.dtype.as_numpy_dtype
    rows = list(x)
    lengths = []
    for _ in range(rank - 1):
        lengths.append(np.array([len(r) for r in rows], np.int64))
        rows = [item for r in rows for item in r]
    lengths.append(np.array([len(r) for r in rows], np.int64))
    # The last level's rows are concatenated as arrays: numpy values keep
    # their exact bits (no round trip through Python floats).
    parts = []
    for r in rows:
        arr = np.asarray(r) if spec.dtype != tf.string else np.asarray(r, dtype=object)
        if (
            spec.dtype != tf.string
            and isinstance(r, np.ndarray)
            and arr.dtype != np.dtype(np_dtype)
        ):
            raise UnsupportedError(f"expected {spec.dtype.name}, got {arr.dtype} at {where}")
        parts.append(arr.astype(np_dtype, copy=False).reshape((-1, *inner)))
    flat = np.concatenate(parts) if parts else np.zeros((0, *inner), np_dtype)
    splits_dtype = spec.row_splits_dtype
    return tf.RaggedTensor.from_nested_row_lengths(
        tf.constant(flat, spec.dtype), [tf.constant(n, splits_dtype) for n in lengths]
    )


def _ragged(spec: tf.RaggedTensorSpec, x: Any, where: str) -> Any:
    if spec.ragged_rank == 0:
        return _dense(tf.TensorSpec(spec.shape, spec.dtype), x, where)
    if isinstance(x, tf.RaggedTensor):
        rt = x
    elif hasattr(x, "flat_values") and hasattr(x, "nested_row_splits"):
        # superserial.numpy.Ragged, tf RaggedTensorValue
        rt = tf.RaggedTensor.from_nested_row_splits(
            _dense(tf.TensorSpec(None, spec.dtype), x.flat_values, where),
            [tf.constant(np.asarray(s), spec.row_splits_dtype) for s in x.nested_row_splits],
            validate=True,
        )
    else:
        try:
            rt = _nested_to_ragged(spec, x, where)
        except (TypeError, ValueError) as e:
            raise UnsupportedError(
                f"expected a ragged value for {spec}, got {type(x).__name__} ({e}) at {where}"
            ) from e
    if rt.row_splits.dtype != spec.row_splits_dtype:
        rt = rt.with_row_splits_dtype(spec.row_splits_dtype)
    if not spec.is_compatible_with(rt):
        raise UnsupportedError(f"expected {spec}, got {tf.type_spec_from_value(rt)} at {where}")
    return rt


def _sparse(spec: tf.SparseTensorSpec, x: Any, where: str) -> tf.SparseTensor:
    if isinstance(x, tf.SparseTensor):
        st = x
    elif hasattr(x, "indices") and hasattr(x, "values") and hasattr(x, "dense_shape"):
        # superserial.numpy.Sparse, tf SparseTensorValue
        st = tf.SparseTensor(
            tf.constant(
                np.asarray(x.indices, np.int64).reshape(-1, spec.shape.rank or 0), tf.int64
            ),
            _dense(tf.TensorSpec([None], spec.dtype), x.values, where),
            tf.constant(np.asarray(x.dense_shape, np.int64), tf.int64),
        )
    elif isinstance(x, np.ndarray | tf.Tensor):
        # What as_numpy_iterator() yields for a sparse leaf: the dense array.
        st = tf.sparse.from_dense(_dense(tf.TensorSpec(spec.shape, spec.dtype), x, where))
    else:
        raise UnsupportedError(
            f"expected a sparse value (indices, values, dense_shape), got {type(x).__name__} at {where}"
        )
    if not spec.is_compatible_with(st):
        raise UnsupportedError(f"expected {spec}, got {tf.type_spec_from_value(st)} at {where}")
    return st


def to_tensors(element: Any, element_spec: Any) -> Any:
    """Converts one element of numpy values to tensors matching ``element_spec``.

    Dense leaves take numpy arrays and scalars (dtype must match exactly),
    Python values (cast to the leaf dtype), ``bytes`` for strings, or tensors.
    Ragged leaves of ``ragged_rank`` 0 (a ragged column of
    ``from_tensor_slices``) take the same, of any length. Other ragged leaves take ``tf.RaggedTensor``, :class:`superserial.numpy.Ragged`
    (what the numpy reader yields), ``RaggedTensorValue``, or nested
    sequences (lists, numpy object arrays of arrays, as
    ``as_numpy_iterator()`` yields). Sparse leaves take ``tf.SparseTensor``,
    :class:`superserial.numpy.Sparse`, ``SparseTensorValue``, or a dense
    array (as ``as_numpy_iterator()`` yields; explicit zeros are lost).

    Raises:
        UnsupportedError: A value does not match its spec; the message names it.
    """
    return _convert(element_spec, element, ())


def _convert(spec: Any, x: Any, path: tuple[Any, ...]) -> Any:
    where = _where(path)
    if isinstance(spec, dict):
        if not isinstance(x, dict) or set(x) != set(spec):
            got = sorted(x) if isinstance(x, dict) else type(x).__name__
            raise UnsupportedError(
                f"expected a dict with keys {sorted(spec)}, got {got} at {where}"
            )
        return {k: _convert(spec[k], x[k], (*path, k)) for k in spec}
    if isinstance(spec, tuple):
        if not isinstance(x, tuple | list) or len(x) != len(spec):
            got = f"{len(x)} items" if isinstance(x, tuple | list) else type(x).__name__
            raise UnsupportedError(f"expected a tuple of {len(spec)} items, got {got} at {where}")
        items = [_convert(s, v, (*path, i)) for i, (s, v) in enumerate(zip(spec, x, strict=True))]
        return type(spec)(*items) if hasattr(spec, "_fields") else tuple(items)
    if isinstance(spec, tf.TensorSpec):
        return _dense(spec, x, where)
    if isinstance(spec, tf.RaggedTensorSpec):
        return _ragged(spec, x, where)
    if isinstance(spec, tf.SparseTensorSpec):
        return _sparse(spec, x, where)
    raise UnsupportedError(
        f"expected a tensor, ragged or sparse spec, got {type(spec).__name__} at {where}"
    )


def _sizes(sizes: tf.Tensor) -> np.ndarray:
    """Per-record sizes of an encoded batch, as ``encode_batch`` gives them."""
    return np.asarray(sizes.numpy(), np.int64)


def _is_ragged0(spec: Any) -> bool:
    return isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank == 0


def _generated(
    generate: Callable[[], Iterator[Any]], element_spec: Any, leaves: tuple[Leaf, ...]
) -> tf.data.Dataset:
    """A dataset of what ``generate`` yields, of exactly ``element_spec``.

    ``from_generator`` cannot yield a ``ragged_rank`` 0 ragged leaf (TF has no
    such value: it is a plain tensor, and the generator's type check rejects
    it). Such leaves are generated as plain tensors of their shape; then every
    leaf gets a leading dimension of 1, sliced off again by
    ``from_tensor_slices``, which gives the ragged spec back.
    """
    specs = tf.nest.flatten(element_spec)
    if not any(_is_ragged0(s) for s in specs):
        return tf.data.Dataset.from_generator(generate, output_signature=element_spec)
    plain = tf.nest.pack_sequence_as(
        element_spec,
        [tf.TensorSpec(s.shape, s.dtype) if _is_ragged0(s) else s for s in specs],
    )

    def slices(*el: Any) -> tf.data.Dataset:
        flat = tf.nest.flatten(el)
        expanded = [codec.expand_leaf(leaf, x) for leaf, x in zip(leaves, flat, strict=True)]
        # Not unbatch: TF 2.21's unbatch crashes (SIGSEGV) on zero-size tensors.
        return tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(element_spec, expanded))

    return tf.data.Dataset.from_generator(generate, output_signature=plain).flat_map(slices)


class ElementEncoder:
    """Encodes lists of elements to records exactly as :func:`superserial.save` does.

    The elements go through the very pipeline ``save`` uses
    (:func:`superserial.writer.encoded_batches`), so the records are byte for
    byte those ``save`` writes for the same elements. The pipeline is built
    (and its functions traced) once; each :meth:`encode` call runs it again
    over new elements. Not thread-safe: one encoder per thread.

    Args:
        element_spec: The elements' ``tf.data`` element spec.
        leaves: The header leaves of ``element_spec``, if already built.
    """

    def __init__(self, element_spec: Any, leaves: tuple[Leaf, ...] | None = None) -> None:
        if leaves is None:
            leaves = tuple(iter_leaves(from_element_spec(element_spec)))
        self.element_spec, self.leaves = element_spec, leaves
        self._pending: list[Any] = []
        self._batches = encoded_batches(_generated(self._generate, element_spec, leaves), leaves)

    def _generate(self) -> Iterator[Any]:
        pending, self._pending = self._pending, []
        yield from pending

    def encode(
        self, elements: Iterable[Any], *, converted: bool = False
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields (records, per-record sizes) per encoded batch, as numpy arrays.

        Args:
            elements: Elements of numpy values or tensors (see :func:`to_tensors`).
            converted: The elements already went through :func:`to_tensors`.
        """
        pending = (
            list(elements) if converted else [to_tensors(e, self.element_spec) for e in elements]
        )
        if not pending:
            return
        self._pending = pending
        for records, sizes in iterate(self._batches):
            yield records.numpy(), _sizes(sizes)


def encode_elements(
    elements: Iterable[Any], element_spec: Any, leaves: tuple[Leaf, ...] | None = None
) -> Iterator[tuple[np.ndarray, int]]:
    """Encodes elements to records exactly as :func:`superserial.save` does.

    A one-off :class:`ElementEncoder`; use one of those to encode many lists.

    Yields:
        (records, total bytes) per encoded batch; records is a numpy array of
        ``bytes``.
    """
    for records, sizes in ElementEncoder(element_spec, leaves).encode(elements):
        yield records, int(sizes.sum())


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
            "header": json.loads(self.header.to_json()),
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
        if not isinstance(attempt, str) or not _ATTEMPT_RE.match(attempt):
            raise HeaderError(
                f"{source}: expected an attempt directory name, got {attempt!r} at attempt"
            )
        header = Header.from_json(json.dumps(obj.get("header")), source=f"{source} header")
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
        self.dir = part_dir(self.path, shard_index)
        self._created = not fs.exists(self.path)
        self._lock: tuple[str, int] | None = None
        self.attempt = self._new_attempt()
        self._tmp = fs.join(self.dir, self.attempt)
        self._shards = _ShardWriter(
            self._tmp, self.compression, None, shard_size or DEFAULT_SHARD_SIZE
        )
        self._spec: Any = None
        self._leaves: tuple[Leaf, ...] = ()
        self._structure: Any = None
        self._buffer: list[Any] = []
        self._encoder: ElementEncoder | None = None
        self._total = 0
        self._state = "open"
        self.part: Part | None = None
        try:
            if element_spec is not None:
                self._set_spec(element_spec)
            fs.makedirs(self._tmp)
        except BaseException:
            self._release()
            self._remove_empty_dirs()
            raise

    def _new_attempt(self) -> str:
        """A fresh attempt name; locally, locked (``attempt-ID.lock``) until commit or abort.

        The lock tells :func:`superserial.cleanup` that the attempt is live.
        """
        for _ in range(100):
            attempt = f"attempt-{uuid.uuid4().hex[:16]}"
            fs.makedirs(self.dir)
            if not fs.is_local(self.path):
                return attempt
            lpath = fs.join(self.dir, attempt + ATTEMPT_LOCK_SUFFIX).removeprefix("file://")
            fd = lock_file(lpath, create=True)
            if fd is not None:
                self._lock = (lpath, fd)
                return attempt
            # A cleanup removed the directory, or saw the file before we locked it.
        raise OSError(f"expected to lock a new attempt in {self.dir}, failed 100 times")

    def _release(self) -> None:
        if self._lock is not None:
            lpath, fd = self._lock
            self._lock = None
            release_file(lpath, fd)

    def _remove_empty_dirs(self) -> None:
        """Removes the part and staging directories, and ``path`` if this Writer made it, while empty."""
        if not fs.is_local(self.path):
            return  # object stores have no empty directories
        dirs = [self.dir, fs.join(self.path, STAGING_DIR)] + ([self.path] if self._created else [])
        for d in dirs:
            try:
                os.rmdir(d.removeprefix("file://"))
            except OSError:  # not empty (another part, a dataset), or gone
                return

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
            raise TypeError(
                f"expected a tf.data.Dataset, got {type(dataset).__module__}.{type(dataset).__qualname__}"
            )
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
            batches = (
                (records.numpy(), _sizes(sizes))
                for records, sizes in iterate(encoded_batches(dataset, self._leaves))
            )
            return self._write_encoded(batches, bar)
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
        try:
            _write_atomically(fs.join(self.dir, MANIFEST_FILE), part.to_json())
        except BaseException:
            self.abort()
            raise
        # Committed: only now may cleanup see the attempt unlocked.
        self._release()
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
            self._state = "aborted"
            try:
                self._shards.close()
                fs.rmtree(self._tmp)
            finally:
                self._release()
            self._remove_empty_dirs()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            try:
                self.close()
            except BaseException:
                self.abort()  # e.g. no element_spec: leave nothing behind
                raise
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


def _read_part(pdir: str) -> Part:
    mpath = fs.join(pdir, MANIFEST_FILE)
    with fs.open_file(mpath, "rb") as f:
        text = f.read(64 << 20)
    return Part.from_json(text, source=mpath)


def _read_parts(staging: str, num_shards: int | None) -> list[Part]:
    names = sorted(fs.listdir(staging)) if fs.isdir(staging) else []
    found: dict[int, str] = {}
    for name in names:
        m = _PART_RE.match(name)
        if m:
            found[int(m.group(1))] = fs.join(staging, name)
    parts: dict[int, Part] = {}
    for i, pdir in sorted(found.items()):
        if fs.exists(fs.join(pdir, MANIFEST_FILE)):
            part = _read_part(pdir)
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
            f"{fs.join(staging, f'part-{i:05d}', MANIFEST_FILE)}, found {what}"
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
    parts = _read_parts(staging, num_shards)
    _check_same(parts)
    total_files = sum(len(p.header.shards) for p in parts)
    plan: list[tuple[str, str, Shard]] = []
    for p in parts:
        src_dir = fs.join(part_dir(path, p.index), p.attempt)
        for s in p.header.shards:
            plan.append((fs.join(src_dir, s.file), shard_name(len(plan), total_files), s))
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
            crc = file_crc32c(where)
            if crc != s.crc32c:
                raise CorruptDataError(f"expected crc32c {s.crc32c} of {where}, got {crc}")
    planned = {dst for _, dst, _ in plan}
    for name in fs.listdir(path):
        if name.startswith("data-") and name.endswith(".tfrecord") and name not in planned:
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
    _write_atomically(hpath, header.to_json())
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

"""Reading datasets written by the super_serial 2.0 script (2020).

That format is one TFRecord file of ``tf.train.Example`` records plus a YAML
header mapping each top-level key to ``{shape: [ints], dtype: <TF DataType
enum>}``. Each key is one fixed-length feature: an Int64List for integer and
bool dtypes, a FloatList for float dtypes, a BytesList for strings. The YAML
is read with ``yaml.safe_load`` only: a header can never construct Python
objects or run code.

The YAML header holds no element count, so ``load_legacy`` counts the records
by walking the file's TFRecord framing (:func:`superserial.format.framing.count_records`:
12 bytes read per record, the data skipped) and gives the dataset that cardinality: ``len()`` works, as it does
for a current dataset.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import yaml

from superserial.errors import DatasetNotFoundError, HeaderError
from superserial.format import dtypes
from superserial.format.framing import count_records
from superserial.format.header import LIMITS
from superserial.storage import fs

__all__ = ["count_records", "load_legacy", "read_legacy_header"]


def read_legacy_header(header_path: str) -> dict[str, tuple[tuple[int, ...], dtypes.DType]]:
    """Reads a super_serial 2.0 YAML header safely.

    Returns:
        key -> (shape, dtype table entry), keys sorted.

    Raises:
        DatasetNotFoundError: The file does not exist.
        HeaderError: The YAML is unsafe, malformed or names unknown dtypes.
    """
    if not fs.exists(header_path):
        raise DatasetNotFoundError(
            f"expected a super_serial 2.0 header at {header_path}, found no file"
        )
    with fs.open_file(header_path, "rb") as f:
        text = f.read(LIMITS.header_bytes + 1)
    if len(text) > LIMITS.header_bytes:
        raise HeaderError(f"{header_path}: expected at most {LIMITS.header_bytes} bytes, got more")
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise HeaderError(f"{header_path}: expected plain YAML (no Python tags), got: {e}") from e
    if not isinstance(obj, dict) or not obj:
        raise HeaderError(
            f"{header_path}: expected a mapping of feature keys, got {type(obj).__name__}"
        )
    out: dict[str, tuple[tuple[int, ...], dtypes.DType]] = {}
    for key in sorted(obj, key=str):
        spec = obj[key]
        where = f"{header_path}: at {key!r}"
        if not isinstance(key, str):
            raise HeaderError(f"{where}: expected a string key, got {type(key).__name__}")
        if not isinstance(spec, dict) or set(spec) != {"shape", "dtype"}:
            raise HeaderError(f"{where}: expected {{shape, dtype}}, got {spec!r}")
        shape, enum = spec["shape"], spec["dtype"]
        if (
            not isinstance(shape, list)
            or len(shape) > LIMITS.rank
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise HeaderError(f"{where}: expected a shape of non-negative ints, got {shape!r}")
        if math.prod(shape) > LIMITS.values_per_leaf:
            raise HeaderError(
                f"{where}: expected at most {LIMITS.values_per_leaf} values, shape {shape}"
            )
        try:
            entry = (
                dtypes.by_enum(enum)
                if isinstance(enum, int) and not isinstance(enum, bool)
                else None
            )
        except KeyError:
            entry = None
        if entry is None:
            raise HeaderError(f"{where}: expected a supported TensorFlow dtype enum, got {enum!r}")
        out[key] = (tuple(shape), entry)
    return out


def _stored(entry: dtypes.DType) -> tf.DType:
    if entry.name == "string":
        return tf.string
    if entry.is_integer:
        return tf.int64
    if entry.name.startswith("complex"):
        raise HeaderError(f"expected a dtype super_serial 2.0 could store, got {entry.name}")
    return tf.float32


def load_legacy(tfrecord_path: str, header_path: str) -> tf.data.Dataset:
    """Loads a super_serial 2.0 ``(tfrecord, header)`` pair with its original dtypes.

    Values the old script narrowed (float64 stored as float32) come back in
    the original dtype with the precision the file holds. The dataset has a
    known cardinality (``len()``): the file's record count, counted from its
    framing when this is called.

    Raises:
        DatasetNotFoundError: Either file does not exist.
        HeaderError: The header is unsafe, malformed or names unknown dtypes.
        CorruptDataError: The file's framing is damaged or truncated.
    """
    fields = read_legacy_header(header_path)
    if not fs.exists(tfrecord_path):
        raise DatasetNotFoundError(
            f"expected a super_serial 2.0 TFRecord file at {tfrecord_path}, found no file"
        )
    spec = {k: tf.io.FixedLenFeature(list(shape), _stored(e)) for k, (shape, e) in fields.items()}

    @tf.autograph.experimental.do_not_convert  # no control flow; else converted at every load
    def parse(serialized: tf.Tensor) -> Any:
        parsed = tf.io.parse_example(serialized, spec)
        return {k: tf.cast(parsed[k], tf.as_dtype(e.name)) for k, (_, e) in fields.items()}

    count = count_records(tfrecord_path)
    ds = tf.data.TFRecordDataset(tfrecord_path).batch(256)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    # A file that shrinks after the count makes iteration fail, never a short epoch.
    return ds.apply(tf.data.experimental.assert_cardinality(count)).prefetch(tf.data.AUTOTUNE)

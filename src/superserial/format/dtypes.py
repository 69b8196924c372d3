"""The single table of supported dtypes and how each is stored.

This module imports numpy (and ml_dtypes for bfloat16) but never TensorFlow,
so the TF-free reader can use it. TensorFlow dtypes are looked up by name
where TensorFlow is present (``tf.as_dtype(entry.name)``).

Stored kinds:

* ``int64``: a ``tf.train.Int64List`` of the values, widened to int64.
  Lossless for every integer type that fits in int64, and bool.
* ``float``: a ``tf.train.FloatList``. Only float32 uses it: it is the one
  float type a FloatList holds bit for bit (NaN payloads included).
* ``bytes``: a ``tf.train.BytesList`` of the strings themselves.
* ``raw``: a ``tf.train.BytesList`` with one value per leaf per element:
  the array's values in C order, little-endian (``np.frombuffer``).
  Used where a list kind would lose information (float64, uint64,
  complex, float16 and bfloat16 whose NaN payloads a widening to float32
  may change) and for uint8, where one byte per value is the natural form
  (it is what images are) and is 2-8x smaller and faster than an Int64List.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import numpy.typing as npt

__all__ = ["DTYPES", "STORED_KINDS", "DType", "by_enum", "by_name"]

STORED_KINDS = ("int64", "float", "bytes", "raw")


@dataclass(frozen=True)
class DType:
    """One supported dtype.

    Attributes:
        name: The TensorFlow dtype name, as written in headers (``"float32"``).
        numpy: The numpy dtype of decoded arrays (``object`` for strings,
            holding ``bytes``).
        stored: How values are stored in a ``tf.train.Example``; one of
            :data:`STORED_KINDS`.
        enum: TensorFlow's ``DataType`` enum value, as the legacy
            super_serial 2.0 YAML header records it.
        arrow: The Apache Arrow type holding these values exactly, as the name
            of its ``pyarrow`` factory (``"int8"``, ``"float16"``, ``"binary"``);
            None where Arrow has none (bfloat16, complex). Converters both ways
            read it here (this module does not import pyarrow).
    """

    name: str
    numpy: np.dtype
    stored: str
    enum: int
    arrow: str | None

    @property
    def itemsize(self) -> int:
        """Bytes per value in the ``raw`` encoding (0 for strings)."""
        return 0 if self.name == "string" else self.numpy.itemsize

    @property
    def int64_range(self) -> tuple[int, int] | None:
        """The values an ``int64``-stored dtype holds, for range checks on read.

        None where every int64 fits (int64 itself) or values are not stored as
        int64. bool is stored as 0 or 1.
        """
        if self.stored != "int64" or self.name == "int64":
            return None
        if self.name == "bool":
            return (0, 1)
        info = np.iinfo(self.numpy)
        return (int(info.min), int(info.max))

    @property
    def is_integer(self) -> bool:
        """True for integer and bool dtypes."""
        return self.name == "bool" or np.issubdtype(self.numpy, np.integer)


def _d(name: str, np_dtype: npt.DTypeLike, stored: str, enum: int, arrow: str | None) -> DType:
    return DType(name, np.dtype(np_dtype), stored, enum, arrow)


# name, numpy, stored kind, TF DataType enum (tensorflow/core/framework/types.proto), Arrow type.
# Arrow's string (UTF-8) and binary both come in as string; "binary" is the way out, unless the
# header's metadata kept the source's Arrow schema.
DTYPES: tuple[DType, ...] = (
    _d("bool", np.bool_, "int64", 10, "bool_"),
    _d("int8", np.int8, "int64", 6, "int8"),
    _d("int16", np.int16, "int64", 5, "int16"),
    _d("int32", np.int32, "int64", 3, "int32"),
    _d("int64", np.int64, "int64", 9, "int64"),
    _d("uint8", np.uint8, "raw", 4, "uint8"),
    _d("uint16", np.uint16, "int64", 17, "uint16"),
    _d("uint32", np.uint32, "int64", 22, "uint32"),
    _d("uint64", np.uint64, "raw", 23, "uint64"),
    _d("float16", np.float16, "raw", 19, "float16"),
    _d("bfloat16", ml_dtypes.bfloat16, "raw", 14, None),
    _d("float32", np.float32, "float", 1, "float32"),
    _d("float64", np.float64, "raw", 2, "float64"),
    _d("complex64", np.complex64, "raw", 8, None),
    _d("complex128", np.complex128, "raw", 18, None),
    _d("string", np.object_, "bytes", 7, "binary"),
)

_BY_NAME = {d.name: d for d in DTYPES}
_BY_ENUM = {d.enum: d for d in DTYPES}


def by_name(name: str) -> DType:
    """Returns the table entry for a dtype name.

    Raises:
        KeyError: ``name`` is not a supported dtype.
    """
    return _BY_NAME[name]


def by_enum(enum: int) -> DType:
    """Returns the table entry for a TensorFlow ``DataType`` enum value.

    Raises:
        KeyError: ``enum`` is not a supported dtype.
    """
    return _BY_ENUM[enum]

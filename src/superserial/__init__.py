"""superserial: save any ``tf.data.Dataset`` to TFRecord files and load it back exactly.

    import superserial
    superserial.save(dataset, "/data/my_dataset")
    dataset = superserial.load("/data/my_dataset")

TensorFlow is imported only when a TensorFlow-facing function is first used,
so that ``superserial.numpy`` (the TF-free reader) works without it.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from superserial import errors
from superserial._version import __version__
from superserial.errors import (
    ConversionError,
    CorruptDataError,
    DatasetExistsError,
    DatasetLockedError,
    DatasetNotFoundError,
    FormatVersionError,
    HeaderError,
    MissingDependencyError,
    RemoteReadError,
    ResumeError,
    SpecMismatchError,
    SuperserialError,
    UnsupportedError,
)
from superserial.format.header import Header

__all__ = [
    "ConversionError",
    "CorruptDataError",
    "DatasetExistsError",
    "DatasetLockedError",
    "DatasetNotFoundError",
    "FormatVersionError",
    "Header",
    "HeaderError",
    "MissingDependencyError",
    "RemoteReadError",
    "ResumeError",
    "SpecMismatchError",
    "SuperserialError",
    "UnsupportedError",
    "Writer",
    "__version__",
    "append",
    "build_index",
    "cleanup",
    "convert",
    "finalize",
    "load",
    "permutation",
    "read_header",
    "save",
    "show",
    "stats",
]

logging.getLogger("superserial").addHandler(logging.NullHandler())

# Public names that need TensorFlow, resolved on first use.
_LAZY = {
    "save": "superserial.tf.save",
    "append": "superserial.tf.append",
    "load": "superserial.tf.load",
    "read_header": "superserial.format.layout",
    "Writer": "superserial.tf.two_phase",
    "finalize": "superserial.write.parts",
    "cleanup": "superserial.write.local_commit",
    "convert": "superserial.foreign.convert",
    "verify": "superserial.inspect.verify",
    "build_index": "superserial.write.indexes",
    "permutation": "superserial.read.order",
    "show": "superserial.inspect.grid",
    "stats": "superserial.inspect.stats",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if _LAZY[name].startswith("superserial.tf."):
            # Named here, the error says which function wanted TensorFlow.
            errors.require(
                "tensorflow", extra="tf", needed_for=f"superserial.{name}", package="TensorFlow"
            )
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'superserial' has no attribute {name!r}")

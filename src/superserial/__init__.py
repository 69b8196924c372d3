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

from superserial.errors import (
    CorruptDataError,
    DatasetExistsError,
    DatasetLockedError,
    DatasetNotFoundError,
    FormatVersionError,
    HeaderError,
    ResumeError,
    SpecMismatchError,
    SuperserialError,
    UnsupportedError,
)
from superserial.header import Header

__version__ = "0.1.0"

__all__ = [
    "CorruptDataError",
    "DatasetExistsError",
    "DatasetLockedError",
    "DatasetNotFoundError",
    "FormatVersionError",
    "Header",
    "HeaderError",
    "ResumeError",
    "SpecMismatchError",
    "SuperserialError",
    "UnsupportedError",
    "Writer",
    "__version__",
    "append",
    "build_index",
    "cleanup",
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
    "save": "superserial.writer",
    "append": "superserial.appending",
    "load": "superserial.reader",
    "read_header": "superserial.layout",
    "Writer": "superserial.distributed",
    "finalize": "superserial.parts",
    "cleanup": "superserial.commit",
    "verify": "superserial.verification",
    "build_index": "superserial.indexing",
    "permutation": "superserial.shuffle",
    "show": "superserial.grid",
    "stats": "superserial.statistics",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'superserial' has no attribute {name!r}")

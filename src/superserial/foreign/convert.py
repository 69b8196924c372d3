"""``superserial.convert``: any source a registry knows -> a superserial dataset.

A source is recognized by the first :class:`Format` of :data:`FORMATS` whose
``detect`` says yes (cheap checks of the object's type or the path's names:
nothing heavy is imported to detect), or named with ``source_format=``; its
converter is imported only then, by name, so converting Parquet never imports
TensorFlow and a source whose library is missing names the extra to install.
Each source is one entry: the Hugging Face, WebDataset, TFDS and ArrayRecord
sources are added here the same way (see ``docs/convert.md``).

This module does not import TensorFlow.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from superserial.errors import UnsupportedError
from superserial.foreign.sources.array_record import is_array_record
from superserial.foreign.sources.hf import detect_hf
from superserial.foreign.sources.tables import is_numpy_dict
from superserial.foreign.sources.webdataset import detect_webdataset
from superserial.format import layout
from superserial.format.header import Header
from superserial.storage import fs

__all__ = ["FORMATS", "Format", "convert", "detect_format", "format_names"]

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Format:
    """One kind of source.

    Attributes:
        name: What ``source_format=`` and ``--from`` call it (``"parquet"``).
        detect: True if a source is of this kind; cheap, never raises, imports nothing heavy.
        converter: ``"module:function"`` of ``function(source, path, **save_options) -> Header``.
        what: The source, for the error listing the known formats.
    """

    name: str
    detect: Callable[[Any], bool]
    converter: str
    what: str

    def load(self) -> Callable[..., Header]:
        """The converter, imported now."""
        module, _, function = self.converter.partition(":")
        fn: Callable[..., Header] = getattr(importlib.import_module(module), function)
        return fn


def _path(source: Any) -> str | None:
    return os.fspath(source) if isinstance(source, str | os.PathLike) else None


def _is_type(source: Any, module: str, *names: str) -> bool:
    t = type(source)
    return t.__module__.split(".")[0] == module and t.__name__ in names


def _is_superserial(source: Any) -> bool:
    path = _path(source)
    if path is None or _GLOB_CHARS & set(path):
        return False
    try:
        return fs.exists(fs.join(path.rstrip("/") or "/", layout.HEADER_FILE))
    except (OSError, ValueError):
        return False


def _is_tfds(source: Any) -> bool:
    """A directory TFDS prepared: its ``features.json`` and ``dataset_info.json``."""
    path = _path(source)
    if path is None or _GLOB_CHARS & set(path):
        return False
    try:
        return all(fs.exists(fs.join(path, m)) for m in ("features.json", "dataset_info.json"))
    except (OSError, ValueError, UnsupportedError):
        return False


def _is_parquet(source: Any) -> bool:
    path = _path(source)
    if path is None:
        return False
    if path.endswith((".parquet", ".parq")):
        return True
    if os.path.isdir(path):
        return any(name.endswith(".parquet") for _, _, names in os.walk(path) for name in names)
    if "://" in path and not path.startswith("file://"):
        # A remote directory: one listing, without the header a superserial dataset has.
        try:
            names = fs.listdir(path) if fs.isdir(path) else []
        except (OSError, ValueError, UnsupportedError):
            return False
        return layout.HEADER_FILE not in names and any(n.endswith(".parquet") for n in names)
    return False


FORMATS: list[Format] = [
    Format(
        "superserial",
        _is_superserial,
        "superserial.foreign.sources.reshard:convert_superserial",
        "a superserial dataset (re-sharded or re-compressed; needs TensorFlow)",
    ),
    # Before array_record: a TFDS directory of ArrayRecord shards is decoded as TFDS decodes it.
    Format(
        "tfds",
        _is_tfds,
        "superserial.foreign.sources.tfds:convert_tfds",
        "a TFDS-prepared directory (features.json, dataset_info.json; needs TensorFlow)",
    ),
    Format(
        "array_record",
        is_array_record,
        "superserial.foreign.sources.array_record:convert_array_record",
        "ArrayRecord files of tf.train.Example (*.array_record, a directory or a glob of them)",
    ),
    Format(
        "parquet",
        _is_parquet,
        "superserial.foreign.sources.tables:convert_parquet",
        "a Parquet file, a directory of them or a glob (*.parquet)",
    ),
    Format(
        "arrow",
        lambda s: _is_type(s, "pyarrow", "Table", "RecordBatch"),
        "superserial.foreign.sources.tables:convert_arrow",
        "a pyarrow.Table or RecordBatch",
    ),
    Format(
        "pandas",
        lambda s: _is_type(s, "pandas", "DataFrame"),
        "superserial.foreign.sources.tables:convert_pandas",
        "a pandas DataFrame",
    ),
    Format(
        "hf",
        detect_hf,
        "superserial.foreign.sources.hf:convert_hf",
        "a Hugging Face datasets.Dataset, a DatasetDict (split=) or a save_to_disk directory",
    ),
    Format(
        "webdataset",
        detect_webdataset,
        "superserial.foreign.sources.webdataset:convert_webdataset",
        "WebDataset tar shards: a .tar, a brace pattern (shards-{000..009}.tar), a list, "
        "a directory of tars",
    ),
    Format(
        "numpy",
        is_numpy_dict,
        "superserial.foreign.sources.tables:convert_numpy",
        "a dict of numpy arrays (first axis: the elements)",
    ),
]


def format_names() -> list[str]:
    """The names of the known formats, in detection order."""
    return [f.name for f in FORMATS]


def _unknown(source: Any, given: str | None) -> UnsupportedError:
    known = "; ".join(f"{f.name} ({f.what})" for f in FORMATS)
    if given is not None:
        return UnsupportedError(f"expected a source format among: {known}; got {given!r}")
    shown = _path(source) or f"a {type(source).__module__}.{type(source).__name__}"
    hint = ""
    if (
        _path(source) is not None
        and not fs.exists(_path(source) or "")
        and not _GLOB_CHARS & set(shown)
    ):
        hint = " (no such file or directory)"
    return UnsupportedError(
        f"expected a source of a known format: {known}; got {shown}{hint}. "
        "Name the format with source_format= (--from) if it was not recognized"
    )


def detect_format(source: Any) -> str:
    """The name of the format of ``source``.

    Raises:
        UnsupportedError: No known format recognizes it; the message lists them.
    """
    for fmt in FORMATS:
        if fmt.detect(source):
            return fmt.name
    if _path(source) is not None and _GLOB_CHARS & set(_path(source) or ""):
        return "parquet"  # a glob: Parquet is the one format of many files matched so
    raise _unknown(source, None)


def convert(
    source: Any, path: str, *, source_format: str | None = None, **save_options: Any
) -> Header:
    """Converts ``source`` into a superserial dataset at ``path``.

    The types each source keeps, and what it refuses, are in ``docs/convert.md``;
    a failed conversion leaves nothing at ``path``.

    Args:
        source: A Parquet file, directory or glob, a ``pyarrow.Table``, a pandas
            ``DataFrame``, a dict of numpy arrays, a superserial dataset path,
            or any other source registered in :data:`FORMATS`.
        path: The dataset directory to create.
        source_format: The source's format by name (see :func:`format_names`),
            where detection would not find it.
        **save_options: As for ``save``: ``compression``, ``num_shards``,
            ``shard_size``, ``overwrite``, ``progress`` (and ``resume`` for a
            superserial source, whose compression and shard count are kept
            unless given).

    Returns:
        The header written.

    Raises:
        UnsupportedError: An unknown format (the message lists the known ones), or
            a type that cannot be kept exactly (named), before anything is written.
        ConversionError: A value that cannot be converted exactly (a null, mixed
            types), naming the column and the row; nothing is left at ``path``.
    """
    name = detect_format(source) if source_format is None else source_format
    fmt = next((f for f in FORMATS if f.name == name), None)
    if fmt is None:
        raise _unknown(source, name)
    return fmt.load()(source, path, **save_options)

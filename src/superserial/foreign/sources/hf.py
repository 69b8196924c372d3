"""Hugging Face ``datasets`` in: a ``Dataset``, a ``DatasetDict`` split or a ``save_to_disk`` directory.

HF keeps a dataset as an Arrow table plus ``Features``, which say what the Arrow
columns mean. Each feature becomes the Arrow column that means the same thing
to :mod:`superserial.foreign.sources.arrow`, batch by batch, and the batches go
through its ``write_arrow``, so there is one Arrow mapping and one encoder:

* ``Value`` -> its Arrow type as it is (numbers, bool, string, binary and their
  large variants); ``Value("null")``, dates, times and decimals are an error;
* ``ArrayXD`` (stored as nested variable-size lists) -> nested fixed-size lists,
  a dense leaf of the feature's shape; a ``None`` first dimension stays a list,
  a ragged leaf of shape ``[None, ...]`` (``ragged_rank`` 0);
* ``List`` / ``Sequence`` / ``LargeList`` -> as stored: a list (ragged), or with
  ``length=`` a fixed-size list (dense); a ``List`` of a dict (a list of structs)
  is an error, a ``Sequence`` of a dict is HF's dict of lists, kept;
* ``ClassLabel`` -> its int64 labels (``-1``, HF's "no label", kept), with the
  names in ``metadata["class_names"][leaf_name]``;
* ``Image``, ``Audio``, ``Video``, ``Pdf`` -> the encoded file's bytes (a string
  leaf), embedded from ``path`` where HF holds only a path: exact, as small as
  the source, and what ``Image(decode=True)`` decodes on the way back; the
  ``path`` itself is not kept;
* a dict of features -> a struct (a dict node);
* ``Json`` (HF's mixed-type columns) and every other feature -> an error naming
  the column.

``metadata["hf_features"]`` keeps ``Features.to_dict()``, so the way out can
rebuild the features exactly. This module is TF-free; ``datasets`` is imported
only when a conversion asks for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from superserial.errors import ConversionError, DatasetNotFoundError, UnsupportedError, require
from superserial.foreign.sources.arrow import write_arrow
from superserial.format.header import Header
from superserial.format.structure import leaf_name
from superserial.storage import fs

__all__ = ["convert_hf", "detect_hf", "open_hf"]

# HF Value dtypes that sources/arrow.py keeps exactly (the rest: dates, times, decimals, null).
_VALUE_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "string",
        "large_string",
        "binary",
        "large_binary",
    ]
)
# Features stored as struct<bytes, path>, whose value is the encoded file.
_FILE_FEATURES = frozenset({"Image", "Audio", "Video", "Pdf"})
# Bytes of one batch handed on at once; a batch holds at least one row.
_BATCH_BYTES = 32 << 20
_MAX_BATCH_ROWS = 65536
# Files a save_to_disk directory holds: a Dataset's, a DatasetDict's.
_DATASET_FILES = ("state.json", "dataset_info.json")
_DICT_FILE = "dataset_dict.json"
# Classes of `datasets` a source may be (the iterable ones to say why they are not taken).
_HF_CLASSES = frozenset({"Dataset", "DatasetDict", "IterableDataset", "IterableDatasetDict"})

_Transform = Callable[[Any], Any]


def _datasets() -> Any:
    return require("datasets", extra="hf-datasets", needed_for="converting a Hugging Face dataset")


def _pa() -> Any:
    return require("pyarrow", extra="hf-datasets", needed_for="converting a Hugging Face dataset")


def _local_dir(source: Any) -> str | None:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            return path
    return None


def detect_hf(source: Any) -> bool:
    """True for a ``datasets.Dataset``/``DatasetDict`` or a ``save_to_disk`` directory.

    Never imports ``datasets``: an object is one of its datasets only if its class
    comes from the ``datasets`` package, and a directory is one if it holds
    ``state.json`` (a ``Dataset``) or ``dataset_dict.json`` (a ``DatasetDict``);
    a TFDS directory holds ``dataset_info.json`` but neither of those.
    """
    for cls in type(source).__mro__:
        if cls.__module__.split(".")[0] == "datasets" and cls.__name__ in _HF_CLASSES:
            return True
    path = _local_dir(source)
    if path is None:
        return False
    return os.path.isfile(os.path.join(path, _DICT_FILE)) or os.path.isfile(
        os.path.join(path, _DATASET_FILES[0])
    )


def _pick_split(splits: Any, split: str | None, where: str) -> Any:
    names = list(splits)
    if split is not None:
        if split not in names:
            raise UnsupportedError(f"expected split= one of {names}, found {split!r} (in {where})")
        return splits[split]
    if len(names) == 1:
        return splits[names[0]]
    raise UnsupportedError(
        f"expected split= naming one split of {where}, found {len(names)} splits: {names}; "
        f"pass split= one of them (or convert each into its own dataset)"
    )


def open_hf(source: Any, split: str | None = None) -> Any:
    """The ``datasets.Dataset`` that ``source`` names.

    Args:
        source: A ``Dataset``, a ``DatasetDict``, or a ``save_to_disk`` directory of either.
        split: The split of a ``DatasetDict``; needed where it has more than one.

    Raises:
        UnsupportedError: ``split`` is missing or names no split, or ``source`` is none of these.
        DatasetNotFoundError: A directory holds no saved HF dataset.
    """
    hd = _datasets()
    where = "the DatasetDict"
    path = _local_dir(source)
    if path is not None:
        files = (_DICT_FILE, *_DATASET_FILES)
        if not any(os.path.isfile(os.path.join(path, f)) for f in files):
            raise DatasetNotFoundError(
                f"expected a Hugging Face save_to_disk directory (with state.json or {_DICT_FILE}), "
                f"found neither in {path}"
            )
        where = path
        source = hd.load_from_disk(path)
    if isinstance(source, hd.DatasetDict):
        source = _pick_split(source, split, where)
    elif isinstance(source, hd.IterableDataset | hd.IterableDatasetDict):
        raise UnsupportedError(
            "expected a datasets.Dataset (an Arrow table), found an IterableDataset; "
            "materialize it first (datasets.Dataset.from_generator(...)) or save_to_disk it"
        )
    elif not isinstance(source, hd.Dataset):
        raise UnsupportedError(
            f"expected a datasets.Dataset or DatasetDict, found {type(source).__name__}"
        )
    elif split is not None:
        raise UnsupportedError(
            f"expected split= only for a DatasetDict, found a Dataset and split={split!r}"
        )
    return source


@dataclass
class _Plan:
    """What the mapping found that the header's metadata keeps: the class names by leaf."""

    class_names: dict[str, list[str]] = field(default_factory=dict)


def _json_error(ds: Any, column: str) -> UnsupportedError | ConversionError:
    # Name the first row whose JSON type differs from the first row's: that is the mix.
    first: str | None = None
    row = 0
    for table in ds.select_columns([column]).with_format("arrow").iter(batch_size=4096):
        for text in table.column(0).to_pylist():
            kind = "null" if text is None else type(json.loads(text)).__name__
            if first is None:
                first = kind
            elif kind != first:
                return ConversionError(
                    f"expected one type in column {column!r}, found mixed types (HF Json feature): "
                    f"row 0 holds {first}, row {row} holds {kind}; cast the column to one "
                    f"feature type first (Dataset.cast_column)",
                    column=column,
                    row=row,
                )
            row += 1
    return UnsupportedError(
        f"expected a typed feature in column {column!r}, found an HF Json feature (untyped JSON "
        f"values, all {first}); cast the column to a typed feature first (Dataset.cast_column)"
    )


def _identity(array: Any) -> Any:
    return array


class _Mapper:
    """Features -> (Arrow type, transform of a stored array) for sources/arrow.py, recursively."""

    def __init__(self) -> None:
        self.pa = _pa()
        self.hd = _datasets()
        self.plan = _Plan()

    def feature(self, feat: Any, path: tuple[str, ...]) -> tuple[Any, _Transform]:
        """The Arrow type ``feat``'s column becomes, and how each stored array becomes it."""
        pa, hd = self.pa, self.hd
        name = leaf_name(path)
        kind = getattr(feat, "_type", None)
        if isinstance(feat, dict):
            return self._struct(feat, path)
        if kind == "Value":
            if feat.dtype not in _VALUE_DTYPES:
                raise UnsupportedError(
                    f"expected a number, bool, string or binary Value in column {name!r}, "
                    f"found Value({feat.dtype!r}), which no superserial dtype holds exactly"
                    + ("; every value is missing" if feat.dtype == "null" else "")
                )
            return feat(), _identity
        if kind == "ClassLabel":
            self.plan.class_names[name] = list(feat.names)
            return pa.int64(), _identity
        if kind in ("Array2D", "Array3D", "Array4D", "Array5D"):
            return self._array(feat)
        if kind in ("List", "LargeList"):
            return self._list(feat, path)
        if kind in _FILE_FEATURES:
            return pa.binary(), self._file_bytes(feat)
        if kind == "Json":
            # A top-level Json column is checked first, by _json_error, for the row of the mix.
            raise UnsupportedError(
                f"expected a typed feature in {name!r}, found an HF Json feature (untyped JSON "
                f"values, of mixed types where HF chose it); cast it to a typed feature first"
            )
        if isinstance(feat, hd.Translation):
            return self._struct({lang: hd.Value("string") for lang in sorted(feat.languages)}, path)
        raise UnsupportedError(
            f"expected a Value, ClassLabel, ArrayXD, List, Image, Audio, Video, Pdf or dict feature "
            f"in column {name!r}, found {kind or type(feat).__name__}, which superserial cannot keep exactly"
        )

    def _struct(self, feats: dict[str, Any], path: tuple[str, ...]) -> tuple[Any, _Transform]:
        pa = self.pa
        names = list(feats)
        typed = [self.feature(feats[k], (*path, k)) for k in names]
        out_type = pa.struct([pa.field(k, t) for k, (t, _) in zip(names, typed, strict=True)])
        if all(f is _identity for _, f in typed):
            return out_type, _identity
        fns = [f for _, f in typed]

        def transform(array: Any) -> Any:
            children = [fn(array.field(i)) for i, fn in enumerate(fns)]
            mask = array.is_null() if array.null_count else None
            return pa.StructArray.from_arrays(children, names=names, mask=mask)

        return out_type, transform

    def _list(self, feat: Any, path: tuple[str, ...]) -> tuple[Any, _Transform]:
        pa = self.pa
        inner_type, inner = self.feature(feat.feature, path)
        if pa.types.is_struct(inner_type):
            raise UnsupportedError(
                f"expected a List of a Value, an ArrayXD or a List in column {leaf_name(path)!r}, "
                f"found a List of a dict (Arrow list<struct>), which no superserial leaf holds; "
                f"Sequence of a dict is HF's dict of lists, which is kept"
            )
        length = getattr(feat, "length", -1)
        large = feat._type == "LargeList"
        if length is not None and length >= 0 and not large:
            out_type = pa.list_(inner_type, length)
        else:
            out_type = pa.large_list(inner_type) if large else pa.list_(inner_type)
        if inner is _identity:
            return out_type, _identity

        def transform(array: Any) -> Any:
            mask = array.is_null() if array.null_count else None
            if pa.types.is_fixed_size_list(array.type):
                size = array.type.list_size
                values = array.values.slice(array.offset * size, len(array) * size)
                return pa.FixedSizeListArray.from_arrays(inner(values), size, mask=mask)
            cls = pa.LargeListArray if large else pa.ListArray
            return cls.from_arrays(array.offsets, inner(array.values), mask=mask)

        return out_type, transform

    def _array(self, feat: Any) -> tuple[Any, _Transform]:
        # HF stores ArrayXD as nested variable-size lists; the fixed dimensions become
        # fixed-size lists (a cast checks every length), so the leaf is dense.
        pa = self.pa
        out_type = pa.from_numpy_dtype(_numpy_dtype(feat.dtype))
        first, *rest = feat.shape
        for d in reversed(rest):
            out_type = pa.list_(out_type, d)
        out_type = pa.list_(out_type) if first is None else pa.list_(out_type, first)

        def transform(array: Any) -> Any:
            storage = array.storage if isinstance(array, pa.ExtensionArray) else array
            return storage.cast(out_type)

        return out_type, transform

    def _file_bytes(self, feat: Any) -> _Transform:
        pa = self.pa

        def transform(array: Any) -> Any:
            storage = array.storage if isinstance(array, pa.ExtensionArray) else array
            data = storage.field("bytes")
            if data.null_count > storage.null_count:
                # Only a path: HF's own embedding reads the file (as push_to_hub does).
                storage = feat.embed_storage(storage)
                data = storage.field("bytes")
            return data

        return transform


def _numpy_dtype(dtype: str) -> Any:
    np = require("numpy", extra="hf-datasets", needed_for="converting a Hugging Face dataset")
    return np.dtype(dtype)


def _batch_rows(ds: Any) -> int:
    rows = len(ds)
    nbytes = int(ds.data.nbytes)
    per_row = max(1, nbytes // max(1, int(ds.data.num_rows)))
    return max(1, min(_MAX_BATCH_ROWS, _BATCH_BYTES // per_row, rows or 1))


def hf_batches(ds: Any) -> tuple[Any, Iterator[Any], _Plan]:
    """The Arrow schema of ``ds`` as sources/arrow.py takes it, its record batches, and the plan.

    The batches are read by ``Dataset.iter`` in Arrow format, so an indices mapping
    (after ``select``, ``shuffle``, ``filter``) is followed, and at most one batch of
    about 32 MiB is held at a time.

    Raises:
        UnsupportedError: A column's feature has no exact superserial leaf.
    """
    pa = _pa()
    mapper = _Mapper()
    fields = []
    transforms: list[_Transform] = []
    for column, feat in ds.features.items():
        if getattr(feat, "_type", None) == "Json":
            raise _json_error(ds, column)
        out_type, fn = mapper.feature(feat, (column,))
        fields.append(pa.field(column, out_type))
        transforms.append(fn)
    schema = pa.schema(fields)

    def batches() -> Iterator[Any]:
        for table in ds.with_format("arrow").iter(batch_size=_batch_rows(ds)):
            arrays = []
            for name, fn in zip(schema.names, transforms, strict=True):
                column = table.column(name)
                chunk = (
                    column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks)
                )
                arrays.append(fn(chunk))
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    return schema, batches(), mapper.plan


def convert_hf(
    source: Any,
    path: Any,
    *,
    split: str | None = None,
    **save_options: Any,
) -> Header:
    """Converts a Hugging Face dataset into a superserial dataset at ``path``.

    Args:
        source: A ``datasets.Dataset``, a ``DatasetDict``, or a ``save_to_disk``
            directory of either.
        path: Where the dataset is written.
        split: The split of a ``DatasetDict`` (needed where it has several).
        **save_options: As for ``superserial.save`` (``compression``, ``shard_size``,
            ``progress``...).

    Returns:
        The header written.

    Raises:
        UnsupportedError: A column has no exact superserial leaf, or ``split`` is
            missing or unknown; nothing is written.
        ConversionError: A value is missing (null), or a column mixes types,
            naming the column and the row; nothing is written.
    """

    ds = open_hf(source, split)
    schema, batches, plan = hf_batches(ds)
    metadata: dict[str, Any] = {
        "hf_features": _json_clean(ds.features.to_dict()),
        "source": {"format": "hf", **({"split": split} if split else {}), "rows": len(ds)},
    }
    if plan.class_names:
        metadata["class_names"] = plan.class_names
    return write_arrow(
        batches,
        fs.dataset_path(path),
        schema=schema,
        metadata=metadata,
        num_rows=len(ds),
        source=f"Hugging Face dataset ({len(ds)} rows)",
        **save_options,
    )


def _json_clean(obj: Any) -> Any:
    # Features.to_dict() holds tuples (ArrayXD shapes); the header holds JSON.
    return json.loads(json.dumps(obj))

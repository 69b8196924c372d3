"""Arrow batches as a Hugging Face ``datasets.Dataset``: :meth:`NumpyDataset.to_hf`.

The table is the one :mod:`superserial.views.arrow` makes. Its features are, in
this order of preference:

* ``metadata["hf_features"]`` of the header (``datasets.Features.to_dict()``, kept by
  a conversion from Hugging Face), for the columns it names: ``ClassLabel``,
  ``Image``, ``Audio``... come back as they went in. Where such a feature stores a
  struct (``Image``, ``Audio``: ``{"bytes", "path"}``) and the column holds the
  encoded bytes alone, they become the struct's ``bytes`` with no ``path``;
* ``metadata["class_names"]`` (``{leaf name: [names...]}``): a ``ClassLabel`` of those
  names for each integer leaf named (nested leaves by their ``a/b`` path in dicts);
* otherwise the features ``datasets`` reads off the Arrow schema.

Each batch is cast to the features' Arrow schema, which carries them (its
``huggingface`` metadata), so the dataset has exactly those features. Garbage in
either key, or a column a feature does not fit, is a
:class:`~superserial.errors.HeaderError` naming the key.

In memory by default; with a cache directory the batches are streamed into an
Arrow file there that the dataset maps (memory bounded by a batch), as
``datasets`` maps its own cache files. ``datasets`` is the ``hf-datasets`` extra.

This module does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from superserial.errors import HeaderError, require
from superserial.format.header import Header
from superserial.views.arrow import pyarrow, table_schema

__all__ = ["datasets", "features_of", "to_hf"]

_STRUCT_FEATURES = ("Image", "Audio")


def datasets() -> Any:
    """The ``datasets`` module, or an error saying which extra installs it.

    Raises:
        MissingDependencyError: datasets cannot be imported.
    """
    return require("datasets", extra="hf-datasets", needed_for="to_hf()")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _class_names(header: Header, features: dict[str, Any]) -> None:
    """Sets a ``ClassLabel`` in ``features`` for each leaf ``metadata["class_names"]`` names."""
    hf = datasets()
    names = header.metadata.get("class_names")
    if names is None:
        return
    where = "metadata.class_names of the header"
    if not isinstance(names, dict):
        raise HeaderError(f"expected a JSON object in {where}, found {type(names).__name__}")
    for leaf, labels in names.items():
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise HeaderError(f"expected a list of names for {leaf!r} in {where}, found {labels!r}")
        parts = [_unescape(p) for p in str(leaf).split("/")]
        node: Any = features
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or parts[-1] not in node:
            continue  # a leaf left out by select=
        node[parts[-1]] = hf.ClassLabel(names=labels)


def features_of(header: Header, schema: Any) -> Any:
    """The ``datasets.Features`` of a table of ``schema`` read from ``header``'s dataset.

    Raises:
        HeaderError: ``metadata["hf_features"]`` or ``["class_names"]`` is garbage.
    """
    hf = datasets()
    features = dict(hf.Features.from_arrow_schema(schema))
    kept = header.metadata.get("hf_features")
    if kept is not None:
        where = "metadata.hf_features of the header"
        if not isinstance(kept, dict):
            raise HeaderError(f"expected a JSON object in {where}, found {type(kept).__name__}")
        try:
            restored = hf.Features.from_dict(kept)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise HeaderError(f"expected datasets.Features.to_dict() in {where}: {e}") from e
        # In the table's column order (the kept Arrow schema's: the source's), not the
        # JSON's sorted keys.
        features.update({k: v for k, v in restored.items() if k in features})
    else:
        _class_names(header, features)
    return hf.Features(features)


def _fit(batch: Any, features: Any) -> Any:
    """``batch`` cast to the features' schema (encoded bytes wrapped as their structs)."""
    pa = pyarrow()
    target = features.arrow_schema
    columns = []
    for name in target.names:
        column, feature = batch.column(name), features[name]
        want = target.field(name).type
        if (
            type(feature).__name__ in _STRUCT_FEATURES
            and pa.types.is_struct(want)
            and (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type))
        ):
            column = pa.StructArray.from_arrays(
                [column.cast(pa.binary()), pa.nulls(len(column), pa.string())],
                names=["bytes", "path"],
            )
        columns.append(column)
    try:
        return pa.RecordBatch.from_arrays(columns, names=target.names).cast(target)
    except (ValueError, TypeError, pa.ArrowNotImplementedError) as e:
        raise HeaderError(
            f"expected the columns to fit the Hugging Face features kept in the header's "
            f"metadata, found a cast from {batch.schema} to {target} fails: {e}"
        ) from e


def _fitted(batches: Iterable[Any], features: Any) -> Iterator[Any]:
    for batch in batches:
        yield _fit(batch, features)


def to_hf(header: Header, batches: Iterable[Any], cache_dir: str | None) -> Any:
    """A ``datasets.Dataset`` of Arrow ``batches`` of ``header``'s dataset.

    Args:
        header: The header of the dataset read (its structure pruned by ``select=``).
        batches: Its record batches (:func:`superserial.views.arrow.record_batches`).
        cache_dir: None: in memory; else a local directory for the Arrow file mapped.

    Raises:
        HeaderError: The kept features do not fit, or are garbage.
    """
    hf, pa = datasets(), pyarrow()
    features = features_of(header, table_schema(header))
    target = features.arrow_schema
    if cache_dir is None:
        table = pa.Table.from_batches(list(_fitted(batches, features)), schema=target)
        return hf.Dataset(table)
    os.makedirs(cache_dir, exist_ok=True)
    file = os.path.join(cache_dir, f"superserial-{uuid.uuid4().hex}.arrow")
    try:
        with pa.OSFile(file, "wb") as sink, pa.ipc.new_stream(sink, target) as writer:
            for batch in _fitted(batches, features):
                writer.write_batch(batch)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(file)
        raise
    return hf.Dataset.from_file(file)

"""A TFDS-prepared directory -> a superserial dataset, decoded as TFDS decodes it.

The directory (``features.json``, ``dataset_info.json`` and the split's shards)
is opened with TFDS itself (``tfds.builder_from_directory``), so every feature
comes out as TFDS gives it to a training loop: ``Image`` as uint8 [H, W, C],
``ClassLabel`` as int64, ``Text`` as a string, ``Tensor`` in its dtype and
shape, ``Sequence`` with a leading unknown dimension (ragged where nested).
That ``tf.data`` dataset is then written by :func:`superserial.tf.save.save`.

TFRecord shards are read by ``builder.as_dataset``. TFDS does not read
ArrayRecord shards into ``tf.data`` (only ``as_data_source``), so for those the
split's raw records come from the data source, in its order, and are decoded
in the graph by the features' own ``deserialize_example`` -- the decoding
``as_dataset`` applies to TFRecord shards.

What tensors cannot hold goes in the header's metadata: the names of every
``ClassLabel`` under ``class_names`` (by leaf name), and under ``source`` the
TFDS name, version, split, file format and the features' JSON
(``features.json``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from superserial.errors import (
    DatasetNotFoundError,
    HeaderError,
    UnsupportedError,
    require,
)
from superserial.format.header import Header
from superserial.format.structure import leaf_name

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow (through save) is imported by the conversion, before TFDS: without it
# the error names the tf extra, not tfds.

__all__ = ["convert_tfds"]

# Raw ArrayRecord records handed to tf.data at once.
_CHUNK = 256


def _pick_split(splits: list[str], split: str | None, where: str) -> str:
    """The split to convert: ``split``, checked, or the only one there is."""
    listed = ", ".join(repr(s) for s in splits)
    if split is None:
        if len(splits) == 1:
            return splits[0]
        raise ValueError(
            f"expected split= naming one of the splits of the TFDS dataset at {where} "
            f"({listed}), got none"
        )
    # TFDS's split syntax: "train", "train[:10%]", "train+test".
    for part in split.split("+"):
        name = part.partition("[")[0].strip()
        if name not in splits:
            raise ValueError(
                f"expected split= naming one of {listed} of the TFDS dataset at {where}, "
                f"got {split!r}"
            )
    return split


def _class_names(tfds: Any, features: Any) -> dict[str, list[str]]:
    """The names of every ``ClassLabel`` in ``features``, by the leaf name it decodes to.

    A ``Sequence`` adds no key to the path (its values decode to one leaf with
    a leading dimension); a ``FeaturesDict`` adds its keys.
    """
    found: dict[str, list[str]] = {}

    def walk(feature: Any, path: tuple[str, ...]) -> None:
        if isinstance(feature, tfds.features.FeaturesDict):
            for key, child in feature.items():
                walk(child, (*path, key))
        elif isinstance(feature, tfds.features.Sequence):
            walk(feature.feature, path)
        elif isinstance(feature, tfds.features.ClassLabel):
            found[leaf_name(path)] = list(feature.names)

    walk(features, ())
    return found


def _array_record_dataset(builder: Any, split: str) -> tf.data.Dataset:
    """The split of an ArrayRecord-format builder as tf.data, in the data source's order."""
    import tensorflow as tf

    from superserial.codec import tf_generator

    source = builder.as_data_source(split=split)
    raw = source.data_source  # the records undecoded: ``source[i]`` decodes in numpy
    n = len(source)

    def chunks() -> Iterator[np.ndarray]:
        for start in range(0, n, _CHUNK):
            records = raw.__getitems__(range(start, min(start + _CHUNK, n)))
            batch = np.empty(len(records), dtype=object)
            batch[:] = list(records)
            yield batch

    records = tf_generator.from_generator(
        chunks, output_signature=tf.TensorSpec([None], tf.string)
    ).unbatch()
    records = records.apply(tf.data.experimental.assert_cardinality(n))
    return records.map(
        builder.info.features.deserialize_example,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def convert_tfds(
    source: Any,
    path: str,
    *,
    split: str | None = None,
    compression: str | None = None,
    num_shards: int | None = None,
    shard_size: int | None = None,
    overwrite: bool = False,
    progress: bool | Callable[[int, int], None] | None = None,
    overwrite_hint: str | None = None,
) -> Header:
    """Makes a dataset at ``path`` of one split of a TFDS-prepared directory.

    Args:
        source: The directory TFDS prepared (the one holding ``features.json``,
            ``dataset_info.json`` and the shards: ``<data_dir>/<name>/<version>``).
        path: The dataset directory to create.
        split: The split, in TFDS's syntax (``"train"``, ``"train[:10%]"``,
            ``"train+test"``); needed when there are several.
        compression: As for ``save``.
        num_shards: As for ``save``.
        shard_size: As for ``save``.
        overwrite: As for ``save``.
        progress: As for ``save``.
        overwrite_hint: Unused: ``save`` words its own (the dispatcher passes one
            to every converter).

    Returns:
        The header written, with ``metadata["class_names"]`` (when there are
        ``ClassLabel`` features) and ``metadata["source"]``.

    Raises:
        MissingDependencyError: tensorflow-datasets is not installed.
        DatasetNotFoundError: ``source`` is no TFDS-prepared directory.
        HeaderError: TFDS cannot read its ``features.json`` or ``dataset_info.json``.
        ValueError: Several splits and no ``split``, or an unknown one (the
            message lists them).
        UnsupportedError: Shards in a file format other than TFRecord or ArrayRecord.
    """
    # save first: without TensorFlow it names the tf extra, not tfds.
    from superserial.tf.save import save

    tfds = require(
        "tensorflow_datasets",
        extra="tfds",
        needed_for="converting a TFDS directory",
        package="tensorflow-datasets",
    )
    del overwrite_hint
    if not isinstance(source, str | os.PathLike):
        raise UnsupportedError(
            f"expected a TFDS-prepared directory's path, got {type(source).__name__}"
        )
    where = os.fspath(source)
    try:
        builder = tfds.builder_from_directory(where)
        info = builder.info
        splits = sorted(info.splits.keys())
        file_format = info.file_format
    except OSError as e:
        # TFDS's DatasetInfoFileError (an OSError) says which file it could not read.
        raise DatasetNotFoundError(
            "expected a TFDS-prepared directory (features.json and dataset_info.json in it), "
            f"found none TFDS can read at {where}: {e}"
        ) from e
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise HeaderError(
            f"expected TFDS's features.json and dataset_info.json, got ones TFDS cannot read "
            f"at {where}: {e}"
        ) from e
    split = _pick_split(splits, split, where)
    format_name = getattr(file_format, "value", str(file_format))
    if format_name == "tfrecord":
        dataset = builder.as_dataset(
            split=split,
            shuffle_files=False,
            read_config=tfds.ReadConfig(try_autocache=False),
        )
    elif format_name == "array_record":
        dataset = _array_record_dataset(builder, split)
    else:
        raise UnsupportedError(
            f"expected TFDS shards in tfrecord or array_record, got {format_name} at {where}"
        )
    metadata: dict[str, Any] = {
        "source": {
            "format": "tfds",
            "name": info.name,
            "version": str(info.version),
            "split": split,
            "file_format": format_name,
            "features": info.features.to_json(),
        }
    }
    names = _class_names(tfds, info.features)
    if names:
        metadata["class_names"] = names
    return save(
        dataset,
        path,
        compression=compression,
        num_shards=num_shards,
        shard_size=shard_size,
        overwrite=overwrite,
        progress=progress,
        metadata=metadata,
    )

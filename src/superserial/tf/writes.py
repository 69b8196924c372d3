"""What every write of a ``tf.data.Dataset`` shares: the checks, and the way into the write loop.

``save``, ``save(shard_index=)`` and the ``Writer``, and ``append`` check
their dataset and options here, one rule each (a finite dataset, at least
one tensor per element, a shard size in bytes, quotas for ``num_shards``),
and encode their elements into the one write loop
(:mod:`superserial.write.loop`) with :func:`write_dataset`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import tensorflow as tf

from superserial.codec.tf_records import framed_batches
from superserial.codec.tf_spec import from_element_spec, not_a_dataset
from superserial.errors import UnsupportedError
from superserial.format.structure import Leaf, Node, iter_leaves
from superserial.write.loop import Bar, check_shard_size, write_with_bar
from superserial.write.shard_writer import quotas
from superserial.write.targets import Target

__all__ = [
    "check_dataset",
    "shard_plan",
    "structure_of",
    "write_dataset",
]

R = TypeVar("R")


def check_dataset(dataset: Any) -> int:
    """The cardinality of ``dataset``, checked to be a finite ``tf.data.Dataset``.

    Raises:
        UnsupportedError: ``dataset`` is not a ``tf.data.Dataset`` (also a
            ``TypeError``).
        ValueError: It is infinite.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise not_a_dataset(dataset)
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError("expected a finite dataset, got one of infinite cardinality")
    return cardinality


def structure_of(element_spec: Any) -> tuple[Node, tuple[Leaf, ...]]:
    """The header structure of ``element_spec`` and its leaves, in order.

    Raises:
        UnsupportedError: A leaf cannot be stored (named), or the structure
            holds no tensor at all.
    """
    structure = from_element_spec(element_spec)
    leaves = tuple(iter_leaves(structure))
    if not leaves:
        raise UnsupportedError(
            "expected at least one tensor in each element, got an empty structure"
        )
    return structure, leaves


def shard_plan(
    dataset: tf.data.Dataset, num_shards: int | None, shard_size: int | None
) -> tuple[int, list[int] | None]:
    """(the dataset's cardinality, records per shard or None), with the checks of both.

    Raises:
        UnsupportedError: ``dataset`` is not a ``tf.data.Dataset`` (also a
            ``TypeError``).
        ValueError: An infinite dataset, a bad ``num_shards`` (or one with an
            unknown cardinality) or a bad ``shard_size``.
    """
    cardinality = check_dataset(dataset)
    shard_quotas = quotas(num_shards, cardinality)
    check_shard_size(shard_size)
    return cardinality, shard_quotas


def write_dataset(
    dataset: tf.data.Dataset,
    target: Target[R],
    leaves: tuple[Leaf, ...],
    *,
    compression: str | None,
    shard_quotas: list[int] | None,
    shard_size: int | None,
    bar: Bar,
) -> R:
    """Encodes ``dataset`` and writes it through the one write loop into ``target``.

    What ``save``, ``append`` and the ``Writer`` share on the TensorFlow side:
    the records come from :func:`~superserial.codec.tf_records.framed_batches`
    (the fixed-shape numpy encoder wherever it applies), after the elements
    of the shards a resumed target already holds.

    Args:
        dataset: The elements to write.
        target: Where they go and how they are committed.
        leaves: The header leaves the records are encoded by.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        shard_quotas: Records per shard, or None to split by ``shard_size``.
        shard_size: Bytes per shard when ``shard_quotas`` is None (None: the default).
        bar: The progress callback (``bar(elements, bytes)``, ``bar.close()``).

    Returns:
        What the target committed.
    """
    done = sum(s.records for s in target.done)
    if done:
        bar(done, sum(s.bytes for s in target.done))
    return write_with_bar(
        framed_batches(dataset.skip(done) if done else dataset, leaves),
        target,
        compression=compression,
        quotas=shard_quotas,
        shard_size=shard_size,
        bar=bar,
    )

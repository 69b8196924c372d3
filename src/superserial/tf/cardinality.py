"""A ``tf.data.Dataset``'s cardinality stated from the header's count, not asserted.

``load`` and the shuffled reads give every dataset its element count, so that
``len()`` works, in a way a tf.data service worker that reads only part of the
shards survives (see :func:`known_cardinality`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["known_cardinality"]


def known_cardinality(ds: tf.data.Dataset, count: int) -> tf.data.Dataset:
    """``ds`` with ``count`` as its cardinality, stated rather than asserted.

    ``assert_cardinality`` fails a tf.data service worker in
    ``distributed_epoch`` mode: each worker reads only the shard files the
    dispatcher hands it, fewer elements than the whole. Here the count comes
    from ``take(count)`` over ``ds`` followed by a dataset of infinite
    cardinality that yields nothing: a whole read stops at ``count`` without
    reaching it; a service worker's share runs into it and ends there.
    The count is still checked where it matters, each shard's own record
    count inside the read of the shard (a shard short of records fails).

    The empty endless dataset is ``choose_from_datasets`` whose first choice
    is an empty input, so it stops (``stop_on_empty_dataset``); its other
    input, ``ds`` repeated, only makes the cardinality infinite and is never
    read. (``repeat()`` of an empty dataset would loop forever under a
    tf.data service; the choices come from ``Dataset.random``, a source the
    service does not split.) The map after it restates the element shapes,
    which TF 2.21 gets wrong for ``choose_from_datasets`` inside
    ``concatenate`` ("Incompatible shapes at component ..."), and fails
    loudly should an element ever come through. A map cannot give back a
    ragged leaf of ``ragged_rank`` 0 (its values are plain tensors): for
    those datasets the count is asserted as before, and a tf.data service in
    ``distributed_epoch`` mode needs ``load(..., assert_cardinality=False)``.

    A ``ds`` whose static cardinality is already ``count`` comes back as it
    is: one shard read by ``TFRecordDataset`` carries its record count from
    its own ``assert_cardinality`` through ``batch`` and ``map`` (a short
    shard fails there), and the shuffled order's positions know theirs.
    Stating it again would only add pipeline steps, which doubled the time
    to build ``load``'s pipeline. Inside a ``tf.function`` the cardinality
    is symbolic, so it is stated again there.
    """
    if tf.get_static_value(ds.cardinality()) == count:
        return ds
    if any(
        isinstance(s, tf.RaggedTensorSpec) and s.ragged_rank == 0
        for s in tf.nest.flatten(ds.element_spec)
    ):
        return ds.apply(tf.data.experimental.assert_cardinality(count))
    unpack = type(ds.element_spec) is tuple  # tf.data passes a plain tuple as arguments

    @tf.autograph.experimental.do_not_convert
    def never(*args: Any) -> Any:
        with tf.control_dependencies([tf.debugging.Assert(False, ["internal: filler read"])]):
            value = args if unpack else args[0]
            return tf.nest.map_structure(tf.identity, value, expand_composites=True)

    choices = tf.data.Dataset.random(seed=0).map(tf.zeros_like)
    nothing = tf.data.Dataset.choose_from_datasets(
        [ds.take(0), ds.repeat()], choices, stop_on_empty_dataset=True
    )
    return ds.concatenate(nothing.map(never)).take(count)

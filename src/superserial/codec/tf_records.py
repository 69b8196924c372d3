"""Elements -> serialized ``tf.train.Example`` records, exactly as ``save`` writes them.

Elements are batched inside the ``tf.data`` graph and each batch is encoded by
one traced function (:func:`superserial.codec.tf_encode.encode_batch`); the records come
out as numpy arrays of ``bytes`` with their sizes, ready for a
:class:`~superserial.write.shard_writer.ShardWriter`. Every writer goes through
:func:`encoded_batches`, so equal elements give equal bytes whoever writes them.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from superserial.codec import numpy_encode, tf_encode, tf_generator, tf_leaves
from superserial.codec.tf_spec import from_element_spec
from superserial.codec.tf_tensors import to_tensors
from superserial.format.framing import frame_batches
from superserial.format.structure import Leaf, iter_leaves

__all__ = [
    "ElementEncoder",
    "encode_elements",
    "encoded_batches",
    "framed_batches",
    "iterate",
    "record_batches",
]

# overheads vanish, small enough to keep memory bounded for big elements.
_BATCH_BYTES = 4 << 20
_MAX_BATCH = 1024


def _element_bytes(leaves: Any) -> int:
    """A rough size of one element, guessing 16 for each unknown dimension."""
    total = 0
    for leaf in leaves:
        n = 1
        for d in leaf.shape:
            n *= 16 if d is None else d
        total += n * max(leaf.entry.itemsize, 8)
    return max(total, 1)


def encoded_batches(dataset: tf.data.Dataset, leaves: tuple[Any, ...]) -> tf.data.Dataset:
    """The dataset as batches of serialized records and their byte totals."""
    ds = dataset
    # No autograph: the encoding has no tensor-dependent Python control flow, and
    # converting its code cost over a second on the first save in a process.
    plain = tf.autograph.experimental.do_not_convert
    if any(tf_leaves.needs_premap(leaf) for leaf in leaves):
        ds = ds.map(
            plain(lambda *el: tf_leaves.split_element(leaves, tf.nest.flatten(el))),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    ds = ds.batch(max(1, min(_MAX_BATCH, _BATCH_BYTES // _element_bytes(leaves))))
    encode = _batch_encoder(leaves, ds.element_spec)
    return ds.map(
        plain(lambda *b: encode(*tf.nest.flatten(b, expand_composites=False))),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    ).prefetch(2)


@functools.lru_cache(maxsize=64)
def _batch_encoder_cached(leaves: tuple[Any, ...], flat_spec: tuple[Any, ...]) -> Any:
    @tf.function(input_signature=flat_spec, autograph=False)
    def encode(*flat: Any) -> Any:
        comps: list[Any] = []
        it = iter(flat)
        for leaf in leaves:
            n = tf_leaves.join_arity(leaf) if tf_leaves.needs_split(leaf) else 1
            comps.append(tuple(next(it) for _ in range(n)) if n > 1 else next(it))
        return tf_encode.encode_batch(leaves, comps)

    return encode


def _batch_encoder(leaves: tuple[Any, ...], batch_spec: Any) -> Any:
    """The batch encoder, traced once per (leaves, batch spec) and reused.

    Tracing costs tens of milliseconds: as much as encoding 10,000 small
    elements, so repeated saves of one kind of dataset share it.
    """
    flat_spec = tuple(tf.nest.flatten(batch_spec, expand_composites=False))
    return _batch_encoder_cached(leaves, flat_spec)


def iterate(dataset: tf.data.Dataset) -> Iterator[Any]:
    """Iterates ``dataset``; on any exception, Ctrl-C included, destroys its iterator at once.

    TensorFlow's iterator of a ``from_generator`` dataset deadlocks when it is
    destroyed during interpreter exit: its destructor waits for the generator
    thread, which waits for the GIL that the exiting main thread holds. A
    ``KeyboardInterrupt`` raised in ``next()`` keeps the iterator alive until
    exit (it is ``self`` in the frames of TensorFlow's ``__next__``, which the
    traceback holds), so the process hung after Ctrl-C. Clearing those
    frames' locals (TensorFlow's own; the caller's frames are not touched)
    and dropping the iterator here destroys it while the generator thread can
    still finish.
    """
    it = iter(dataset)
    try:
        yield from it
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        del it


def record_batches(
    dataset: tf.data.Dataset, leaves: tuple[Leaf, ...]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Runs :func:`encoded_batches`: (records, per-record sizes) as numpy arrays."""
    for records, sizes in iterate(encoded_batches(dataset, leaves)):
        yield records.numpy(), np.asarray(sizes.numpy(), np.int64)


def framed_batches(
    dataset: tf.data.Dataset, leaves: tuple[Leaf, ...]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The records of ``dataset`` in their TFRecord framing: (one uint8 buffer, data sizes) per batch.

    Fixed-shape numeric leaves are encoded from numpy batches
    (:mod:`superserial.codec.numpy_encode`: one copy of the payload, no traced
    function); others by the graph encoder, then framed a batch at once.
    Either way the bytes are the same.
    """
    if not numpy_encode.encodable(leaves):
        yield from frame_batches(record_batches(dataset, leaves))
        return
    size = max(1, min(_MAX_BATCH, _BATCH_BYTES // _element_bytes(leaves)))
    for batch in iterate(dataset.batch(size).prefetch(2)):
        yield numpy_encode.frame_batch(leaves, [t.numpy() for t in tf.nest.flatten(batch)])


def _is_ragged0(spec: Any) -> bool:
    return isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank == 0


def _generated(
    generate: Callable[[], Iterator[Any]], element_spec: Any, leaves: tuple[Leaf, ...]
) -> tf.data.Dataset:
    """A dataset of what ``generate`` yields, of exactly ``element_spec``.

    ``from_generator`` cannot yield a ``ragged_rank`` 0 ragged leaf (TF has no
    such value: it is a plain tensor, and the generator's type check rejects
    it). Such leaves are generated as plain tensors of their shape; then every
    leaf gets a leading dimension of 1, sliced off again by
    ``from_tensor_slices``, which gives the ragged spec back.
    """
    specs = tf.nest.flatten(element_spec)
    if not any(_is_ragged0(s) for s in specs):
        return tf_generator.from_generator(generate, output_signature=element_spec)
    plain = tf.nest.pack_sequence_as(
        element_spec,
        [tf.TensorSpec(s.shape, s.dtype) if _is_ragged0(s) else s for s in specs],
    )

    def slices(*el: Any) -> tf.data.Dataset:
        flat = tf.nest.flatten(el)
        expanded = [tf_leaves.expand_leaf(leaf, x) for leaf, x in zip(leaves, flat, strict=True)]
        # Not unbatch: TF 2.21's unbatch crashes (SIGSEGV) on zero-size tensors.
        return tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(element_spec, expanded))

    return tf_generator.from_generator(generate, output_signature=plain).flat_map(slices)


class ElementEncoder:
    """Encodes lists of elements to records exactly as :func:`superserial.save` does.

    The elements go through the very pipeline ``save`` uses
    (:func:`superserial.tf.save.encoded_batches`), so the records are byte for
    byte those ``save`` writes for the same elements. The pipeline is built
    (and its functions traced) once, by the first :meth:`encode` call (not at
    construction: the framed path of :meth:`encode_framed`, the two-phase
    ``Writer``'s, never runs it, and tracing it took most of a small part's
    write, 1.8 of 3 s); each call runs it again over new elements. Not
    thread-safe: one encoder per thread.

    Args:
        element_spec: The elements' ``tf.data`` element spec.
        leaves: The header leaves of ``element_spec``, if already built.
    """

    def __init__(self, element_spec: Any, leaves: tuple[Leaf, ...] | None = None) -> None:
        if leaves is None:
            leaves = tuple(iter_leaves(from_element_spec(element_spec)))
        self.element_spec, self.leaves = element_spec, leaves
        self._pending: list[Any] = []
        self._dataset = _generated(self._generate, element_spec, leaves)
        self._batches: tf.data.Dataset | None = None  # built by the first encode()

    def _take(self, elements: Iterable[Any], converted: bool) -> bool:
        """Queues ``elements`` for the next run of the pipeline; False if there are none."""
        self._pending = (
            list(elements) if converted else [to_tensors(e, self.element_spec) for e in elements]
        )
        return bool(self._pending)

    def _generate(self) -> Iterator[Any]:
        pending, self._pending = self._pending, []
        yield from pending

    def encode(
        self, elements: Iterable[Any], *, converted: bool = False
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields (records, per-record sizes) per encoded batch, as numpy arrays.

        Args:
            elements: Elements of numpy values or tensors (see :func:`to_tensors`).
            converted: The elements already went through :func:`to_tensors`.
        """
        if not self._take(elements, converted):
            return
        if self._batches is None:
            self._batches = encoded_batches(self._dataset, self.leaves)
        for records, sizes in iterate(self._batches):
            yield records.numpy(), np.asarray(sizes.numpy(), np.int64)

    def encode_framed(
        self, elements: Iterable[Any], *, converted: bool = False
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields (framed records as one uint8 buffer, data sizes) per batch, for the write loop.

        As :func:`framed_batches` encodes a dataset: fixed-shape leaves in
        numpy, others in graph; the bytes are those of :meth:`encode`, framed.

        Args:
            elements: Elements of numpy values or tensors (see :func:`to_tensors`).
            converted: The elements already went through :func:`to_tensors`.
        """
        if self._take(elements, converted):
            yield from framed_batches(self._dataset, self.leaves)


def encode_elements(
    elements: Iterable[Any], element_spec: Any, leaves: tuple[Leaf, ...] | None = None
) -> Iterator[tuple[np.ndarray, int]]:
    """Encodes elements to records exactly as :func:`superserial.save` does.

    A one-off :class:`ElementEncoder`; use one of those to encode many lists.

    Yields:
        (records, total bytes) per encoded batch; records is a numpy array of
        ``bytes``.
    """
    for records, sizes in ElementEncoder(element_spec, leaves).encode(elements):
        yield records, int(sizes.sum())

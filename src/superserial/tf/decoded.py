"""Records decoded by the numpy decoder inside tf.data pipelines, not by ``parse_example``.

Where records pass through Python anyway (remote shards streamed in order by
:mod:`superserial.tf.streamed`), a chunk of them costs the vectorized numpy
decoder (:class:`~superserial.codec.numpy_batch_decode.BatchDecoder`) a
fraction of the CPU ``tf.io.parse_example`` takes, which was about half of
a remote epoch's time on 2 cores. (Not the shuffled reads of
:mod:`superserial.tf.shuffled`: decoding there, in the numpy call of each
chunk of positions under the GIL, read a local windowed epoch at 85-107k el/s
against 80-128k with ``parse_example`` in parallel, and the global order at
74-78k against 82-93k.) It serves headers whose leaves are all dense
of a fixed shape holding values (:func:`decoder` gives a decoder for
those, None for others): it gives the very arrays
``parse_example`` and :mod:`superserial.codec.tf_decode` give. A chunk it
declines (records of another writer, a value failing a check) is decoded
record by record (:class:`~superserial.codec.numpy_decode.RecordDecoder`),
which names the record at fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from superserial.codec import tf_leaves
from superserial.codec.numpy_batch_decode import BatchDecoder
from superserial.codec.numpy_decode import RecordDecoder
from superserial.codec.tf_spec import leaf_spec
from superserial.format.header import Header

__all__ = ["ChunkDecoder", "decoder"]


def decoder(header: Header) -> ChunkDecoder | None:
    """A decoder giving this header's batches as ``parse_example`` would; None where it cannot."""
    if not header.leaves or not all(
        x.kind == "dense" and x.fixed and not tf_leaves.needs_join(x) for x in header.leaves
    ):
        return None
    fast = BatchDecoder(header)
    return ChunkDecoder(header, fast) if fast.supported else None


class ChunkDecoder:
    """Chunks of a header's records -> their flat leaves, stacked (see the module docstring).

    Made by :func:`decoder`, which checks the header's leaves once.

    Args:
        header: The header of the records.
        fast: Its batch decoder, which supports it.
    """

    def __init__(self, header: Header, fast: BatchDecoder) -> None:
        if not fast.supported:
            raise ValueError("internal: a ChunkDecoder over a batch decoder that declines")
        self._fast, self._slow = fast, RecordDecoder(header)
        self.specs = tuple(leaf_spec(x) for x in header.leaves)
        self.dtypes = tuple(s.dtype for s in self.specs)

    def decode(
        self, buffer: bytes, starts: np.ndarray, lengths: np.ndarray, where: Callable[[int], str]
    ) -> list[Any]:
        """The flat leaves of records ``buffer[starts[m] : starts[m] + lengths[m]]``.

        ``where(m)`` names record ``m`` (called only where the fast decoder declines).
        """
        stops = starts + lengths
        leaves = self._fast.decode(buffer, starts, stops)
        if leaves is not None:
            return leaves
        records = [buffer[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
        return self._slow.decode(records, [where(m) for m in range(len(records))])

    def batched(self, rows: int | None) -> tuple[tf.TensorSpec, ...]:
        """The specs of the leaves of a batch of ``rows`` (None: any)."""
        return tuple(s._batch(rows) for s in self.specs)

"""Python generators into tf.data: ``from_generator``, with glibc's large blocks reused.

Every ``tf.data.Dataset.from_generator`` of superserial is made here. The
first such iterator of a process makes TensorFlow fix glibc's mmap threshold
at 128 KiB, after which each of the readers' megabyte blocks is mapped afresh
and faulted in page by page; the generator given here first lifts it again
(:func:`superserial.base.malloc.lift_mmap_threshold`, once per process), which
runs after TensorFlow's call since TensorFlow makes it as the iterator is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from superserial.base import malloc

__all__ = ["from_generator"]


def from_generator(
    generator: Callable[..., Iterator[Any]],
    output_signature: Any,
    args: tuple[Any, ...] | None = None,
) -> tf.data.Dataset:
    """``tf.data.Dataset.from_generator(generator, output_signature=..., args=...)``.

    Each iteration calls ``generator(*args)`` as TensorFlow would, after
    :func:`~superserial.base.malloc.lift_mmap_threshold`.
    """

    def lifted(*values: Any) -> Iterator[Any]:
        malloc.lift_mmap_threshold()
        return generator(*values)

    return tf.data.Dataset.from_generator(lifted, output_signature=output_signature, args=args)

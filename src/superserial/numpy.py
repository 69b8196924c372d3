"""Reads superserial datasets into numpy arrays, without TensorFlow.

    import superserial.numpy as ssnp

    for element in ssnp.load("/data/digits"):              # one element at a time
        image, label = element["image"], element["label"]  # np.uint8[28, 28], np.int64[]
    for batch in ssnp.iter_batches("/data/digits", 256):   # stacked [256, ...] arrays
        ...

The public face of :mod:`superserial.read.numpy_reader`.
"""

from __future__ import annotations

from superserial.read.numpy_reader import (
    NumpyDataset,
    Ragged,
    RecordDecoder,
    Sparse,
    iter_batches,
    load,
    read_records,
)

__all__ = [
    "NumpyDataset",
    "Ragged",
    "RecordDecoder",
    "Sparse",
    "iter_batches",
    "load",
    "read_records",
]

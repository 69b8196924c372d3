"""Writes seed corpora for the fuzz targets from real saves (needs TensorFlow).

    .venv/bin/python fuzz/make_corpus.py

Creates ``fuzz/corpus/header/*`` (headers of datasets of many structures) and
``fuzz/corpus/records/*`` plus ``fuzz/corpus/records.header.json`` (shards of
one dataset, uncompressed, GZIP and ZLIB, with the selector byte the records
target expects).
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile

import tensorflow as tf

import superserial

log = logging.getLogger("make_corpus")
HERE = os.path.dirname(os.path.abspath(__file__))


def _datasets() -> dict[str, tf.data.Dataset]:
    point = collections.namedtuple("point", ["x", "y"])
    r = tf.data.Dataset.range(5)
    return {
        "plain": r,
        "dict": r.map(lambda i: {"a/b": i, "c~d": tf.strings.as_string(i)}),
        "tuple_nested": r.map(lambda i: (i, (tf.cast(i, tf.float64), {"k": tf.cast(i, tf.uint8)}))),
        "namedtuple": r.map(lambda i: point(i, tf.cast(i, tf.bfloat16))),
        "unknown_dims": r.map(lambda i: tf.zeros(tf.stack([i, 2]), tf.complex64)),
        "ragged": r.map(lambda i: tf.RaggedTensor.from_row_lengths(tf.range(i * 2), [i, i])),
        "sparse": r.map(lambda i: tf.sparse.SparseTensor([[0, 1]], [i], [2, 3])),
    }


def _records_dataset() -> tf.data.Dataset:
    r = tf.data.Dataset.range(3)
    return r.map(
        lambda i: {
            "d": tf.fill([2], i),
            "s": tf.strings.as_string(i),
            "u": tf.cast(tf.fill([3], i), tf.uint8),
            "f": tf.cast(i, tf.float64),
            "r": tf.RaggedTensor.from_row_lengths(tf.range(i * 2), [i, i]),
            "p": tf.sparse.SparseTensor([[0, 1]], [i], [2, 3]),
        }
    )


def main() -> None:
    """Writes the corpora."""
    tmp = tempfile.mkdtemp()
    try:
        hdir = os.path.join(HERE, "corpus", "header")
        os.makedirs(hdir, exist_ok=True)
        for name, ds in _datasets().items():
            p = os.path.join(tmp, name)
            superserial.save(ds, p, num_shards=2)
            shutil.copy(os.path.join(p, "header.json"), os.path.join(hdir, name + ".json"))
        rdir = os.path.join(HERE, "corpus", "records")
        os.makedirs(rdir, exist_ok=True)
        for sel, compression in enumerate([None, "GZIP", "ZLIB"]):
            p = os.path.join(tmp, f"records-{compression}")
            h = superserial.save(_records_dataset(), p, compression=compression)
            with open(os.path.join(p, h.shards[0].file), "rb") as f:
                data = f.read()
            with open(os.path.join(rdir, f"{compression or 'NONE'}"), "wb") as f:
                f.write(bytes([sel + 3 * 3]) + data)  # selector: compression, count 3
            if compression is None:
                shutil.copy(
                    os.path.join(p, "header.json"),
                    os.path.join(HERE, "corpus", "records.header.json"),
                )
        log.info("corpora written under %s", os.path.join(HERE, "corpus"))
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()

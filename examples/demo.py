"""The main job on real data: save, inspect, load, compare, train.

Data ships with scikit-learn (no download): the 1,797 handwritten digits
(8x8 float64 images, int labels), and, for a ragged dataset, the text of the
descriptions of scikit-learn's bundled datasets, tokenized into word ids.
Both are saved, loaded back and compared bit for bit; then a small Keras model
trains on the loaded digits and is scored on digits it never saw. Everything is
written to a temporary directory that is removed at the end, except the pictures
of the data: the digits grid (`superserial show`) and their statistics
(`superserial stats --plot`) go to docs/images/, or to the
directory given with `--images DIR`.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from sklearn import datasets

import superserial


def digits_dataset() -> tf.data.Dataset:
    d = datasets.load_digits()
    return tf.data.Dataset.from_tensor_slices({"image": d.images, "label": d.target})


def text_dataset() -> tf.data.Dataset:
    texts = []
    for loader in (
        datasets.load_iris,
        datasets.load_digits,
        datasets.load_wine,
        datasets.load_breast_cancer,
        datasets.load_diabetes,
    ):
        texts += [s.strip() for s in re.split(r"[.\n]\s*\n|\.\s", loader().DESCR) if s.strip()]
    words = [re.findall(r"[a-z0-9]+", t.lower()) for t in texts]
    vocab = {w: i + 1 for i, w in enumerate(sorted({w for ws in words for w in ws}))}
    ids = tf.ragged.constant([[vocab[w] for w in ws] for ws in words], dtype=tf.int32)
    return tf.data.Dataset.from_tensor_slices({"tokens": ids, "text": tf.constant(texts)})


def identical(a: tf.data.Dataset, b: tf.data.Dataset) -> bool:
    if a.element_spec != b.element_spec:
        return False
    n = 0
    for x, y in zip(a, b, strict=True):
        for u, v in zip(
            tf.nest.flatten(x, expand_composites=True),
            tf.nest.flatten(y, expand_composites=True),
            strict=True,
        ):
            if (
                np.asarray(u.numpy()).tobytes() != np.asarray(v.numpy()).tobytes()
                or u.dtype != v.dtype
            ):
                return False
        n += 1
    return n == len(b)


def round_trip(name: str, ds: tf.data.Dataset, root: str) -> tf.data.Dataset:
    path = os.path.join(root, name)
    t0 = time.perf_counter()
    header = superserial.save(ds, path, progress=False)
    t1 = time.perf_counter()
    loaded = superserial.load(path)
    n = sum(1 for _ in loaded.batch(512))  # consumed in batches, as training does
    t2 = time.perf_counter()
    print(f"\n== {name}: saved to {path}")
    print(superserial.read_header(path).summary())
    same = identical(ds, loaded)
    print(f"identical after load: {same}")
    print(
        f"size on disk: {header.total_bytes:,} bytes; save {t1 - t0:.2f}s; load+iterate {len(loaded)} elements ({n} batches) {t2 - t1:.2f}s"
    )
    if not same:
        raise SystemExit(f"{name}: loaded dataset differs from the saved one")
    return loaded


IMAGES = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "images")
)


def pictures(path: str, images: str) -> None:
    """The first 32 saved digits as a captioned grid (TF-free reader, Pillow)."""
    os.makedirs(images, exist_ok=True)
    out = os.path.join(images, "digits_grid.png")
    grid = superserial.show(path, n=32, columns=8)
    grid.save(out)
    width, height = grid.image.size
    print(f"\n== the first {len(grid.indices)} digits and their labels: {out}, {width}x{height}")
    print(f"pixels scaled {grid.scaling}")
    out = os.path.join(images, "digits_stats.png")
    stats = superserial.stats(path)  # one streaming pass, TF-free
    width, height = stats.plot(out)
    print(f"\n== statistics of every leaf: {out}, {width}x{height}")
    print(stats)


def train(digits: tf.data.Dataset) -> None:
    """Trains a small dense net on the loaded digits; reports held-out accuracy."""
    n_train = 1_400  # of 1,797: the other 397 are never seen in training
    # Pixel values are 0..16: scaled to 0..1. One fixed shuffle, then a train/test split.
    xy = digits.map(
        lambda e: (tf.reshape(tf.cast(e["image"], tf.float32) / 16.0, [64]), e["label"])
    ).shuffle(len(digits), seed=0, reshuffle_each_iteration=False)
    train_ds = xy.take(n_train).cache().shuffle(n_train, seed=0).batch(32)
    test_ds = xy.skip(n_train).batch(256)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input([64]),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        tf.keras.optimizers.Adam(0.01),
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    epochs = 15
    t0 = time.perf_counter()
    model.fit(train_ds, epochs=epochs, verbose=0, shuffle=False)
    seconds = time.perf_counter() - t0
    _, accuracy = model.evaluate(test_ds, verbose=0)
    print(
        f"\n== trained a small Keras model on the loaded digits: {epochs} epochs in {seconds:.1f}s; "
        f"accuracy on {len(digits) - n_train} held-out digits {accuracy:.3f} (chance: 0.100)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", default=IMAGES, help="where the pictures go (docs/images)")
    args = parser.parse_args()
    # A temporary directory removed at the end, also when something fails.
    with tempfile.TemporaryDirectory(prefix="superserial-demo-") as root:
        digits = round_trip("digits", digits_dataset(), root)
        pictures(os.path.join(root, "digits"), args.images)
        round_trip("text", text_dataset(), root)
        train(digits)


if __name__ == "__main__":
    main()

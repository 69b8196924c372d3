"""How long deleting an exhausted tf.data iterator takes, against how long it was iterated.

With tf.data's autotuning on (the default), TensorFlow 2.21 deletes an iterator only
after its autotuner's model thread wakes for its next optimization, and that thread's
period doubles as the iterator lives. A ``for batch in ds:`` loop that ends deletes
its iterator there, so each epoch that makes a new iterator can wait about as long
again as it had run. This measures that wait, for a pipeline with a Python function in
it (as ``superserial.load``'s remote and shuffled reads have) and one of TensorFlow ops
only, with autotuning on and off:

    .venv/bin/python benchmarks/tf_iterator_deletion.py
    .venv/bin/python benchmarks/tf_iterator_deletion.py --seconds 1,4,16 --repeats 3

Nothing of superserial runs here: the pipelines are plain tf.data.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

STEP_S = 0.005  # each element of the Python pipeline sleeps this long


def _python(seconds: float) -> tf.data.Dataset:
    def slow(i: np.int64) -> np.int64:
        time.sleep(STEP_S)
        return i

    steps = max(1, int(seconds / STEP_S))
    return tf.data.Dataset.range(steps).map(
        lambda i: tf.ensure_shape(tf.numpy_function(slow, [i], tf.int64), [])
    )


def _tf_only(seconds: float) -> tf.data.Dataset:
    # About 0.16 ms an element on one core here: the count is only roughly ``seconds``.
    steps = max(1, int(seconds / 0.00016))
    return tf.data.Dataset.range(steps).map(
        lambda i: tf.reduce_sum(tf.random.stateless_uniform([20_000], tf.stack([i, i])))
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", default="1,4,16", help="iteration times to try, comma-separated")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print("| pipeline | autotune | iterated s | deletion s, each try |")
    print("|---|---|---:|---|")
    for make, name in ((_python, "range.map(numpy_function)"), (_tf_only, "range.map(tf ops)")):
        for seconds in [float(s) for s in args.seconds.split(",")]:
            for autotune in (True, False):
                waits, ran = [], []
                for _ in range(args.repeats):
                    ds = make(seconds)
                    options = tf.data.Options()
                    options.autotune.enabled = autotune
                    it = iter(ds.with_options(options))
                    t = time.perf_counter()
                    for _ in it:
                        pass
                    ran.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    del it
                    waits.append(time.perf_counter() - t)
                print(
                    f"| {name} | {'on' if autotune else 'off'} | {np.median(ran):.1f} | "
                    + ", ".join(f"{w:.2f}" for w in waits)
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""Leaves <-> ``tf.train.Example`` records. Each module names its direction and its backend:
``tf_*`` run in TensorFlow, ``numpy_*`` without it."""

"""Opening a dataset and reading it without TensorFlow: the opening sequence, ``select=``, the
shard cache, random access, the global shuffled order, ``verify`` and the numpy reader."""

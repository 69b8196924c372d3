"""The one filesystem layer: local paths, fsspec URLs and TensorFlow's filesystems, the retry
policy of remote reads, and range reads planned and kept in flight (TF-free)."""

"""The one filesystem layer: local paths, fsspec URLs and TensorFlow's filesystems (TF-free)."""

"""Datasets written by others made superserial datasets: ``infer`` (TFRecord files of
``tf.train.Example``) and ``legacy`` (the super_serial 2.0 script)."""

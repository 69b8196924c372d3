"""Datasets written by other tools made superserial datasets, and superserial datasets
written out for them: ``infer`` (TFRecord files of ``tf.train.Example``)."""

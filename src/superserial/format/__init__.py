"""The bytes on disk: dtypes, the element structure, the header, file names, TFRecord framing,
the ``tf.train.Example`` wire format and the record index (TF-free; see docs/format.md)."""

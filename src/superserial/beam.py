"""Apache Beam transforms that write and read superserial datasets in a pipeline.

    import superserial.beam as ssb

    with beam.Pipeline(options=options) as p:
        p | beam.Create(elements) | ssb.WriteToSuperSerial("gs://bucket/ds", element_spec)

The public face of :mod:`superserial.integrations.beam`.
"""

from __future__ import annotations

from superserial.integrations.beam import ReadFromSuperSerial, WriteToSuperSerial

__all__ = ["ReadFromSuperSerial", "WriteToSuperSerial"]

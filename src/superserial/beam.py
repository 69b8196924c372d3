"""Apache Beam transforms that write and read superserial datasets in a pipeline.

    import superserial.beam as ssb

    with beam.Pipeline(options=options) as p:
        p | beam.Create(elements) | ssb.WriteToSuperSerial("gs://bucket/ds", element_spec)

The public face of :mod:`superserial.integrations.beam`. Importing it without Apache Beam
raises :class:`~superserial.errors.MissingDependencyError` naming the ``beam`` extra.
"""

from __future__ import annotations

from superserial.errors import require

require("apache_beam", extra="beam", needed_for="superserial.beam", package="Apache Beam")

from superserial.integrations.beam import (  # noqa: E402  (after the check above)
    ReadFromSuperSerial,
    WriteToSuperSerial,
)

__all__ = ["ReadFromSuperSerial", "WriteToSuperSerial"]

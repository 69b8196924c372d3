"""Grain input from superserial datasets, without TensorFlow.

    import grain
    from superserial.grain import DataSource

    source = DataSource("/data/digits")
    ds = grain.MapDataset.source(source).shuffle(seed=0).batch(256, batch_fn=source.collate)

The public face of :mod:`superserial.integrations.grain.source`.
"""

from __future__ import annotations

from superserial.integrations.grain.source import DataSource, dataset

__all__ = ["DataSource", "dataset"]

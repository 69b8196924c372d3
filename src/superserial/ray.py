"""Ray Data from and to superserial datasets, without TensorFlow.

    import superserial.ray as ssr

    ds = ssr.read("/data/digits")                    # a ray.data.Dataset, one task per shard
    ds = ds.map_batches(preprocess)
    header = ssr.write(ds, "/data/digits-prepared")  # one part per write task, then the commit

The public face of :mod:`superserial.integrations.ray.source` (the
``Datasource``) and :mod:`superserial.integrations.ray.sink` (the ``Datasink``).
Needs ``superserial[ray]``.
"""

from __future__ import annotations

from superserial.integrations.ray.sink import SuperserialDatasink, write
from superserial.integrations.ray.source import SuperserialDatasource, read

__all__ = ["SuperserialDatasink", "SuperserialDatasource", "read", "write"]

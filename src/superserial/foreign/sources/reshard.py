"""A superserial dataset as a ``convert`` source: loaded and saved again, metadata kept.

Re-sharding and re-compressing (``superserial convert PATH -o NEW``): the
dataset is read with ``load`` and written with ``save``, its header's metadata
(class names, the Arrow schema of its own source) carried over. Unless told
otherwise, the new dataset keeps the source's compression and its shard count
(the records split evenly): a re-compression should not change how many
readers share the work.
"""

from __future__ import annotations

from typing import Any

from superserial.format.header import Header
from superserial.format.layout import read_header
from superserial.tf.load import load
from superserial.tf.save import save

__all__ = ["convert_superserial"]


def convert_superserial(source: Any, path: str, **options: Any) -> Header:
    """Writes the dataset at ``source`` anew at ``path`` (see the module).

    Args:
        source: The superserial dataset's path.
        path: The new dataset's path (not ``source`` itself).
        **options: As for ``save``; without ``compression``, the source's; without
            ``num_shards`` or ``shard_size``, its shard count.
    """
    options.pop("overwrite_hint", None)  # save words its own
    header = read_header(str(source))
    options.setdefault("compression", header.compression)
    if options.get("num_shards") is None and options.get("shard_size") is None:
        options["num_shards"] = max(len(header.shards), 1)
    return save(load(str(source)), path, metadata=header.metadata, **options)

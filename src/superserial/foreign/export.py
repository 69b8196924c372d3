"""A dataset written out for other tools: ``superserial export PATH -o OUT``.

* Parquet (``to="parquet"``, one file): the Arrow batches of
  :meth:`superserial.numpy.NumpyDataset.iter_arrow` (types as
  :mod:`superserial.views.arrow` maps them, the kept Arrow schema of a conversion
  restored), one row group per batch through ``pyarrow.parquet.ParquetWriter``:
  memory bounded by a batch.
* WebDataset (``to="webdataset"``, a directory of tar shards
  :func:`superserial.format.layout.webdataset_shard_name` names): one sample per
  element, its key the element's index zero-padded to 9 digits (more where there are
  more elements), one member per leaf named ``KEY.LEAF.EXT`` (the leaf's name with
  ``/`` as ``.``): an integer scalar as ``.cls`` (its decimal digits, which
  ``webdataset``'s decoders give back as an ``int``), a string scalar as ``.bin``
  (its bytes as they are, text or not: one extension for every element of a leaf),
  any other dense or ``ragged_rank`` 0 numeric leaf as ``.npy`` (``np.save``, no
  pickle). A new shard starts after ``shard_size`` bytes. Leaves with no such form
  (sparse, ragged rows, string arrays, bfloat16) are an
  :class:`~superserial.errors.UnsupportedError` naming the leaf, before anything is
  written.

Either is written under a temporary name beside ``OUT`` and renamed into place last,
so a failed export leaves nothing that looks complete (and removes what it wrote).
Progress and throughput as for save.

This module does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from superserial.base.progress import make_progress
from superserial.base.sizes import parse_size
from superserial.errors import DatasetExistsError, UnsupportedError, require
from superserial.format.layout import webdataset_shard_name
from superserial.format.structure import Leaf
from superserial.read.numpy_reader import NumpyDataset, load
from superserial.storage import fs

__all__ = ["FORMATS", "ExportResult", "export"]

FORMATS = ("parquet", "webdataset")
_BATCH = 1024  # elements decoded together for a WebDataset export


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export` wrote.

    Attributes:
        output: The Parquet file or WebDataset directory.
        files: The files written (the Parquet file, or the tar shards).
        elements: Elements (rows, samples) written.
        bytes: Bytes written.
        seconds: Wall time of the export.
    """

    output: str
    files: tuple[str, ...]
    elements: int
    bytes: int
    seconds: float


def export(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    to: str = "parquet",
    select: Any = None,
    batch_size: int | None = None,
    shard_size: int | str = "1GB",
    overwrite: bool = False,
    progress: Any = None,
) -> ExportResult:
    """Writes the dataset at ``path`` as Parquet or WebDataset shards at ``output``.

    Args:
        path: The dataset (local or a URL the numpy reader reaches).
        output: The Parquet file, or the directory of tar shards.
        to: ``"parquet"`` or ``"webdataset"``.
        select: Only these leaves (names as for :func:`superserial.numpy.load`).
        batch_size: Parquet: rows per row group (None: about 64 MiB of records);
            WebDataset: elements decoded together (None: 1024).
        shard_size: WebDataset: bytes per tar shard, about (``"1GB"``, an int).
        overwrite: Replace what is at ``output``.
        progress: True for a bar, False for none, None for a bar on a terminal, or
            a callable given (elements, bytes) per batch.

    Raises:
        DatasetExistsError: Something is at ``output`` and not ``overwrite``.
        UnsupportedError: A leaf has no form in the format asked for (named).
        MissingDependencyError: pyarrow is not installed (Parquet).
        ValueError: An unknown format.
    """
    if to not in FORMATS:
        raise ValueError(f"expected an export format in {FORMATS}, got {to!r}")
    out = fs.dataset_path(output)
    if fs.exists(out) and not overwrite:
        raise DatasetExistsError(
            f"expected nothing at {out}, found something (overwrite=True, --overwrite)"
        )
    size = parse_size(shard_size, "shard_size")
    if size is None or size < 1:
        raise ValueError(f"expected a shard_size of at least 1 byte, got {shard_size!r}")
    ds = load(path, select=select)
    started = time.perf_counter()
    bar = make_progress(progress, total=len(ds), desc=f"export {to}")
    tmp = fs.temp_sibling(out)
    try:
        if to == "parquet":
            written = _parquet(ds, tmp, batch_size, bar)
            files = [out]
        else:
            names, written = _webdataset(ds, tmp, size, batch_size or _BATCH, bar)
            files = [fs.join(out, n) for n in names]
        if fs.exists(out):
            (fs.rmtree if fs.isdir(out) else fs.remove)(out)
        fs.rename(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            (fs.rmtree if fs.isdir(tmp) else fs.remove)(tmp)
        raise
    finally:
        bar.close()
    return ExportResult(out, tuple(files), len(ds), written, time.perf_counter() - started)


# ------------------------------------------------------------------ Parquet


def _parquet(ds: NumpyDataset, tmp: str, batch_size: int | None, bar: Callable[..., None]) -> int:
    pq = require("pyarrow.parquet", extra="arrow", needed_for="Parquet", package="pyarrow")
    reader = ds.to_arrow_reader(batch_size)
    with fs.open_file(tmp, "wb") as f, pq.ParquetWriter(f, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch)  # one row group per batch
            bar(batch.num_rows, batch.nbytes)
    return fs.size(tmp)


# ------------------------------------------------------------------ WebDataset


def _member(leaf: Leaf) -> str:
    """The extension of ``leaf``'s tar members, or why it has none."""
    if leaf.kind == "dense" and leaf.shape == () and leaf.dtype == "string":
        return "bin"
    if leaf.kind == "dense" and leaf.shape == () and leaf.entry.is_integer and leaf.dtype != "bool":
        return "cls"
    why = None
    if leaf.kind == "sparse":
        why = "a sparse leaf"
    elif leaf.kind == "ragged" and leaf.ragged_rank:
        why = "a ragged leaf"
    elif leaf.dtype == "string":
        why = "an array of strings"
    elif leaf.dtype == "bfloat16":
        why = "a bfloat16 leaf (.npy has no bfloat16)"
    if why is not None:
        raise UnsupportedError(
            f"expected leaves a WebDataset member holds (scalars, numeric arrays), found "
            f"{why}: {leaf.name!r} (export to Parquet, or leave it out with select=)"
        )
    return "npy"


def _encode(ext: str, value: Any) -> bytes:
    if ext == "bin":
        return bytes(value.item() if isinstance(value, np.ndarray) else value)
    if ext == "cls":
        return str(int(value)).encode()
    buf = io.BytesIO()
    np.save(buf, np.asarray(value), allow_pickle=False)
    return buf.getvalue()


def _samples(ds: NumpyDataset, exts: list[str], size: int) -> Iterator[tuple[int, list[bytes]]]:
    """Each element's members' bytes, with the element count of each batch they end."""
    for batch in ds.flat_batches(None, size):
        count = len(batch[0]) if batch else 0
        for i in range(count):
            yield (
                count if i == count - 1 else 0,
                [_encode(e, v[i]) for e, v in zip(exts, batch, strict=True)],
            )


def _webdataset(
    ds: NumpyDataset, tmp: str, shard_size: int, batch: int, bar: Callable[..., None]
) -> tuple[list[str], int]:
    leaves = ds.header.leaves
    exts = [_member(leaf) for leaf in leaves]
    names = [leaf.name.replace("/", ".") for leaf in leaves]
    width = max(9, len(str(max(len(ds) - 1, 0))))
    fs.makedirs(tmp)
    samples = enumerate(_samples(ds, exts, batch))
    shards: list[str] = []
    total = pending = 0
    sample = next(samples, None)
    while sample is not None:
        shards.append(webdataset_shard_name(len(shards)))
        in_shard = 0
        with (
            fs.open_file(fs.join(tmp, shards[-1]), "wb") as f,
            tarfile.open(fileobj=f, mode="w|") as tar,
        ):
            while sample is not None and in_shard < shard_size:
                key, (ends_batch, members) = sample
                for name, ext, data in zip(names, exts, members, strict=True):
                    info = tarfile.TarInfo(f"{key:0{width}d}.{name}.{ext}")
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
                    in_shard += len(data) + 512  # and its tar header
                    pending += len(data)
                if ends_batch:
                    bar(ends_batch, pending)
                    total, pending = total + pending, 0
                sample = next(samples, None)
    return shards, total + pending

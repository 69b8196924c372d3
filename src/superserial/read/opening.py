"""Opening a dataset for reading: the one sequence every reader goes through.

    opened = open_dataset(path, select=["image"], shard=(1, 4), cache_dir="/tmp/c")
    opened.selected      # the header pruned to the leaves read
    opened.files         # local paths of the shard files this host reads
    opened.counts        # their record counts; opened.count, their sum

``superserial.load`` (sequential and shuffled), ``superserial.numpy.load``,
the PyTorch and Grain readers, ``stats``, ``show`` and ``verify`` all open
a dataset with :func:`open_dataset`, which does, in this order:

1. **Header.** Read once from ``path`` (one GET on object stores), unless
   the caller already read it to choose what to read (``show`` picks its
   leaves from it) and passes it in.
2. **select=.** The header's structure pruned to the selected leaves
   (:func:`superserial.read.selection.select_header`). Before any shard
   file is touched: a name that is no leaf is an error before a single
   byte is downloaded.
3. **This host's shards.** ``shard=(i, n)`` picks shard files ``i, i+n,
   ...`` (:func:`superserial.format.layout.host_shards`, which warns when
   some host reads nothing); None picks every shard.
4. **Cache.** The picked shards are localized
   (:func:`superserial.read.cache.directory.localize`): fetched into ``cache_dir``
   for a URL, or the dataset's own files, checked cheaply against the header.
   A sequential reader (``stream=True``) whose shards do not all fit
   ``cache_limit`` gets a :class:`~superserial.read.cache.stream.Stream`
   instead, which fetches them as they are read; a random-access reader
   (``random_access=True``) gets :class:`~superserial.read.cache.pins.Pins`,
   which pin as many whole shards as fit, in the background, the others
   read remotely.
5. **Counts.** The record count of each picked shard, from the header.

Why select comes before the cache, and why the cache still gets the whole
header: ``select`` changes only the structure, never the shards, so the
shard files, their sizes, CRC-32Cs and cache keys are the same either way
(the cache keys a shard by its URL, size and CRC-32C). What the order does
change is what a bad ``select`` costs (an error before, not after,
downloading), and which header a whole cache view holds: it is given the
full header, so that a view stays the dataset it copies (its records hold
every leaf; ``superserial verify`` of the view checks them all), whatever
the reader selected.

This module does not import TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from superserial.base.sizes import parse_size
from superserial.format import layout
from superserial.format.header import Header
from superserial.read.cache.directory import Lease, localize
from superserial.read.cache.pins import Pins
from superserial.read.cache.pins import plan as plan_pins
from superserial.read.cache.stream import Stream, plan
from superserial.read.selection import select_header
from superserial.storage import fs

__all__ = ["OpenedDataset", "open_dataset"]


@dataclass(frozen=True)
class OpenedDataset:
    """A dataset opened for reading by :func:`open_dataset`.

    Attributes:
        path: The dataset directory or URL, as given.
        header: Its whole header, as read from ``path``.
        selected: ``header`` with its structure pruned by ``select=`` (the
            leaves to decode); ``header`` itself without ``select``.
        shards: The indices into ``header.shards`` of the shards read, in order.
        root: The directory the files are in: the cache view for a cached
            URL, else ``path``.
        files: The path of each picked shard's file (in ``root``), in order.
        counts: The record count of each picked shard, from the header.
        lease: Keeps the cache view's files; hold it as long as the reader
            (None when nothing is cached).
        stream: With ``stream=True``, when the shards do not all fit
            ``cache_limit``: the :class:`~superserial.read.cache.stream.Stream`
            that fetches them as they are read. ``files`` are then the
            remote paths, ``root`` is ``path``, and ``lease`` is None.
        pins: With ``random_access=True``, when the shards do not all fit
            ``cache_limit``: the started :class:`~superserial.read.cache.pins.Pins`
            naming the local copies of the shards pinned so far. ``files``
            are then the remote paths, ``root`` is ``path``, and ``lease``
            is None (the pins hold their view).
    """

    path: str
    header: Header
    selected: Header
    shards: tuple[int, ...]
    root: str
    files: tuple[str, ...]
    counts: tuple[int, ...]
    lease: Lease | None
    stream: Stream | None = None
    pins: Pins | None = None

    @property
    def count(self) -> int:
        """The records (elements) of the picked shards together."""
        return sum(self.counts)


def open_dataset(
    path: str | os.PathLike[str],
    *,
    header: Header | None = None,
    select: Iterable[str] | None = None,
    shard: tuple[int, int] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    check_files: bool = True,
    stream: bool = False,
    random_access: bool = False,
    stacklevel: int = 3,
) -> OpenedDataset:
    """Opens the dataset at ``path``: header, select, this host's shards, cache, counts.

    Args:
        path: The dataset directory: a local path or a URL.
        header: Its header, when the caller has just read it from ``path``
            (to choose ``select`` from it); None reads it.
        select: Read only these leaves (names as ``superserial inspect``
            prints them, or inner nodes); None: every leaf.
        shard: ``(i, n)``: only shard files ``i, i+n, i+2n, ...``; None: all.
        cache_dir: For a URL: the local cache directory the picked shards are
            fetched into (see :mod:`superserial.read.cache.directory`); ignored for
            local paths.
        cache_limit: The most bytes ``cache_dir`` keeps; None: no bound.
        check_files: Check the shard files cheaply against the header (all
            there, of the right sizes, no extra ones). False, for a caller
            that checks every file itself and reports what is wrong rather
            than raising (``verify``): the files are only named, and
            ``cache_dir`` and ``cache_limit`` must be None.
        stream: The caller reads the shards once through, in order (a
            sequential reader): when they do not all fit ``cache_limit``,
            give it a :class:`~superserial.read.cache.stream.Stream` rather
            than raising.
        random_access: The caller reads records by position: when the
            shards do not all fit ``cache_limit``, give it started
            :class:`~superserial.read.cache.pins.Pins` rather than raising.
        stacklevel: Where the warning of an idle host points, counted as
            ``warnings.warn`` counts it from this function: 2 its caller, 3
            (the default) its caller's caller, the user of a reader that
            calls this.

    Returns:
        The :class:`OpenedDataset`.

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        HeaderError: The header is malformed or of an unknown version.
        CorruptDataError: A picked shard is missing or of the wrong size, an
            unlisted shard is there, or a download disagrees with the header.
        TypeError: ``select`` is not a list of names.
        ValueError: ``select`` names no leaf (the message lists them), a bad
            ``shard`` or ``cache_limit``, picked shards larger than
            ``cache_limit`` (without ``stream`` or ``random_access``; with
            ``stream``, one shard larger),
            or a cache with ``check_files=False``.

    Warns:
        IdleReaderWarning: ``shard=(i, n)`` with fewer shard files than ``n``.
    """
    path = os.fspath(path)
    if not check_files and (cache_dir is not None or cache_limit is not None):
        raise ValueError(
            f"expected cache_dir=None and cache_limit=None with check_files=False (the files "
            f"of {path} are then read where they are), got cache_dir={cache_dir!r} "
            f"cache_limit={cache_limit!r}"
        )
    if header is None:
        header = layout.read_header(path)
    selected = select_header(header, select)
    everything = range(len(header.shards))
    picked = (
        list(everything)
        if shard is None
        else layout.host_shards(path, len(everything), shard, stacklevel=stacklevel + 1)
    )
    limit = parse_size(cache_limit, "cache_limit")
    streamed, pins = None, None
    bounded = check_files and cache_dir is not None and limit is not None and not fs.is_local(path)
    if bounded and cache_dir is not None and limit is not None:
        if stream:
            streamed = plan(path, header, picked, os.fspath(cache_dir), limit)
        elif random_access:
            pins = plan_pins(path, header, picked, os.fspath(cache_dir), limit)
    if pins is not None:
        pins.start()
    if streamed is not None or pins is not None:
        root, files, lease = path, [fs.join(path, header.shards[k].file) for k in picked], None
    elif check_files:
        # The whole header, not the selected one: see the module docstring.
        local = localize(path, header, picked, cache_dir, cache_limit)
        root, files, lease = local.path, local.files, local.lease
    else:
        root, files, lease = path, [fs.join(path, header.shards[k].file) for k in picked], None
    return OpenedDataset(
        path=path,
        header=header,
        selected=selected,
        shards=tuple(picked),
        root=root,
        files=tuple(files),
        counts=tuple(header.shards[k].records for k in picked),
        lease=lease,
        stream=streamed,
        pins=pins,
    )

"""``load`` and ``read_header``: a superserial directory back to a ``tf.data.Dataset``.

Records are read in order, parsed in batches with ``tf.io.parse_example``
(parallel ``map``), restored to their exact dtypes and shapes, and unbatched;
``load(path, batch_size=n)`` skips the unbatch where it can. The element
count from the header is applied with ``assert_cardinality``, so ``len()``
works and a short file is an error rather than a short epoch.

Remote shards that TensorFlow cannot read (``s3://``, ``http://``) are streamed
by :mod:`superserial.tf.streamed`; where every leaf is dense of a fixed shape,
with ``batch_size``, they come decoded by the numpy decoder as they are read
(a fraction of ``parse_example``'s CPU, which was half of such an epoch's time),
into the same batches.

``load(path, shuffle=True)`` builds another graph: records read by offset
in the global shuffled order (:mod:`superserial.tf.shuffled`), then
decoded by the same in-graph code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import tensorflow as tf

from superserial.codec import tf_decode, tf_generator, tf_leaves
from superserial.codec.tf_spec import pack, to_element_spec
from superserial.errors import HeaderError, UnsupportedError
from superserial.format.header import Header
from superserial.format.structure import Leaf, TupleNode
from superserial.read.cache.directory import Lease
from superserial.read.cache.stream import Stream
from superserial.read.opening import open_dataset
from superserial.storage import fs
from superserial.tf import streamed
from superserial.tf.cardinality import known_cardinality
from superserial.tf.shuffled import ShuffledRecords

__all__ = ["known_cardinality", "load", "records_to_dataset"]

_PARSE_BYTES = 4 << 20
# Shuffled batches smaller than this are read in larger chunks and rebatched:
# each chunk costs one Python call.
_MIN_DIRECT = 64


def _parse_batch_size(header: Header) -> int:
    avg = header.total_bytes / max(header.element_count, 1)
    return int(max(16, min(1024, _PARSE_BYTES // max(avg, 1))))


def load(
    path: str,
    header_path: str | None = None,
    *,
    batch_size: int | None = None,
    drop_remainder: bool = False,
    deterministic: bool = True,
    shuffle_files: bool = False,
    seed: int | None = None,
    shard: tuple[int, int] | None = None,
    assert_cardinality: bool = True,
    shuffle: bool = False,
    epoch: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    select: Iterable[str] | None = None,
    shuffle_window: int | None = None,
) -> tf.data.Dataset:
    """Loads a dataset saved by :func:`superserial.save`.

    Args:
        path: The dataset directory. For a super_serial 2.0 pair, the TFRecord
            file, with ``header_path`` its YAML header.
        header_path: Only for super_serial 2.0 pairs.
        batch_size: Return batches of this many elements, exactly as
            ``load(path).batch(batch_size, drop_remainder)`` would, but parsed
            straight into batches without an unbatch/rebatch round trip.
        drop_remainder: With ``batch_size``, drop a last partial batch.
        deterministic: Keep the saved order (default). False lets shards be
            read in parallel and batches come out as soon as they are ready.
        shuffle_files: Shuffle the order of shard files (an epoch-level
            shuffle; combine with ``Dataset.shuffle`` for element-level).
        seed: With ``shuffle``, the seed of the order: an integer in
            ``[0, 2**64)``; None draws one (logged at INFO). Otherwise the
            seed of ``shuffle_files``.
        shard: ``(i, n)``: read only shards ``i, i+n, i+2n, ...`` (multi-host
            input without a tf.data service). With fewer shard files than
            ``n``, hosts ``len(files)..n-1`` read nothing and every host
            warns (:class:`~superserial.errors.IdleReaderWarning`). With
            ``shuffle``, positions ``i, i+n, i+2n, ...`` of the shuffled
            order instead (any number of readers; the same global order).
        assert_cardinality: Give the dataset its element count (``len()``
            works; a short dataset is an error). False leaves it unknown, as a
            tf.data service in ``distributed_epoch`` mode needs: each of its
            workers reads only some shards. Each shard's own record count is
            checked either way.
        shuffle: Yield the elements in the global shuffled order
            ``superserial.permutation(len, seed, epoch)``, read by offset
            (uncompressed shards with record indexes only). Each new
            iteration of the returned dataset takes the next epoch: pass
            ``k`` of ``load(...).repeat()`` yields ``permutation(len, seed,
            epoch + k)``, and so does a new iterator over the same dataset
            object (as ``Dataset.shuffle`` reshuffles). Its iterator
            checkpoints (``tf.train.Checkpoint(iterator=it)``) hold
            positions, not records, and resume exactly, across passes too;
            restore them into a dataset made by the same ``load`` arguments.
        epoch: With ``shuffle``, the epoch of the first iteration, an integer
            in ``[0, 2**64)``.
        shuffle_window: With ``shuffle``, None (the global order) or an
            integer ``W``: the windowed order ``permutation(len, seed,
            epoch, window=W)``, whose windows of about ``W`` positions
            read runs of consecutive records, five windows sharing their
            blocks, so each block is read once, whole (see
            ``docs/shuffle.md``); a reader holds about two groups of five
            windows, ``10 W`` records. Restore a checkpoint with the same ``W``.
        cache_dir: For a remote ``path`` (a URL): a local directory where the
            shard files read (and their indexes) are fetched first, once,
            checked against the header's sizes and CRC-32Cs; they are read
            there, by this and later loads, by any process sharing the
            directory. See :mod:`superserial.read.cache.directory`. Ignored for local paths.
        cache_limit: The most bytes ``cache_dir`` keeps, least recently used
            shards removed first: an int, or a string such as ``"20GB"``
            (powers of 1000) or ``"500MiB"`` (powers of 1024); None: no bound.
            Without ``shuffle`` and ``shuffle_files``, shards that do not all
            fit are streamed: each iteration fetches them ahead in order and
            lets go of each once read (see :mod:`superserial.read.cache.stream`).
            With ``shuffle``, as many whole shards as fit are pinned in the
            background and the others read remotely (see
            :mod:`superserial.read.cache.pins`).
        select: Read only these leaves: names as ``superserial inspect``
            prints them (``["image", "meta/id"]``), or inner nodes (``"meta"``:
            every leaf below it). The structure is pruned to them (a dict
            keeps the selected keys, a tuple or namedtuple its selected items,
            in order) and only their features are parsed; see
            :mod:`superserial.read.selection`. None reads every leaf.

    Returns:
        A dataset whose ``element_spec`` equals the saved one (pruned by
        ``select``), with the saved elements, bit for bit.

    Raises:
        DatasetNotFoundError: No dataset at ``path``.
        HeaderError: The header is malformed or of an unknown version.
        CorruptDataError: Shard files disagree with the header.
        UnsupportedError: ``shuffle`` with shards without a record index
            (compressed: without restart points).
        ValueError: A bad ``batch_size``, ``shard``, ``seed``, ``epoch``, ``shuffle_window`` or
            ``cache_limit``, shards larger than ``cache_limit`` (with
            ``shuffle_files``; without ``shuffle``, one shard larger), or ``select``
            names no leaf of the dataset (the message lists them).
    """
    if cache_dir is not None and header_path is not None:
        raise ValueError(
            f"expected cache_dir=None for a super_serial 2.0 pair ({path}), got {cache_dir!r}; "
            "turn it into a dataset directory with `superserial upgrade` to cache it"
        )
    if select is not None and header_path is not None:
        raise UnsupportedError(
            f"expected a dataset directory for select=, got a super_serial 2.0 pair {path}; "
            "turn it into one with `superserial upgrade`"
        )
    if shuffle:
        return _load_shuffled(
            path,
            header_path,
            batch_size=batch_size,
            drop_remainder=drop_remainder,
            deterministic=deterministic,
            shuffle_files=shuffle_files,
            seed=seed,
            shard=shard,
            assert_cardinality=assert_cardinality,
            epoch=epoch,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            select=select,
            shuffle_window=shuffle_window,
        )
    if shuffle_window is not None:
        raise ValueError(
            f"expected shuffle_window=None without shuffle=True, got shuffle_window={shuffle_window!r}"
        )
    if not (isinstance(epoch, int) and epoch == 0):
        raise ValueError(f"expected epoch=0 without shuffle=True, got epoch={epoch!r}")
    if header_path is not None:
        from superserial.tf.legacy import load_legacy

        return load_legacy(path, header_path)
    # In file order, the shards can stream through a cache smaller than them.
    opened = open_dataset(
        path,
        select=select,
        shard=shard,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        stream=not shuffle_files,
    )
    ds = records_to_dataset(
        opened.selected,
        list(opened.files),
        opened.count,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        deterministic=deterministic,
        shuffle_files=shuffle_files,
        seed=seed,
        assert_count=assert_cardinality,
        stream=opened.stream,
    )
    return _keep(ds, opened.lease)


def _keep(ds: tf.data.Dataset, lease: Lease | None) -> tf.data.Dataset:
    """Ties the cache lease of a dataset's files to it (and so to its iterators)."""
    if lease is not None:
        # Datasets made from ``ds`` hold it, and so do iterators over them.
        ds._superserial_cache_lease = lease
    return ds


def _load_shuffled(
    path: str,
    header_path: str | None,
    *,
    batch_size: int | None,
    drop_remainder: bool,
    deterministic: bool,
    shuffle_files: bool,
    seed: int | None,
    shard: tuple[int, int] | None,
    assert_cardinality: bool,
    epoch: int,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit: int | str | None,
    select: Iterable[str] | None,
    shuffle_window: int | None,
) -> tf.data.Dataset:
    """``load(path, shuffle=True, ...)``: records read by offset in the shuffled order."""
    if header_path is not None:
        raise UnsupportedError(
            f"expected a dataset directory for shuffle=True, got a super_serial 2.0 pair "
            f"{path} (it has no record index); turn it into one with `superserial upgrade`"
        )
    if shuffle_files:
        raise ValueError(
            "expected shuffle_files=False with shuffle=True (which shuffles every element), "
            "got shuffle_files=True"
        )
    # Every shard file (shard= splits the positions of the global order, which
    # are anywhere); selected before they are localized, as every reader does.
    opened = open_dataset(
        path, select=select, cache_dir=cache_dir, cache_limit=cache_limit, random_access=True
    )
    header = opened.selected
    source = ShuffledRecords(
        opened.root,
        header,
        seed=seed,
        epoch=epoch,
        shard=shard,
        window=shuffle_window,
        local=None if opened.pins is None else opened.pins.local,
    )
    direct, chunk = _plan(header, batch_size, _MIN_DIRECT)
    batches = source.batches(
        chunk, drop_remainder=direct and drop_remainder, deterministic=deterministic
    )
    ds = _decode(
        header,
        batches,
        source.count,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        deterministic=deterministic,
        direct=direct,
        rebatch=False,
        assert_count=assert_cardinality,
        # The parser's Python function, traced into the map: a call of the
        # traced tf.function would be a stateful op (it holds assertions),
        # which TF warns about at every element under symbolic checkpointing.
        # Not converted by autograph, as the tf.function is not (_batch_parser):
        # the map converted it at every load (0.5-0.8 s of a process's first
        # shuffled load's first batch, about 25 ms of each later one).
        parse=tf.autograph.experimental.do_not_convert(_batch_parser(header).python_function),
    )
    return _keep(ds, opened.lease)


def records_to_dataset(
    header: Header,
    files: list[str],
    count: int,
    *,
    batch_size: int | None = None,
    drop_remainder: bool = False,
    deterministic: bool = True,
    shuffle_files: bool = False,
    seed: int | None = None,
    assert_count: bool = True,
    stream: Stream | None = None,
) -> tf.data.Dataset:
    """The dataset ``load`` builds from the given shard files of a header.

    Args:
        header: The dataset's header.
        files: Paths of the shard files to read, in order.
        count: How many elements those files hold.
        batch_size: As in :func:`load`.
        drop_remainder: As in :func:`load`.
        deterministic: As in :func:`load`.
        shuffle_files: As in :func:`load`.
        seed: As in :func:`load`.
        assert_count: Give the dataset ``count`` as its cardinality, as
            ``load``'s ``assert_cardinality`` does.
        stream: Fetch ``files`` (remote) through the cache as they are read,
            one pass of the stream per iteration, in order (see
            :mod:`superserial.read.cache.stream`).

    Returns:
        The decoded dataset; decoding errors surface as it is iterated.
    """
    compression = header.compression or ""
    # Each shard must hold exactly the records its header entry says, so a
    # short (or long) shard fails at its own end, before any element of the next.
    per_file = {s.file: s.records for s in header.shards}
    counts = [per_file.get(fs.basename(f)) for f in files]
    checked = None not in counts
    names = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant(files, tf.string, shape=[len(files)]),
            tf.constant([c if checked else 0 for c in counts], tf.int64, shape=[len(files)]),
        )
    )
    if stream is not None:
        if shuffle_files:
            raise ValueError(
                "expected shuffle_files=False for shards streamed through a cache, got True"
            )
        sizes = [(c or 0) if checked else 0 for c in counts]

        def passes() -> Iterator[tuple[str, int]]:
            # A new pass (view, fetching thread) per iteration; flat_map asks for the
            # next path only once the shard before it is read to its end.
            return zip(stream.files(), sizes, strict=True)

        names = tf_generator.from_generator(
            passes,
            output_signature=(
                tf.TensorSpec([], tf.string),
                tf.TensorSpec([], tf.int64),
            ),
        )
    if shuffle_files:
        names = names.shuffle(max(len(files), 1), seed=seed, reshuffle_each_iteration=True)

    direct, per_batch = _plan(header, batch_size)
    # Where TensorFlow has no filesystem for the scheme, fs reads the bytes.
    through_fs = bool(files) and stream is None and not fs.tensorflow_reaches(files[0])

    @tf.autograph.experimental.do_not_convert
    def shard_batches(f: tf.Tensor, n: tf.Tensor, drop: bool = False) -> tf.data.Dataset:
        if through_fs:
            return streamed.shard_batches(
                f,
                n,
                compression=compression or None,
                checked=checked,
                per_batch=per_batch,
                drop_remainder=drop,
                header=header,
            )
        # Batched per shard: flat_map then costs per batch, not per record.
        recs = tf.data.TFRecordDataset(f, compression, buffer_size=1 << 20)
        if checked:
            recs = recs.apply(tf.data.experimental.assert_cardinality(n))
        return recs.batch(per_batch, drop_remainder=drop)

    one = len(files) == 1 and stream is None
    ahead = stream is not None and streamed.reads_ahead(files[0])
    whole = not one and checked and (ahead or (through_fs and not shuffle_files))
    decoder = streamed.decoder(header, files) if whole and direct else None  # no parse_example
    decoded = decoder is not None
    if one:
        # One shard needs neither flat_map nor rebatch (each costs 10-20% here).
        n0 = tf.constant(counts[0] if checked else 0, tf.int64)
        batches = shard_batches(tf.constant(files[0]), n0, direct and drop_remainder)
    elif whole:
        # Every shard in order through one stream (requests in flight across shards;
        # through a cache, copies kept as read), cut in batches across shard ends.
        batches = streamed.files_batches(
            header, files, per_batch=per_batch, stream=stream, decoder=decoder
        )
    elif deterministic or stream is not None:
        batches = names.flat_map(shard_batches)
    else:
        batches = names.interleave(
            shard_batches,
            cycle_length=min(max(len(files), 1), 4),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=False,
        )

    return _decode(
        header,
        batches,
        count,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        deterministic=deterministic,
        direct=direct,
        rebatch=decoded or (not one and not (whole and not drop_remainder)),
        assert_count=assert_count,
        parse=None if decoded else _batch_parser(header),
    )


def _plan(header: Header, batch_size: int | None, min_direct: int = 1) -> tuple[bool, int]:
    """Whether records are parsed straight into ``batch_size`` batches, and how many per parse.

    Straight into batches unless a leaf is split (rebuilt per element) or
    the batches are smaller than ``min_direct``.

    Raises:
        ValueError: ``batch_size`` is not a positive integer.
    """
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"expected batch_size >= 1, got {batch_size!r}")
    split = any(tf_leaves.needs_join(leaf) for leaf in header.leaves)
    direct = batch_size is not None and not split and batch_size >= min_direct
    return direct, batch_size if direct and batch_size is not None else _parse_batch_size(header)


def _decode(
    header: Header,
    batches: tf.data.Dataset,
    count: int,
    *,
    batch_size: int | None,
    drop_remainder: bool,
    deterministic: bool,
    direct: bool,
    rebatch: bool,
    assert_count: bool,
    parse: Any,
) -> tf.data.Dataset:
    """Elements (or ``batch_size`` batches) from batches of serialized records, decoded in graph.

    Args:
        header: The dataset's header.
        batches: tf.string vectors of records, in order.
        count: How many records ``batches`` holds.
        batch_size: As in :func:`load`.
        drop_remainder: As in :func:`load`.
        deterministic: As in :func:`load`.
        direct: Parse straight into ``batch_size`` batches (see :func:`_plan`).
        rebatch: With ``direct``: ``batches`` are cut short at shard ends, so
            join them into exact batches first.
        assert_count: Give the dataset its cardinality.
        parse: The batch parser of the structure (None: ``batches`` come decoded).
    """
    leaves = header.leaves
    split = any(tf_leaves.needs_join(leaf) for leaf in leaves)
    root = header.structure
    split_root = isinstance(root, Leaf) and tf_leaves.join_arity(root) > 1

    def element(args: tuple[Any, ...], components: bool = True) -> Any:
        # tf.data passes a top-level plain tuple as separate arguments; a split
        # leaf at the root travels as a tuple of its components.
        return args if isinstance(root, TupleNode) or (components and split_root) else args[0]

    @tf.autograph.experimental.do_not_convert
    def join(*args: Any) -> Any:
        flat = tf.nest.flatten(element(args), expand_composites=False)
        comps, it = [], iter(flat)
        for leaf in leaves:
            n = tf_leaves.join_arity(leaf)
            comps.append(tuple(next(it) for _ in range(n)) if n > 1 else next(it))
        joined = tf_leaves.join_element(leaves, comps)
        expanded = [tf_leaves.expand_leaf(leaf, x) for leaf, x in zip(leaves, joined, strict=True)]
        return pack(header.structure, expanded)

    @tf.autograph.experimental.do_not_convert
    def slices(*args: Any) -> tf.data.Dataset:
        # Like unbatch, but TF 2.21's unbatch crashes (SIGSEGV) on zero-size tensors.
        return tf.data.Dataset.from_tensor_slices(element(args))

    if direct and batch_size is not None:  # (direct implies a batch size; mypy cannot see it)
        # Shard ends cut batches short: rebatch joins them into exact batches.
        ds = batches.rebatch(batch_size, drop_remainder=drop_remainder) if rebatch else batches
        if parse is not None:  # None: ``batches`` come decoded
            ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        n_batches = count // batch_size if drop_remainder else -(-count // batch_size)
        if assert_count:
            ds = known_cardinality(ds, n_batches)
        return _match_spec(
            ds, to_element_spec(header.structure), batch_size if drop_remainder else None
        )
    ds = batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if split:
        # Rebuild split leaves per element, each as a batch of one, then slice
        # (not unbatch: it crashes on zero-size tensors) and restore the structure.
        ds = ds.flat_map(slices)
        ds = ds.map(join, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        ds = ds.flat_map(
            tf.autograph.experimental.do_not_convert(
                lambda *args: tf.data.Dataset.from_tensor_slices(element(args, False))
            )
        )
    else:
        ds = ds.unbatch()
    if assert_count:
        ds = known_cardinality(ds, count)
    want = to_element_spec(header.structure)
    if ds.element_spec != want:
        raise HeaderError(
            f"internal: rebuilt element_spec {ds.element_spec} differs from the header's {want}"
        )
    if batch_size is not None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)


_PARSERS: dict[str, Any] = {}


def _batch_parser(header: Header) -> Any:
    """The batch parser of a structure, traced once and reused by later loads.

    Tracing costs tens of milliseconds per ``load``; datasets of one structure
    (the shards of a training set, every epoch's ``load``) share it.
    """
    key = header.structure_json()
    if key not in _PARSERS:
        leaves, structure = header.leaves, header.structure
        spec = tf_decode.parse_spec(leaves)

        # No autograph: the decoding has no Python control flow on tensors, and
        # converting it costs most of a first load's time (1-2 s of AST work).
        @tf.function(autograph=False)
        def parse(serialized: tf.Tensor) -> Any:
            parsed = tf.io.parse_example(serialized, spec)
            return pack(structure, tf_decode.decode_batch(leaves, parsed))

        if len(_PARSERS) > 64:
            _PARSERS.clear()
        _PARSERS[key] = parse
    return _PARSERS[key]


def _match_spec(ds: tf.data.Dataset, element_spec: Any, batch: int | None) -> tf.data.Dataset:
    """Checks a directly parsed batch dataset against ``element_spec`` batched."""
    want = tf.nest.map_structure(lambda s: s._batch(batch), element_spec)
    if ds.element_spec != want:
        raise HeaderError(f"internal: batched element_spec {ds.element_spec} differs from {want}")
    return ds.prefetch(tf.data.AUTOTUNE)

"""``append``: adds elements after those of a saved dataset, atomically.

The new elements are written exactly as ``save`` writes them (the same
encoder and the one write loop, :func:`superserial.tf.writes.write_dataset`,
so uncompressed shards get their record index), under the same lock, into
the same resumable work directory ``.NAME.superserial-partial``; the commit
is :class:`~superserial.write.targets.AppendTarget`'s. Then, for a local ``path``:

1. the new shards get their final names: ``data-IIIII-of-NNNNN-TAG.tfrecord``,
   numbered within this append (``NNNNN`` is how many shards this append
   adds) with a tag new to this append, never a name the dataset has; the
   header's list, not the names, gives the order of the shards;
2. every file of the dataset except ``header.json`` is hard-linked into the
   work directory (the same inodes: same bytes, same mtimes; a copy where
   the filesystem has no hard links), and the new header (the old shards,
   then the new ones; ``element_count`` added up; everything else kept) is
   written there;
3. the work directory and the dataset are exchanged atomically
   (``renameat2``), as ``save(..., overwrite=True)`` does, and the old
   directory (now only links) is removed.

So at any instant ``path`` is the old dataset, file for file, or the new
one; a reader that is iterating the old dataset keeps finding its files
under the same names. A kill leaves at most the work directory, which
``superserial.cleanup`` removes and ``append(..., resume=True)`` continues.

Object stores have no hard links and no rename: there, the new shards are
moved into the dataset and ``header.json`` is replaced last (the commit
point). A reader in between finds shard files its header does not list and
fails with :class:`~superserial.errors.CorruptDataError`; without a lock,
two concurrent appends can lose one of them.

The elements must have the saved element spec: the same structure, kinds,
dtypes, ranks and ragged ranks, and at every dimension the saved spec knows,
the same size. A dimension the saved spec leaves unknown accepts any size
(the header's spec is never widened: a dimension known when the dataset was
saved is stored without a shape, so records with another size could not be
read back). The records are encoded by the saved spec, so they are exactly
those a save of the whole dataset writes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from types import EllipsisType

import tensorflow as tf

from superserial.codec.tf_spec import from_element_spec
from superserial.errors import SpecMismatchError, UnsupportedError
from superserial.format import layout, record_index
from superserial.format.header import Header, normalize_compression
from superserial.format.structure import (
    DictNode,
    Leaf,
    NamedTupleNode,
    Node,
    leaf_name,
    node_to_obj,
)
from superserial.storage import fs
from superserial.tf.writes import check_dataset, shard_plan, write_dataset
from superserial.write import local_commit
from superserial.write.shard_writer import DEFAULT_SHARD_SIZE
from superserial.write.targets import AppendTarget

__all__ = ["append", "first_difference", "refuse_legacy", "spec_difference"]

log = logging.getLogger("superserial")


def _shape(leaf: Leaf) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in leaf.shape) + "]"


def _what(node: Node) -> str:
    if isinstance(node, Leaf):
        return f"{node.kind} tensor"
    if isinstance(node, DictNode):
        return "dict"
    if isinstance(node, NamedTupleNode):
        return f"namedtuple {node.name}"
    return f"tuple of {len(node.items)}"


def _leaf_difference(saved: Leaf, given: Leaf) -> str | None:
    at = f"at leaf {saved.name}"
    if saved.kind != given.kind:
        return f"expected a {saved.kind} tensor {at}, got a {given.kind} tensor"
    if saved.dtype != given.dtype:
        return f"expected dtype {saved.dtype} {at}, got {given.dtype}"
    if len(saved.shape) != len(given.shape):
        return (
            f"expected shape {_shape(saved)} (rank {len(saved.shape)}) {at}, "
            f"got {_shape(given)} (rank {len(given.shape)})"
        )
    if saved.kind == "ragged" and saved.ragged_rank != given.ragged_rank:
        return f"expected ragged_rank {saved.ragged_rank} {at}, got {given.ragged_rank}"
    if saved.kind == "ragged" and saved.row_splits_dtype != given.row_splits_dtype:
        return (
            f"expected row_splits_dtype {saved.row_splits_dtype} {at}, got {given.row_splits_dtype}"
        )
    for i, (want, got) in enumerate(zip(saved.shape, given.shape, strict=True)):
        if want is None or want == got:
            continue
        if got is None:
            return (
                f"expected shape {_shape(saved)} {at}, got {_shape(given)}: dimension {i} is "
                f"unknown in the dataset, {want} in the saved spec; state it with "
                f"ds.map(lambda ...: tf.ensure_shape(x, {list(saved.shape)}))"
            )
        return f"expected shape {_shape(saved)} {at}, got {_shape(given)} (dimension {i})"
    return None


def _children(node: Node) -> list[tuple[str | int, Node]]:
    """(key, child) of a container node, in flattening order."""
    if isinstance(node, DictNode):
        return [(k, node.items[k]) for k in sorted(node.items)]
    if isinstance(node, Leaf):
        return []
    return list(enumerate(node.items))


def _container_difference(saved: Node, given: Node, where: str) -> str | None:
    """How two containers differ themselves (not in their children), or None."""
    if type(saved) is not type(given):
        return f"expected a {_what(saved)} at {where}, got a {_what(given)}"
    if isinstance(saved, DictNode) and isinstance(given, DictNode):
        missing = sorted(set(saved.items) - set(given.items))
        extra = sorted(set(given.items) - set(saved.items))
        if not (missing or extra):
            return None
        which = f"{missing[0]!r} is missing" if missing else f"{extra[0]!r} is new"
        return (
            f"expected keys {sorted(saved.items)} in the dict at {where}, "
            f"got {sorted(given.items)}: {which}"
        )
    if (
        isinstance(saved, NamedTupleNode)
        and isinstance(given, NamedTupleNode)
        and (saved.name, saved.fields) != (given.name, given.fields)
    ):
        return (
            f"expected namedtuple {saved.name}{list(saved.fields)} at {where}, "
            f"got {given.name}{list(given.fields)}"
        )
    if len(_children(saved)) != len(_children(given)):
        return f"expected a {_what(saved)} at {where}, got a {_what(given)}"
    return None


def first_difference(
    saved: Node, given: Node, path: tuple[str | int, ...] = ()
) -> tuple[str | None, str] | None:
    """The first way ``given`` cannot be appended to a dataset of structure ``saved``.

    Leaves are visited in flattening order; see the module docstring for the
    rule (a dimension unknown in ``saved`` accepts any size).

    Returns:
        None if ``given`` fits; else (the leaf's name, or None for a
        difference in the containers around the leaves; what differs).
    """
    if isinstance(saved, Leaf) and isinstance(given, Leaf):
        text = _leaf_difference(saved, given)
        return None if text is None else (saved.name, text)
    where = leaf_name(path) if path else "the top of the element"
    text = _container_difference(saved, given, where)
    if text is not None:
        return None, text
    for (key, a), (_, b) in zip(_children(saved), _children(given), strict=True):
        diff = first_difference(a, b, (*path, key))
        if diff is not None:
            return diff
    return None


def spec_difference(saved: Node, given: Node) -> str | None:
    """What :func:`first_difference` finds, as text (None: ``given`` fits)."""
    diff = first_difference(saved, given)
    return None if diff is None else diff[1]


def refuse_legacy(path: str, doing: str = "appended to") -> None:
    """Refuses a super_serial 2.0 pair (NAME.tfrecord + NAME.header), saying the way out.

    Args:
        path: What the user gave as a dataset.
        doing: What cannot be done with the pair, for the message.

    Raises:
        UnsupportedError: ``path`` is one file of such a pair.
    """
    if fs.isdir(path):
        return
    stem = path.removesuffix(".header").removesuffix(".tfrecord")
    if fs.exists(stem + ".header") and fs.exists(stem + ".tfrecord"):
        raise UnsupportedError(
            f"expected a superserial dataset directory at {path}, found a super_serial 2.0 pair "
            f"({stem}.tfrecord + {stem}.header), which cannot be {doing}; upgrade it first "
            f"with `superserial upgrade {stem}.header -o NEW_DIR` and use NEW_DIR"
        )


def _check(base: Header, given: Node, compression: str | EllipsisType | None, path: str) -> None:
    """Refuses elements of another spec, or another compression asked for, than the saved.

    Raises:
        SpecMismatchError: Naming the first difference.
    """
    diff = first_difference(base.structure, given)
    if diff is not None:
        raise SpecMismatchError(
            f"expected elements of the saved element spec of {path} to append, got a "
            f"difference: {diff[1]}; nothing was changed",
            leaf=diff[0],
        )
    if compression is not ... and normalize_compression(compression) != base.compression:
        raise SpecMismatchError(
            f"expected compression {base.compression} as the dataset at {path} has, got "
            f"{normalize_compression(compression)}; an append writes the dataset's own "
            "compression (leave compression unset); nothing was changed"
        )


def append(
    dataset: tf.data.Dataset,
    path: str,
    *,
    shard_size: int | None = None,
    num_shards: int | None = None,
    progress: bool | Callable[[int, int], None] | None = None,
    resume: bool = False,
    compression: str | EllipsisType | None = ...,
) -> Header:
    """Adds the elements of ``dataset`` after those of the saved dataset at ``path``.

    The existing files are not changed (not a byte, not an mtime); the new
    elements go to new shard files (with their record index when the
    dataset is uncompressed), and ``header.json`` lists them after the old
    ones. Atomic as :func:`superserial.save` is: it takes the same lock, and
    a failure or a kill at any instant leaves the old dataset exactly, or
    the new one (local paths; see the module docstring for object stores).

    Args:
        dataset: A finite ``tf.data.Dataset`` whose element spec matches the
            saved one: same structure, kinds, dtypes, ranks, and sizes at the
            dimensions the saved spec knows (an unknown saved dimension
            accepts any size).
        path: The dataset directory to extend.
        shard_size: Start a new file after about this many bytes (default 128 MiB).
        num_shards: Or split the new elements into this many files (needs a
            known cardinality).
        progress: Show a progress bar (default: when stderr is a terminal),
            or a callable given (elements, bytes) after every batch.
        resume: Continue an interrupted append to ``path`` after its last
            complete shard, as ``save(..., resume=True)`` does.
        compression: Leave unset: the new shards get the dataset's own
            compression. If given, it must be the dataset's (a check).

    Returns:
        The new header (the old one if ``dataset`` is empty: nothing changes).

    Raises:
        UnsupportedError: ``dataset`` is not a ``tf.data.Dataset`` (also a
            ``TypeError``).
        DatasetNotFoundError: There is no dataset at ``path``.
        SpecMismatchError: The element spec (or the compression given)
            differs from the saved one; the message names the first
            difference (leaf, dtype, shape). Nothing is changed.
        UnsupportedError: ``path`` is a super_serial 2.0 pair (upgrade it first).
        DatasetLockedError: Another process is writing to ``path`` (local paths).
        ResumeError: ``resume`` found an interrupted write of another dataset,
            to another base, or with other options.
    """
    check_dataset(dataset)
    path = fs.dataset_path(path)
    if fs.is_local(path) and os.path.islink(path):
        # The exchange swaps directory entries: swap the real directory, not the link.
        path = os.path.realpath(path)
    refuse_legacy(path)
    given = from_element_spec(dataset.element_spec)
    cardinality, shard_quotas = shard_plan(dataset, num_shards, shard_size)

    from superserial.base.progress import make_progress

    start = time.perf_counter()
    with local_commit.SaveLock(path):
        base = layout.read_header(path)
        _check(base, given, compression, path)
        fingerprint = {
            "append_to": {
                "element_count": base.element_count,
                "header_crc32c": f"{record_index.crc32c(base.to_json().encode('utf-8')):08x}",
            },
            "structure": node_to_obj(given),
            "compression": base.compression,
            "num_shards": num_shards,
            "shard_size": None if shard_quotas is not None else shard_size or DEFAULT_SHARD_SIZE,
            "cardinality": cardinality,
        }
        header = write_dataset(
            dataset,
            AppendTarget(path, base, fingerprint=fingerprint, resume=resume),
            base.leaves,
            compression=base.compression,
            shard_quotas=shard_quotas,
            shard_size=shard_size,
            bar=make_progress(
                progress,
                total=cardinality if cardinality >= 0 else None,
                desc=f"append {path}",
            ),
        )
    log.info(
        "appended %d elements to %s in %d new shard(s), %.2fs; %d elements now",
        header.element_count - base.element_count,
        path,
        len(header.shards) - len(base.shards),
        time.perf_counter() - start,
        header.element_count,
    )
    return header

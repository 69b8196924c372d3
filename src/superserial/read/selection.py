"""``select=``: the leaves a reader keeps, as a pruned structure and header.

Every reader (``superserial.load``, ``superserial.numpy.load``, the torch
and Grain sources) takes ``select=[names]`` and reads through
:func:`select_header` (called by :func:`superserial.read.opening.open_dataset`,
before any shard file is touched): the header with its structure pruned to
the selected leaves. The readers need nothing else: they parse and decode the leaves of
the header they are given, so the features of the other leaves are never
parsed (TensorFlow's parse spec lists only the selected features; the numpy
decoders decode only the selected leaves).

Names are the leaf names ``superserial inspect`` prints (:func:`leaf_name`:
dict keys JSON-pointer escaped, tuple and namedtuple positions in decimal,
joined with ``/``; ``value`` for a dataset of plain tensors), or the name of
an inner node, which selects every leaf below it (``meta`` selects
``meta/id`` and ``meta/tags``).

How the structure is pruned:

* a dict keeps only the selected keys;
* a tuple keeps its selected items, in their order: a shorter tuple
  (selecting ``1`` of ``(image, label)`` gives ``(label,)``);
* a namedtuple keeps its selected fields: a namedtuple of the same name with
  only those fields, so ``element.label`` still works;
* a node with nothing selected below it disappears.

Leaves keep their names (their feature names in the records), whatever their
new position. The order of ``select`` does not matter, nor do repeats.

This module does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from superserial.format.header import Header
from superserial.format.structure import DictNode, Leaf, NamedTupleNode, Node, TupleNode, leaf_name

__all__ = ["node_names", "prune", "select_header"]

_SHOWN_NAMES = 50


def node_names(node: Node) -> list[str]:
    """Every name ``select`` accepts for ``node``: leaves and inner nodes, in ``tf.nest`` order."""
    out: list[str] = []

    def walk(n: Node, path: tuple[str | int, ...]) -> None:
        if isinstance(n, Leaf):
            out.append(n.name)
            return
        if path:
            out.append(leaf_name(path))
        if isinstance(n, DictNode):
            for k in sorted(n.items):
                walk(n.items[k], (*path, k))
        else:
            for i, item in enumerate(n.items):
                walk(item, (*path, i))

    walk(node, ())
    return out


def _check_names(select: object) -> list[str]:
    if isinstance(select, (str, bytes)):
        raise TypeError(f"expected select= as a list of leaf names, got a string: [{select!r}]?")
    if not isinstance(select, Iterable):
        raise TypeError(f"expected select= as a list of leaf names, got {type(select).__name__}")
    names = list(select)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(
                f"expected select= names as strings, got {type(name).__name__} {name!r}"
            )
    if not names:
        raise ValueError("expected at least one name in select=, got none")
    return names


def prune(node: Node, select: Iterable[str]) -> Node:
    """``node`` with only the leaves named (or under the nodes named) in ``select``.

    Args:
        node: A structure, as the header holds it.
        select: Leaf or inner-node names (see the module docstring).

    Returns:
        The pruned structure (see the module docstring); ``node`` itself
        when everything is selected.

    Raises:
        TypeError: ``select`` is a string, or not a list of strings.
        ValueError: ``select`` is empty, or names no leaf or node of
            ``node``; the message lists the names there are.
    """
    names = _check_names(select)
    known = node_names(node)
    unknown = [n for n in dict.fromkeys(names) if n not in set(known)]
    if unknown:
        shown = ", ".join(known[:_SHOWN_NAMES])
        more = f" ... and {len(known) - _SHOWN_NAMES} more" if len(known) > _SHOWN_NAMES else ""
        raise ValueError(
            f"expected select= names of leaves or nodes of the dataset, got unknown "
            f"{', '.join(repr(n) for n in unknown)}; the names (as `superserial inspect` "
            f"prints them) are: {shown}{more}"
        )
    wanted = set(names)

    def keep(n: Node, path: tuple[str | int, ...]) -> Node | None:
        if isinstance(n, Leaf):
            return n if n.name in wanted else None
        if path and leaf_name(path) in wanted:
            return n  # an inner node selected whole
        if isinstance(n, DictNode):
            items = {k: keep(v, (*path, k)) for k, v in n.items.items()}
            kept = {k: v for k, v in items.items() if v is not None}
            return DictNode(kept) if kept else None
        pairs = [(i, keep(v, (*path, i))) for i, v in enumerate(n.items)]
        kept_items = [(i, v) for i, v in pairs if v is not None]
        if not kept_items:
            return None
        if isinstance(n, NamedTupleNode):
            return NamedTupleNode(
                n.name, tuple(n.fields[i] for i, _ in kept_items), tuple(v for _, v in kept_items)
            )
        return TupleNode(tuple(v for _, v in kept_items))

    pruned = keep(node, ())
    # Every name is known, so at least one leaf is kept.
    return node if pruned is None else pruned


def select_header(header: Header, select: Iterable[str] | None) -> Header:
    """``header`` with its structure pruned to ``select`` (None: ``header`` itself).

    The shards, counts and compression are the same: only what is parsed
    and decoded changes. The result is for reading, never for writing.

    Raises:
        TypeError, ValueError: As :func:`prune`.
    """
    if select is None:
        return header
    pruned = prune(header.structure, select)
    return header if pruned == header.structure else dataclasses.replace(header, structure=pruned)

"""The element structure: leaves (one tensor each) in dicts, tuples and namedtuples.

A dataset's elements are nested structures of tensors. This module holds
that structure as plain data (:class:`Leaf` and the node classes), names
each leaf the way its ``tf.train.Example`` features are named, flattens and
packs values in ``tf.nest`` order, and turns a structure into the JSON
objects the header stores. Parsing untrusted structure JSON is the header's
job (:mod:`superserial.format.header`).

This module does not import TensorFlow.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union

from superserial.format import dtypes

__all__ = [
    "DictNode",
    "Leaf",
    "NamedTupleNode",
    "Node",
    "TupleNode",
    "iter_leaves",
    "leaf_name",
    "namedtuple_type",
    "node_to_obj",
    "pack",
]


def _escape(key: str) -> str:
    # JSON-pointer escaping (RFC 6901) keeps "/" free as the path separator;
    # a lone "~" never appears in an escaped name, so "~" marks our own suffixes.
    return key.replace("~", "~0").replace("/", "~1")


def leaf_name(path: tuple[str | int, ...]) -> str:
    """Returns the feature name of the leaf at ``path`` in the structure.

    Dict keys are escaped as in JSON pointers (``~`` -> ``~0``, ``/`` -> ``~1``)
    and joined with ``/``; tuple positions are decimal. The single leaf of a
    dataset of plain tensors is named ``value``.
    """
    if not path:
        return "value"
    return "/".join(_escape(p) if isinstance(p, str) else str(p) for p in path)


@dataclass(frozen=True)
class Leaf:
    """One tensor of the element structure.

    Attributes:
        name: The leaf's path, as :func:`leaf_name` spells it; also the name
            of its values feature in every ``tf.train.Example``.
        kind: ``"dense"``, ``"ragged"`` or ``"sparse"``.
        dtype: A dtype name from :data:`superserial.format.dtypes.DTYPES`.
        shape: Per-element shape; ``None`` for an unknown dimension.
        ragged_rank: For ragged leaves, the element's ragged rank.
        row_splits_dtype: For ragged leaves, ``"int64"`` or ``"int32"``.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int | None, ...]
    ragged_rank: int | None = None
    row_splits_dtype: str | None = None

    @property
    def entry(self) -> dtypes.DType:
        """The dtype table entry of this leaf."""
        return dtypes.by_name(self.dtype)

    @property
    def encoding(self) -> str:
        """How the values feature is stored (see :mod:`superserial.format.dtypes`)."""
        return self.entry.stored

    @property
    def fixed(self) -> bool:
        """True for a dense leaf whose shape is fully known."""
        return self.kind == "dense" and None not in self.shape

    @property
    def num_values(self) -> int:
        """Values per element of a fixed leaf; per innermost row of a ragged one.

        For a fixed dense leaf, the product of its shape; for a ragged leaf,
        the product of its :attr:`inner_shape` (1 without inner dimensions).
        """
        dims = self.inner_shape if self.kind == "ragged" else self.shape
        return int(math.prod(d for d in dims if d is not None))

    @property
    def inner_shape(self) -> tuple[int, ...]:
        """For ragged leaves, the uniform dimensions inside the ragged ones."""
        # The header guarantees known dimensions inside the ragged ones.
        return tuple(self.shape[(self.ragged_rank or 0) + 1 :])  # type: ignore[arg-type]

    @property
    def features(self) -> dict[str, Any]:
        """The ``tf.train.Example`` features that hold this leaf, by role.

        ``values`` always; ``shape`` (int64, the element's full shape) for dense
        leaves with unknown dimensions and for sparse leaves; ``row_lengths``
        (int64, outermost first) for ragged leaves with ``ragged_rank >= 1``;
        ``indices`` (int64, row-major ``[nnz, rank]``) for sparse leaves.
        """
        out: dict[str, Any] = {"values": self.name}
        if (self.kind == "dense" and not self.fixed) or self.kind == "sparse":
            out["shape"] = self.name + "~shape"
        if self.kind == "ragged" and self.ragged_rank:
            out["row_lengths"] = [f"{self.name}~rl{i}" for i in range(1, self.ragged_rank + 1)]
        if self.kind == "sparse":
            out["indices"] = self.name + "~idx"
        return out

    def feature_names(self) -> list[str]:
        """All feature names of this leaf, flattened."""
        names: list[str] = []
        for v in self.features.values():
            names.extend(v if isinstance(v, list) else [v])
        return names

    def to_obj(self) -> dict[str, Any]:
        """Returns the JSON object of this leaf."""
        out: dict[str, Any] = {
            "type": "tensor",
            "name": self.name,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "encoding": self.encoding,
            "features": self.features,
        }
        if self.kind == "ragged":
            out["ragged_rank"] = self.ragged_rank
            out["row_splits_dtype"] = self.row_splits_dtype
        return out


@dataclass(frozen=True)
class DictNode:
    """A dict of nodes; keys are strings, kept in sorted order as tf.nest does."""

    items: dict[str, Node]


@dataclass(frozen=True)
class TupleNode:
    """A tuple of nodes."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class NamedTupleNode:
    """A namedtuple, rebuilt on load as ``collections.namedtuple(name, fields)``."""

    name: str
    fields: tuple[str, ...]
    items: tuple[Node, ...]


Node = Union[Leaf, DictNode, TupleNode, NamedTupleNode]  # noqa: UP007


def iter_leaves(node: Node) -> Iterator[Leaf]:
    """Yields the leaves under ``node`` in ``tf.nest`` flattening order."""
    if isinstance(node, Leaf):
        yield node
    elif isinstance(node, DictNode):
        for key in sorted(node.items):
            yield from iter_leaves(node.items[key])
    else:
        for item in node.items:
            yield from iter_leaves(item)


_NAMEDTUPLES: dict[tuple[str, tuple[str, ...]], type] = {}


def _rebuild_namedtuple(name: str, fields: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    return namedtuple_type(name, fields)(*values)


def namedtuple_type(name: str, fields: tuple[str, ...]) -> type:
    """One namedtuple class per (name, fields), so rebuilt specs compare equal.

    The class exists only in processes that read the header, so its values
    pickle by name and fields (DataLoader workers and Beam send elements to
    other processes by pickling them).
    """
    key = (name, tuple(fields))
    if key not in _NAMEDTUPLES:
        cls = collections.namedtuple(name, fields)  # type: ignore[misc]  # fields known at run time

        def reduce(self: tuple[Any, ...]) -> tuple[Any, ...]:
            return (_rebuild_namedtuple, (name, key[1], tuple(self)))

        cls.__reduce__ = reduce  # type: ignore[method-assign,assignment]  # pickle by name and fields
        _NAMEDTUPLES[key] = cls
    return _NAMEDTUPLES[key]


def _build(n: Node, it: Iterator[Any]) -> Any:
    if isinstance(n, Leaf):
        return next(it)
    if isinstance(n, DictNode):
        return {k: _build(n.items[k], it) for k in sorted(n.items)}
    if isinstance(n, NamedTupleNode):
        return namedtuple_type(n.name, n.fields)(*[_build(v, it) for v in n.items])
    return tuple(_build(v, it) for v in n.items)


def pack(node: Node, leaves: list[Any]) -> Any:
    """Packs flat ``leaves`` (in :func:`iter_leaves` order) into ``node``'s structure."""
    # A module-level helper, not a recursive closure: a closure that calls itself
    # is a reference cycle, which kept every batch's arrays alive until the
    # garbage collector ran (memory grew with the data read).
    return _build(node, iter(leaves))


def node_to_obj(node: Node) -> dict[str, Any]:
    if isinstance(node, Leaf):
        return node.to_obj()
    if isinstance(node, DictNode):
        return {"type": "dict", "items": {k: node_to_obj(v) for k, v in node.items.items()}}
    if isinstance(node, TupleNode):
        return {"type": "tuple", "items": [node_to_obj(v) for v in node.items]}
    return {
        "type": "namedtuple",
        "name": node.name,
        "fields": list(node.fields),
        "items": [node_to_obj(v) for v in node.items],
    }

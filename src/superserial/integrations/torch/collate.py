"""Batching PyTorch elements of a saved dataset: ``collate``, ``collate_padded`` (TF-free).

:func:`collate` stacks fixed-shape leaves and keeps every other leaf a list;
:func:`collate_padded` pads variable-length numeric leaves into
:class:`Padded`. See :mod:`superserial.integrations.torch.dataset` for the
types. :class:`Elements` is what ``MapDataset.__getitems__`` returns: the
elements of a batch decoded at once, each a view of that batch, which
:func:`collate` hands on whole instead of stacking its elements again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from superserial.codec.numpy_decode import Ragged
from superserial.format.structure import DictNode, Leaf, Node
from superserial.integrations.torch.share import one_storage

__all__ = ["Elements", "Padded", "collate", "collate_padded", "mark", "variable_leaves"]

# The attribute TorchDataset sets on the tensor of a variable-length dense
# leaf: its variable dimensions. A tensor alone cannot tell an int64[None]
# leaf that happens to have equal lengths in a batch from an int64[3] one;
# the mark lets collate decide from the header, the same way every batch.
_VARIABLE = "_superserial_variable_dims"


class Padded(NamedTuple):
    """A batch of a variable-length leaf, padded (from :func:`collate_padded`).

    Attributes:
        values: ``[B, *max_shape]``: element ``i`` in
            ``values[i, :lengths[i, 0], :lengths[i, 1], ...]``, the rest
            ``pad_value``.
        lengths: int64 sizes of each element along the leaf's variable
            dimensions: ``[B]`` for one variable dimension, ``[B, k]`` for
            ``k`` of them, in dimension order.
    """

    values: torch.Tensor
    lengths: torch.Tensor


def collate(batch: list[Any]) -> Any:
    """Batches a list of :class:`TorchDataset` elements, structure kept.

    Dense leaves of a fixed shape are stacked with ``torch.stack``; every
    other leaf (unknown dimensions, ragged, sparse, strings) becomes a list
    of the per-element values, as :func:`superserial.numpy.iter_batches`
    gives them. Tensors that did not come from a :class:`TorchDataset`
    variable-length leaf are stacked, and must have equal shapes.

    A list from ``MapDataset.__getitems__`` whose elements are as it made
    them (:class:`Elements`) is returned as the batch they were cut from.

    Raises:
        ValueError: Elements differ in structure, or tensors of a fixed-shape
            leaf in shape.
    """
    if isinstance(batch, Elements) and batch.intact():
        return batch.batch
    return _collate(batch, "<element>", None)


def collate_padded(pad_value: float | bool | complex = 0) -> Callable[[list[Any]], Any]:
    """A ``collate_fn`` that pads variable-length leaves into :class:`Padded`.

    As :func:`collate`, except that each variable-length numeric leaf (a
    dense leaf with an unknown dimension, ragged of any ``ragged_rank``)
    becomes a :class:`Padded`: the elements padded with ``pad_value`` to
    the batch's largest size in each dimension, and their lengths. String
    and sparse leaves stay lists.

    Args:
        pad_value: The value of padded positions (cast to the leaf's dtype).

    Returns:
        A picklable callable, for ``DataLoader(..., collate_fn=...)``.
    """
    return _PaddedCollate(pad_value)


class _PaddedCollate:
    """:func:`collate_padded`'s callable; a class so that DataLoader workers can unpickle it."""

    def __init__(self, pad_value: Any) -> None:
        self.pad_value = pad_value

    def __call__(self, batch: list[Any]) -> Any:
        return _collate(batch, "<element>", self.pad_value)

    def __repr__(self) -> str:
        return f"collate_padded(pad_value={self.pad_value!r})"


def _collate(items: list[Any], where: str, pad: Any) -> Any:
    first = items[0]
    if isinstance(first, dict):
        keys = list(first)
        for x in items:
            if not isinstance(x, dict) or list(x) != keys:
                raise ValueError(f"expected dicts with keys {keys}, got {_describe(x)} at {where}")
        return {k: _collate([x[k] for x in items], f"{where}/{k}", pad) for k in keys}
    if isinstance(first, tuple):
        for x in items:
            if type(x) is not type(first) or len(x) != len(first):
                raise ValueError(f"expected {_describe(first)}, got {_describe(x)} at {where}")
        parts = [_collate([x[i] for x in items], f"{where}/{i}", pad) for i in range(len(first))]
        return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
    if isinstance(first, torch.Tensor):
        dims = getattr(first, _VARIABLE, None)
        if dims is not None:
            return one_storage(items) if pad is None else _pad_dense(items, dims, pad, where)
        shapes = {tuple(x.shape) for x in items}
        if len(shapes) > 1:
            raise ValueError(
                f"expected tensors of one shape to stack, got shapes {sorted(shapes)} at {where} "
                "(variable-length leaves of a TorchDataset become lists; these tensors are not one)"
            )
        return torch.stack(items)
    ragged = isinstance(first, Ragged) and isinstance(first.flat_values, torch.Tensor)
    if pad is not None and ragged:
        return _pad_ragged(items, pad)
    return list(items)


def _pad_dense(items: list[torch.Tensor], dims: tuple[int, ...], pad: Any, where: str) -> Padded:
    ranks = {x.dim() for x in items}
    if len(ranks) > 1:
        raise ValueError(
            f"expected tensors of one rank to pad, got ranks {sorted(ranks)} at {where}"
        )
    sizes = torch.tensor([tuple(x.shape) for x in items], dtype=torch.int64).reshape(
        len(items), ranks.pop()
    )
    out = torch.full((len(items), *sizes.amax(0).tolist()), pad, dtype=items[0].dtype)
    for i, x in enumerate(items):
        out[i][tuple(slice(0, n) for n in x.shape)] = x
    return Padded(out, _lengths(sizes[:, list(dims)]))


def _pad_ragged(items: list[Ragged], pad: Any) -> Padded:
    # Each flat value's coordinates, innermost ragged dimension first: its
    # position in its row, then that row's position in its parent row...
    coords, extents = [], []
    for r in items:
        idx = torch.arange(len(r.flat_values))
        cs = []
        ext = [len(r)]
        for s in reversed(r.nested_row_splits):
            s = s.to(torch.int64)
            parent = torch.searchsorted(s, idx, right=True) - 1
            cs.append(idx - s[parent])
            idx = parent
            ext.insert(1, int((s[1:] - s[:-1]).max()) if len(s) > 1 else 0)
        cs.append(idx)
        coords.append(tuple(reversed(cs)))
        extents.append(ext)
    sizes = torch.tensor(extents, dtype=torch.int64)
    inner = tuple(items[0].flat_values.shape[1:])
    out = torch.full(
        (len(items), *sizes.amax(0).tolist(), *inner), pad, dtype=items[0].flat_values.dtype
    )
    # torch has no index_put for uint16-64: scatter through a signed view of the same bytes.
    signed = _SIGNED.get(out.dtype)
    target = out.view(signed) if signed is not None else out
    for i, (r, c) in enumerate(zip(items, coords, strict=True)):
        target[i][c] = r.flat_values.view(signed) if signed is not None else r.flat_values
    return Padded(out, _lengths(sizes))


_SIGNED = {
    getattr(torch, f"uint{n}"): getattr(torch, f"int{n}")
    for n in (16, 32, 64)
    if hasattr(torch, f"uint{n}")
}


def _lengths(sizes: torch.Tensor) -> torch.Tensor:
    return sizes[:, 0].contiguous() if sizes.shape[1] == 1 else sizes


def variable_leaves(node: Node, path: tuple[str | int, ...] = ()) -> list[tuple[Any, ...]]:
    """``(path, variable dims)`` of each leaf that is a plain tensor of unknown shape."""
    if isinstance(node, Leaf):
        dims = tuple(i for i, d in enumerate(node.shape) if d is None)
        dense = node.kind == "dense" or (node.kind == "ragged" and not node.ragged_rank)
        return [(path, dims)] if dense and dims and node.dtype != "string" else []
    if isinstance(node, DictNode):
        return [x for k in sorted(node.items) for x in variable_leaves(node.items[k], (*path, k))]
    return [x for i, n in enumerate(node.items) for x in variable_leaves(n, (*path, i))]


def mark(element: Any, variable: list[tuple[Any, ...]]) -> Any:
    for path, dims in variable:
        value = element
        for key in path:
            value = value[key]
        setattr(value, _VARIABLE, dims)
    return element


def _describe(x: Any) -> str:
    if isinstance(x, dict):
        return f"a dict with keys {list(x)}"
    if isinstance(x, tuple):
        return f"a {type(x).__name__} of {len(x)}"
    return type(x).__name__


class Elements(list[Any]):
    """A batch's elements, made from ``batch`` only when looked at.

    Cutting B elements out of a batch costs more than decoding it (a torch
    view is about 3 microseconds), and :func:`collate` does not need them: for
    a list no one has looked into it returns ``batch`` itself. Any other use
    (a ``collate_fn`` of your own, ``len`` aside) first fills the list with
    the elements ``MapDataset`` gave one by one, each cut from ``batch`` (views
    of its tensors, items of its lists); :func:`collate` then stacks them as
    they are, changes included. Elements that are one leaf (no dict or tuple)
    are cut at once: C code such as ``torch.stack(batch)`` reads a list's
    items without calling its methods.

    Args:
        batch: A converted batch (the layout of :meth:`superserial.numpy.NumpyDataset.get_batch`).
        variable: :func:`variable_leaves` of the dataset's structure, to mark.
    """

    def __init__(self, batch: Any, variable: list[tuple[Any, ...]]) -> None:
        super().__init__()
        self.batch, self._variable = batch, variable
        self._n, self._columns = _columns(batch)
        self.filled = False
        if not isinstance(batch, (dict, tuple)):
            self._fill()

    def intact(self) -> bool:
        """Whether no one has looked at the elements (so none was changed)."""
        return not self.filled and bool(self._columns)

    def _fill(self) -> None:
        if self.filled:
            return
        self.filled = True
        rows = _rows(self.batch, self._columns, self._n)
        if self._variable:
            rows = [mark(e, self._variable) for e in rows]
        list.extend(self, rows)

    def __len__(self) -> int:
        return self._n if not self.filled else list.__len__(self)


def _filling(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def call(self: Elements, *args: Any, **kwargs: Any) -> Any:
        self._fill()
        return method(self, *args, **kwargs)

    call.__name__ = name
    return call


# Every list method but len fills the list first (len is known without it).
_FILLING = (
    "__add__", "__contains__", "__delitem__", "__eq__", "__ge__", "__getitem__", "__gt__",
    "__iadd__", "__imul__", "__iter__", "__le__", "__lt__", "__mul__", "__ne__", "__reduce__",
    "__reduce_ex__", "__repr__", "__reversed__", "__rmul__", "__setitem__", "__str__",
    "__format__", "__copy__", "append", "clear", "copy", "count", "extend", "index", "insert",
    "pop", "remove", "reverse", "sort",
)  # fmt: skip
for _name in _FILLING:
    if hasattr(list, _name):
        setattr(Elements, _name, _filling(_name))


def _rows(batch: Any, leaves: list[tuple[tuple[Any, ...], Any]], n: int) -> list[Any]:
    columns = [(p, x.unbind(0) if isinstance(x, torch.Tensor) else x) for p, x in leaves]
    if type(batch) is dict and all(len(p) == 1 for p, _ in columns):  # flat dicts, the usual
        keys = [p[0] for p, _ in columns]
        return [
            dict(zip(keys, values, strict=True))
            for values in zip(*[c for _, c in columns], strict=True)
        ]
    return [_element(batch, columns, i) for i in range(n)]


def _columns(batch: Any) -> tuple[int, list[tuple[tuple[Any, ...], Any]]]:
    """``(B, [(path, leaf)])`` of a converted batch, leaves in order: a stacked tensor or a list."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    _walk(batch, (), out)  # (no recursive closure: its cycle would hold the batch until gc)
    return (len(out[-1][1]) if out else 0), out


def _walk(x: Any, at: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any]]) -> None:
    if isinstance(x, dict):
        for k, v in x.items():
            _walk(v, (*at, k), out)
    elif isinstance(x, tuple):
        for i, v in enumerate(x):
            _walk(v, (*at, i), out)
    else:
        out.append((at, x))


def _element(batch: Any, columns: list[tuple[tuple[Any, ...], Any]], i: int) -> Any:
    return _build(batch, iter(columns), i)


def _build(x: Any, columns: Any, i: int) -> Any:
    if isinstance(x, dict):
        return {k: _build(v, columns, i) for k, v in x.items()}
    if isinstance(x, tuple):
        parts = [_build(v, columns, i) for v in x]
        return type(x)(*parts) if hasattr(x, "_fields") else tuple(parts)
    return next(columns)[1][i]

"""Image-like leaves: which leaves are pictures, and their values as 8-bit pixels.

Shared by the image grid (:mod:`superserial.inspect.grid`, ``superserial show``) and
the notebook view of a numpy dataset (:mod:`superserial.views.notebook`).

A leaf is image-like when it is dense, of shape ``[H, W]``, ``[H, W, 1]``,
``[H, W, 3]`` or ``[H, W, 4]`` (``H`` and ``W`` may be unknown; the channel
dimension must be known), and of dtype ``uint8`` or a float. Those are the
*candidates* picked automatically. Asked for by name, other integer dtypes
and ``bool`` are accepted too; they are scaled as floats are (they are more
often masks, counts or token ids than pictures, so they are never picked
automatically).

Pixels: ``uint8`` values are shown as they are; other dtypes are scaled
linearly from the min/max of the finite values of the images shown
together (:class:`Scaling`) to 0..255, rounded to nearest; NaN becomes 0,
``-inf`` 0 and ``+inf`` 255; when every finite value is equal, they all become 0.

Pillow is the ``viz`` extra; :func:`pil` says how to install it when it is missing.

This module does not import TensorFlow.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from superserial.format.header import Header
from superserial.format.structure import Leaf
from superserial.views import viz

__all__ = [
    "Scaling",
    "candidates",
    "image_problem",
    "label_candidates",
    "mode",
    "pick_image",
    "pick_label",
    "pil",
    "png_bytes",
    "to_pixels",
]

_CHANNELS = (1, 3, 4)
_FLOATS = ("float16", "bfloat16", "float32", "float64")
_SHOWN = 30


def pil() -> Any:
    """The ``PIL.Image`` module, or an error saying which extra installs it.

    Raises:
        MissingDependencyError: Pillow cannot be imported.
    """
    return viz.require("PIL.Image")


def image_problem(leaf: Leaf, *, named: bool = False) -> str | None:
    """Why ``leaf`` is not image-like, or None when it is.

    Args:
        leaf: A leaf of a header.
        named: The user asked for this leaf by name: integer dtypes other
            than uint8, and bool, are accepted too.
    """
    if leaf.kind != "dense":
        return f"it is {leaf.kind}, not dense"
    ok_dtype = leaf.dtype == "uint8" or leaf.dtype in _FLOATS
    if named and (leaf.entry.is_integer or leaf.dtype == "bool"):
        ok_dtype = True
    if not ok_dtype:
        return f"its dtype is {leaf.dtype}, not uint8 or a float" + (
            "" if named else " (integer dtypes are shown when named)"
        )
    shape = leaf.shape
    rank_ok = len(shape) == 2 or (len(shape) == 3 and shape[2] in _CHANNELS)
    if not rank_ok:
        return f"its shape is {_shape(shape)}, not [H, W], [H, W, 1], [H, W, 3] or [H, W, 4]"
    return None


def candidates(header: Header) -> list[Leaf]:
    """The image-like leaves of ``header`` picked automatically (uint8 and float)."""
    return [leaf for leaf in header.leaves if image_problem(leaf) is None]


def label_candidates(header: Header) -> list[Leaf]:
    """The leaves that can label an image automatically: integer (not bool) or string scalars."""
    return [
        leaf
        for leaf in header.leaves
        if leaf.kind == "dense"
        and leaf.shape == ()
        and (leaf.dtype == "string" or (leaf.entry.is_integer and leaf.dtype != "bool"))
    ]


def _shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def _listing(header: Header) -> str:
    leaves = header.leaves
    text = ", ".join(f"{leaf.name} {leaf.dtype}{_shape(leaf.shape)}" for leaf in leaves[:_SHOWN])
    more = f", ... ({len(leaves) - _SHOWN} more)" if len(leaves) > _SHOWN else ""
    return text + more


def _by_name(header: Header, name: str, what: str) -> Leaf:
    for leaf in header.leaves:
        if leaf.name == name:
            return leaf
    raise ValueError(
        f"expected {what} to name a leaf of the dataset, got {name!r}; the leaves: {_listing(header)}"
    )


def pick_image(header: Header, name: str | None, where: str) -> Leaf:
    """The image leaf: ``name``, or the one candidate.

    Raises:
        ValueError: ``name`` is no leaf, or no image-like one; or, without a
            name, there are no candidates or several (the message lists them).
    """
    if name is not None:
        leaf = _by_name(header, name, "the image leaf")
        problem = image_problem(leaf, named=True)
        if problem is not None:
            raise ValueError(
                f"expected an image-like leaf (dense uint8, float or integer, shape [H, W], "
                f"[H, W, 1], [H, W, 3] or [H, W, 4]), got {name!r} in {where}: {problem}"
            )
        return leaf
    found = candidates(header)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError(
            f"expected an image-like leaf (dense uint8 or float, shape [H, W], [H, W, 1], "
            f"[H, W, 3] or [H, W, 4]) in {where}, found none; the leaves: {_listing(header)}"
            " (an integer leaf can be named as the image)"
        )
    names = ", ".join(f"{leaf.name} {leaf.dtype}{_shape(leaf.shape)}" for leaf in found)
    raise ValueError(
        f"expected one image-like leaf in {where}, found {len(found)}: {names}; "
        "name the one to show (--image LEAF, or image=)"
    )


def pick_label(header: Header, name: str | None, where: str) -> Leaf | None:
    """The label leaf: ``name`` (any dense scalar), the one candidate, or None.

    Without a name: the one candidate, else the one integer candidate (an
    integer beside a string is the class id, the string its name or a file
    name), else None (:func:`label_candidates` says which could be named).

    Raises:
        ValueError: ``name`` is no leaf, or not a dense scalar.
    """
    if name is None:
        found = label_candidates(header)
        integers = [leaf for leaf in found if leaf.dtype != "string"]
        if len(found) == 1:
            return found[0]
        return integers[0] if len(integers) == 1 else None
    leaf = _by_name(header, name, "the label leaf")
    if leaf.kind != "dense" or leaf.shape != ():
        raise ValueError(
            f"expected the label leaf to be a dense scalar, got {name!r} in {where}: "
            f"{leaf.kind} {leaf.dtype}{_shape(leaf.shape)}"
        )
    return leaf


@dataclass(frozen=True)
class Scaling:
    """How non-uint8 values became 8-bit pixels: ``low`` -> 0, ``high`` -> 255, linearly.

    Attributes:
        dtype: The leaf's dtype.
        low: The smallest finite value of the images shown together.
        high: The largest one.
    """

    dtype: str
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.dtype} [{self.low:g}, {self.high:g}] -> uint8 [0, 255]"

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "low": self.low, "high": self.high}


def _hwc(a: np.ndarray) -> np.ndarray:
    """``[H, W]`` -> ``[H, W]``; ``[H, W, 1]`` -> ``[H, W]``; others unchanged."""
    return a[:, :, 0] if a.ndim == 3 and a.shape[2] == 1 else a


def to_pixels(images: list[np.ndarray], leaf: Leaf) -> tuple[list[np.ndarray], Scaling | None]:
    """The images as uint8 arrays ``[H, W]`` (gray), ``[H, W, 3]`` or ``[H, W, 4]``.

    Args:
        images: The leaf's values, one array per element.
        leaf: The (image-like) leaf they are values of.

    Returns:
        The pixels, and the :class:`Scaling` used (None for uint8).
    """
    if leaf.dtype == "uint8":
        return [np.ascontiguousarray(_hwc(np.asarray(a))) for a in images], None
    wide = [np.asarray(a).astype(np.float64) for a in images]
    finite = [a[np.isfinite(a)] for a in wide]
    finite = [a for a in finite if a.size]
    low = float(min(a.min() for a in finite)) if finite else 0.0
    high = float(max(a.max() for a in finite)) if finite else 0.0
    span = high - low
    out = []
    for a in wide:
        with np.errstate(invalid="ignore"):
            scaled = (a - low) * (255.0 / span) if span > 0 else np.zeros_like(a)
        scaled = np.nan_to_num(scaled, nan=0.0, posinf=255.0, neginf=0.0)
        out.append(np.ascontiguousarray(_hwc(np.clip(np.rint(scaled), 0, 255).astype(np.uint8))))
    return out, Scaling(leaf.dtype, low, high)


def mode(pixels: np.ndarray) -> str:
    """The Pillow mode of uint8 pixels from :func:`to_pixels`."""
    if pixels.ndim == 2:
        return "L"
    return "RGB" if pixels.shape[2] == 3 else "RGBA"


def png_bytes(image: Any) -> bytes:
    """A Pillow image as PNG bytes."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()

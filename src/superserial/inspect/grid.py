"""``superserial.show``: a grid of a dataset's images, captioned, as a Pillow image.

    grid = superserial.show("/data/digits", n=16)        # displays in a notebook
    grid.save("grid.png"); grid.scaling                   # how floats became pixels
    superserial.show("/data/digits", shuffle=True, seed=1, image="image", label="label")

The elements are read with the TF-free reader (:mod:`superserial.numpy`):
the first ``n`` by streaming (any dataset), or a seeded sample of ``n``
positions (``shuffle=True``) or given ``indices`` by random access (shards
with record indexes). Only the image and label leaves are decoded.

Which leaves are images and how values become pixels: :mod:`superserial.views.images`.
Layout: ``ceil(sqrt(n))`` columns (or ``columns=``); each tile is pasted at
exact pixels, upscaled by an integer ``scale`` (nearest neighbour; by default
the largest that keeps the longer side at most 64 pixels, at least 1), at the
top left of its cell, with its caption (``index`` or ``index: label``) below.
:attr:`Grid.boxes` gives each tile's pixel box.

This module does not import TensorFlow.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from superserial.format import layout
from superserial.format.structure import DictNode, Leaf, Node
from superserial.read import numpy_reader as ssnp
from superserial.read.opening import open_dataset
from superserial.storage import fs
from superserial.views import images
from superserial.views.images import Scaling

__all__ = ["Grid", "show"]

_PAD = 4
_TARGET = 64  # the default scale brings the longer side of a tile up to at most this
_MIN_CELL = 48  # room for a caption under tiny tiles


@dataclass
class Grid:
    """An image grid made by :func:`show`; a notebook displays it (``_repr_png_``).

    Attributes:
        image: The grid, a ``PIL.Image.Image`` (mode L, RGB or RGBA, as the leaf).
        path: The dataset shown.
        leaf: The image leaf's name.
        label: The label leaf's name, or None (captions are indices only).
        indices: The element of each tile, in tile order (row by row).
        boxes: Each tile's pixel box in :attr:`image`, ``(left, top, right, bottom)``.
        scale: The integer upscaling factor of every tile.
        scaling: How non-uint8 values became pixels (None for uint8).
        seed: The seed of the shuffled pick (drawn when not given), else None.
        label_choices: When no label was picked because several leaves could
            be one, their names (pass one as ``label=``); else empty.
    """

    image: Any
    path: str
    leaf: str
    label: str | None
    indices: list[int]
    boxes: list[tuple[int, int, int, int]] = field(repr=False)
    scale: int
    scaling: Scaling | None
    seed: int | None
    label_choices: list[str] = field(default_factory=list)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the grid as PNG to ``path`` (local, or a URL :mod:`superserial.storage.fs` reaches)."""
        with fs.open_file(os.fspath(path), "wb") as f:
            f.write(images.png_bytes(self.image))

    def _repr_png_(self) -> bytes:
        return images.png_bytes(self.image)

    def to_dict(self) -> dict[str, Any]:
        """The grid's facts, as ``superserial show --json`` prints them."""
        return {
            "path": self.path,
            "leaf": self.leaf,
            "label": self.label,
            "indices": self.indices,
            "size": list(self.image.size),
            "scale": self.scale,
            "scaling": None if self.scaling is None else self.scaling.to_dict(),
            "seed": self.seed,
            "label_choices": self.label_choices,
        }


def _flat(node: Node, value: Any) -> list[Any]:
    """The leaf values of a packed structure, in header order."""
    if isinstance(node, Leaf):
        return [value]
    if isinstance(node, DictNode):
        return [x for k in sorted(node.items) for x in _flat(node.items[k], value[k])]
    return [x for n, v in zip(node.items, value, strict=True) for x in _flat(n, v)]


def _pick(
    total: int, n: int, shuffle: bool, seed: int | None, indices: Sequence[int] | None
) -> tuple[list[int] | None, int | None]:
    """The positions to show (None: the first ``n``) and the seed used."""
    if indices is not None:
        if shuffle:
            raise ValueError("expected either indices= or shuffle=True, got both")
        return [int(i) for i in indices], None
    if not shuffle:
        if seed is not None:
            raise ValueError(f"expected shuffle=True with seed={seed!r} (the seed of the pick)")
        return None, None
    if seed is None:
        seed = secrets.randbelow(2**32)
    rng = np.random.default_rng(seed)
    picked = rng.choice(total, size=min(n, total), replace=False)
    return sorted(int(i) for i in picked), seed


def _caption(index: int, label: Any) -> str:
    if label is None:
        return str(index)
    value = np.asarray(label)
    x = value.item() if value.ndim == 0 else value
    if isinstance(x, bytes):
        x = x.decode("utf-8", errors="replace")
    elif isinstance(x, float):
        x = f"{x:.4g}"
    return f"{index}: {x}"


def _caption_strip(
    Image: Any, mode: str, size: tuple[int, int], text: str, font: Any, colors: tuple[Any, Any]
) -> Any:
    """The caption on its own strip, so no glyph reaches outside it (onto a tile)."""
    from PIL import ImageDraw

    white, ink = colors
    strip = Image.new(mode, size, white)
    draw = ImageDraw.Draw(strip)
    text = "".join(c if c.isprintable() else "?" for c in text)  # one line, always
    if draw.textlength(text, font=font) > size[0]:
        while len(text) > 1 and draw.textlength(text + "..", font=font) > size[0]:
            text = text[:-1]
        text += ".."
    try:
        draw.text((0, 0), text, fill=ink, font=font)
    except UnicodeEncodeError:  # Pillow's bitmap font (no FreeType) is latin-1 only
        draw.text((0, 0), text.encode("ascii", "backslashreplace").decode(), fill=ink, font=font)
    return strip


def render(
    pixels: list[np.ndarray], captions: list[str], *, columns: int | None, scale: int | None
) -> tuple[Any, list[tuple[int, int, int, int]], int]:
    """Lays out uint8 tiles (from :func:`superserial.views.images.to_pixels`) with their captions.

    Returns:
        The Pillow image, each tile's box, and the scale used.
    """
    Image = images.pil()
    from PIL import ImageFont

    k = len(pixels)
    h = max(p.shape[0] for p in pixels)
    w = max(p.shape[1] for p in pixels)
    if scale is None:
        scale = max(1, _TARGET // max(h, w, 1))
    cols = min(columns or math.ceil(math.sqrt(k)), k)
    rows = math.ceil(k / cols)
    font = ImageFont.load_default()
    text_h = int(font.getbbox("0123456789: gjpqyAX")[3]) + 2  # its bottom
    cell_w, cell_h = max(w * scale, _MIN_CELL), h * scale + text_h + 2
    mode = images.mode(pixels[0])
    white: Any = {"L": 255, "RGB": (255, 255, 255), "RGBA": (255, 255, 255, 255)}[mode]
    ink: Any = {"L": 0, "RGB": (0, 0, 0), "RGBA": (0, 0, 0, 255)}[mode]
    size = (_PAD + cols * (cell_w + _PAD), _PAD + rows * (cell_h + _PAD))
    canvas = Image.new(mode, size, white)
    boxes = []
    for i, (p, text) in enumerate(zip(pixels, captions, strict=True)):
        r, c = divmod(i, cols)
        x, y = _PAD + c * (cell_w + _PAD), _PAD + r * (cell_h + _PAD)
        big = np.repeat(np.repeat(p, scale, axis=0), scale, axis=1)
        if big.size:
            canvas.paste(Image.fromarray(big, mode), (x, y))
        boxes.append((x, y, x + big.shape[1], y + big.shape[0]))
        strip = _caption_strip(Image, mode, (cell_w, text_h), text, font, (white, ink))
        canvas.paste(strip, (x, y + h * scale + 2))
    return canvas, boxes, scale


def show(
    path: str | os.PathLike[str],
    *,
    n: int = 16,
    image: str | None = None,
    label: str | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    indices: Sequence[int] | None = None,
    columns: int | None = None,
    scale: int | None = None,
) -> Grid:
    """A grid of ``n`` images of a saved dataset, each captioned with its index and label.

    Args:
        path: The dataset (a local path or URL, as :func:`superserial.numpy.load` takes).
        n: How many images (fewer if the dataset is smaller).
        image: The image leaf's name (as ``superserial inspect`` prints it);
            None: the one image-like leaf (uint8 or float).
        label: The label leaf's name (any dense scalar); None: the one integer
            or string scalar leaf if there is exactly one, else the one integer
            scalar leaf, else no label (:attr:`Grid.label_choices` lists them).
        shuffle: Show a random sample of ``n`` elements (in index order)
            instead of the first ``n``.
        seed: The sample's seed (needs ``shuffle=True``); None: drawn, and
            kept in :attr:`Grid.seed` so the pick can be repeated.
        indices: Show these elements (instead of ``n``/``shuffle``).
        columns: Tiles per row; None: ``ceil(sqrt(n))``.
        scale: The integer upscaling of every tile; None: automatic.

    Returns:
        A :class:`Grid`: ``.image`` (Pillow), ``.save(path)``, ``.scaling``.

    Raises:
        ValueError: No image-like leaf, several (the message lists them), a
            named leaf that is missing or not image-like, or an empty dataset.
        UnsupportedError: Pillow is not installed (``pip install
            'superserial[viz]'``), or a shuffled pick in shards without record
            indexes.
    """
    path = os.fspath(path)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"expected n >= 1 images, got {n!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int) or scale < 1):
        raise ValueError(f"expected scale >= 1, got {scale!r}")
    if columns is not None and (
        isinstance(columns, bool) or not isinstance(columns, int) or columns < 1
    ):
        raise ValueError(f"expected columns >= 1, got {columns!r}")
    images.pil()  # the missing extra is said before any reading
    header = layout.read_header(path)
    picked_leaf = images.pick_image(header, image, path)
    label_leaf = images.pick_label(header, label, path)
    choices = [] if label_leaf is not None else images.label_candidates(header)
    names = [picked_leaf.name] + ([label_leaf.name] if label_leaf is not None else [])
    # The header the leaves were picked from is the one read: one read, one version.
    ds = ssnp.NumpyDataset.from_opened(open_dataset(path, header=header, select=names))
    if len(ds) == 0:
        raise ValueError(f"expected elements to show, found none: {path} holds 0 elements")
    positions, used_seed = _pick(len(ds), n, shuffle, seed, indices)
    if positions is None:
        batch = next(ds.batches(n))
        shown = list(range(min(n, len(ds))))
    else:
        if not positions:
            raise ValueError("expected at least one index in indices=, got none")
        batch = ds.get_batch(positions)
        shown = [i + len(ds) if i < 0 else i for i in positions]
    by_name = dict(
        zip(
            (leaf.name for leaf in ds.header.leaves), _flat(ds.header.structure, batch), strict=True
        )
    )
    values = list(by_name[picked_leaf.name])
    labels = list(by_name[label_leaf.name]) if label_leaf is not None else [None] * len(values)
    pixels, scaling = images.to_pixels(values, picked_leaf)
    captions = [_caption(i, y) for i, y in zip(shown, labels, strict=True)]
    canvas, boxes, used_scale = render(pixels, captions, columns=columns, scale=scale)
    return Grid(
        image=canvas,
        path=path,
        leaf=picked_leaf.name,
        label=None if label_leaf is None else label_leaf.name,
        indices=shown,
        boxes=boxes,
        scale=used_scale,
        scaling=scaling,
        seed=used_seed,
        label_choices=[leaf.name for leaf in choices] if len(choices) > 1 else [],
    )

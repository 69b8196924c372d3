"""The notebook view of a numpy dataset: :meth:`superserial.numpy.NumpyDataset._repr_html_`.

A summary (path, element count, shards, compression), the leaves (name,
kind, dtype, shape), and the first rows as a table: one row per element, one
column per leaf. Image-like leaves (:mod:`superserial.views.images`) show as inline
PNG thumbnails (each scaled on its own when not uint8), or as text when
Pillow is missing; other values as short text.

Everything that comes from the dataset (paths, leaf names, strings) is
HTML-escaped: a dataset is untrusted input.

This module does not import TensorFlow.
"""

from __future__ import annotations

import base64
import html
from typing import Any

import numpy as np

from superserial.codec.numpy_decode import Ragged, Sparse
from superserial.errors import UnsupportedError
from superserial.format.header import Header
from superserial.format.structure import Leaf
from superserial.views import images

__all__ = ["ROWS", "dataset_html"]

ROWS = 5
_TEXT = 80  # characters of a value's text
_THUMB = 64  # thumbnails are at most this many pixels on their longer side
_MIN_THUMB = 32  # small images are shown at least this big (pixelated)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _shape(shape: tuple[int | None, ...] | tuple[int, ...]) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def _short(text: str) -> str:
    return text if len(text) <= _TEXT else text[: _TEXT - 3] + "..."


def _lists(rows: list[Any]) -> list[Any]:
    return [_lists(r) if isinstance(r, list) else np.asarray(r).tolist() for r in rows]


def value_text(leaf: Leaf, x: Any) -> str:
    """A short plain-text form of one decoded value (not escaped)."""
    if isinstance(x, Sparse):
        shape = _shape(tuple(int(d) for d in np.asarray(x.dense_shape)))
        return f"sparse {leaf.dtype}{shape}, {len(np.asarray(x.values))} values"
    if isinstance(x, Ragged):
        return _short(f"ragged {leaf.dtype} {_lists(x.to_list())!r}")
    a = np.asarray(x)
    if a.ndim == 0:
        return _short(repr(a.item()) if a.dtype == object else str(a.item()))
    with np.printoptions(threshold=8, edgeitems=2, linewidth=10_000):
        body = " ".join(np.array2string(a, separator=", ").split())
    return _short(f"{leaf.dtype}{_shape(a.shape)} {body}")


def _thumbnail(leaf: Leaf, x: Any) -> str | None:
    """An ``<img>`` of one image value, or None without Pillow."""
    try:
        Image = images.pil()
    except UnsupportedError:
        return None
    (pixels,), _ = images.to_pixels([np.asarray(x)], leaf)
    if pixels.size == 0:
        return None
    picture = Image.fromarray(pixels, images.mode(pixels))
    h, w = pixels.shape[:2]
    if max(h, w) > _THUMB:
        picture.thumbnail((_THUMB, _THUMB))
    width, height = picture.size
    if max(width, height) < _MIN_THUMB:  # let the browser enlarge it, pixels kept sharp
        factor = -(-_MIN_THUMB // max(width, height))
        width, height = width * factor, height * factor
    data = base64.b64encode(images.png_bytes(picture)).decode("ascii")
    return (
        f'<img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
        f'style="image-rendering: pixelated" alt="{_e(leaf.name)}">'
    )


def _cell(leaf: Leaf, x: Any, image_like: bool) -> str:
    if image_like:
        img = _thumbnail(leaf, x)
        if img is not None:
            return img
    return f"<code>{_e(value_text(leaf, x))}</code>"


def dataset_html(path: str, header: Header, shards: int, length: int, rows: list[list[Any]]) -> str:
    """The HTML of a dataset: summary, leaves, and ``rows`` (flat leaf values) as a table."""
    leaves = header.leaves
    pictures = [images.image_problem(leaf) is None for leaf in leaves]
    out = [
        "<div>",
        f"<p><b>superserial dataset</b> <code>{_e(path)}</code>: {length:,} elements, "
        f"{shards} shard file(s), compression {_e(header.compression or 'none')}</p>",
        "<table><thead><tr><th>leaf</th><th>kind</th><th>dtype</th><th>shape</th></tr></thead><tbody>",
    ]
    for leaf in leaves:
        out.append(
            f"<tr><td><code>{_e(leaf.name)}</code></td><td>{_e(leaf.kind)}</td>"
            f"<td>{_e(leaf.dtype)}</td><td>{_e(_shape(leaf.shape))}</td></tr>"
        )
    out.append("</tbody></table>")
    if rows:
        shown = f"the first {len(rows)}" if len(rows) < length else f"all {len(rows)}"
        out.append(f"<p>{shown} element(s):</p>")
        heads = "".join(f"<th>{_e(leaf.name)}</th>" for leaf in leaves)
        out.append(f"<table><thead><tr><th></th>{heads}</tr></thead><tbody>")
        for i, flat in enumerate(rows):
            cells = "".join(
                f"<td>{_cell(leaf, x, p)}</td>"
                for leaf, x, p in zip(leaves, flat, pictures, strict=True)
            )
            out.append(f"<tr><th>{i}</th>{cells}</tr>")
        out.append("</tbody></table>")
    out.append("</div>")
    return "\n".join(out)

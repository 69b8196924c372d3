"""Statistics (``superserial.stats``'s dicts) as readable text and as a PNG of small panels.

The PNG needs matplotlib (``superserial[viz]``, through :mod:`superserial.views.viz`);
the text needs nothing. This module does not import TensorFlow.
"""

from __future__ import annotations

import math
import os
from typing import Any

from superserial.views import viz

__all__ = ["PANEL_INCHES", "PLOT_COLUMNS", "PLOT_DPI", "plot_size", "stats_png", "stats_text"]

_BARS = " ▁▂▃▄▅▆▇█"
_SPARK = 48  # the most characters of a histogram line
_SHOWN_VALUES = 10

PANEL_INCHES = (4.0, 3.0)
"""The size of one leaf's panel."""
PLOT_DPI = 100
PLOT_COLUMNS = 3
"""Panels per row (fewer when there are fewer leaves)."""


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool | str):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.6g}"


def _spark(counts: list[int]) -> str:
    """A histogram as one line of block characters, bins grouped to at most ``_SPARK``."""
    if not counts:
        return ""
    group = math.ceil(len(counts) / _SPARK)
    # Per-bin means, so a last group of fewer bins is not drawn lower.
    sums = [
        sum(counts[i : i + group]) / len(counts[i : i + group])
        for i in range(0, len(counts), group)
    ]
    top = max(sums) or 1
    return "".join(_BARS[0 if not c else max(1, round(8 * c / top))] for c in sums)


def _number_lines(s: dict[str, Any], indent: str) -> list[str]:
    lines = [
        f"{indent}count {_num(s['count'])}, min {_num(s['min'])}, max {_num(s['max'])}, "
        f"mean {_num(s['mean'])}, std {_num(s['std'])}"
    ]
    odd = [f"{k} {_num(s[k])}" for k in ("nan", "posinf", "neginf") if s.get(k)]
    lines.append(f"{indent}zeros {_num(s['zeros'])}" + (", " + ", ".join(odd) if odd else ""))
    h = s["histogram"]
    if h["counts"]:
        edges = h["bin_edges"]
        lines.append(
            f"{indent}histogram [{_num(edges[0])}, {_num(edges[-1])}) "
            f"{len(h['counts'])} bins: {_spark(h['counts'])}"
        )
    return lines


def _value(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def _values_lines(v: dict[str, Any], indent: str) -> list[str]:
    if v["type"] == "number":
        return _number_lines(v, indent)
    if v["type"] == "complex":
        return [
            f"{indent}zeros {_num(v['zeros'])}",
            f"{indent}real part:",
            *_number_lines(v["real"], indent + "  "),
            f"{indent}imaginary part:",
            *_number_lines(v["imag"], indent + "  "),
        ]
    return [
        f"{indent}lengths in bytes:",
        *_number_lines(v["lengths"], indent + "  "),
        f"{indent}most frequent{_top_text(v['top'])}",
    ]


def _top_text(top: dict[str, Any]) -> str:
    """The most frequent strings, after "most frequent"; an empty summary says what it means."""
    values, bound = top["values"], top["max_undercount"]
    if top["approximate"] and not values:
        # Misra-Gries keeps every value occurring more than the bound: an empty
        # summary means none does (typically ids or file names, all distinct).
        return f": none stands out, no value occurs more than {_num(bound)} times"
    if not top["approximate"] and len(values) > 1 and all(c == 1 for _, c in values):
        return f" (exact): none, all {_num(len(values))} values are distinct"
    shown = ", ".join(f"{_value(x)}: {_num(c)}" for x, c in values[:_SHOWN_VALUES])
    note = (
        f" (approximate: counts may be low by up to {_num(bound)})"
        if top["approximate"]
        else " (exact)"
    )
    return f"{note}: {shown or '-'}"


def _leaf_lines(name: str, d: dict[str, Any]) -> list[str]:
    shape = ", ".join("None" if x is None else str(x) for x in d["shape"])
    lines = [f"{name}: {d['kind']} {d['dtype']}[{shape}], {_num(d['elements'])} elements"]
    lines.append("  values:")
    lines += _values_lines(d["values"], "    ")
    vc = d["value_counts"]
    if vc is not None:
        if vc["complete"]:
            total = sum(c for _, c in vc["values"]) or 1
            shown = ", ".join(
                f"{_value(x)}: {_num(c)} ({100 * c / total:.1f}%)"
                for x, c in vc["values"][: _SHOWN_VALUES * 2]
            )
            more = len(vc["values"]) - _SHOWN_VALUES * 2
            tail = f", ... {more} more" if more > 0 else ""
            lines.append(f"  value counts ({len(vc['values'])} distinct): {shown}{tail}")
        else:
            lines.append(f"  value counts: more than {vc['limit']} distinct values, not counted")
    for dim, s in d["dims"].items():
        lines.append(f"  dimension {dim} sizes:")
        lines += _number_lines(s, "    ")
    if d["nnz"] is not None:
        lines.append("  stored values (nnz) per element:")
        lines += _number_lines(d["nnz"], "    ")
    return lines


def stats_text(data: dict[str, Any]) -> str:
    """The text of :meth:`superserial.inspect.stats.Stats.to_dict`'s dict."""
    n = len(data["leaves"])
    lines = [f"{data['path']}: {data['elements']:,} elements, {n} lea" + ("f" if n == 1 else "ves")]
    for name, d in data["leaves"].items():
        lines += _leaf_lines(name, d)
    return "\n".join(lines)


# ------------------------------------------------------------------ the PNG


def plot_size(leaves: int) -> tuple[int, int]:
    """The PNG's (width, height) in pixels for a number of leaves."""
    cols = max(1, min(PLOT_COLUMNS, leaves))
    rows = max(1, math.ceil(leaves / cols))
    return round(cols * PANEL_INCHES[0] * PLOT_DPI), round(rows * PANEL_INCHES[1] * PLOT_DPI)


def _histogram(ax: Any, h: dict[str, Any], what: str) -> str:
    if h["counts"]:
        ax.stairs(h["counts"], h["bin_edges"], fill=True)
    else:
        ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
    return what


def _bars(ax: Any, pairs: list[list[Any]], what: str, horizontal: bool = False) -> str:
    labels = [str(v) for v, _ in pairs]
    counts = [c for _, c in pairs]
    if horizontal:
        ax.barh(range(len(pairs)), counts)
        ax.set_yticks(range(len(pairs)), [t[:16] for t in labels], fontsize=7)
        ax.invert_yaxis()
    else:
        ax.bar(range(len(pairs)), counts)
        if len(pairs) <= 20:
            ax.set_xticks(range(len(pairs)), labels, fontsize=7)
    return what


def _panel(ax: Any, name: str, d: dict[str, Any]) -> None:
    """One leaf's most telling picture: value counts, lengths, or the values' histogram."""
    v = d["values"]
    vc = d["value_counts"]
    if vc is not None and vc["complete"] and vc["values"]:
        what = _bars(ax, vc["values"], "value counts")
    elif v["type"] == "string" and v["top"]["values"]:
        top = v["top"]
        what = _bars(ax, top["values"][:_SHOWN_VALUES], "most frequent", horizontal=True)
        if top["approximate"]:
            what += " (approximate)"
    elif d["nnz"] is not None:
        what = _histogram(ax, d["nnz"]["histogram"], "nnz per element")
    elif d["dims"]:
        dim, s = list(d["dims"].items())[-1]
        what = _histogram(ax, s["histogram"], f"dimension {dim} sizes")
    elif v["type"] == "complex":
        what = _histogram(ax, v["real"]["histogram"], "real parts")
    elif v["type"] == "string":
        what = _histogram(ax, v["lengths"]["histogram"], "lengths")
    else:
        what = _histogram(ax, v["histogram"], "values")
    ax.set_title(f"{name}: {what}", fontsize=9)
    ax.tick_params(labelsize=7)


def stats_png(data: dict[str, Any], out: str | os.PathLike[str]) -> tuple[int, int]:
    """Writes one PNG with a panel per leaf to the local file ``out``; returns its (width, height).

    Raises:
        UnsupportedError: matplotlib is not installed.
    """
    leaves = data["leaves"]
    width, height = plot_size(len(leaves))
    fig = viz.figure(figsize=(width / PLOT_DPI, height / PLOT_DPI), dpi=PLOT_DPI)
    cols = max(1, min(PLOT_COLUMNS, len(leaves)))
    rows = max(1, math.ceil(len(leaves) / cols))
    for i, (name, d) in enumerate(leaves.items()):
        _panel(fig.add_subplot(rows, cols, i + 1), name, d)
    if not leaves:
        fig.text(0.5, 0.5, "no leaves", ha="center")
    fig.tight_layout()
    fig.savefig(os.fspath(out), dpi=PLOT_DPI, format="png")
    return width, height

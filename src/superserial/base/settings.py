"""Settings read from ``SUPERSERIAL_*`` environment variables: one parser per kind.

Each setting's module names its variable and default and asks here, so an
unset or empty variable means the default everywhere, and a value of the wrong
kind is the same ``ValueError`` naming the variable, what it expects and what it
holds.

This module does not import TensorFlow.
"""

from __future__ import annotations

import os

from superserial.base.sizes import parse_size

__all__ = ["count", "flag", "seconds", "size"]


def _text(name: str) -> str:
    return os.environ.get(name, "").strip()


def count(name: str, default: int) -> int:
    """A positive integer from the variable ``name``, else ``default``.

    Raises:
        ValueError: The variable holds other than a positive integer.
    """
    text = _text(name)
    if not text:
        return default
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"expected a positive integer in {name}, got {text!r}")
    return n


def flag(name: str, default: bool) -> bool:
    """On (``1``, ``true``, ``yes``, ``on``) or off (``0``, ``false``, ``no``, ``off``) from ``name``, else ``default``.

    Raises:
        ValueError: The variable holds neither.
    """
    text = _text(name)
    if not text:
        return default
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1 or 0 (on or off) in {name}, got {text!r}")


def seconds(name: str, default: float, *, zero: bool = True) -> float:
    """Seconds from the variable ``name``, else ``default``.

    Args:
        name: The variable.
        default: Its value when unset or empty.
        zero: Whether 0 is allowed (else the seconds must be more).

    Raises:
        ValueError: The variable holds no number of seconds (>= 0, or > 0).
    """
    text = _text(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 if zero else value > 0):  # also NaN, and inf - inf
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"expected {name} to be seconds {bound}, got {text!r}")
    return value


def size(name: str, default: int) -> int:
    """Bytes from the variable ``name`` (``"64MiB"``, ``"32M"``, bytes; ``"0"``: 0), else ``default``.

    Raises:
        ValueError: The variable holds no size.
    """
    text = _text(name)
    if not text:
        return default
    if text == "0":
        return 0
    n = parse_size(text, name)
    return default if n is None else n

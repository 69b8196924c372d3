"""Byte sizes written by people: one rule for the command line and the Python API.

The rule is GNU coreutils' (``dd``, ``sort -S``): a bare letter ``K M G T P``
is a power of 1024; ``kB MB GB TB PB`` are powers of 1000; ``KiB MiB GiB TiB
PiB`` are powers of 1024. Case does not matter. So ``--shard-size 64M`` and
``cache_limit="500MiB"`` are binary, ``cache_limit="20GB"`` is 20 * 10**9.

This module does not import TensorFlow.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["parse_size"]

_UNITS = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgtp", start=1):
    _UNITS[_letter] = 1024**_i
    _UNITS[_letter + "b"] = 1000**_i
    _UNITS[_letter + "ib"] = 1024**_i
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | str | None, what: str = "size") -> int | None:
    """Bytes from an int or a string such as ``"64M"``, ``"20GB"`` or ``"500MiB"``.

    None stays None. A bare number is bytes; a fraction (``"1.5GB"``) is
    rounded down to whole bytes.

    Args:
        value: The size.
        what: What the size is for, named in the error.

    Raises:
        ValueError: Anything else, or a size below 1 byte.
    """
    if value is None:
        return None
    expected = (
        f"expected {what} as a number of bytes (an int) or a string such as '64M', '20GB' "
        "or '500MiB' (K M G T: powers of 1024; kB MB GB TB: powers of 1000; "
        "KiB MiB GiB TiB: powers of 1024)"
    )
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{expected}, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.match(value)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _UNITS:
            raise ValueError(f"{expected}, got {value!r}")
        n = int(Decimal(m.group(1)) * _UNITS[unit])  # exact: "1.1GB" is 1100000000
    if n < 1:
        raise ValueError(f"{expected}; at least 1 byte, got {value!r}")
    return n

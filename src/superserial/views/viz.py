"""The optional picture libraries (``superserial[viz]``), imported only when a picture is asked for.

Figures are made as ``matplotlib.figure.Figure`` objects, which draw with
the Agg canvas and touch no global pyplot state: no display is needed, and
a notebook's own backend is left alone.

This module does not import TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

from superserial.errors import UnsupportedError

__all__ = ["INSTALL", "figure", "require"]

INSTALL = "pip install 'superserial[viz]'"
"""What to run when matplotlib is missing."""


def require(module: str = "matplotlib") -> Any:
    """Imports a ``superserial[viz]`` module (``"matplotlib"``, ``"PIL"``...).

    Raises:
        UnsupportedError: It is not installed; the message says how to install it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.partition(".")[0]
        name = {"PIL": "Pillow"}.get(top, top)  # the package's name, not its import name
        raise UnsupportedError(
            f"expected {name} for pictures, found it not installed ({e}): {INSTALL}"
        ) from e


def figure(**kwargs: Any) -> Any:
    """A new ``matplotlib.figure.Figure(**kwargs)``, drawn by Agg.

    Raises:
        UnsupportedError: matplotlib is not installed.
    """
    require("matplotlib")
    return require("matplotlib.figure").Figure(**kwargs)

"""The optional picture libraries (``superserial[viz]``), imported only when a picture is asked for.

Figures are made as ``matplotlib.figure.Figure`` objects, which draw with
the Agg canvas and touch no global pyplot state: no display is needed, and
a notebook's own backend is left alone.

This module does not import TensorFlow.
"""

from __future__ import annotations

from typing import Any

from superserial import errors

__all__ = ["figure", "require"]


def require(module: str = "matplotlib") -> Any:
    """Imports a ``superserial[viz]`` module (``"matplotlib"``, ``"PIL"``...).

    Raises:
        MissingDependencyError: It is not installed; the message says how to install it.
    """
    top = module.partition(".")[0]
    package = {"PIL": "Pillow"}.get(top)  # the package's name, not its import name
    return errors.require(module, extra="viz", needed_for="pictures", package=package)


def figure(**kwargs: Any) -> Any:
    """A new ``matplotlib.figure.Figure(**kwargs)``, drawn by Agg.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    require("matplotlib")
    return require("matplotlib.figure").Figure(**kwargs)

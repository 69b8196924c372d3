"""Progress reporting for long operations: a tqdm bar, a callback, or nothing.

Updates come once per batch of records, never per element.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["make_progress"]


class _Progress:
    def __init__(self, update: Callable[[int, int], None], close: Callable[[], None]):
        self._update, self._close = update, close

    def __call__(self, elements: int, nbytes: int) -> None:
        self._update(elements, nbytes)

    def close(self) -> None:
        self._close()


def make_progress(progress: Any, *, total: int | None, desc: str) -> _Progress:
    """Returns a progress reporter.

    Args:
        progress: True for a tqdm bar, False for none, None for a bar only when
            stderr is a terminal, or a callable given (elements, bytes) per batch.
        total: The expected element count, if known.
        desc: The bar's label.
    """
    if callable(progress):
        return _Progress(progress, lambda: None)
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return _Progress(lambda n, b: None, lambda: None)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit=" el", unit_scale=True, dynamic_ncols=True)
    written = [0]

    def update(n: int, b: int) -> None:
        written[0] += b
        bar.update(n)
        bar.set_postfix_str(f"{written[0] / 1e6:,.1f} MB", refresh=False)

    return _Progress(update, bar.close)

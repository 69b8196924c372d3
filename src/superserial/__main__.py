"""``python -m superserial``: the command line (see :mod:`superserial.cli`)."""

from __future__ import annotations

from superserial.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main()

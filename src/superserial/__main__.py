"""``python -m superserial``: the command line (see :mod:`superserial.cli.main`)."""

from __future__ import annotations

from superserial.cli.main import main

__all__: list[str] = []

if __name__ == "__main__":
    main()

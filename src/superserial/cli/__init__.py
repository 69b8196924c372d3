"""The ``superserial`` command line: :mod:`superserial.cli.main` is the entry point."""

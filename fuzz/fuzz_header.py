"""Fuzz target: the header parser must raise only HeaderError on any input.

    .venv/bin/python fuzz/make_corpus.py                 # seeds from real saves (needs TF)
    .venv/bin/python fuzz/fuzz_header.py -dict=fuzz/header.dict \
        -max_total_time=300 fuzz/corpus/header

Any other exception (or a hang, or memory blow-up past -rss_limit_mb) is a
crash; libFuzzer writes the input to ``crash-*`` and it belongs in
``tests/test_hostile.py`` as a regression case.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from superserial.errors import HeaderError
    from superserial.format.header import Header


def test_one_input(data: bytes) -> None:
    """Parses ``data`` as a header; only ``HeaderError`` may come out."""
    try:
        header = Header.from_json(data, source="fuzz")
    except HeaderError:
        return
    # Whatever parses must serialize and parse back to the same header.
    again = Header.from_json(header.to_json(), source="fuzz-roundtrip")
    if again != header:
        raise AssertionError("header does not round-trip through to_json")


def main() -> None:
    """Runs libFuzzer with the command-line arguments."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

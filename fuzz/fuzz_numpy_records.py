"""Fuzz target: the TF-free record reader (``superserial.numpy``) on damaged shards.

A fixed header (dense, string, uint8, float64, ragged and sparse leaves; see
``make_corpus.py``) and a fuzzed shard file: reading it must yield elements
or raise ``CorruptDataError``, nothing else.

    .venv/bin/python fuzz/make_corpus.py
    .venv/bin/python fuzz/fuzz_numpy_records.py -max_total_time=300 fuzz/corpus/records

The first input byte picks the compression (none/GZIP/ZLIB) and the record
count the header claims; the rest is the file. Inputs are written to a file
in ``/dev/shm`` (or the temp dir) because the reader takes paths.
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    import superserial.numpy as ssnp
    from superserial.errors import CorruptDataError
    from superserial.format.header import Header

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "corpus", "records.header.json"), "rb") as _f:
    HEADER = Header.from_json(_f.read())
DIR = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
FILE = os.path.join(DIR, "data.tfrecord")
COMPRESSIONS = (None, "GZIP", "ZLIB")


def test_one_input(data: bytes) -> None:
    """Reads ``data[1:]`` as a shard of ``HEADER``; only ``CorruptDataError`` may come out."""
    if not data:
        return
    compression = COMPRESSIONS[data[0] % 3]
    count = (data[0] // 3) % 8
    with open(FILE, "wb") as f:
        f.write(data[1:])
    header = Header(HEADER.structure, count, compression, HEADER.shards[:0], HEADER.writer)
    try:
        for _ in ssnp.NumpyDataset(DIR, header, [FILE], [count]):
            pass
    except CorruptDataError:
        return


def main() -> None:
    """Runs libFuzzer with the command-line arguments."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

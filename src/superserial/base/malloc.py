"""glibc's threshold for large blocks, lifted where TensorFlow fixed it at 128 KiB.

TensorFlow 2.21 calls ``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` once per process,
when the first ``tf.data.Dataset.from_generator`` iterator is made (its
``ApplyPython311MemoryPatch``). glibc then maps every block of 128 KiB or more
afresh and unmaps it when freed, where its default would have learned to keep
blocks of the sizes a program frees and reuse them. The readers' blocks are
megabytes (8 MiB read-ahead blocks, 1-4 MiB chunks and their decoded arrays),
so after that call each one costs a page fault per 4 KiB touched: over nginx
+50 ms, tf ``load`` of 50 MB took 42,797 minor faults and 0.209 CPU-s per
epoch, against 22,554 and 0.161 with the threshold lifted
(``benchmarks/mmap_threshold.py``, ``docs/performance.md``).

:func:`lift_mmap_threshold` sets the threshold to :data:`DEFAULT_THRESHOLD`:
what glibc's own adjustment gives once a block of that size is freed. The trim
threshold (how much free memory a heap keeps at its top rather than give back)
is left as it is: raised to twice the threshold, as glibc's adjustment would,
the process kept about 300 MB more after 20 epochs of tf ``load`` over nginx, and
still growing (1,046 -> 1,212 MiB, against 868 -> 881 with TensorFlow's setting
and 901 -> 920 with only the mmap threshold lifted). The readers' tf.data
generators call it when they start, which is after TensorFlow's call.
``SUPERSERIAL_MMAP_THRESHOLD`` sets another size; ``0`` leaves the process's
setting alone. It is done at most once per process, and only on glibc.

This module does not import TensorFlow.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

from superserial.base import settings

__all__ = ["DEFAULT_THRESHOLD", "MMAP_THRESHOLD_ENV", "lift_mmap_threshold"]

MMAP_THRESHOLD_ENV = "SUPERSERIAL_MMAP_THRESHOLD"
# Above the readers' largest blocks (8 MiB and a bytes object's header), below
# glibc's own ceiling for its adjustment (32 MiB on 64-bit).
DEFAULT_THRESHOLD = 16 << 20

# <malloc.h>
_M_MMAP_THRESHOLD = -3

log = logging.getLogger("superserial")
_done_in: int | None = None  # the pid that called it (a fork inherits the setting)


def lift_mmap_threshold() -> bool:
    """Sets glibc's mmap threshold to ``SUPERSERIAL_MMAP_THRESHOLD`` (default 16 MiB), once.

    Returns:
        Whether it was set by this call: False after the first call in this
        process, with the variable at ``0``, or where the C library is not glibc.

    Raises:
        ValueError: ``SUPERSERIAL_MMAP_THRESHOLD`` holds no size.
    """
    global _done_in
    if _done_in == os.getpid():
        return False
    threshold = settings.size(MMAP_THRESHOLD_ENV, DEFAULT_THRESHOLD)
    _done_in = os.getpid()
    if not threshold or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # mallopt returns 1 on success (0 for a value glibc does not take).
    if libc.mallopt(_M_MMAP_THRESHOLD, threshold) != 1:
        log.info("superserial: glibc refused an mmap threshold of %d bytes", threshold)
        return False
    log.info("superserial: glibc's mmap threshold set to %d bytes", threshold)
    return True

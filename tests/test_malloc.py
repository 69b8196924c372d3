"""glibc's mmap threshold: TensorFlow's first from_generator fixes it at 128 KiB; ours lift it.

Each case runs in a fresh interpreter (TensorFlow applies its setting once per
process, and the pytest worker's may have been set already). The setting is not
readable, so what it decides is looked at: whether a 12 MiB block is a mapping of
its own (above the threshold) or lies in a heap (below it), in /proc/self/maps.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import subprocess
import sys

import pytest

from superserial.base import malloc

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="glibc's mallopt",
)

_CHILD = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
from superserial.codec import tf_generator

def mapped_alone():
    # Whether glibc mapped a 12 MiB block for itself: its mapping then starts at
    # the block's 16-byte header (CPython's id() of bytes is the block's address).
    a = b"\x01" * (12 << 20)
    at = id(a)
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= at < hi:
            return lo == at - 16
    raise AssertionError("the block is in no mapping")

def drain(make):
    ds = make(lambda: iter([np.arange(3)]), output_signature=tf.TensorSpec([None], tf.int64))
    return [x.numpy().tolist() for x in ds]

out = {"plain": drain(tf.data.Dataset.from_generator)}
out["after_tf"] = mapped_alone()
out["ours"] = drain(tf_generator.from_generator)
out["after_ours"] = mapped_alone()
print(json.dumps(out))
"""


def _child(**env: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def test_tensorflow_fixes_it_and_our_generators_lift_it() -> None:
    out = _child()
    # TensorFlow's 128 KiB: the block is mapped alone.
    assert out["after_tf"] is True, out
    # After one of ours: from the heap.
    assert out["after_ours"] is False, out
    # The generators still give what they yield.
    assert out["plain"] == out["ours"] == [[0, 1, 2]]


def test_zero_leaves_tensorflows_setting() -> None:
    out = _child(**{malloc.MMAP_THRESHOLD_ENV: "0"})
    assert out["after_tf"] is True, out
    assert out["after_ours"] is True, out


def test_lifted_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(malloc, "_done_in", None)
    monkeypatch.setenv(malloc.MMAP_THRESHOLD_ENV, "16MiB")
    assert malloc.lift_mmap_threshold() is True
    assert malloc.lift_mmap_threshold() is False


def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(malloc, "_done_in", None)
    monkeypatch.setenv(malloc.MMAP_THRESHOLD_ENV, "lots")
    with pytest.raises(ValueError, match=malloc.MMAP_THRESHOLD_ENV):
        malloc.lift_mmap_threshold()
    # Still to be done: a later call with a good value sets it.
    monkeypatch.setenv(malloc.MMAP_THRESHOLD_ENV, "16MiB")
    assert malloc.lift_mmap_threshold() is True


def test_every_from_generator_is_ours() -> None:
    # One owner: a from_generator made elsewhere would leave the threshold fixed.
    src = pathlib.Path(malloc.__file__).parents[1]
    makers = sorted(
        {
            str(p.relative_to(src))
            for p in src.rglob("*.py")
            for line in p.read_text().splitlines()
            if re.search(r"\btf\.data\.Dataset\.from_generator\(", line) and "``" not in line
        }
    )
    assert makers == ["codec/tf_generator.py"], makers

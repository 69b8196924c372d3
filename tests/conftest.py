"""Shared test helpers: exact comparison of datasets, element by element."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from typing import Any

import numpy as np
import pytest


def _bits(x: Any) -> np.ndarray:
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def assert_same_value(a: Any, b: Any, where: str = "") -> None:
    """Asserts two (possibly composite) values are identical, bit for bit."""
    import tensorflow as tf

    fa = tf.nest.flatten(a, expand_composites=True)
    fb = tf.nest.flatten(b, expand_composites=True)
    assert len(fa) == len(fb), f"{where}: {len(fa)} vs {len(fb)} components"
    for i, (x, y) in enumerate(zip(fa, fb, strict=True)):
        x, y = _bits(x), _bits(y)
        assert x.dtype == y.dtype, f"{where}[{i}]: dtype {x.dtype} vs {y.dtype}"
        assert x.shape == y.shape, f"{where}[{i}]: shape {x.shape} vs {y.shape}"
        if x.dtype == object:
            assert x.tolist() == y.tolist(), f"{where}[{i}]: {x!r} vs {y!r}"
        else:
            assert x.tobytes() == y.tobytes(), f"{where}[{i}]: {x!r} vs {y!r}"


def assert_same_dataset(expected: Any, actual: Any) -> None:
    """Asserts equal element_spec and identical elements in the same order."""
    assert actual.element_spec == expected.element_spec, (
        actual.element_spec,
        expected.element_spec,
    )
    ea, aa = list(expected), list(actual)
    assert len(ea) == len(aa), f"{len(ea)} elements expected, {len(aa)} loaded"
    for i, (x, y) in enumerate(zip(ea, aa, strict=True)):
        assert_same_value(x, y, where=f"element {i}")


@pytest.fixture
def ds_path(tmp_path: Any) -> str:
    """A fresh path for a dataset directory (not created)."""
    return str(tmp_path / "ds")

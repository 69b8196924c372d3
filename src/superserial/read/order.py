"""One global shuffled order of a dataset, computed position by position.

The order is a permutation of ``range(n)`` defined by ``n``, a seed and an
epoch alone, so that every framework (tf.data, PyTorch, Grain) and every
number of workers sees the same one: position ``p`` of epoch ``e`` is element
:func:`indices_at` ``(p)``, and worker ``i`` of ``k`` takes positions
``i, i+k, i+2k, ...``. Nothing of size ``n`` is ever made by the readers;
:func:`permutation` (the whole order) is for tests and small datasets.

The algorithm (``docs/shuffle.md`` specifies it for other implementations) is
a keyed Feistel network over the smallest domain ``4**h >= n`` with cycle
walking: a position is enciphered again until it falls below ``n``, which
keeps it a bijection of ``range(n)``. All arithmetic is on unsigned 64-bit
integers, modulo ``2**64``:

* ``mix(x)``: the SplitMix64 finalizer: ``z = x + 0x9E3779B97F4A7C15``;
  ``z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9``;
  ``z = (z ^ (z >> 27)) * 0x94D049BB133111EB``; ``z ^ (z >> 31)``.
* The round keys: ``base = mix(mix(seed) ^ epoch)``,
  ``key[r] = mix(base ^ r)`` for ``r = 0 .. ROUNDS-1`` (``ROUNDS = 6``).
* ``h = max(1, ceil(bits(n - 1) / 2))`` where ``bits(m)`` is the bit length of
  ``m``; halves of ``h`` bits, ``mask = 2**h - 1``.
* One encipherment of ``x < 4**h``: ``L = x >> h``, ``R = x & mask``; for each
  round ``r``: ``L, R = R, L ^ (mix(R ^ key[r]) & mask)``; the result is
  ``(L << h) | R``.
* ``index(p) = x`` where ``x = encipher(p)`` repeated until ``x < n``.

``n`` of 0 or 1 has the identity order. The domain is less than ``4 n``, so a
position takes fewer than 4 encipherments on average.

This module does not import TensorFlow.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["MAX_N", "ROUNDS", "check_seed", "indices_at", "permutation", "positions_of_worker"]

ROUNDS = 6
# Halves of at most 31 bits keep every intermediate within uint64 arithmetic and
# the positions within int64.
MAX_N = 1 << 62
_U64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on an array of uint64 (wrapping arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _mix_int(x: int) -> int:
    return int(_mix(np.array([x & _U64], dtype=np.uint64))[0])


def check_seed(value: Any, what: str = "seed") -> int:
    """``value`` as an int in ``[0, 2**64)``.

    Raises:
        ValueError: ``value`` is not an integer (bools are not), or is out of range.
    """
    if isinstance(value, (bool, float)):
        raise ValueError(f"expected {what} to be an integer in [0, 2**64), got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(
            f"expected {what} to be an integer in [0, 2**64), got {type(value).__name__} {value!r}"
        ) from None
    if not 0 <= v <= _U64:
        raise ValueError(f"expected {what} to be an integer in [0, 2**64), got {v}")
    return v


def _check_n(n: Any) -> int:
    if isinstance(n, bool):
        raise ValueError(f"expected n to be an integer in [0, 2**62], got {n!r}")
    try:
        v = operator.index(n)
    except TypeError:
        raise ValueError(f"expected n to be an integer in [0, 2**62], got {n!r}") from None
    if not 0 <= v <= MAX_N:
        raise ValueError(f"expected n to be an integer in [0, 2**62], got {v}")
    return v


def _keys(seed: int, epoch: int) -> np.ndarray:
    base = _mix_int(_mix_int(seed) ^ epoch)
    return _mix(np.uint64(base) ^ np.arange(ROUNDS, dtype=np.uint64))


def _half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def indices_at(positions: Any, n: int, seed: int, epoch: int = 0) -> np.ndarray:
    """The elements at ``positions`` of the order of ``n`` elements for ``seed`` and ``epoch``.

    Args:
        positions: Integers in ``[0, n)`` (any shape).
        n: The number of elements.
        seed: An integer in ``[0, 2**64)``.
        epoch: An integer in ``[0, 2**64)``.

    Returns:
        An int64 array of the same shape: ``permutation(n, seed, epoch)[positions]``.

    Raises:
        ValueError: A bad ``n``, ``seed`` or ``epoch``, or a position out of range.
    """
    n, seed, epoch = _check_n(n), check_seed(seed), check_seed(epoch, "epoch")
    pos = np.asarray(positions)
    if pos.size and not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(f"expected integer positions, got an array of {pos.dtype}")
    pos = pos.astype(np.int64, copy=False)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(f"expected positions in [0, {n}), got some in [{pos.min()}, {pos.max()}]")
    if n <= 1:
        return pos.copy()
    h = _half_bits(n)
    shift, mask = np.uint64(h), np.uint64((1 << h) - 1)
    keys = [np.uint64(k) for k in _keys(seed, epoch)]
    limit = np.uint64(n)
    x = pos.astype(np.uint64).ravel()
    out = np.empty_like(x)
    todo = np.arange(len(x))
    while len(todo):
        v = x[todo]
        left, right = v >> shift, v & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        v = (left << shift) | right
        done = v < limit
        out[todo[done]] = v[done]
        x[todo] = v
        todo = todo[~done]
    return out.astype(np.int64).reshape(pos.shape)


def permutation(n: int, seed: int, epoch: int = 0) -> np.ndarray:
    """The whole shuffled order of ``n`` elements: ``indices_at(arange(n), n, seed, epoch)``.

    A bijection of ``range(n)`` as an int64 array; the readers never make it
    (they compute the positions they read), so it is for tests, inspection
    and small datasets.

    Raises:
        ValueError: ``n`` not in ``[0, 2**62]``, or ``seed`` / ``epoch`` not
            integers in ``[0, 2**64)``.
    """
    n = _check_n(n)
    return indices_at(np.arange(n, dtype=np.int64), n, seed, epoch)


def positions_of_worker(n: int, worker: int, num_workers: int) -> range:
    """The positions of the global order worker ``worker`` of ``num_workers`` takes.

    ``worker, worker + num_workers, ...``: the workers' positions interleave
    to the global order, whatever their number.

    Raises:
        ValueError: Not ``0 <= worker < num_workers``.
    """
    if not (isinstance(worker, int) and isinstance(num_workers, int) and 0 <= worker < num_workers):
        raise ValueError(
            f"expected 0 <= worker < num_workers, got worker={worker!r}, "
            f"num_workers={num_workers!r}"
        )
    return range(worker, n, num_workers)

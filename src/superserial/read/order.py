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

The windowed order (``window=W``, also in ``docs/shuffle.md``) is built of
the same network: blocks of ``SPREAD`` (5) runs of ``b = max(1, W // 4096)``
consecutive records are put in the global order of the blocks (for a seed
derived from ``seed``, ``epoch`` and ``W``); each group of ``W // b`` blocks
of that sequence makes five windows, window ``j`` taking run ``j`` of each
block, shuffled by the global order of its size (epoch ``w + 1`` for window
``w``); what is left after the last whole group is shuffled as one. A window
thus holds at least 4,096 runs (or single records) from across the dataset,
so the labels of a batch of a sorted dataset stay near uniform, and a reader
holding a group's records (:func:`read_unit`) reads each block once, whole.

This module does not import TensorFlow.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = [
    "MAX_N",
    "ROUNDS",
    "RUNS_PER_WINDOW",
    "SPREAD",
    "check_seed",
    "check_window",
    "indices_at",
    "permutation",
    "positions_of_worker",
    "read_unit",
    "run_length",
]

ROUNDS = 6
# A window holds at least this many runs (docs/shuffle.md, "The windowed order").
RUNS_PER_WINDOW = 4096
# A block of the windowed order is this many runs, one in each of this many
# consecutive windows: a reader holding that many windows reads blocks whole.
SPREAD = 5
# Halves of at most 31 bits keep every intermediate within uint64 arithmetic and
# the positions within int64.
MAX_N = 1 << 62
_U64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_FEISTEL: Any
try:  # built by setuptools where a C compiler was found (pyproject.toml)
    import superserial.read._feistel as _FEISTEL
except ImportError:
    _FEISTEL = None
# Whether the orders' networks run in C (else in numpy: the same values, about 5x slower).
NATIVE = _FEISTEL is not None


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on an array of uint64 (wrapping arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _mix_int(x: int) -> int:
    return int(_mix(np.array([x & _U64], dtype=np.uint64))[0])


def _integer(value: Any, lo: int, hi: int, expected: str) -> int:
    """``value`` as an int in ``[lo, hi]``; else a ValueError saying ``expected`` and what it got."""
    if isinstance(value, (bool, float)):
        raise ValueError(f"{expected}, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{expected}, got {type(value).__name__} {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{expected}, got {v}")
    return v


def check_seed(value: Any, what: str = "seed") -> int:
    """``value`` as an int in ``[0, 2**64)``.

    Raises:
        ValueError: ``value`` is not an integer (bools are not), or is out of range.
    """
    return _integer(value, 0, _U64, f"expected {what} to be an integer in [0, 2**64)")


def _check_n(n: Any) -> int:
    return _integer(n, 0, MAX_N, "expected n to be an integer in [0, 2**62]")


def _half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def check_window(value: Any, what: str = "shuffle_window") -> int | None:
    """``value`` as a window size: None (the global order) or an int in ``[1, 2**62]``.

    Raises:
        ValueError: ``value`` is not None nor an integer (bools are not), or
            is out of range.
    """
    if value is None:
        return None
    return _integer(value, 1, MAX_N, f"expected {what} to be None or an integer in [1, 2**62]")


def run_length(window: int) -> int:
    """The records per run of the windowed order of window ``window``: ``max(1, window // 4096)``.

    A window then holds at least :data:`RUNS_PER_WINDOW` runs (or is all
    single records), so ``s`` consecutive positions hold on average fewer
    than ``1 + s / 4096`` records of one run: a batch of 1,000 is as
    varied as one of a uniform shuffle within a design effect of 1.25.
    """
    return max(1, window // RUNS_PER_WINDOW)


def _round_keys(base: np.ndarray) -> list[np.ndarray]:
    """The round keys ``mix(base ^ r)`` of each base (a uint64 array, 0-d or 1-d)."""
    # On arrays, not numpy scalars: scalar arithmetic warns when it wraps.
    keys = _mix(np.asarray(base, dtype=np.uint64)[..., None] ^ np.arange(ROUNDS, dtype=np.uint64))
    return [keys[..., r] for r in range(ROUNDS)]


def _walk(x: np.ndarray, size: int, bases: np.ndarray) -> np.ndarray:
    """The Feistel network over ``range(size)`` with cycle walking, on uint64 ``x < size``.

    ``bases`` (uint64) give the round keys (:func:`_round_keys`): one base for
    every element, or one per element (one network each). In C where the
    ``_feistel`` extension was built; :func:`_walk_numpy` gives the same values.
    """
    if size <= 1:
        return x.copy()
    bases = np.ascontiguousarray(bases, dtype=np.uint64).reshape(-1)
    if _FEISTEL is None or not len(x):
        return _walk_numpy(x, size, bases)
    x = np.ascontiguousarray(x, dtype=np.uint64)
    out = np.empty_like(x)
    _FEISTEL.walk(x, size, bases, out)
    return out


def _walk_numpy(x: np.ndarray, size: int, bases: np.ndarray) -> np.ndarray:
    """:func:`_walk` in numpy (``size`` > 1; ``bases`` 1-d, of one or ``len(x)`` bases)."""
    keys = _round_keys(bases[0] if len(bases) == 1 else bases)
    h = _half_bits(size)
    shift, mask = np.uint64(h), np.uint64((1 << h) - 1)
    limit = np.uint64(size)
    per_element = keys[0].ndim > 0
    out = np.empty_like(x)
    todo = np.arange(len(x))
    v = x.copy()
    while len(todo):
        ks = [k[todo] for k in keys] if per_element else keys
        left, right = v >> shift, v & mask
        for k in ks:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        v = (left << shift) | right
        done = v < limit
        out[todo[done]] = v[done]
        todo, v = todo[~done], v[~done]
    return out


def _global(x: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """Elements at uint64 positions ``x`` of the global order (arguments checked)."""
    base = np.array(_mix_int(_mix_int(seed) ^ epoch), dtype=np.uint64)
    return _walk(x, n, base)


def read_unit(n: int, window: int) -> tuple[int, int]:
    """How the windowed order of window ``window`` over ``n`` records is read: ``(L, M)``.

    Positions ``[g L, (g + 1) L)`` for ``g < M // L`` are group ``g``, whose
    records are ``L / SPREAD / b`` whole blocks of :func:`run_length` times
    :data:`SPREAD` consecutive records (``docs/shuffle.md``); positions
    ``[M, n)`` are the rest, the last group. A reader that holds one group's
    records at a time reads every block once, whole.
    """
    b = run_length(window)
    blocks = max(1, window // b)
    full = n // (SPREAD * b)
    group = blocks * SPREAD * b
    return group, full // blocks * group


def _windowed(x: np.ndarray, n: int, seed: int, epoch: int, window: int) -> np.ndarray:
    """Elements at uint64 positions ``x`` of the windowed order (arguments checked)."""
    b = run_length(window)
    c = SPREAD * b  # records per block
    blocks = max(1, window // b)  # blocks per group
    wsize = blocks * b  # positions per window (W rounded down to whole runs)
    group, rest = read_unit(n, window)
    full, groups = n // c, rest // group
    wseed = _mix_int(_mix_int(_mix_int(seed) ^ epoch) ^ window)
    u64 = np.uint64
    out = np.empty_like(x)
    # Window number -> shuffled place: the global order of the window's size
    # for seed wseed and epoch (window number + 1); one network per window.
    in_groups = x < u64(rest)
    if in_groups.any():
        g, q = np.divmod(x[in_groups], u64(group))
        j, r = np.divmod(q, u64(wsize))
        bases = _mix(np.array([_mix_int(wseed)], dtype=np.uint64) ^ (g * u64(SPREAD) + j + u64(1)))
        i, o = np.divmod(_walk(r, wsize, bases), u64(b))
        block = _global(g * u64(blocks) + i, full, wseed, 0)
        out[in_groups] = block * u64(c) + j * u64(b) + o
    if not in_groups.all():
        left = full - groups * blocks  # whole blocks in the rest, before the tail
        base = np.array(_mix_int(_mix_int(wseed) ^ (groups * SPREAD + 1)), dtype=np.uint64)
        s = _walk(x[~in_groups] - u64(rest), n - rest, base)
        in_block = s < u64(left * c)
        block = _global(u64(groups * blocks) + s[in_block] // u64(c), full, wseed, 0)
        rec = s.copy()
        rec[in_block] = block * u64(c) + s[in_block] % u64(c)
        rec[~in_block] = s[~in_block] + u64(full * c - left * c)
        out[~in_groups] = rec
    return out


def indices_at(
    positions: Any, n: int, seed: int, epoch: int = 0, window: int | None = None
) -> np.ndarray:
    """The elements at ``positions`` of the order of ``n`` elements for ``seed`` and ``epoch``.

    Args:
        positions: Integers in ``[0, n)`` (any shape).
        n: The number of elements.
        seed: An integer in ``[0, 2**64)``.
        epoch: An integer in ``[0, 2**64)``.
        window: None: the global order. An integer ``W``: the windowed order
            (``docs/shuffle.md``): windows of about ``W`` positions, each
            one run of :func:`run_length` ``(W)`` consecutive records of
            each of thousands of blocks from across the dataset, in a
            shuffled order; five windows share their blocks.

    Returns:
        An int64 array of the same shape: ``permutation(n, seed, epoch, window)[positions]``.

    Raises:
        ValueError: A bad ``n``, ``seed``, ``epoch`` or ``window``, or a
            position out of range.
    """
    n, seed, epoch = _check_n(n), check_seed(seed), check_seed(epoch, "epoch")
    window = check_window(window, "window")
    pos = np.asarray(positions)
    if pos.size and not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(f"expected integer positions, got an array of {pos.dtype}")
    pos = pos.astype(np.int64, copy=False)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(f"expected positions in [0, {n}), got some in [{pos.min()}, {pos.max()}]")
    if n <= 1 or not pos.size:
        return pos.copy()
    x = pos.astype(np.uint64).ravel()
    out = _global(x, n, seed, epoch) if window is None else _windowed(x, n, seed, epoch, window)
    return out.astype(np.int64).reshape(pos.shape)


def permutation(n: int, seed: int, epoch: int = 0, window: int | None = None) -> np.ndarray:
    """The whole shuffled order of ``n`` elements: ``indices_at(arange(n), n, seed, epoch, window)``.

    A bijection of ``range(n)`` as an int64 array; the readers never make it
    (they compute the positions they read), so it is for tests, inspection
    and small datasets. ``window=None`` is the global order; an integer is
    the windowed order, which reads blocks of consecutive records.

    Raises:
        ValueError: ``n`` not in ``[0, 2**62]``, ``seed`` / ``epoch`` not
            integers in ``[0, 2**64)``, or ``window`` not None nor an
            integer in ``[1, 2**62]``.
    """
    n = _check_n(n)
    return indices_at(np.arange(n, dtype=np.int64), n, seed, epoch, window)


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

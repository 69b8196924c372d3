"""The records of a dataset in its global shuffled order, as a ``tf.data`` dataset.

``superserial.load(path, shuffle=True)`` does not stream shards: it reads
records by offset, through the record index of each shard
(:class:`~superserial.read.random_access.RecordReader`), in the order
:func:`superserial.read.order.indices_at` gives. The graph is::

    pass tokens ─map→ pass k ─flat_map→ range(start, n, step) ─batch(chunk)
        ─map(numpy_function: positions → element indices → records)→ tf.string[chunk]

and :mod:`superserial.tf.load` decodes those record batches in graph as it
decodes the sequential ones. Python runs once per chunk of positions (and
once per pass), never per element.

Passes. Iteration ``k`` of the dataset (the ``k``-th pass of a
``.repeat()``, or the ``k``-th iterator made over the same dataset object,
counting from 0) yields ``permutation(n, seed, epoch + k)``, so the passes
are the epochs ``epoch, epoch + 1, ...`` that ``load(..., epoch=e)`` or the
PyTorch and Grain readers name. The pass number must live in the iterator's
state to survive a checkpoint, and a ``tf.Variable`` cannot. What does live
there, and advances once per iteration even across ``.repeat()``, is the seed
generator of a ``RandomDatasetV2`` with ``rerandomize_each_iteration``: each
iteration draws fresh seeds from it, and the iterator checkpoint saves and
restores its position (the number of seeds drawn). Its first two values in
iteration ``k`` form a 64-bit *pass token*; with fixed seeds (not TF's
global seed) the tokens are the same sequence in every process, so
:class:`_PassTable` maps a token back to ``k`` by computing that sequence
once, with TensorFlow, as far as needed.

Checkpoints. The dataset carries ``experimental_symbolic_checkpoint``: an
iterator checkpoint holds positions (the range's next value, the pass
token's generator state, offsets inside a batch), not the records buffered
by ``prefetch`` or a parallel ``map``; on restore those are read again. Its
size does not depend on the position or on the data.
"""

from __future__ import annotations

import atexit
import logging
import secrets
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from superserial.errors import IdleReaderWarning
from superserial.format.header import Header
from superserial.read import order
from superserial.read.group_reads import GroupReads
from superserial.read.random_access import RecordReader

__all__ = ["MAX_PASSES", "ShuffledRecords", "draw_seed", "pass_of", "pass_tokens"]

log = logging.getLogger("superserial")

# Fixed seeds of the pass-token generator: its tokens are then the same in
# every process whatever TF's global seed, so a checkpoint written by one
# process maps to the same passes in another.
_TOKEN_SEED, _TOKEN_SEED2 = 0x55_5EED, 0x9A55
# Pass numbers are found by computing the token sequence this many at a time.
_TOKEN_CHUNK = 4096
# A token not among this many passes is refused rather than searched for ever
# (it cannot come from this dataset's iterators; 2**22 tokens take 32 MiB).
MAX_PASSES = 1 << 22
_U64 = 1 << 64
# The order is computed for this many consecutive positions at once, and
# kept for the reads of the chunks in them: a numpy call costs about the same
# for one position as for a thousand, and cycle walking ends each computation
# with a few calls on a handful of positions.
_ORDER_WINDOW = 1 << 14
# Windows kept (reads in flight, and out of order with deterministic=False).
_ORDER_KEPT = 8


# Set at interpreter exit. An iterator still alive then is destroyed during
# finalization, and its destructor waits for the reads in flight in TF's
# threads, which wait for the GIL the finalizing thread holds: a hang (as for
# any tf.numpy_function pipeline, tensorflow#21277). So at exit, while threads
# can still run Python, reads fail at once: TF's threads fill the iterator's
# buffers with errors and stop calling Python before finalization begins.
_EXITING = threading.Event()
_USED = threading.Event()
_DRAIN_SECONDS = 0.5


@atexit.register
def _stop_reads_at_exit() -> None:
    if _USED.is_set():
        _EXITING.set()
        time.sleep(_DRAIN_SECONDS)  # lets the reads in flight finish, without the GIL


def pass_tokens() -> tf.data.Dataset:
    """A dataset of one int64[2] token per iteration: new each iteration, restored by checkpoints.

    ``Dataset.random(seed=...)`` would draw its seeds through TF's global seed
    (``tf.random.set_seed``); the raw op takes them as given.
    """
    variant = tf.raw_ops.RandomDatasetV2(
        seed=_TOKEN_SEED,
        seed2=_TOKEN_SEED2,
        seed_generator=tf.raw_ops.DummySeedGenerator(),
        rerandomize_each_iteration=True,
        output_types=[tf.int64],
        output_shapes=[[]],
    )
    random = tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.int64))
    # Each value holds 32 random bits: two make tokens that do not collide.
    return random.take(2).batch(2, drop_remainder=True)


def _combine(tokens: np.ndarray) -> np.ndarray:
    """``[..., 2]`` tokens of two 32-bit halves as uint64 values."""
    t = tokens.astype(np.uint64)
    return (t[..., 0] << np.uint64(32)) | t[..., 1]


class _PassTable:
    """Pass tokens back to pass numbers: the token sequence, computed as far as asked.

    Thread-safe; the first chunk is computed by the first ``load`` (in the
    caller's thread), later ones from inside the ``tf.data`` graph, which
    happens only past ``_TOKEN_CHUNK`` passes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens = np.zeros(0, dtype=np.uint64)
        self._probe: Any = None
        self._last = -1

    def _extend(self) -> None:
        if self._probe is None:
            self._probe = iter(pass_tokens().repeat().batch(_TOKEN_CHUNK))
        more = _combine(next(self._probe).numpy())
        self._tokens = np.concatenate([self._tokens, more])

    def prepare(self) -> None:
        """Computes the first chunk of tokens, if not yet done."""
        with self._lock:
            if not len(self._tokens):
                self._extend()

    def pass_of(self, token: np.ndarray) -> int:
        """The pass number of ``token`` (an int64[2] from :func:`pass_tokens`).

        Raises:
            ValueError: ``token`` is not among the first :data:`MAX_PASSES` passes.
        """
        t = _combine(np.asarray(token))
        with self._lock:
            k = self._last + 1
            # Passes mostly come in order: try the one after the last first.
            if not (k < len(self._tokens) and self._tokens[k] == t):
                found = np.flatnonzero(self._tokens == t)
                while not len(found) and len(self._tokens) < MAX_PASSES:
                    start = len(self._tokens)
                    self._extend()
                    found = np.flatnonzero(self._tokens[start:] == t) + start
                if not len(found):
                    raise ValueError(
                        f"expected a pass token of one of the first {MAX_PASSES} iterations of a "
                        f"shuffled load, got {int(t):#018x}: the iterator state does not come "
                        "from superserial.load(..., shuffle=True), or has made more passes "
                        "than that (load each epoch with load(..., epoch=e) instead)"
                    )
                k = int(found[0])
            self._last = k
            return k


_PASSES = _PassTable()


def pass_of(token: np.ndarray) -> np.int64:
    """The pass (iteration) number of a pass token of a shuffled load's iterator."""
    return np.int64(_PASSES.pass_of(token))


def draw_seed() -> int:
    """A fresh random seed in ``[0, 2**63)`` (an int64 on every platform and in every framework)."""
    return secrets.randbits(63)


class ShuffledRecords:
    """The serialized records of a dataset (or of one worker's positions) in shuffled order.

    Args:
        path: The dataset directory or URL.
        header: Its header.
        seed: The order's seed, an integer in ``[0, 2**64)``; None draws one
            (logged at INFO, and kept as :attr:`seed`).
        epoch: The epoch of the first iteration, in ``[0, 2**64)``.
        shard: ``(i, k)``: positions ``i, i+k, i+2k, ...`` of the global
            order; None: every position.
        window: None: the global order. An integer ``W``: the windowed
            order ``permutation(n, seed, epoch, window=W)``; this reader's
            records of each group of its windows (``order.read_unit``:
            ``SPREAD`` windows, made of whole blocks of consecutive
            records) longer than a chunk's span are read whole, the next
            read ahead, and kept while its chunks are made
            (:class:`~superserial.read.group_reads.GroupReads`: at most
            three groups held; a cold group's first chunk is read by
            itself). Shorter groups are read by their chunks.
        local: The local copy of a shard file, once there is one (the pins
            of a cache smaller than the dataset), as
            :class:`~superserial.read.random_access.RecordReader` takes it.

    Attributes:
        seed: The seed in use.
        count: How many records one pass yields.

    Raises:
        ValueError: A bad ``seed``, ``epoch``, ``shard`` or ``window``.
        UnsupportedError: A shard has no index (the error random access
            raises).
    """

    def __init__(
        self,
        path: str,
        header: Header,
        *,
        seed: int | None,
        epoch: int,
        shard: tuple[int, int] | None,
        window: int | None = None,
        local: Callable[[str], str | None] | None = None,
    ) -> None:
        if seed is None:
            seed = draw_seed()
            log.info(
                "load(%s, shuffle=True): drew seed=%d; pass seed=%d to get this order again",
                path,
                seed,
                seed,
            )
        self.seed = order.check_seed(seed)
        self.epoch = order.check_seed(epoch, "epoch")
        self.window = order.check_window(window)
        self.n = header.element_count
        start, step = self._positions(path, shard)
        self._start, self._step = start, step
        self.count = len(range(start, self.n, step))
        self._order: dict[tuple[int, int, int], np.ndarray] = {}
        self._order_lock = threading.Lock()
        self._window = _ORDER_WINDOW
        self._by_window = self.window is not None
        # (positions per group, where the rest begins): the reading unit.
        self._unit = order.read_unit(self.n, self.window or 1)
        counts = [s.records for s in header.shards]
        _USED.set()
        self._reader = RecordReader(
            path, header, header.shards, [0] * len(counts), counts, local=local
        )
        self._groups = None
        if self.window is not None:
            self._groups = GroupReads(
                self._reader, self.n, self.seed, self.window, start=start, step=step
            )
        if self.n > 1:
            _PASSES.prepare()

    def _positions(self, path: str, shard: tuple[int, int] | None) -> tuple[int, int]:
        if shard is None:
            return 0, 1
        if not (isinstance(shard, tuple) and len(shard) == 2):
            raise ValueError(f"expected shard=(i, k) with 0 <= i < k, got {shard!r}")
        i, k = shard
        if isinstance(i, bool) or isinstance(k, bool):
            raise ValueError(f"expected shard=(i, k) with 0 <= i < k, got {shard!r}")
        order.positions_of_worker(self.n, i, k)  # checks 0 <= i < k
        if self.n < k:
            idle = f"readers {self.n}..{k - 1}" if self.n < k - 1 else f"reader {k - 1}"
            warnings.warn(
                f"shard={shard!r}: the dataset at {path} has {self.n} element(s) for {k} "
                f"readers, so {idle} of {k} read nothing",
                IdleReaderWarning,
                stacklevel=5,  # the caller of superserial.load
            )
        return i, k

    def _read(
        self, positions: np.ndarray, pass_number: np.int64
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The records at ``positions`` of pass ``pass_number``'s order, packed.

        A pure function of its arguments (the files of a committed dataset do
        not change), which is what lets the graph declare it stateless.

        Returns:
            A buffer (a 0-d object array holding bytes) and the start and
            length of each record in it (see ``RecordReader.read_packed``):
            one string to hand to TensorFlow, not one per record.
        """
        if _EXITING.is_set():
            raise RuntimeError("the interpreter is exiting: no more shuffled reads")
        epoch = (self.epoch + int(pass_number)) % _U64
        if self._groups is not None and self._by_window and len(positions):
            data, starts, lengths, _ = self._groups.read(positions, epoch)
        else:
            indices = self._indices(positions, epoch, self._window)
            data, starts, lengths = self._reader.read_packed(indices)
        buffer = np.empty((), dtype=object)
        buffer[()] = data
        return buffer, starts, lengths

    def _indices(
        self, positions: np.ndarray, epoch: int, window: int = _ORDER_WINDOW
    ) -> np.ndarray:
        """``order.indices_at(positions, ..., self.window)`` for consecutive positions of this reader.

        Computed ``window`` positions at a time (those of the reader's range
        from a multiple of ``window`` on) and kept, so that the chunks of one
        window share one computation.
        """
        if not len(positions):
            return np.zeros(0, dtype=np.int64)
        first, last = ((int(positions[i]) - self._start) // self._step for i in (0, -1))
        w = first // window
        if last // window != w or last - first + 1 != len(positions):
            return order.indices_at(positions, self.n, self.seed, epoch, self.window)
        key = (epoch, window, w)
        with self._order_lock:
            perm = self._order.get(key)
        if perm is None:
            lo, hi = w * window, min((w + 1) * window, self.count)
            wanted = self._start + np.arange(lo, hi, dtype=np.int64) * self._step
            perm = order.indices_at(wanted, self.n, self.seed, epoch, self.window)
            with self._order_lock:
                self._order[key] = perm
                while len(self._order) > _ORDER_KEPT:
                    del self._order[next(iter(self._order))]  # the oldest
        return perm[first - w * window : last - w * window + 1]

    def batches(
        self, chunk: int, *, drop_remainder: bool = False, deterministic: bool = True
    ) -> tf.data.Dataset:
        """The records as tf.string vectors of ``chunk`` consecutive positions (the last may be short).

        Args:
            chunk: Positions per vector (one Python call each).
            drop_remainder: Drop a last vector of fewer than ``chunk``.
            deterministic: As in :func:`superserial.load`.
        """
        start, stop, step = self._start, self.n, self._step
        # Windows of whole chunks: a chunk's order is never split between two.
        self._window = chunk * max(1, _ORDER_WINDOW // chunk)
        if self.window is not None:
            group = self._unit[0]
            # Groups no larger than a chunk's span are read whole by the
            # chunks that span them (the ends by two): no need to keep them.
            self._by_window = group > chunk * self._step
        read = self._read

        # No autograph: these functions have no Python control flow on
        # tensors, and converting them is most of the cost of building the
        # pipeline, paid on every load.
        plain = tf.autograph.experimental.do_not_convert

        @plain
        def records(positions: tf.Tensor, pass_number: tf.Tensor) -> tf.Tensor:
            # stateful=False: the function is pure (see _read); a stateful
            # op in a map would make TF warn at every element under symbolic
            # checkpointing, and refuse or warn when saving the iterator.
            buffer, starts, lengths = tf.numpy_function(
                read, [positions, pass_number], (tf.string, tf.int64, tf.int64), stateful=False
            )
            records = tf.strings.substr(buffer, starts, lengths)
            return tf.ensure_shape(records, [chunk if drop_remainder else None])

        @plain
        def one_pass(pass_number: tf.Tensor) -> tf.data.Dataset:
            positions = tf.data.Dataset.range(start, stop, step)
            return positions.batch(chunk, drop_remainder=drop_remainder).map(
                plain(lambda p: records(p, pass_number)),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=deterministic,
            )

        if self.n > 1:
            passes = pass_tokens().map(
                plain(
                    lambda t: tf.ensure_shape(
                        tf.numpy_function(pass_of, [t], tf.int64, stateful=False), []
                    )
                )
            )
        else:
            # Every epoch has the identity order: no pass numbers needed.
            passes = pass_tokens().map(plain(lambda t: tf.constant(0, tf.int64)))
        ds = passes.flat_map(one_pass)
        options = tf.data.Options()
        # Checkpoints hold positions, not buffered records (see the module doc).
        options.experimental_symbolic_checkpoint = True
        return ds.with_options(options)

"""The global shuffled order as a PyTorch sampler, resumable mid-epoch.

    from torchdata.stateful_dataloader import StatefulDataLoader
    from superserial.torch import MapDataset, Sampler, collate

    ds = MapDataset("/data/digits")
    sampler = Sampler(len(ds), seed=1234)      # ranks from torch.distributed
    loader = StatefulDataLoader(ds, sampler=sampler, batch_size=256,
                                num_workers=4, collate_fn=collate)
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        for batch in loader: ...               # loader.state_dict() is a checkpoint

:class:`Sampler` yields the dataset indices of one rank's positions of
:func:`superserial.read.order.permutation` ``(n, seed, epoch)``: rank ``r`` of
``k`` takes positions ``r, r + k, r + 2k, ...``, so the ranks together read
the same global order whatever their number, and it is the order
``superserial.load(path, shuffle=True, seed=seed, epoch=epoch)`` and
``superserial.grain.dataset`` give. With ``n`` not a multiple of ``k`` the
first ``n % k`` ranks get one index more than the others (nothing is padded
or dropped, unlike ``DistributedSampler``): a training loop that needs equal
step counts per rank must stop at the smallest rank's length itself.

The indices are computed a chunk of positions at a time, never the whole
order. The state (:meth:`Sampler.state_dict`) is the epoch and the count of
indices the current iteration has handed out, so ``StatefulDataLoader``
(``torchdata``), which takes the sampler's state when it hands each batch's
indices to a worker and keeps it with the batch until the batch is yielded,
resumes exactly: nothing repeated or skipped, with any ``num_workers``.

This module does not import TensorFlow.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler as _TorchSampler

from superserial.integrations.torch.windowed import MARK, Plan, WindowedIndex
from superserial.read.order import MAX_N, check_seed, check_window, indices_at

__all__ = ["Sampler"]

# Positions computed per call of indices_at: large enough to amortize its
# ~150 us fixed cost, small enough that the first index comes at once.
_CHUNK = 4096
_STATE_KEYS = ("n", "seed", "shuffle", "shuffle_window", "num_replicas", "rank", "epoch", "yielded")
# The arguments a state must share with the sampler it is loaded into.
_SAME = ("n", "seed", "shuffle", "shuffle_window", "num_replicas", "rank")


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected {what} to be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(
            f"expected {what} to be an integer, got {type(value).__name__} {value!r}"
        ) from None


class Sampler(_TorchSampler[int]):
    """This rank's indices of the global shuffled order of ``n`` elements.

    Args:
        n: The number of elements (``len`` of the map-style dataset).
        seed: The order's seed, an integer in ``[0, 2**64)``. Required, and
            the same on every rank: a seed drawn per process would give
            each rank another order, and the ranks would no longer split
            one.
        shuffle: False yields the positions themselves (the identity order),
            split among ranks the same way.
        shuffle_window: None: the global order. An integer ``W``: the
            windowed order ``permutation(n, seed, epoch, window=W)``, whose
            windows of about ``W`` positions read runs of consecutive
            records (``docs/shuffle.md``). One index in eight is a
            :class:`~superserial.integrations.torch.windowed.WindowedIndex`,
            an int that carries its place in the order, so that ``MapDataset``
            reads their batches a group at a time.
        num_replicas: The number of ranks. Default: the world size of
            ``torch.distributed`` if it is initialized, else 1.
        rank: This rank. Default: the rank of ``torch.distributed`` if it is
            initialized, else 0.

    Attributes:
        n, seed, shuffle, shuffle_window, num_replicas, rank: As given (or found).
        epoch: The epoch of the next iteration (:meth:`set_epoch`).

    Raises:
        ValueError: ``n`` is not an integer in ``[0, 2**62]``, ``seed`` not an
            integer in ``[0, 2**64)``, ``shuffle_window`` not None nor a
            positive integer (or given with ``shuffle=False``), or not
            ``0 <= rank < num_replicas``.
    """

    def __init__(
        self,
        n: int,
        *,
        seed: int,
        shuffle: bool = True,
        shuffle_window: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        n = _whole(n, "n")
        if not 0 <= n <= MAX_N:
            raise ValueError(f"expected n to be an integer in [0, 2**62], got {n}")
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if initialized else 1
        if rank is None:
            rank = dist.get_rank() if initialized else 0
        num_replicas, rank = _whole(num_replicas, "num_replicas"), _whole(rank, "rank")
        if not 0 <= rank < num_replicas:
            raise ValueError(
                f"expected 0 <= rank < num_replicas, got rank={rank} num_replicas={num_replicas}"
            )
        self.n, self.seed, self.shuffle = n, check_seed(seed), bool(shuffle)
        self.shuffle_window = check_window(shuffle_window)
        if self.shuffle_window is not None and not self.shuffle:
            raise ValueError(
                f"expected shuffle_window=None with shuffle=False (the saved order), "
                f"got shuffle_window={self.shuffle_window}"
            )
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        # The latest iteration: its epoch (None before the first) and the
        # indices it handed out. The state is of it, not of self.epoch, which
        # set_epoch may already have moved on.
        self._iter_epoch: int | None = None
        self._yielded = 0
        self._resume: tuple[int, int] | None = None  # (epoch, yielded) from load_state_dict

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next iteration: its order is ``permutation(n, seed, epoch)``.

        Call it before each epoch, on every rank, as for ``DistributedSampler``.

        Raises:
            ValueError: ``epoch`` is not an integer in ``[0, 2**64)``.
        """
        self.epoch = check_seed(epoch, "epoch")

    def __len__(self) -> int:
        """The number of indices of this rank per epoch: ``ceil((n - rank) / num_replicas)``."""
        return len(range(self.rank, self.n, self.num_replicas))

    def __iter__(self) -> Iterator[int]:
        """This rank's indices of the epoch, from where a loaded state left off.

        A state from :meth:`load_state_dict` applies to the first iteration
        after it, if that is of the state's epoch.

        Raises:
            ValueError: The loaded state is in the middle of another epoch
                than the sampler's (call :meth:`set_epoch` with the state's
                epoch to resume it).
        """
        # Not a generator function: a loaded state is taken up here, by the
        # iter() call, and not by the first next(). StatefulDataLoader calls
        # iter() once after loading and, when the state's epoch was finished,
        # again for the next epoch, which must then start afresh.
        start, resume, self._resume = 0, self._resume, None
        if resume is not None:
            epoch, yielded = resume
            if epoch == self.epoch:
                start = yielded
            elif yielded < len(self):
                raise ValueError(
                    f"expected the sampler to resume epoch {epoch} of the state loaded into it "
                    f"({yielded} of {len(self)} indices handed out), got epoch {self.epoch}: "
                    f"call set_epoch({epoch}) before iterating to resume it"
                )
            # A finished epoch's state only says that the next epoch starts afresh.
        self._iter_epoch, self._yielded = self.epoch, start
        return self._indices(start)

    def _indices(self, start: int) -> Iterator[int]:
        n, k, rank = self.n, self.num_replicas, self.rank
        seed, epoch, window = self.seed, self.epoch, self.shuffle_window
        stop = len(self)
        # A windowed order's indices say where they are, for MapDataset to read by group.
        plan = None if window is None else Plan(n, seed, window, epoch, k, rank)
        for lo in range(start, stop, _CHUNK):
            hi = min(lo + _CHUNK, stop)
            positions = np.arange(rank + lo * k, rank + hi * k, k, dtype=np.int64)
            chunk = indices_at(positions, n, seed, epoch, window) if self.shuffle else positions
            values = chunk.tolist()
            if plan is not None:
                # One index in MARK carries its place (MapDataset counts on from it):
                # an object per index cost the DataLoader's process more than the reads.
                first = -lo % MARK
                for j in range(first, len(values), MARK):
                    values[j] = WindowedIndex(values[j], plan, lo + j)
            for index in values:
                # Counted before it is handed out: a state taken after next()
                # returns includes this index.
                self._yielded += 1
                yield index

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the order: the latest iteration's epoch and indices handed out.

        Before the first iteration, the epoch set and none. Also the sampler's arguments, which :meth:`load_state_dict` checks.
        ``StatefulDataLoader`` takes this state as it hands out each batch's
        indices and pairs it with that batch, so its own ``state_dict()`` is
        exact; taken directly from a sampler under a plain ``DataLoader``
        with workers, it runs ahead of the batches consumed by the batches
        the workers prefetch.
        """
        return {
            "n": self.n,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "epoch": self.epoch if self._iter_epoch is None else self._iter_epoch,
            "yielded": self._yielded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next iteration continue from ``state`` (from :meth:`state_dict`).

        The next iteration, if it is of the state's epoch, starts after the
        indices the state counts as handed out (none left if that epoch was
        finished). :meth:`set_epoch` decides the epoch, not the state: after
        a finished epoch's state, an iteration of another epoch starts that
        epoch afresh; in the middle of an epoch, iterating another epoch
        raises ``ValueError``.

        Raises:
            ValueError: ``state`` is not a state of a sampler of the same
                ``n``, ``seed``, ``shuffle``, ``shuffle_window``,
                ``num_replicas`` and ``rank``.
        """
        if isinstance(state, dict) and "shuffle_window" not in state:
            # A state from before windowed orders: of the global order.
            state = {**state, "shuffle_window": None}
        if not isinstance(state, dict) or set(state) != set(_STATE_KEYS):
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"expected a Sampler state with keys {list(_STATE_KEYS)}, got {found}")
        mine = self.state_dict()
        for key in _SAME:
            if state[key] != mine[key]:
                raise ValueError(
                    f"expected a state of a Sampler with {key}={mine[key]!r} (as this one), "
                    f"got {key}={state[key]!r}: resuming with another {key} would repeat and "
                    "skip elements"
                )
        epoch = check_seed(state["epoch"], "the state's epoch")
        yielded = _whole(state["yielded"], "the state's yielded")
        if not 0 <= yielded <= len(self):
            raise ValueError(
                f"expected the state's yielded in [0, {len(self)}] (this rank's indices per "
                f"epoch), got {yielded}"
            )
        self._resume = (epoch, yielded)

    def __repr__(self) -> str:
        return (
            f"Sampler(n={self.n}, seed={self.seed}, shuffle={self.shuffle}, "
            f"shuffle_window={self.shuffle_window}, "
            f"num_replicas={self.num_replicas}, rank={self.rank}, epoch={self.epoch})"
        )

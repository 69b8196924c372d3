"""Lists of tensors from DataLoader workers travel as views of one storage, values unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from superserial.integrations.torch.share import TensorRun, one_storage

DTYPES = [torch.uint32, torch.uint64, torch.int32, torch.bfloat16, torch.bool, torch.complex128]


def _items(dtype: torch.dtype) -> list[torch.Tensor]:
    """Tensors of one dtype: a scalar, empty, not contiguous, odd sizes."""
    return [
        torch.tensor(1).to(dtype),
        torch.zeros(0, 2).to(dtype),
        torch.arange(10).reshape(5, 2)[:, 1].to(dtype),
        torch.tensor([1, 0, 1]).to(dtype),
        torch.ones(2, 3).to(dtype),
    ]


class _Lists(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, lists: list[list[torch.Tensor]]) -> None:
        self.lists = lists

    def __iter__(self) -> Any:
        for items in self.lists:
            yield one_storage(items)


def _key(x: torch.Tensor) -> tuple[Any, ...]:
    raw = x.contiguous().view(-1).view(torch.uint8).tolist() if x.numel() else []
    return (x.dtype, tuple(x.shape), raw)


# All empty, or of several dtypes (which cannot share aligned views): left as they are.
ALONE = [
    [torch.zeros(0), torch.zeros(0, 3)],
    [torch.tensor([1], dtype=torch.uint8), torch.tensor([2.0], dtype=torch.float64)],
]


def test_worker_lists_share_one_storage() -> None:
    lists = [_items(dtype) for dtype in DTYPES] + ALONE
    got = list(DataLoader(_Lists(lists), batch_size=None, num_workers=1))
    assert len(got) == len(lists)
    for out, items in zip(got, lists, strict=True):
        assert [_key(x) for x in out] == [_key(x) for x in items], items[0].dtype
    for out in got[: len(DTYPES)]:  # one storage each
        assert len({x.untyped_storage().data_ptr() for x in out if x.numel()}) == 1, out[0].dtype


@pytest.mark.parametrize("items", [_items(torch.int32), *ALONE])
def test_lists_in_main_process_untouched(items: list[torch.Tensor]) -> None:
    assert all(a is b for a, b in zip(one_storage(items), items, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_run_pickles_as_one_tensor_and_unpickles_as_a_plain_list(dtype: torch.dtype) -> None:
    import copy
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # (registers the shared-memory reductions)

    items = [x for _ in range(200) for x in _items(dtype)]
    run = TensorRun.cut(
        torch.cat([x.reshape(-1) for x in items]),
        [x.numel() for x in items],
        [tuple(x.shape) for x in items],
    )
    assert [_key(x) for x in run] == [_key(x) for x in items]
    assert type(copy.copy(run)) is TensorRun  # DataLoader's default_convert copies it
    data = bytes(ForkingPickler.dumps(run))  # as DataLoader workers send it
    back = pickle.loads(data)
    assert type(back) is list and [_key(x) for x in back] == [_key(x) for x in items]
    assert len({x.untyped_storage().data_ptr() for x in back if x.numel()}) == 1
    # One tensor and the sizes, not a tensor per item.
    assert len(data) < len(bytes(ForkingPickler.dumps(list(run)))) / 4

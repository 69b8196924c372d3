"""Reused shared-memory slots of DataLoader workers (torch_share) and MapDataset's batch decode."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import superserial  # noqa: E402
import superserial.numpy as ssnp  # noqa: E402
from superserial.integrations.torch import share as torch_share  # noqa: E402
from superserial.integrations.torch.collate import Elements  # noqa: E402
from superserial.torch import MapDataset, TorchDataset, collate, collate_padded, keep  # noqa: E402

COUNT = 48
BATCH = 2  # 24 batches: more than a worker's MAX_SLOTS


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> dict[str, Any]:
    import tensorflow as tf

    assert COUNT // BATCH > torch_share.MAX_SLOTS
    rng = np.random.default_rng(3)
    cols = {
        "img": rng.integers(0, 256, (COUNT, 4, 4), dtype=np.uint8),
        "x": rng.standard_normal((COUNT, 3)).astype(np.float32),
        "label": np.arange(COUNT, dtype=np.int64),
    }
    root = tmp_path_factory.mktemp("pool")
    fixed = str(root / "fixed")
    superserial.save(tf.data.Dataset.from_tensor_slices(cols), fixed)
    tokens = tf.ragged.constant([[i] * (i % 4) for i in range(COUNT)], dtype=tf.int32)
    mixed = str(root / "mixed")
    superserial.save(
        tf.data.Dataset.from_tensor_slices({"tokens": tokens, "label": cols["label"]}), mixed
    )
    return {"fixed": fixed, "mixed": mixed, **cols}


def _loader(path: str, workers: int = 2, **kw: Any) -> Any:
    return torch.utils.data.DataLoader(
        TorchDataset(path, batch_size=BATCH), batch_size=None, num_workers=workers, **kw
    )


def _check(data: dict[str, Any], batch: Any, key: str = "img") -> None:
    labels = batch["label"].numpy()
    np.testing.assert_array_equal(batch[key].numpy(), data[key][labels])


@pytest.mark.timeout(180)
def test_slots_are_reused_and_every_batch_is_exact(data: dict[str, Any]) -> None:
    before = set(torch_share._MAPPED)
    seen = []
    for b in _loader(data["fixed"]):  # each batch dropped before the next
        _check(data, b)
        _check(data, b, "x")
        seen += b["label"].tolist()
    assert sorted(seen) == list(range(COUNT))
    mapped = {t: len(v) for t, v in torch_share._MAPPED.items() if t not in before}
    # Two workers, 12 batches each, in a handful of slots each.
    assert len(mapped) == 2 and max(mapped.values()) < COUNT // BATCH // 2


@pytest.mark.timeout(180)
def test_batches_a_consumer_holds_are_not_overwritten(data: dict[str, Any]) -> None:
    # All held (more than the slots: the rest come as torch sends them), then
    # parts held: a view, a slice, a .numpy() array, each keeping its batch's slot.
    held = list(_loader(data["fixed"], persistent_workers=True))
    views, arrays = [], []
    loader = _loader(data["fixed"], persistent_workers=True)
    for _ in range(2):
        for i, b in enumerate(loader):
            if i % 3 == 0:
                views.append((b["label"].clone(), b["img"][1:], b["x"].view(-1)))
            elif i % 3 == 1:
                arrays.append((b["label"].numpy(), b["img"].numpy()))
    for b in held:
        _check(data, b)
    for labels, img_tail, x_flat in views:
        np.testing.assert_array_equal(img_tail.numpy(), data["img"][labels.numpy()][1:])
        np.testing.assert_array_equal(x_flat.numpy(), data["x"][labels.numpy()].reshape(-1))
    for labels, img in arrays:
        np.testing.assert_array_equal(img, data["img"][labels])
    assert len(views) + len(arrays) > torch_share.MAX_SLOTS


@pytest.mark.timeout(180)
def test_tuples_with_keep_and_mixed_leaves_come_exact(data: dict[str, Any]) -> None:
    batches = list(_loader(data["mixed"]))
    got = {int(lab): t for b in batches for lab, t in zip(b["label"], b["tokens"], strict=True)}
    assert sorted(got) == list(range(COUNT))
    assert all(t.tolist() == [i] * (i % 4) for i, t in got.items())


def test_a_batch_changed_in_the_worker_sends_its_new_values(data: dict[str, Any]) -> None:
    class Scaled(TorchDataset):
        def __iter__(self) -> Any:
            for b in super().__iter__():
                b["img"] = b["img"].float() / 255  # a new tensor, not in the slot
                b["x"].mul_(2)  # in place, in the slot
                yield b

    loader = torch.utils.data.DataLoader(
        Scaled(data["fixed"], batch_size=BATCH), batch_size=None, num_workers=1, collate_fn=keep
    )
    for b in loader:
        labels = b["label"].numpy()
        assert b["img"].dtype == torch.float32
        np.testing.assert_allclose(b["img"].numpy(), data["img"][labels] / 255, rtol=1e-6)
        np.testing.assert_array_equal(b["x"].numpy(), data["x"][labels] * 2)


def test_map_dataset_collate_hands_on_the_decoded_batch(data: dict[str, Any]) -> None:
    md = MapDataset(data["mixed"])
    idx = [5, 1, 1, 9, 30]
    got = md.__getitems__(idx)
    assert isinstance(got, Elements) and len(got) == 5
    batch = collate(got)
    assert batch is got.batch
    # The same as the elements read one by one and collated.
    one_by_one = collate([md[i] for i in idx])
    assert torch.equal(batch["label"], one_by_one["label"])
    assert [t.tolist() for t in batch["tokens"]] == [t.tolist() for t in one_by_one["tokens"]]
    # collate_padded needs the elements: the same values as one by one.
    padded = collate_padded(0)(md.__getitems__(idx))["tokens"]
    assert torch.equal(padded.values, collate_padded(0)([md[i] for i in idx])["tokens"].values)


def test_map_dataset_elements_looked_at_or_changed_are_collated_as_they_are(
    data: dict[str, Any],
) -> None:
    md = MapDataset(data["fixed"])
    got = md.__getitems__([3, 4, 7])
    assert [int(e["label"]) for e in got] == [3, 4, 7]  # looked at: filled
    got[1]["label"] = torch.tensor(99)
    got.append(md[0])
    assert collate(got)["label"].tolist() == [3, 99, 7, 0]
    np.testing.assert_array_equal(collate(got)["img"][0].numpy(), data["img"][3])
    # torch's default_collate sees plain elements too.
    default = torch.utils.data.default_collate(md.__getitems__([2, 8]))
    assert default["label"].tolist() == [2, 8]


def test_map_dataset_of_one_leaf_stacks_with_torch(tmp_path: Any) -> None:
    import tensorflow as tf

    p = str(tmp_path / "bare")
    x = np.arange(12, dtype=np.int16).reshape(6, 2)
    superserial.save(tf.data.Dataset.from_tensor_slices(x), p)
    got = MapDataset(p).__getitems__([4, 0])
    # C code reads a list's items directly: a one-leaf batch's list is filled at once.
    assert torch.equal(torch.stack(got), torch.from_numpy(x[[4, 0]]))


@pytest.mark.timeout(180)
def test_map_dataset_in_workers_matches_get_batch(data: dict[str, Any]) -> None:
    md = MapDataset(data["fixed"])
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(range(COUNT), generator=torch.Generator().manual_seed(0)),
        BATCH,
        drop_last=False,
    )
    before = set(torch_share._MAPPED)
    loader = torch.utils.data.DataLoader(
        md, batch_sampler=sampler, num_workers=2, collate_fn=collate
    )
    ref = ssnp.load(data["fixed"])
    n = 0
    for b in loader:
        want = ref.get_batch(b["label"].tolist())
        for k in ("img", "x", "label"):
            np.testing.assert_array_equal(b[k].numpy(), want[k])
        n += len(b["label"])
    assert n == COUNT
    # Slots reused there too: nothing in the worker holds a batch after it is sent.
    mapped = [len(v) for t, v in torch_share._MAPPED.items() if t not in before]
    assert len(mapped) == 2 and max(mapped) < COUNT // BATCH // 2


def test_named_tuple_batches_still_travel(tmp_path: Any) -> None:
    # Only dicts and plain tuples use slots: anything else pickles as torch sends it.
    Pair = collections.namedtuple("Pair", ["a", "b"])
    arrays: list[np.ndarray] = []
    assert torch_share._strip(Pair(np.zeros(2), np.ones(2)), arrays) is not None
    assert torch_share.send(Pair(1, 2), lambda x: ("converted", x)) == ("converted", Pair(1, 2))


def test_map_dataset_batches_are_freed_without_the_cycle_collector(data: dict[str, Any]) -> None:
    # In a worker a batch held on by a reference cycle keeps its slot until gc runs.
    import gc
    import weakref

    md = MapDataset(data["mixed"])
    gc.disable()
    try:
        got = md.__getitems__([1, 2, 3])
        batch = collate(got)
        label = weakref.ref(batch["label"])
        del got, batch
        assert label() is None
    finally:
        gc.enable()

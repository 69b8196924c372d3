"""Concurrency between real processes: saves racing for one path, many readers,
and a reader while the dataset is replaced.

Guarantees tested (local Linux filesystem):

* two saves to one path: one wins; the other fails (``DatasetLockedError``
  while the winner runs, ``DatasetExistsError`` after) or, with
  ``overwrite=True``, runs after it; the result is one complete dataset;
* readers never see a mix of an old and a new dataset: a ``load`` sees one
  complete dataset; an iteration that is running when an overwrite commits
  either finishes on the shards it already opened or fails with
  ``NotFoundError`` at its next shard, never reading a shard of the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial

CHILD = r"""
import hashlib, json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
mode, path = sys.argv[1], sys.argv[2]
# A reader given "numpy" reads through the TF-free numpy reader: its interpreter starts in
# a fraction of a second, where one that imports TensorFlow takes seconds of CPU.
if mode == "read" and sys.argv[4] == "numpy":
    import superserial.numpy as ssnp
else:
    import tensorflow as tf, superserial

def source(start, n):
    return tf.data.Dataset.range(start, start + n).map(lambda i: (i, tf.strings.as_string(i)))

def tf_batches(ds):
    return ((a.numpy(), b.numpy()) for a, b in ds)

def digest(batches):
    h = hashlib.sha256()
    n = 0
    for a, b in batches:
        for x, s in zip(a, b.tolist()):
            h.update(x.tobytes() + s + b"|")
        n += int(a.shape[0])
    return n, h.hexdigest()

if mode == "save":
    start, n, overwrite, go = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
    ds = source(start, n)
    open(go + ".ready-%d" % os.getpid(), "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        superserial.save(ds, path, num_shards=20, overwrite=overwrite)
        print("RESULT SAVED", flush=True)
    except superserial.SuperserialError as e:
        print("RESULT " + type(e).__name__ + " " + str(e).replace("\n", " "), flush=True)
elif mode == "read":
    go = sys.argv[3]
    open(go + ".ready-%d" % os.getpid(), "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    if sys.argv[4] == "numpy":
        n, d = digest(ssnp.load(path).batches(1000))
    else:
        n, d = digest(tf_batches(superserial.load(path, batch_size=1000)))
    print("RESULT " + json.dumps([n, d]), flush=True)
elif mode == "read_loop":
    stop = sys.argv[3]
    out = []
    while not os.path.exists(stop):
        try:
            out.append(digest(tf_batches(superserial.load(path, batch_size=500))))
            if len(out) == 1:
                open(stop + ".first", "w").close()
        except (tf.errors.NotFoundError, superserial.CorruptDataError, superserial.DatasetNotFoundError) as e:
            out.append(["error", type(e).__name__])
    print("RESULT " + json.dumps(out), flush=True)
"""


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = proc.communicate(timeout=timeout)
    lines = [ln[len("RESULT ") :] for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"child printed no result; stderr: {err[-3000:]}"
    return lines[-1]


def _wait_ready(go: str, n: int, procs: list[subprocess.Popen[str]], timeout: float = 120) -> None:
    """Waits until ``n`` children are ready (TensorFlow imported), then lets them go."""
    parent = os.path.dirname(go)
    end = time.monotonic() + timeout
    while sum(f.startswith(os.path.basename(go) + ".ready-") for f in os.listdir(parent)) < n:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"child ended early: {p.communicate()[1][-3000:]}")
        assert time.monotonic() < end, "children not ready in time"
        time.sleep(0.01)
    open(go, "w").close()


def _digest(start: int, n: int) -> list[Any]:
    h = hashlib.sha256()
    for x in np.arange(start, start + n, dtype=np.int64):
        h.update(x.tobytes() + str(int(x)).encode() + b"|")
    return [n, h.hexdigest()]


def _load_digest(path: str) -> list[Any]:
    h = hashlib.sha256()
    n = 0
    for a, b in superserial.load(path, batch_size=1000):
        for x, s in zip(a.numpy(), b.numpy().tolist(), strict=True):
            h.update(x.tobytes() + s + b"|")
        n += int(a.shape[0])
    return [n, h.hexdigest()]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("overwrite", [False, True], ids=["fresh", "overwrite"])
def test_two_saves_to_one_path(overwrite, tmp_path):
    path = str(tmp_path / "ds")
    if overwrite:
        superserial.save(tf.data.Dataset.range(3).map(lambda i: (i, tf.strings.as_string(i))), path)
    go = str(tmp_path / "go")
    a = _start("save", path, 0, 20000, int(overwrite), go)
    b = _start("save", path, 10**6, 20000, int(overwrite), go)
    _wait_ready(go, 2, [a, b])
    ra, rb = _result(a), _result(b)
    results = sorted([ra.split(" ")[0], rb.split(" ")[0]])
    got = _load_digest(path)
    if overwrite:
        # Either one was refused by the lock, or they ran one after the other.
        assert results in (["DatasetLockedError", "SAVED"], ["SAVED", "SAVED"]), (ra, rb)
    else:
        assert results in (["DatasetLockedError", "SAVED"], ["DatasetExistsError", "SAVED"]), (
            ra,
            rb,
        )
    winner = (
        0
        if ra == "SAVED" and (rb != "SAVED")
        else 10**6
        if rb == "SAVED" and ra != "SAVED"
        else None
    )
    if winner is None:
        assert got in (_digest(0, 20000), _digest(10**6, 20000))
    else:
        assert got == _digest(winner, 20000)
    assert sorted(os.listdir(tmp_path)) == [
        "ds",
        "go",
        *sorted(f for f in os.listdir(tmp_path) if ".ready-" in f),
    ]
    print(f"CENSUS two savers ({'overwrite' if overwrite else 'fresh'}): {results}")


@pytest.mark.timeout(240)
def test_eight_readers_read_identical_data(tmp_path):
    path = str(tmp_path / "ds")
    superserial.save(
        tf.data.Dataset.range(30000).map(lambda i: (i, tf.strings.as_string(i))), path, num_shards=7
    )
    go = str(tmp_path / "go")
    # Two read through load (TensorFlow), six through the TF-free numpy reader: eight
    # processes reading at once, both readers among them, and six fewer TensorFlow imports.
    procs = [_start("read", path, go, "tf" if k < 2 else "numpy") for k in range(8)]
    _wait_ready(go, 8, procs, timeout=200)
    results = [json.loads(_result(p, timeout=200)) for p in procs]
    assert results == [_digest(0, 30000)] * 8


def test_reader_mid_iteration_never_reads_the_new_dataset(tmp_path):
    """In-process and deterministic: the overwrite commits between two shards of a read."""
    path = str(tmp_path / "ds")
    old = tf.data.Dataset.range(40000).map(lambda i: (i, tf.strings.as_string(i)))
    new = tf.data.Dataset.range(10**6, 10**6 + 40000).map(lambda i: (i, tf.strings.as_string(i)))
    superserial.save(old, path, num_shards=20)
    it = iter(superserial.load(path))  # deterministic: shard by shard, opened lazily
    first = [int(next(it)[0]) for _ in range(3000)]  # into the second shard
    superserial.save(new, path, num_shards=20, overwrite=True)
    seen = []
    with pytest.raises(tf.errors.NotFoundError):
        for a, _ in it:
            seen.append(int(a))
    assert first + seen == list(range(len(first) + len(seen))), "read elements of the new dataset"
    assert len(first + seen) < 40000
    # A new load sees the new dataset, whole.
    assert [int(a) for a, _ in superserial.load(path)][:3] == [10**6, 10**6 + 1, 10**6 + 2]


@pytest.mark.timeout(240)
def test_overwrites_while_a_process_reads_in_a_loop(tmp_path):
    path = str(tmp_path / "ds")
    versions = [(0, 12000), (10**6, 12000)]
    src = [
        tf.data.Dataset.range(s, s + n).map(lambda i: (i, tf.strings.as_string(i)))
        for s, n in versions
    ]
    superserial.save(src[0], path, num_shards=12)
    stop = str(tmp_path / "stop")
    reader = _start("read_loop", path, stop)
    # Wait for the reader's first complete read (its TensorFlow import takes seconds on a
    # loaded machine), then overwrite back and forth.
    end = time.monotonic() + 120
    while not os.path.exists(stop + ".first"):
        if reader.poll() is not None:
            raise AssertionError(reader.communicate()[1][-3000:])
        assert time.monotonic() < end, "the reader never completed a read"
        time.sleep(0.05)
    swaps = 0
    deadline = time.monotonic() + 120
    while swaps < 10 and time.monotonic() < deadline:
        if reader.poll() is not None:
            raise AssertionError(reader.communicate()[1][-3000:])
        superserial.save(src[(swaps + 1) % 2], path, num_shards=12, overwrite=True)
        swaps += 1
        time.sleep(0.3)
    open(stop, "w").close()
    reads = json.loads(_result(reader))
    good = {tuple(_digest(s, n)) for s, n in versions}
    whole = [r for r in reads if r[0] != "error"]
    errors = [r for r in reads if r[0] == "error"]
    assert all(tuple(r) in good for r in whole), "a read saw a mix of two datasets"
    assert {e[1] for e in errors} <= {"NotFoundError", "CorruptDataError", "DatasetNotFoundError"}
    assert whole, "no read completed"
    print(
        f"CENSUS overwrite while reading: {swaps} overwrites, {len(reads)} reads: "
        f"{len(whole)} whole (old or new), {len(errors)} failed cleanly "
        f"({sorted({e[1] for e in errors})}), 0 mixed"
    )


def test_lock_held_refuses_a_save_and_spares_the_work_dir(tmp_path):
    """Deterministic: while a save's lock is held, another save fails at once and
    cleanup keeps the work directory; once released, both proceed."""
    from superserial.format.layout import LOCK_SUFFIX, PARTIAL_SUFFIX
    from superserial.write.local_commit import SaveLock

    path = str(tmp_path / "ds")
    partial = tmp_path / f".ds{PARTIAL_SUFFIX}"
    lock = SaveLock(path).acquire()
    try:
        partial.mkdir()
        with pytest.raises(superserial.DatasetLockedError, match="in progress"):
            superserial.save(tf.data.Dataset.range(3), path)
        assert superserial.cleanup(path) == []
        assert partial.exists()
    finally:
        lock.release()
    assert not (tmp_path / f".ds{LOCK_SUFFIX}").exists()
    assert superserial.cleanup(path) == [str(partial)]
    superserial.save(tf.data.Dataset.range(3), path)
    assert [int(x) for x in superserial.load(path)] == [0, 1, 2]
    assert sorted(os.listdir(tmp_path)) == ["ds"]

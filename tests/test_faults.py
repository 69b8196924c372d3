"""Faults during save: SIGKILL at random points, full disks, read-only places,
errors in the user's pipeline, and resuming an interrupted save.

After any of them, ``path`` holds either nothing or the complete previous
dataset, bit for bit, and no save can hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
from conftest import interrupt_after
from superserial.errors import ResumeError
from superserial.format.layout import LOCK_SUFFIX, PARTIAL_SUFFIX, PROGRESS_FILE

N = 60_000
SHARDS = 40

# The child saves N small elements in SHARDS shards; __PATH__ and __ARGS__ are filled in.
CHILD = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's Ctrl-C, whatever is inherited
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf, superserial
ds = tf.data.Dataset.range(__N__).map(lambda i: (i, tf.strings.as_string(i * 7)))
__SLOW__
superserial.save(ds, __PATH__, num_shards=__SHARDS__, __ARGS__)
print("SAVED", flush=True)
"""


def _source(n: int = N) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(lambda i: (i, tf.strings.as_string(i * 7)))


# With ``slow``, each element from the fourth shard on takes a millisecond more: the
# rest of the save takes about a minute, not about two seconds, so a signal the test
# sends once three shards are done always lands mid-save, however loaded the machine.
SLOW = f"""
# tf.data's own sleep, in C++: no Python called from tf.data's threads while the
# interrupted child exits (with a py_function here, one CI run's child had not
# exited 60 s after its KeyboardInterrupt).
from tensorflow.python.data.experimental.ops import testing
ds = ds.take(3 * {N // SHARDS}).concatenate(ds.skip(3 * {N // SHARDS}).apply(testing.sleep(1000)))
"""


def _child(path: str, args: str = "", *, slow: bool = False) -> subprocess.Popen[bytes]:
    code = (
        CHILD.replace("__N__", str(N))
        .replace("__SLOW__", SLOW if slow else "")
        .replace("__SHARDS__", str(SHARDS))
        .replace("__PATH__", repr(path))
        .replace("__ARGS__", args)
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _tree_digest(path: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def _check_equal_to_source(path: str, n: int = N) -> None:
    """The dataset at ``path`` holds exactly the source's elements, in order."""
    ids, strs = [], []
    for a, b in superserial.load(path, batch_size=8192):
        ids.append(a.numpy())
        strs.extend(b.numpy().tolist())
    ids_all = np.concatenate(ids) if ids else np.zeros([0], np.int64)
    np.testing.assert_array_equal(ids_all, np.arange(n))
    assert strs == [str(i * 7).encode() for i in range(n)]


def _wait_for(
    cond: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None
) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"child ended before {what}: {proc.communicate()[1].decode()[-2000:]}"
            )
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _siblings(path: str) -> list[str]:
    base = os.path.basename(path)
    return sorted(n for n in os.listdir(os.path.dirname(path)) if n.startswith(f".{base}."))


# ------------------------------------------------------------------- SIGKILL


def _shards_done(partial: str) -> int:
    try:
        with open(os.path.join(partial, PROGRESS_FILE)) as f:
            return len(json.load(f)["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("overwrite", [False, True], ids=["fresh", "overwrite"])
def test_sigkill_at_random_points_leaves_nothing_or_the_old_dataset(overwrite, tmp_path):
    """SIGKILL a saving child at random points: after k random shards, plus a random delay."""
    rng = random.Random(1234 + overwrite)
    path = str(tmp_path / "ds")
    partial = str(tmp_path / f".ds{PARTIAL_SUFFIX}")
    if overwrite:
        old = tf.data.Dataset.range(10).map(lambda i: (i, tf.strings.as_string(i)))
        superserial.save(old, path, num_shards=3)
        before = _tree_digest(path)
    kills = []
    for shards in (rng.randint(0, 5), rng.randint(10, SHARDS - 1)):
        delay = rng.uniform(0, 0.3)
        proc = _child(path, "overwrite=True" if overwrite else "")
        _wait_for(
            lambda s=shards: os.path.exists(partial) and _shards_done(partial) >= s,
            90,
            f"{shards} shards",
            proc,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills.append((shards, round(delay, 2), _shards_done(partial)))
        if overwrite:
            assert _tree_digest(path) == before, f"old dataset changed by a kill at {kills[-1]}"
            assert [int(a) for a, _ in superserial.load(path)] == list(range(10))
        else:
            assert not os.path.exists(path), f"{path} exists after a kill at {kills[-1]}"
            with pytest.raises(superserial.DatasetNotFoundError):
                superserial.load(path)
    # Leftovers are the work directory (and perhaps the lock file); cleanup removes them.
    assert set(_siblings(path)) <= {f".ds{PARTIAL_SUFFIX}", f".ds{LOCK_SUFFIX}"}, _siblings(path)
    removed = superserial.cleanup(path)
    assert partial in removed
    assert _siblings(path) == []
    if overwrite:
        assert _tree_digest(path) == before
    mode = "overwrite" if overwrite else "fresh"
    print(f"CENSUS sigkill {mode}: (after >= k shards, delay s, shards complete at kill) {kills}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", ["before_commit", "after_exchange"])
def test_sigkill_at_the_commit(point, tmp_path):
    """Kills at the two instants that matter: header written but not renamed, and
    new dataset swapped in but the old one not yet removed."""
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.range(5), path)
    before = _tree_digest(path)
    code = f"""
import os, signal
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf, superserial
from superserial.storage import fs
real = fs.exchange_or_rename
def hooked(new, path, **kw):
    if {point!r} == "before_commit":
        os.kill(os.getpid(), signal.SIGKILL)
    old = real(new, path, **kw)
    os.kill(os.getpid(), signal.SIGKILL)
fs.exchange_or_rename = hooked
superserial.save(tf.data.Dataset.range(100, 107), {path!r}, overwrite=True)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=100)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    got = [int(x) for x in superserial.load(path)]
    if point == "before_commit":
        assert _tree_digest(path) == before
        assert got == list(range(5))
    else:
        assert got == list(range(100, 107))
    assert f".ds{PARTIAL_SUFFIX}" in _siblings(
        path
    )  # the new work dir, or the swapped-out old dataset
    superserial.cleanup(path)
    assert _siblings(path) == []
    # The next save is not confused by what was left.
    superserial.save(tf.data.Dataset.range(3), path, overwrite=True)
    assert [int(x) for x in superserial.load(path)] == [0, 1, 2]


def test_cleanup_spares_live_processes_and_removes_dead_ones(tmp_path):
    path = str(tmp_path / "ds")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    leftover = tmp_path / f".ds.superserial-tmp-{dead_pid}-abcdef"
    live = tmp_path / f".ds.superserial-tmp-{os.getpid()}-abcdef"
    other = tmp_path / ".other.superserial-tmp-1-abcdef"
    for d in (leftover, live, other):
        d.mkdir()
        (d / "header.json").write_text("{}")
    assert superserial.cleanup(path) == [str(leftover)]
    assert live.exists() and other.exists() and not leftover.exists()


def test_load_ignores_leftovers(tmp_path):
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.range(4), path)
    (tmp_path / f".ds{PARTIAL_SUFFIX}").mkdir()
    (tmp_path / f".ds{PARTIAL_SUFFIX}" / "data-00000.tfrecord").write_bytes(b"junk")
    (tmp_path / ".ds.superserial-tmp-1-x").mkdir()
    assert [int(x) for x in superserial.load(path)] == [0, 1, 2, 3]


# -------------------------------------------------------- disk full, read-only


@pytest.fixture
def tiny_tmpfs(tmp_path: Any) -> Any:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def _big(n: int = 30_000) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(lambda i: tf.fill([16], i))


@pytest.mark.parametrize("overwrite", [False, True], ids=["fresh", "overwrite"])
def test_disk_full(overwrite, tiny_tmpfs):
    path = str(tiny_tmpfs / "ds")
    if overwrite:
        superserial.save(tf.data.Dataset.range(100), path)
        before = _tree_digest(path)
    with pytest.raises((OSError, tf.errors.OpError), match=r"No space left|space") as info:
        superserial.save(_big(), path, num_shards=3, overwrite=overwrite)
    assert str(tiny_tmpfs) in str(info.value)  # names the file that could not be written
    if overwrite:
        assert _tree_digest(path) == before
        assert [int(x) for x in superserial.load(path)] == list(range(100))
    else:
        assert not os.path.exists(path)
    assert _siblings(path) == []


def test_disk_full_while_writing_the_header(tiny_tmpfs, monkeypatch):
    """The last write (the header, from Python) fails: OSError, nothing left."""
    path = str(tiny_tmpfs / "ds")
    from superserial.tf import save

    real = save.fs.open_file

    def fill_then_open(p: str, mode: str = "rb") -> Any:
        if p.endswith("header.json"):
            filler = tiny_tmpfs / "filler"
            with open(filler, "wb") as f, pytest.raises(OSError):
                f.write(bytes(2 << 20))
        return real(p, mode)

    monkeypatch.setattr(save.fs, "open_file", fill_then_open)
    with pytest.raises(OSError, match="No space left"):
        superserial.save(tf.data.Dataset.range(10), path)
    assert not os.path.exists(path)
    assert _siblings(path) == []


@pytest.mark.timeout(150)
def test_file_size_limit(tmp_path):
    """RLIMIT_FSIZE in a child: writes fail with EFBIG; the error surfaces, nothing is left."""
    path = str(tmp_path / "ds")
    code = f"""
import os, resource, signal
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf, superserial
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
try:
    superserial.save(tf.data.Dataset.range(50000).map(lambda i: tf.fill([8], i)), {path!r}, num_shards=2)
except Exception as e:
    print("RAISED", type(e).__name__, e)
"""
    # A hang still fails, but not a busy machine: the child's TensorFlow import alone took
    # 60 s on a shared 2-core machine, and 50 s timed this test out there.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "RAISED" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "too large" in proc.stdout.lower() or "File too large" in proc.stdout, proc.stdout
    assert not os.path.exists(path)
    assert _siblings(path) == []


@pytest.fixture
def immutable_dir(tmp_path: Any) -> Any:
    d = tmp_path / "ro"
    d.mkdir()
    yield d
    subprocess.run(["chattr", "-i", str(d)], capture_output=True)


def _chattr_i(d: Any) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("no chattr here (root bypasses permission bits, so it is needed)")
    r = subprocess.run(["chattr", "+i", str(d)], capture_output=True)
    if r.returncode:
        pytest.skip(f"chattr +i not supported here: {r.stderr.decode().strip()}")


def test_read_only_parent(immutable_dir):
    path = str(immutable_dir / "ds")
    _chattr_i(immutable_dir)
    with pytest.raises(PermissionError, match="ds"):
        superserial.save(tf.data.Dataset.range(10), path)
    assert os.listdir(immutable_dir) == []


def test_read_only_parent_with_old_dataset(immutable_dir):
    path = str(immutable_dir / "ds")
    superserial.save(tf.data.Dataset.range(10), path)
    before = _tree_digest(path)
    _chattr_i(immutable_dir)
    with pytest.raises(PermissionError):
        superserial.save(tf.data.Dataset.range(20), path, overwrite=True)
    assert _tree_digest(path) == before
    assert os.listdir(immutable_dir) == ["ds"]


# -------------------------------------------------------------- source errors

SOURCE_ERRORS = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf, superserial
base = sys.argv[1]
out = {}

def gen():
    for i in range(5000):
        if i == 3001:
            raise RuntimeError("boom from the generator at 3001")
        yield np.int64(i)

def bad(i):
    if i == 2500:
        raise ValueError("boom from py_function at 2500")
    return i

def checked(i):
    op = tf.debugging.assert_less(i, tf.constant(4000, tf.int64), message="boom from an assert")
    with tf.control_dependencies([op] if op is not None else []):
        return tf.identity(i)

cases = {
    "generator": tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([], tf.int64)),
    "py_function": tf.data.Dataset.range(5000).map(
        lambda i: tf.ensure_shape(tf.py_function(bad, [i], tf.int64), [])
    ),
    "map_assert": tf.data.Dataset.range(5000).map(checked),
}
for name, ds in cases.items():
    path = os.path.join(base, name)
    try:
        superserial.save(ds, path, shard_size=1000)
        out[name] = "no error"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(90)
def test_errors_in_the_source_propagate_and_leave_no_dataset(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SOURCE_ERRORS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=80,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stdout + proc.stderr[-3000:]
    out = json.loads(line[0][len("RESULT ") :])
    assert "boom from the generator at 3001" in out["generator"], out
    assert "boom from py_function at 2500" in out["py_function"], out
    assert "boom from an assert" in out["map_assert"], out
    # No dataset and no lock; only the work directories that keep the complete shards.
    kept = sorted(f".{name}{PARTIAL_SUFFIX}" for name in out)
    assert sorted(os.listdir(tmp_path)) == kept, os.listdir(tmp_path)


def test_keyboard_interrupt_keeps_the_complete_shards_for_resume(tmp_path, caplog):
    """Ctrl-C in a default save (no resume=True): nothing at ``path``, the shards kept."""
    path = str(tmp_path / "ds")
    partial = str(tmp_path / f".ds{PARTIAL_SUFFIX}")
    progress = interrupt_after(3)

    with pytest.raises(KeyboardInterrupt):
        superserial.save(_big(5000), path, progress=progress, num_shards=10)
    assert not os.path.exists(path)  # nothing that looks like a dataset
    done = _shards_done(partial)
    assert 1 <= done < 10, done
    assert "resume=True" in caplog.text and partial in caplog.text
    assert _siblings(path) == [os.path.basename(partial)]  # no lock left
    first = os.stat(os.path.join(partial, "data-00000.tfrecord")).st_ino

    caplog.set_level("INFO", logger="superserial")
    header = superserial.save(_big(5000), path, num_shards=10, resume=True)
    assert f"after {done} complete shard(s)" in caplog.text
    assert os.stat(os.path.join(path, header.shards[0].file)).st_ino == first
    got = np.concatenate([b.numpy() for b in superserial.load(path, batch_size=5000)])
    np.testing.assert_array_equal(got, np.repeat(np.arange(5000), 16).reshape(5000, 16))
    assert _siblings(path) == []


def test_a_plain_save_warns_before_discarding_kept_shards(tmp_path, caplog):
    path = str(tmp_path / "ds")
    progress = interrupt_after(3)

    with pytest.raises(KeyboardInterrupt):
        superserial.save(_big(5000), path, progress=progress, num_shards=10)
    done = _shards_done(str(tmp_path / f".ds{PARTIAL_SUFFIX}"))
    assert done >= 1
    caplog.clear()
    superserial.save(_big(5000), path, num_shards=10)  # without resume: starts over
    assert f"discarding the {done} complete shard(s)" in caplog.text
    assert _siblings(path) == []
    assert len(superserial.load(path)) == 5000


# The child saves an endless from_generator dataset; the test stops it with a real SIGINT.
CTRL_C = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf, superserial
path, marker, mode = sys.argv[1:4]

def gen():
    for i in range(10**9):
        if i == 50:
            open(marker, "w").close()
        time.sleep(0.001)
        yield np.full([4], i, np.int64)

ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([4], tf.int64))
if mode == "save":
    superserial.save(ds, path)
else:  # a part, through Writer.write_dataset
    superserial.save(ds, path, shard_index=0, num_shards=1)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["save", "part"])
def test_ctrl_c_during_a_from_generator_save_exits_and_leaves_nothing(mode, tmp_path):
    # TensorFlow's from_generator iterator, destroyed at interpreter exit,
    # deadlocks; a KeyboardInterrupt's traceback used to keep it alive until then.
    path, marker = str(tmp_path / "ds"), str(tmp_path / "marker")
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C, path, marker, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: os.path.exists(marker), 150, "the generator to start", proc)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the process hung after SIGINT")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGINT, err.decode(errors="replace")[-3000:]
    assert b"KeyboardInterrupt" in err
    assert os.listdir(tmp_path) == ["marker"]  # no dataset, no work directory, no lock


# The same endless save, interrupted between batches, in the write loop (where a Ctrl-C
# lands while the loop writes): a KeyboardInterrupt raised by the progress callback.
CTRL_C_BETWEEN = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf, superserial
path, mode = sys.argv[1:3]

def gen():
    for i in range(10**9):
        time.sleep(0.001)
        yield np.full([4], i, np.int64)

calls = [0]

def progress(elements, size):
    calls[0] += 1
    if calls[0] == 3:
        raise KeyboardInterrupt

ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([4], tf.int64))
if mode == "save":
    superserial.save(ds, path, progress=progress)
else:  # a part, through Writer.write_dataset
    superserial.save(ds, path, shard_index=0, num_shards=1, progress=progress)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["save", "part"])
def test_ctrl_c_between_batches_of_a_from_generator_save_exits(mode, tmp_path):
    # The suspended source's iterator, kept by the traceback, was destroyed at
    # interpreter exit and deadlocked there: the process hung (the test above,
    # whose signal lands anywhere, failed so on a loaded CI).
    path = str(tmp_path / "ds")
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_BETWEEN, path, mode], capture_output=True, timeout=90
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr.decode(errors="replace")[-3000:]
    assert b"KeyboardInterrupt" in proc.stderr
    assert os.listdir(tmp_path) == []  # no dataset, no work directory, no lock


# -------------------------------------------------------------------- resume


@pytest.mark.timeout(150)
def test_resume_after_sigkill_continues_exactly(tmp_path, caplog):
    path = str(tmp_path / "ds")
    partial = str(tmp_path / f".ds{PARTIAL_SUFFIX}")

    def shards_done() -> int:
        return _shards_done(partial)

    proc = _child(path, "resume=True", slow=True)
    _wait_for(lambda: shards_done() >= 3, 90, "three complete shards", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = shards_done()
    assert 3 <= done < SHARDS, done
    first = os.stat(os.path.join(partial, "data-00000.tfrecord")).st_ino
    assert not os.path.exists(path)

    # Another dataset (here: another element spec) must not resume this save.
    other = _source().map(lambda a, b: (a, b, a))
    with pytest.raises(ResumeError, match="structure"):
        superserial.save(other, path, num_shards=SHARDS, resume=True)
    assert shards_done() == done  # refused without touching the work
    with pytest.raises(ResumeError, match="num_shards"):
        superserial.save(_source(), path, num_shards=SHARDS + 1, resume=True)

    caplog.set_level("INFO", logger="superserial")
    header = superserial.save(_source(), path, num_shards=SHARDS, resume=True)
    assert f"after {done} complete shard(s)" in caplog.text
    assert header.element_count == N and len(header.shards) == SHARDS
    # The completed shards were kept, not rewritten.
    assert os.stat(os.path.join(path, header.shards[0].file)).st_ino == first
    _check_equal_to_source(path)
    assert _siblings(path) == []
    print(f"CENSUS resume: killed after {done}/{SHARDS} shards, resumed to an exact copy")


@pytest.mark.timeout(150)
def test_ctrl_c_then_resume_continues_exactly(tmp_path, caplog):
    """A real SIGINT to a default save (no resume=True); the same call with resume=True finishes."""
    path = str(tmp_path / "ds")
    partial = str(tmp_path / f".ds{PARTIAL_SUFFIX}")
    proc = _child(path, slow=True)
    _wait_for(lambda: _shards_done(partial) >= 3, 90, "three complete shards", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err, err[-3000:]
    assert b"resume=True" in err, err[-3000:]  # the user is told how to continue
    done = _shards_done(partial)
    assert 3 <= done < SHARDS, done
    assert not os.path.exists(path)
    assert _siblings(path) == [os.path.basename(partial)]  # no lock left
    first = os.stat(os.path.join(partial, "data-00000.tfrecord")).st_ino

    caplog.set_level("INFO", logger="superserial")
    header = superserial.save(_source(), path, num_shards=SHARDS, resume=True)
    assert f"after {done} complete shard(s)" in caplog.text
    assert os.stat(os.path.join(path, header.shards[0].file)).st_ino == first
    _check_equal_to_source(path)
    assert _siblings(path) == []


def test_resume_with_nothing_to_resume_is_a_plain_save(tmp_path):
    path = str(tmp_path / "ds")
    superserial.save(_source(1000), path, num_shards=4, resume=True)
    _check_equal_to_source(path, 1000)


@pytest.mark.parametrize("first", [False, True], ids=["default", "resume"])
def test_an_error_keeps_completed_shards_and_resume_finishes(first, tmp_path):
    """An error keeps the completed shards, with or without resume=True; the retry finishes."""
    path = str(tmp_path / "ds")
    fail = {"on": True}

    def flaky(i: Any) -> Any:
        if fail["on"] and int(i) == 5000:
            raise OSError("transient read error at 5000")
        return i

    def make() -> tf.data.Dataset:
        ds = tf.data.Dataset.range(6000).map(lambda i: tf.py_function(flaky, [i], tf.int64))
        return ds.map(lambda i: tf.ensure_shape(i, []))

    # Batches of 1024 are encoded ahead: the error at 5000 comes after 4096 written.
    with pytest.raises(tf.errors.OpError, match="transient read error at 5000"):
        superserial.save(make(), path, num_shards=12, resume=first)
    assert not os.path.exists(path)
    with open(os.path.join(str(tmp_path / f".ds{PARTIAL_SUFFIX}"), PROGRESS_FILE)) as f:
        assert len(json.load(f)["shards"]) >= 1
    fail["on"] = False
    superserial.save(make(), path, num_shards=12, resume=True)
    got = np.concatenate([b.numpy() for b in superserial.load(path, batch_size=4096)])
    np.testing.assert_array_equal(got, np.arange(6000))


def test_plain_save_discards_an_interrupted_one(tmp_path):
    path = str(tmp_path / "ds")
    partial = tmp_path / f".ds{PARTIAL_SUFFIX}"
    partial.mkdir()
    (partial / "data-00000.tfrecord").write_bytes(b"stale")
    (partial / PROGRESS_FILE).write_text('{"fingerprint": {}, "shards": []}')
    superserial.save(_source(100), path, num_shards=2)
    _check_equal_to_source(path, 100)
    assert _siblings(path) == []


def test_resume_rewrites_a_damaged_completed_shard(tmp_path, caplog):
    path = str(tmp_path / "ds")

    def fail_at_5000(a: tf.Tensor, b: tf.Tensor) -> Any:
        op = tf.debugging.assert_less(a, tf.constant(5000, tf.int64), message="boom at 5000")
        with tf.control_dependencies([op] if op is not None else []):
            return tf.identity(a), b

    with pytest.raises(tf.errors.OpError, match="boom at 5000"):
        superserial.save(_source(6000).map(fail_at_5000), path, num_shards=12, resume=True)
    partial = str(tmp_path / f".ds{PARTIAL_SUFFIX}")
    with open(os.path.join(partial, "data-00001.tfrecord"), "r+b") as f:
        f.seek(20)
        f.write(b"X")
    caplog.set_level("WARNING", logger="superserial")
    superserial.save(_source(6000), path, num_shards=12, resume=True)
    assert "data-00001.tfrecord is missing or damaged" in caplog.text
    _check_equal_to_source(path, 6000)

"""superserial.storage.fs: every operation on each backend (os, tf.io.gfile, fsspec) and
the rule that picks the backend for a path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import google_crc32c
import pytest
import tensorflow as tf

from superserial.errors import CorruptDataError, UnsupportedError
from superserial.storage import fs

BACKENDS = {"local": "os", "ram": "gfile", "memory": "fsspec"}


@pytest.fixture(params=list(BACKENDS))
def root(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A fresh, existing directory on each backend."""
    kind = request.param
    if kind == "local":
        path = str(tmp_path)
    else:
        path = f"{kind}://superserial-fs-{uuid.uuid4().hex}/root"
        fs.makedirs(path)
    assert fs.backend_name(path) == BACKENDS[kind]
    yield path
    if kind != "local":
        fs.rmtree(path.rsplit("/", 1)[0])


def _child(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


# ------------------------------------------------------------------ operations


def test_directory_operations(root: str) -> None:
    d = fs.join(root, "a", "b")
    assert not fs.exists(d)
    fs.makedirs(d)
    fs.makedirs(d)  # an existing directory is fine
    assert fs.exists(d) and fs.isdir(d)
    fs.write_bytes(fs.join(d, "x.bin"), b"12345")
    fs.write_bytes(fs.join(d, "y.txt"), b"")
    assert sorted(fs.listdir(d)) == ["x.bin", "y.txt"]
    assert sorted(fs.listdir(fs.join(root, "a"))) == ["b"]  # no trailing "/"
    assert not fs.isdir(fs.join(d, "x.bin"))
    assert fs.size(fs.join(d, "x.bin")) == 5
    assert fs.size(fs.join(d, "y.txt")) == 0
    assert fs.glob(fs.join(d, "*.bin")) == [fs.join(d, "x.bin")]
    assert fs.glob(fs.join(d, "*.none")) == []
    fs.rmtree(fs.join(root, "a"))
    assert not fs.exists(fs.join(root, "a"))
    fs.rmtree(fs.join(root, "a"))  # a missing tree is fine


def test_file_operations(root: str) -> None:
    a, b = fs.join(root, "a.bin"), fs.join(root, "b.bin")
    with fs.open_file(a, "wb") as f:
        f.write(b"first")
    assert fs.read_bytes(a) == b"first"
    assert fs.read_bytes(a, limit=3) == b"fir"
    assert fs.read_bytes(a, limit=100) == b"first"
    with fs.open_file(a) as f:
        assert f.read() == b"first"
    with fs.open_file(a, "rb", buffering=1 << 20) as f:  # a local buffer size; ignored elsewhere
        assert f.read(2) == b"fi"
    fs.rename(a, b)
    assert not fs.exists(a) and fs.read_bytes(b) == b"first"
    fs.write_bytes(a, b"second")
    fs.replace(a, b)
    assert not fs.exists(a) and fs.read_bytes(b) == b"second"
    fs.write_bytes(b, b"s")  # replaces the longer content (ram:// appended before)
    assert fs.read_bytes(b) == b"s"
    fs.remove(b)
    assert not fs.exists(b)
    fs.remove(b)  # a missing file is fine


def test_rename_refuses_to_overwrite_a_file_off_local(root: str) -> None:
    if fs.is_local(root):
        pytest.skip("os.rename replaces a file on POSIX, as it always did")
    a, b = fs.join(root, "a"), fs.join(root, "b")
    fs.write_bytes(a, b"new")
    fs.write_bytes(b, b"old")
    with pytest.raises((FileExistsError, tf.errors.AlreadyExistsError)):
        fs.rename(a, b)
    assert fs.read_bytes(b) == b"old"


def test_temp_sibling_is_beside_and_marked(root: str) -> None:
    target = fs.join(root, "ds")
    tmp = fs.temp_sibling(target)
    assert tmp != fs.temp_sibling(target)
    name = tmp.rstrip("/").rsplit("/", 1)[-1]
    assert name.startswith(f".ds{fs.TMP_MARK}{os.getpid()}-")
    fs.makedirs(tmp)
    assert name in fs.listdir(root)


def test_file_url_is_local(tmp_path: os.PathLike[str]) -> None:
    url = f"file://{tmp_path}/f.bin"
    assert fs.is_local(url) and fs.backend_name(url) == "os"
    fs.write_atomically(url, b"abc")
    assert fs.read_range(url, 1, 2) == b"bc"
    assert fs.glob(f"file://{tmp_path}/*.bin") == [url]


# ------------------------------------------------------------------ read_range


def test_read_range(root: str) -> None:
    path = fs.join(root, "r.bin")
    data = bytes(range(256)) * 40
    fs.write_bytes(path, data)
    assert fs.read_range(path, 0, 10) == data[:10]
    assert fs.read_range(path, 1000, 3000) == data[1000:4000]
    assert fs.read_range(path, len(data) - 1, 1) == data[-1:]
    assert fs.read_range(path, 0, len(data)) == data
    assert fs.read_range(path, len(data), 0) == b""  # at the end, nothing asked
    with fs.open_range_reader(path) as reader:  # one open file, many reads
        got = [reader.read(o, 7) for o in range(0, 7000, 700)]
    assert got == [data[o : o + 7] for o in range(0, 7000, 700)]


@pytest.mark.parametrize(
    ("offset", "length", "got"), [(10230, 20, 10), (10240, 1, 0), (20000, 5, 0)]
)
def test_read_range_past_the_end_raises(root: str, offset: int, length: int, got: int) -> None:
    path = fs.join(root, "r.bin")
    fs.write_bytes(path, bytes(10240))
    with pytest.raises(CorruptDataError) as info:
        fs.read_range(path, offset, length)
    msg = str(info.value)
    assert path in msg and f"offset {offset}" in msg
    assert f"expected {length} bytes" in msg and f"got {got}" in msg


def test_read_range_rejects_negative(root: str) -> None:
    path = fs.join(root, "r.bin")
    fs.write_bytes(path, b"abc")
    with pytest.raises(ValueError, match="offset >= 0"):
        fs.read_range(path, -1, 2)
    with pytest.raises(ValueError, match="length >= 0"):
        fs.read_range(path, 0, -2)


# ------------------------------------------------------------------ writes, CRCs


def test_write_atomically(root: str) -> None:
    path = fs.join(root, "header.json")
    fs.write_atomically(path, "first")
    fs.write_atomically(path, b"second, longer")
    assert fs.read_bytes(path) == b"second, longer"
    assert fs.listdir(root) == ["header.json"]  # no temporary left


def test_write_atomically_failing_keeps_the_old_file(root: str) -> None:
    path = fs.join(root, "header.json")
    fs.write_atomically(path, b"old")
    with pytest.raises(TypeError):
        fs.write_atomically(path, 12345)  # type: ignore[arg-type]  # fails inside the write
    assert fs.read_bytes(path) == b"old"
    assert fs.listdir(root) == ["header.json"]


@pytest.mark.timeout(120)
def test_write_atomically_killed_never_leaves_a_partial_target(tmp_path: os.PathLike[str]) -> None:
    """SIGKILL a process rewriting a 16 MiB file in a loop: the target is whole, A or B."""
    path = os.path.join(tmp_path, "target.bin")
    a, b = b"a" * (16 << 20), b"b" * (16 << 20)
    code = f"""
        from superserial.storage import fs
        fs.write_atomically({path!r}, b"a" * (16 << 20))
        print("ready", flush=True)
        while True:
            fs.write_atomically({path!r}, b"b" * (16 << 20))
            fs.write_atomically({path!r}, b"a" * (16 << 20))
    """
    for delay in (0.05, 0.2, 0.5):
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(delay)
        assert proc.poll() is None, "the writer stopped before it was killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with open(path, "rb") as f:
            got = f.read()
        assert got in (a, b), f"partial target of {len(got)} bytes"


def test_file_crc32c_and_copy(root: str) -> None:
    path = fs.join(root, "big.bin")
    data = os.urandom((8 << 20) + 12345)  # crosses a chunk boundary
    fs.write_bytes(path, data)
    want = f"{google_crc32c.value(data):08x}"
    assert fs.file_crc32c(path) == want
    assert fs.copy_file(path, fs.join(root, "copy.bin")) == (len(data), want)
    assert fs.read_bytes(fs.join(root, "copy.bin")) == data
    fs.write_bytes(path, b"")
    assert fs.file_crc32c(path) == "00000000"


# ------------------------------------------------------------------ directory swap


def test_exchange_or_rename_moves_files_through_the_backend(root: str) -> None:
    """On memory:// this went straight to tf.io.gfile before, which has no memory://."""
    path, new = fs.join(root, "ds"), fs.join(root, "new")
    fs.makedirs(path)
    fs.write_bytes(fs.join(path, "header.json"), b"old header")
    fs.write_bytes(fs.join(path, "data-old.tfrecord"), b"old")
    fs.makedirs(new)
    fs.write_bytes(fs.join(new, "header.json"), b"new header")
    fs.write_bytes(fs.join(new, "data-new.tfrecord"), b"new")
    old = fs.exchange_or_rename(new, path, commit_file="header.json")
    if old is not None:
        fs.rmtree(old)
    assert sorted(fs.listdir(path)) == ["data-new.tfrecord", "header.json"]
    assert fs.read_bytes(fs.join(path, "header.json")) == b"new header"
    assert not fs.exists(new)
    assert sorted(fs.listdir(root)) == ["ds"]


def test_exchange_or_rename_to_a_fresh_path(root: str) -> None:
    path, new = fs.join(root, "ds"), fs.join(root, "new")
    fs.makedirs(new)
    fs.write_bytes(fs.join(new, "header.json"), b"h")
    assert fs.exchange_or_rename(new, path, commit_file="header.json") is None
    assert fs.listdir(path) == ["header.json"] and not fs.exists(new)


# ------------------------------------------------------------------ choosing the backend


def test_backend_choice_with_tensorflow_imported(tmp_path: os.PathLike[str]) -> None:
    assert "tensorflow" in sys.modules
    assert fs.backend_name(str(tmp_path)) == "os"
    assert fs.backend_name("relative/path") == "os"
    assert fs.backend_name("ram://x/y") == "gfile"  # TF registers it
    assert fs.backend_name("memory://x/y") == "fsspec"  # TF does not


def test_fsspec_reads_take_the_buffering_as_block_size() -> None:
    """open_file(buffering=N) on fsspec reads in N-byte range requests (the numpy reader's
    1 MiB reads and 64 KiB record-header walks), 8 MiB ones by default; read() the rest in one."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    asked: list[tuple[int, int]] = []

    class Ranges(MemoryFileSystem):  # a real in-memory fsspec filesystem that notes requests
        protocol = "ssranges"

        def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
            asked.append((start, end))
            return super().cat_file(path, start=start, end=end, **kwargs)

    fsspec.register_implementation("ssranges", Ranges, clobber=True)
    path = f"ssranges://ranges-{uuid.uuid4().hex}/f"
    data = bytes(range(256)) * 40
    fs.write_bytes(path, data)
    with fs.open_file(path, "rb", buffering=4096) as f:
        assert f.read(100) == data[:100]
        assert f.read() == data[100:]
    with fs.open_file(path, "rb") as f:
        assert f.read(100) == data[:100]
    assert asked == [(0, 4096), (4096, 10240), (0, 10240)]
    fs.remove(path)


def test_tf_free_use_never_imports_tensorflow(tmp_path: os.PathLike[str]) -> None:
    proc = _child(f"""
        import sys
        import superserial.storage.fs as fs
        assert "tensorflow" not in sys.modules, "import superserial.storage.fs imported TensorFlow"
        fs.makedirs("memory://tf-free/d")
        fs.write_atomically("memory://tf-free/d/h.json", b"x")
        assert fs.listdir("memory://tf-free/d") == ["h.json"]
        assert fs.read_range("memory://tf-free/d/h.json", 0, 1) == b"x"
        local = {str(tmp_path)!r} + "/f.bin"
        fs.write_bytes(local, b"abc")
        assert fs.file_crc32c(local) and fs.read_range(local, 1, 2) == b"bc"
        print(fs.backend_name("memory://tf-free/d"), fs.backend_name(local))
        print("tensorflow" in sys.modules)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["fsspec", "os", "False"]


def test_scheme_only_tensorflow_has_imports_it() -> None:
    proc = _child("""
        import sys
        from superserial.storage import fs
        fs.write_bytes("ram://only-tf/f", b"abc")
        print(fs.backend_name("ram://only-tf/f"), "tensorflow" in sys.modules)
        print(fs.read_bytes("ram://only-tf/f").decode())
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["gfile", "True", "abc"]


def test_unsupported_scheme_names_it() -> None:
    with pytest.raises(UnsupportedError, match=r"nosuch://") as info:
        fs.exists("nosuch://bucket/ds")
    assert "nosuch://bucket/ds" in str(info.value)
    assert "TensorFlow does not register it" in str(info.value)


def test_missing_fsspec_implementation_says_what_to_install() -> None:
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed here")
    with pytest.raises(UnsupportedError, match=r"s3://.*pip install s3fs"):
        fs.exists("s3://bucket/ds")


def test_nothing_installed_says_fsspec_or_tensorflow() -> None:
    """With fsspec and TensorFlow both unimportable, the message names both."""
    proc = _child("""
        import sys
        sys.modules["fsspec"] = None  # makes "import fsspec" fail, as if not installed
        sys.modules["tensorflow"] = None
        from superserial.storage import fs
        from superserial.errors import UnsupportedError
        assert fs.backend_name("/tmp") == "os"
        for url in ("s3://b/k", "memory://b/k"):
            try:
                fs.exists(url)
            except UnsupportedError as e:
                print(e)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s3, memory = proc.stdout.strip().splitlines()
    assert "s3://" in s3 and "pip install fsspec s3fs" in s3 and "pip install tensorflow" in s3
    assert "memory://" in memory and "pip install fsspec" in memory


def test_rename_across_backends_is_refused(tmp_path: os.PathLike[str]) -> None:
    local = os.path.join(tmp_path, "f")
    fs.write_bytes(local, b"x")
    with pytest.raises(UnsupportedError, match="one filesystem"):
        fs.rename(local, f"memory://cross-{uuid.uuid4().hex}/f")
    assert fs.exists(local)

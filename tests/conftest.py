"""Shared test helpers: exact comparison of datasets, element by element."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Reads retry a transient failure for 10 s here, not 60: a test that reads a few
# batches of a globally shuffled remote load and then closes its proxy leaves tf.data's
# parallel reads retrying a dead server, and the iterator's destructor (at some later
# garbage collection, in whichever test) waits for them: 58 s measured, one 30 s
# teardown in a CI run. Tests of the budget set their own.
os.environ.setdefault("SUPERSERIAL_RETRY_SECONDS", "10")

import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pytest

from servers import AWS_ENV, aws_env, find_nginx, start_moto, start_nginx, stop_nginx


def arr_key(a: Any) -> tuple[Any, ...]:
    """A comparable form of an array: dtype, shape and bytes (bytes objects for strings)."""
    a = np.asarray(a)
    if a.dtype == object or a.dtype.kind == "S":
        return ("bytes", a.shape, np.asarray(a, object).tolist())
    return (str(a.dtype), a.shape, a.tobytes())


def canon_np(x: Any) -> Any:
    """A comparable form of a numpy-reader element; dense leaves must be real ndarrays."""
    from superserial.numpy import Ragged, Sparse

    if isinstance(x, dict):
        return {k: canon_np(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return ("namedtuple", type(x).__name__, x._fields, [canon_np(v) for v in x])
    if isinstance(x, tuple):
        return ("tuple", [canon_np(v) for v in x])
    if isinstance(x, Ragged):
        return ("ragged", arr_key(x.flat_values), [arr_key(s) for s in x.nested_row_splits])
    if isinstance(x, Sparse):
        return ("sparse", arr_key(x.indices), arr_key(x.values), arr_key(x.dense_shape))
    assert type(x) is np.ndarray, f"expected an ndarray, got {type(x)}"
    return arr_key(x)


SRC = os.path.join(os.path.dirname(__file__), os.pardir, "src")


def run_without(
    modules: Iterable[str], code: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a child python where importing any of ``modules`` fails as if not
    installed (``ModuleNotFoundError``); ``args`` are its ``sys.argv[1:]``.

    Returns the finished process, its stdout and stderr as text.
    """
    hide = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)  # import m now raises
    env = {**os.environ, "PYTHONPATH": SRC, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{hide}{code}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dataset_files(header: Any) -> list[str]:
    """The sorted names of a dataset's files: header, shards and their indexes."""
    return sorted(["header.json", *(f[0] for s in header.shards for f in s.files())])


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


# ------------------------------------------------------------------ test order

# The files that take longest, longest first: their summed test times (setup and teardown
# included) in one run of `make test`'s command on a 2-core machine at 2d66024 (the suite
# took 773 s; the files' times summed to 1,461 s). `make test` runs pytest -n 2 --dist
# loadfile --no-loadscope-reorder: xdist hands whole files to its two workers in
# collection order, so these start first and no long file is left to start last, with one
# worker idle while the other runs it. The rest follow in their usual order. Only the
# order changes: every file still runs whole, in its own order, its fixtures as before.
LONGEST_FIRST = (
    "test_faults.py",  # 122 s
    "test_shuffle_tf.py",  # 111 s (before its exiting children ran at once)
    "test_distributed.py",  # 109 s
    "test_concurrency.py",  # 90 s
    "test_beam.py",  # 79 s
    "test_roundtrip.py",  # 66 s
    "test_readahead.py",  # 62 s
    "test_numpy_reader.py",  # 52 s
    "test_cache.py",  # 41 s
    "test_integrity.py",  # 41 s
    "test_cache_pin.py",  # 40 s
    "test_docs.py",  # 37 s
    "test_s3.py",  # 36 s
    "test_append.py",  # 35 s
    "test_random_access.py",  # 35 s
    "test_windowed_reads.py",  # 30 s
    "test_compressed_access.py",  # 30 s
    "test_map_readers.py",  # 29 s
    "test_http.py",  # 29 s
    "test_shuffle_torch_grain.py",  # 28 s
)


def interrupt_after(calls: int) -> Callable[[int, int], None]:
    """A save progress callback that raises KeyboardInterrupt at its ``calls``-th call (a Ctrl-C)."""
    seen = [0]

    def progress(elements: int, size: int) -> None:
        seen[0] += 1
        if seen[0] == calls:
            raise KeyboardInterrupt

    return progress


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


@pytest.fixture
def ds_path(tmp_path: Any) -> str:
    """A fresh path for a dataset directory (not created)."""
    return str(tmp_path / "ds")


# ------------------------------------------------------------------ object stores


@pytest.fixture(scope="session")
def s3_server() -> Any:
    """A real S3 API: moto's server on 127.0.0.1, an OS-chosen port, for the whole run.

    The usual AWS settings point at it (``AWS_ENDPOINT_URL`` and dummy credentials), as a
    user would point boto3/s3fs at MinIO or a VPC endpoint; nothing of ours is mocked.
    Yields the endpoint URL.
    """
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    server, endpoint = start_moto()
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(aws_env(endpoint))
    os.environ.pop("AWS_PROFILE", None)
    try:
        yield endpoint
    finally:
        server.stop()
        _restore_env(saved)


def _restore_env(saved: dict[str, str | None]) -> None:
    """Puts environment variables back as they were (None: unset)."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_server: str, request: Any) -> str:
    """A new, empty bucket on the S3 server; yields its ``s3://`` URL (no trailing slash)."""
    import re
    import uuid

    import boto3
    import fsspec

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{name}-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    fsspec.filesystem("s3").invalidate_cache()  # s3fs caches listings across tests
    return f"s3://{bucket}"


@pytest.fixture(scope="session")
def gcs_server() -> Any:
    """A GCS emulator (gcp-storage-emulator, in memory) on 127.0.0.1, an OS-chosen port.

    ``STORAGE_EMULATOR_HOST`` points gcsfs at it (superserial then serves gs:// with
    gcsfs: TensorFlow's GCS client cannot be pointed at an emulator).
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` stops gcsfs (2026.10) from probing each
    bucket's type over gRPC, which the emulator lacks (a 60 s timeout per call).
    Yields the endpoint URL.
    """
    pytest.importorskip("gcsfs")
    server_mod = pytest.importorskip("gcp_storage_emulator.server")
    saved = {k: os.environ.get(k) for k in _GCS_ENV}
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    import fsspec
    import gcsfs.core

    # Imported before the variable was set, gcsfs registered its probing class: undo that.
    fsspec.register_implementation("gs", gcsfs.core.GCSFileSystem, clobber=True)
    fsspec.register_implementation("gcs", gcsfs.core.GCSFileSystem, clobber=True)
    # Port 0: the OS picks a free port as the server binds, so parallel workers (pytest -n)
    # and other runs on the machine never race for one. A port picked ahead and released
    # could be taken before the emulator binds it, and then its start() would wait forever.
    server = server_mod.create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    port = server._api._httpd.server_port  # the emulator has no public getter for it
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    try:
        yield endpoint
    finally:
        server.stop()
        _restore_env(saved)


_GCS_ENV = ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")


@pytest.fixture
def gcs_bucket(gcs_server: str, request: Any) -> str:
    """A new, empty bucket on the GCS emulator; yields its ``gs://`` URL."""
    import re
    import uuid

    import fsspec

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{name}-{uuid.uuid4().hex[:8]}"
    gcs = fsspec.filesystem("gs", token="anon")
    gcs.mkdir(bucket)
    gcs.invalidate_cache()
    return f"gs://{bucket}"


# ------------------------------------------------------------------ a web server


class WebServer:
    """nginx serving ``root`` (a local directory) at ``url``, with directory listing off."""

    def __init__(self, root: str, url: str) -> None:
        self.root, self.url = root, url
        self.host, self.port = "127.0.0.1", int(url.rsplit(":", 1)[1])


def serve_nginx(tmp_path_factory: Any, name: str, extra: str = "") -> Iterator[WebServer]:
    """Debian's nginx on 127.0.0.1 and a free port, ``autoindex off``, until the generator ends.

    Its root, config, pid, log and temp files are in a new temp directory called
    ``name``; ``extra`` (formatted with ``root=``) goes into its server block
    (:func:`servers.start_nginx`). Skips the test where nginx is not installed.
    """
    nginx = find_nginx()
    if nginx is None:
        pytest.skip("nginx is not installed (make test installs nginx-light)")
    base = tmp_path_factory.mktemp(name)
    root, run = base / "root", base / "run"
    root.mkdir()
    run.mkdir()
    try:
        proc, url = start_nginx(nginx, root, run, extra=extra.format(root=root))
    except RuntimeError as e:
        pytest.fail(str(e))
    try:
        yield WebServer(str(root), url)
    finally:
        stop_nginx(proc)


@pytest.fixture(scope="session")
def web_server(tmp_path_factory: Any) -> Iterator[WebServer]:
    """Debian's nginx on 127.0.0.1, a free port, ``autoindex off``, for the whole run.

    As a CDN or a static website does, it serves files and refuses to list a directory
    (a 403). Its config, pid, log and temp files are in a temp directory; it runs as the
    current user, in the foreground (``daemon off``), and is stopped at the end. The
    Makefile installs nginx; without it the tests that need it are skipped. Yields a
    :class:`WebServer`: save datasets under ``.root``, read them at ``.url``.
    """
    yield from serve_nginx(tmp_path_factory, "nginx")

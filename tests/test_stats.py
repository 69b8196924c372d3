"""superserial.stats and `superserial stats`: every figure against numpy on the source arrays.

Datasets are saved with superserial.save and read back by the statistics'
own streaming pass; the expected figures are computed with numpy on the
arrays that were saved. Counts, min, max, NaN/inf/zero counts, histogram
bins and value counts must be equal; mean and std within float tolerance.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from PIL import Image

import superserial
from superserial.cli.main import cli
from superserial.format.dtypes import DTYPES
from superserial.inspect import sketches
from superserial.inspect.stats import SCHEMA
from superserial.inspect.stats_render import plot_size

N = 300  # elements; small batches below make several batches of each
REAL = [d for d in DTYPES if d.name not in ("string", "complex64", "complex128")]
SHAPES = [(), (3,), (2, 5)]


def _values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """N elements of ``shape``: spread over the dtype, with zeros, and NaN/inf for floats."""
    dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    size = (N, *shape)
    if name == "bool":
        return rng.random(size) < 0.3
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
        a.reshape(-1)[::7] = 0
        if dtype.itemsize >= 4:  # big ints: both ends of the range too
            a.reshape(-1)[1] = info.min
            a.reshape(-1)[2] = info.max
        return a
    a = (rng.standard_normal(size) * 100).astype(dtype)
    flat = a.reshape(-1)
    flat[::11] = 0
    flat[3], flat[5], flat[8] = np.nan, np.inf, -np.inf
    flat[13] = np.nan
    return a


def _expected(a: np.ndarray) -> dict[str, Any]:
    """The number summary numpy gives for ``a``."""
    x = a.reshape(-1)
    if x.dtype == np.bool_ or x.dtype.kind in "iu":
        return {
            "count": x.size,
            "min": x.min().item(),
            "max": x.max().item(),
            "mean": x.astype(np.float64).mean(),
            "std": x.astype(np.float64).std(),
            "nan": 0,
            "posinf": 0,
            "neginf": 0,
            "zeros": int(np.sum(x == 0)),
            "finite": x,
        }
    xf = x.astype(np.float64)
    finite = xf[np.isfinite(xf)]
    return {
        "count": x.size,
        "min": float(np.nanmin(xf)),
        "max": float(np.nanmax(xf)),
        "mean": finite.mean(),
        "std": finite.std(),
        "nan": int(np.isnan(xf).sum()),
        "posinf": int((xf == np.inf).sum()),
        "neginf": int((xf == -np.inf).sum()),
        "zeros": int((xf == 0).sum()),
        "finite": finite,
    }


def _check_histogram(h: dict[str, Any], finite: np.ndarray) -> None:
    edges, counts = h["bin_edges"], h["counts"]
    assert len(edges) == len(counts) + 1
    assert 1 <= len(counts) <= sketches.BINS
    if finite.dtype.kind in "iub":
        want = np.array(
            [((finite >= lo) & (finite < hi)).sum() for lo, hi in itertools.pairwise(edges)]
        )
        widths = {b - a for a, b in itertools.pairwise(edges)}
        assert len(widths) == 1 and (w := widths.pop()) >= 1 and w & (w - 1) == 0  # a power of two
    else:
        e = np.array(edges, np.float64)
        want = np.array(
            [((finite >= lo) & (finite < hi)).sum() for lo, hi in itertools.pairwise(e)]
        )
    assert counts == want.tolist()
    assert sum(counts) == finite.size
    assert counts[0] and counts[-1]  # trimmed to the data
    if np.unique(finite).size > sketches.BINS:
        assert len(counts) >= sketches.BINS // 2 - 1  # the doubling keeps resolution


def _check_number(got: dict[str, Any], a: np.ndarray) -> None:
    want = _expected(a)
    assert got["type"] == "number"
    for key in ("count", "nan", "posinf", "neginf", "zeros"):
        assert got[key] == want[key], key
    for key in ("min", "max"):
        value = got[key]
        value = float(value) if isinstance(value, str) else value  # "inf", "-inf"
        assert value == want[key], (key, value, want[key])
        assert type(value) is type(want[key]) or isinstance(value, float)
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-9, atol=1e-9 * want["std"])
    np.testing.assert_allclose(got["std"], want["std"], rtol=1e-7)
    _check_histogram(got["histogram"], want["finite"])


@pytest.fixture(scope="module")
def real_stats(tmp_path_factory: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One dataset with a leaf of every real dtype and shape; stats in small batches."""
    rng = np.random.default_rng(0)
    arrays = {f"{d.name}_{len(s)}": _values(d.name, s, rng) for d in REAL for s in SHAPES}
    path = str(tmp_path_factory.mktemp("real") / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices(arrays), path)
    return arrays, superserial.stats(path, batch_size=64).to_dict()


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", [d.name for d in REAL])
def test_numbers_equal_numpy(real_stats: Any, name: str, shape: tuple[int, ...]) -> None:
    arrays, result = real_stats
    key = f"{name}_{len(shape)}"
    leaf = result["leaves"][key]
    assert (leaf["kind"], leaf["dtype"], leaf["shape"], leaf["elements"]) == (
        "dense",
        name,
        list(shape),
        N,
    )
    _check_number(leaf["values"], arrays[key])
    if shape == () and name in ("bool", "int8", "uint8", "int16", "uint16", "int32", "int64"):
        vc = leaf["value_counts"]
        values, counts = np.unique(arrays[key], return_counts=True)
        if len(values) <= sketches.DISTINCT_LIMIT:
            assert vc["complete"]
            assert vc["values"] == [
                [v, c] for v, c in zip(values.tolist(), counts.tolist(), strict=True)
            ]
        else:
            assert vc == {"limit": sketches.DISTINCT_LIMIT, "complete": False, "values": []}
    elif shape != ():
        assert leaf["value_counts"] is None


def test_labels_value_counts_and_limit(tmp_path: Any) -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(-3, 7, 2000).astype(np.int32)
    ids = np.arange(2000, dtype=np.int64)  # 2000 distinct: past the limit
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices({"label": labels, "id": ids}), path)
    result = superserial.stats(path, batch_size=100)
    values, counts = np.unique(labels, return_counts=True)
    assert result["label"]["value_counts"] == {
        "limit": 1000,
        "complete": True,
        "values": [[v, c] for v, c in zip(values.tolist(), counts.tolist(), strict=True)],
    }
    assert result["id"]["value_counts"]["complete"] is False
    _check_number(result["id"]["values"], ids)
    assert "value counts (10 distinct)" in result.text()
    assert "more than 1000 distinct values" in result.text()


@pytest.mark.parametrize("name", ["complex64", "complex128"])
def test_complex_parts(tmp_path: Any, name: str) -> None:
    rng = np.random.default_rng(2)
    z = (rng.standard_normal((N, 4)) + 1j * rng.standard_normal((N, 4))).astype(name)
    z[0, 0] = 0
    z[1, 1] = complex(np.nan, 1.0)
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices(z), path)
    v = superserial.stats(path, batch_size=50)["value"]["values"]
    assert (v["type"], v["count"], v["zeros"]) == ("complex", z.size, 1)
    _check_number(v["real"], z.real.copy())
    _check_number(v["imag"], z.imag.copy())


def test_strings_heavy_hitters(tmp_path: Any) -> None:
    """Misra-Gries keeps every value above its bound, and no count is high or low by more."""
    rng = np.random.default_rng(3)
    heavy = [b"alpha", b"beta", "\u00e9t\u00e9".encode(), b"\xff\xfe"]
    n = 4000
    values = [
        heavy[i % 4] if rng.random() < 0.3 else b"r%d" % rng.integers(1 << 30) for i in range(n)
    ]
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices({"s": values}), path)
    s = superserial.stats(path, batch_size=256)["s"]["values"]
    truth = Counter(values)
    lengths = np.array([len(v) for v in values])
    _check_number(s["lengths"], lengths)
    top = s["top"]
    assert top["approximate"] and top["method"] == "misra-gries"
    k, bound = top["counters"], top["max_undercount"]
    assert 0 < bound <= n // (k + 1)
    got = {json.dumps(v): c for v, c in top["values"]}

    def key(b: bytes) -> str:
        return json.dumps(sketches.json_value(b))

    for value, count in truth.items():
        if count > bound:
            assert key(value) in got, value
        if key(value) in got:
            assert count - bound <= got[key(value)] <= count
    assert key(b"\xff\xfe") == json.dumps({"base64": "//4="})
    assert [v for v, _ in top["values"][:4]] != []


def test_strings_exact_when_few(tmp_path: Any) -> None:
    values = [b"a", b"bb", b"", b"a"] * 50
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices(values), path)
    s = superserial.stats(path, batch_size=16)["value"]["values"]
    assert s["top"]["approximate"] is False and s["top"]["max_undercount"] == 0
    assert s["top"]["values"] == [["a", 100], ["", 50], ["bb", 50]]
    assert s["lengths"]["zeros"] == 50


def test_ragged_row_lengths(tmp_path: Any) -> None:
    rng = np.random.default_rng(4)
    rows = [
        [list(rng.integers(0, 100, rng.integers(0, 6))) for _ in range(rng.integers(0, 4))]
        for _ in range(100)
    ]
    rt = tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=2)
    path = str(tmp_path / "ds")
    superserial.save(tf.data.Dataset.from_tensor_slices(rt), path)
    leaf = superserial.stats(path, batch_size=32)["value"]
    assert leaf["kind"] == "ragged"
    flat = np.array([v for e in rows for r in e for v in r], np.int64)
    _check_number(leaf["values"], flat)
    _check_number(leaf["dims"]["0"], np.array([len(e) for e in rows]))
    _check_number(leaf["dims"]["1"], np.array([len(r) for e in rows for r in e]))
    assert leaf["nnz"] is None


def test_sparse_nnz_and_varying_dense(tmp_path: Any) -> None:
    n = 100
    rng = np.random.default_rng(5)
    dense = rng.standard_normal((n, 4, 5)).astype(np.float32) * (rng.random((n, 4, 5)) < 0.2)
    sparse = tf.sparse.from_dense(dense)

    def varying() -> Any:
        for i in range(n):
            yield np.full((i % 4, 2), i, np.int16)

    ds = tf.data.Dataset.zip(
        (
            tf.data.Dataset.from_tensor_slices(sparse),
            tf.data.Dataset.from_generator(
                varying, output_signature=tf.TensorSpec([None, 2], tf.int16)
            ),
        )
    )
    path = str(tmp_path / "ds")
    superserial.save(ds, path)
    result = superserial.stats(path, batch_size=32)
    sp = result["0"]
    assert sp["kind"] == "sparse"
    _check_number(sp["nnz"], np.count_nonzero(dense.reshape(n, -1), axis=1))
    _check_number(sp["values"], dense[dense != 0])
    var = result["1"]
    _check_number(var["dims"]["0"], np.arange(n) % 4)
    _check_number(
        var["values"], np.concatenate([np.full((i % 4) * 2, i, np.int16) for i in range(n)])
    )


def test_select_and_empty(tmp_path: Any) -> None:
    path = str(tmp_path / "ds")
    superserial.save(
        tf.data.Dataset.from_tensor_slices(
            {"x": np.zeros((0, 3), np.float32), "y": np.zeros(0, np.int64), "s": np.zeros(0, bytes)}
        ),
        path,
    )
    result = superserial.stats(path, select=["x", "s"])
    assert list(result.leaves) == ["s", "x"]
    d = result.to_dict()
    assert d["schema"] == SCHEMA and d["elements"] == 0
    x = d["leaves"]["x"]["values"]
    assert (x["count"], x["min"], x["max"], x["mean"], x["std"]) == (0, None, None, None, None)
    assert x["histogram"] == {"bin_edges": [], "counts": []}
    assert d["leaves"]["s"]["values"]["top"]["values"] == []
    assert "0 elements" in result.text()
    with pytest.raises(ValueError, match="nope"):
        superserial.stats(path, select=["nope"])


def test_histogram_doubling_is_exact() -> None:
    """Ranges that grow batch after batch: the bins merge, the counts stay exact."""
    rng = np.random.default_rng(6)
    for integer in (True, False):
        s = sketches.NumberSummary(np.dtype(np.int64 if integer else np.float64))
        seen = []
        for scale in (1, 10, 1000, 1e6, 1e9, 3):
            x = rng.standard_normal(500) * scale + scale
            x = x.astype(np.int64) if integer else x
            s.add(x)
            seen.append(x)
        _check_number(s.to_dict(), np.concatenate(seen))


def test_bounded_state() -> None:
    """The summaries keep as much after a million distinct values as after a few."""
    hh, vc = sketches.HeavyHitters(8), sketches.ValueCounts(50)
    for i in range(200):
        batch = np.arange(i * 5000, (i + 1) * 5000)
        hh.add(batch.tolist())
        vc.add(batch)
    assert len(hh.counters) <= 8 and vc.counts is None


# ------------------------------------------------------------------ CLI and processes


@pytest.fixture(scope="module")
def small(tmp_path_factory: Any) -> str:
    path = str(tmp_path_factory.mktemp("small") / "ds")
    rng = np.random.default_rng(7)
    superserial.save(
        tf.data.Dataset.from_tensor_slices(
            {
                "image": rng.integers(0, 256, (100, 8, 8), dtype=np.uint8),
                "label": rng.integers(0, 10, 100),
                "name": [b"n%d" % (i % 7) for i in range(100)],
                "tokens": tf.ragged.constant([[1] * (i % 5) for i in range(100)]),
            }
        ),
        path,
    )
    return path


def test_cli_text_json_plot(small: str, tmp_path: Any) -> None:
    png = tmp_path / "stats.png"
    result = CliRunner().invoke(cli, ["stats", small, "--plot", str(png)])
    assert result.exit_code == 0, result.output
    for text in (
        "image: dense uint8[8, 8]",
        "label: dense int64[]",
        "value counts",
        "most frequent",
    ):
        assert text in result.stdout
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == plot_size(4)
        assert len(set(im.convert("L").getdata())) > 2  # something drawn
    result = CliRunner().invoke(cli, ["stats", small, "--json", "--select", "label"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got == superserial.stats(small, select=["label"]).to_dict()
    assert list(got) == ["schema", "path", "elements", "leaves"] and list(got["leaves"]) == [
        "label"
    ]
    result = CliRunner().invoke(cli, ["stats", small, "--select", "nope", "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["ok"] is False


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_no_tensorflow_and_missing_matplotlib(small: str, tmp_path: Any) -> None:
    code = (
        "import sys; sys.modules['tensorflow'] = None; sys.modules['matplotlib'] = None\n"
        "import superserial\n"
        "print(superserial.stats(sys.argv[1]).elements)\n"
        "from superserial.cli.main import main\n"
        "main(['stats', sys.argv[1], '--plot', sys.argv[2]])\n"
    )
    out = _run(code, small, str(tmp_path / "p.png"))
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines()[0] == "100"
    assert "pip install 'superserial[viz]'" in out.stderr
    assert not (tmp_path / "p.png").exists()


CHILD = r"""
import sys
import superserial
s = superserial.stats(sys.argv[1], batch_size=16)
assert s.elements == int(sys.argv[2]), s.elements
# VmHWM: this process's own peak (ru_maxrss keeps the forking parent's across exec).
print([line for line in open("/proc/self/status") if line.startswith("VmHWM")][0].split()[1])
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_memory_does_not_grow_with_the_dataset(tmp_path: Any) -> None:
    """8x the data (256 KiB elements, 8 MiB and 64 MiB) adds next to no memory."""
    peaks = {}
    for n in (32, 256):
        path = str(tmp_path / f"ds{n}")
        ds = tf.data.Dataset.range(n).map(
            lambda i: {"x": tf.fill([65536], tf.cast(i, tf.float32)), "i": i}
        )
        superserial.save(ds, path)
        out = _run(CHILD, path, str(n))
        assert out.returncode == 0, out.stderr
        peaks[n] = int(out.stdout.split()[-1]) // 1024  # MiB
    # Holding the values (or batches kept alive by reference cycles) adds ~56 MiB.
    assert peaks[256] - peaks[32] < 16, peaks


def test_distinct_strings_say_so_not_dash(tmp_path: Any) -> None:
    ids = [b"id-%d" % i for i in range(5000)]
    many, few = str(tmp_path / "many"), str(tmp_path / "few")
    superserial.save(tf.data.Dataset.from_tensor_slices({"id": ids}), many)
    superserial.save(tf.data.Dataset.from_tensor_slices({"id": ids[:40]}), few)
    s = superserial.stats(many)
    top = s["id"]["values"]["top"]
    assert top["values"] == [] and top["approximate"]  # Misra-Gries kept none of them
    text = str(s)
    assert (
        f"most frequent: none stands out, no value occurs more than {top['max_undercount']} times"
        in text
    ), text
    assert "most frequent (exact): none, all 40 values are distinct" in str(superserial.stats(few))
    assert ": -" not in text

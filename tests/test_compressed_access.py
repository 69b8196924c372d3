"""Random access to GZIP and ZLIB shards through their restart points (issue 24).

Real files, real TensorFlow. Most datasets here are written with restart
blocks of a few hundred bytes (``record_file._RESTART``, set for the save
alone) so that small datasets have many blocks and records that span two or
more of them; one is written with the default spacing.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import superserial
import superserial.numpy as ssnp
from conftest import canon_np
from matrix import N, SavedOnUse, leaf_kinds_dataset
from superserial.errors import CorruptDataError, UnsupportedError
from superserial.format import dtypes, framing, layout, record_index
from superserial.format.record_index import Restarts, read_restarts
from superserial.read.blocks import check_blocks
from superserial.read.order import permutation
from superserial.write import record_file

COMPRESSIONS = ["GZIP", "ZLIB"]
SEED = 77


@contextlib.contextmanager
def restart_spacing(nbytes: int) -> Iterator[None]:
    """Saves within write restart blocks of ``nbytes`` uncompressed bytes."""
    saved = record_file._RESTART
    record_file._RESTART = nbytes
    try:
        yield
    finally:
        record_file._RESTART = saved


def _save(path: Path | str, ds: tf.data.Dataset, spacing: int | None = 200, **kw: Any) -> str:
    out = str(path)
    with restart_spacing(spacing) if spacing else contextlib.nullcontext():
        superserial.save(ds, out, **kw)
    return out


def _ids(n: int, width: int = 3) -> tf.data.Dataset:
    """``{"i": i, "s": str(i) * (i % width)}``: records of varying sizes."""
    return tf.data.Dataset.range(n).map(
        lambda i: {"i": i, "s": tf.strings.reduce_join(tf.fill([i % width], tf.as_string(i)))}
    )


def _table(path: str, k: int = 0) -> tuple[str, Restarts]:
    header = superserial.read_header(path)
    shard = header.shards[k]
    assert header.compression is not None
    return os.path.join(path, shard.file), read_restarts(path, shard, header.compression)


def _unpack(raw: bytes, compression: str) -> bytes:
    return gzip.decompress(raw) if compression == "GZIP" else zlib.decompress(raw)


# ------------------------------------------------------------------ the files


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("spacing", [200, None])
def test_files_stay_ordinary_streams_and_indexes_hold(
    tmp_path: Path, compression: str, spacing: int | None
) -> None:
    ds = _ids(3000, width=40)
    plain = _save(tmp_path / "plain", ds, spacing=None, num_shards=2)
    packed = _save(tmp_path / "packed", ds, spacing=spacing, num_shards=2, compression=compression)
    ph, zh = superserial.read_header(plain), superserial.read_header(packed)
    for p, z in zip(ph.shards, zh.shards, strict=True):
        raw = Path(packed, z.file).read_bytes()
        stream = _unpack(raw, compression)
        assert stream == Path(plain, p.file).read_bytes()  # gzip/zlib: the same records
        tf_records = list(
            tf.data.TFRecordDataset(os.path.join(packed, z.file), compression_type=compression)
        )
        assert [r.numpy() for r in tf_records] == [
            r.numpy() for r in tf.data.TFRecordDataset(os.path.join(plain, p.file))
        ]
        assert z.index is not None and z.index.file == layout.index_name(z.file)
        table = read_restarts(packed, z, compression)
        np.testing.assert_array_equal(table.offsets, record_index.read_index(plain, p))
        assert int(table.plain[-1]) == len(stream)
        assert check_blocks(os.path.join(packed, z.file), table) is None
        # Each block inflates alone to its part of the stream.
        for j in range(len(table.packed) - 1):
            block = raw[int(table.packed[j]) : int(table.packed[j + 1])]
            assert zlib.decompressobj(-15).decompress(block) == bytes(
                stream[int(table.plain[j]) : int(table.plain[j + 1])]
            )
        if spacing:
            assert len(table.packed) > 10  # many blocks: records cross them
    if shutil.which("zcat") and compression == "GZIP":
        out = subprocess.run(
            ["zcat", os.path.join(packed, zh.shards[0].file)], capture_output=True, check=True
        )
        assert out.stdout == Path(plain, ph.shards[0].file).read_bytes()


def test_same_records_give_the_same_bytes(tmp_path: Path) -> None:
    a = _save(tmp_path / "a", _ids(500), compression="GZIP")
    b = _save(tmp_path / "b", _ids(500), compression="GZIP")
    ha, hb = superserial.read_header(a), superserial.read_header(b)
    assert [(s.bytes, s.crc32c) for s in ha.shards] == [(s.bytes, s.crc32c) for s in hb.shards]
    for sa, sb in zip(ha.shards, hb.shards, strict=True):
        assert sa.index is not None and sb.index is not None
        assert Path(a, sa.index.file).read_bytes() == Path(b, sb.index.file).read_bytes()


# ------------------------------------------------------------------ random access


# Each dtype in one compression, the two taking turns, and the only dtypes of their
# stored kinds (float32: float, string: bytes) in both, so each compression reads every
# leaf kind of every stored kind: 18 saves of about 2 s of CPU each, not the full
# product's 32. GZIP and ZLIB shards are the same raw deflate blocks in another wrapper,
# so a leaf inflates to the same bytes in either; the other tests here take both.
MATRIX = [(e.name, COMPRESSIONS[i % 2]) for i, e in enumerate(dtypes.DTYPES)]
MATRIX += [
    (name, c) for name in ("float32", "string") for c in COMPRESSIONS if (name, c) not in MATRIX
]


@pytest.fixture(scope="module")
def matrix_paths(tmp_path_factory: Any) -> SavedOnUse:
    """Each dtype's leaf-kinds dataset (GZIP or ZLIB), in 2 shards of many tiny blocks."""
    base = tmp_path_factory.mktemp("cmatrix")
    seeds = {key: i for i, key in enumerate(MATRIX)}

    def make(key: Any) -> str:
        name, c = key
        return _save(
            base / f"{name}-{c}",
            leaf_kinds_dataset(dtypes.by_name(name), seed=seeds[key]),
            spacing=64,
            num_shards=2,
            compression=c,
        )

    return SavedOnUse(make)


@pytest.mark.parametrize(("dtype", "compression"), MATRIX)
def test_every_leaf_kind_reads_at_random_as_in_order(
    matrix_paths: SavedOnUse, dtype: str, compression: str
) -> None:
    ds = ssnp.load(matrix_paths[(dtype, compression)])
    seq = [canon_np(e) for e in ds]
    assert len(seq) == len(ds) == N
    for i in range(-N, N):
        assert canon_np(ds[i]) == seq[i], f"element {i}"
    assert [canon_np(e) for e in ds[::-1]] == seq[::-1]
    order = [5, 0, 5, 2, -1, 3]
    assert [canon_np(e) for e in ds.get_elements(order)] == [seq[i] for i in order]
    batch = ds.get_batch(order)
    flat = [canon_np(b) for b in tf.nest.flatten(batch)]
    assert flat == [
        canon_np(b)
        for b in tf.nest.flatten(ssnp.load(matrix_paths[(dtype, compression)]).get_batch(order))
    ]


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize(
    ("count", "kwargs"),
    [
        (400, {"num_shards": 7}),  # uneven shards
        (3, {"num_shards": 5}),  # empty shards
        (600, {"shard_size": 2000}),  # shards cut by size
        (1, {}),
    ],
)
def test_shard_and_block_boundaries(
    tmp_path: Path, compression: str, count: int, kwargs: dict[str, Any]
) -> None:
    path = _save(tmp_path / "ds", _ids(count, width=60), compression=compression, **kwargs)
    d = ssnp.load(path)
    want = [(i, str(i).encode() * (i % 60)) for i in range(count)]
    got = [(int(d[i]["i"]), d[i]["s"]) for i in range(count)]
    assert got == want
    assert [int(d[i]["i"]) for i in range(-count, 0)] == list(range(count))
    rng = np.random.default_rng(0)
    idx = rng.integers(-count, count, size=500)
    batch = d.get_batch(idx)
    assert batch["i"].tolist() == (idx % count).tolist()
    assert batch["s"].tolist() == [want[i][1] for i in idx % count]
    records = d.records
    data, _ = records.read_many(idx % count)
    buffer, starts, lengths = records.read_packed(idx % count)
    assert [buffer[a : a + n] for a, n in zip(starts, lengths, strict=True)] == data


def test_records_at_every_block_boundary(tmp_path: Path) -> None:
    """Records starting, ending and spanning at block edges, and records over many blocks."""
    sizes = [1, 183, 184, 185, 199, 200, 201, 399, 400, 401, 1500, 3, 0, 777, 2, 1200]
    blobs = [bytes([k % 251]) * n for k, n in enumerate(sizes * 5)]
    ds = tf.data.Dataset.from_tensor_slices({"b": tf.constant(blobs)})
    path = _save(tmp_path / "edges", ds, spacing=200, compression="GZIP")
    _, table = _table(path)
    # Blocks holding no record start (inside a long record), and records over several blocks.
    assert (np.diff(table.first) == 0).any()
    assert (np.diff(table.offsets) > 400).any()
    d = ssnp.load(path)
    assert [d[i]["b"].item() for i in range(len(blobs))] == blobs
    order = np.random.default_rng(3).permutation(len(blobs))
    assert d.get_batch(order)["b"].tolist() == [blobs[i] for i in order]
    assert [d[int(i)]["b"].item() for i in order] == [blobs[i] for i in order]  # LRU hits too


def test_records_starting_on_block_starts(tmp_path: Path) -> None:
    ds = tf.data.Dataset.range(90).map(lambda i: {"i": i})
    plain = _save(tmp_path / "plain", ds, spacing=None)
    framed = int(record_index.read_index(plain, superserial.read_header(plain).shards[0])[1])
    path = _save(tmp_path / "aligned", ds, spacing=3 * framed, compression="ZLIB")
    _, table = _table(path)
    assert set(table.plain[:-1].tolist()) <= set(table.offsets.tolist())
    np.testing.assert_array_equal(table.first, np.arange(0, 90, 3))
    d = ssnp.load(path)
    assert [int(d[i]["i"]) for i in range(-90, 90)] == list(range(90)) * 2
    assert d.get_batch([89, 0, 3, 2, 3])["i"].tolist() == [89, 0, 3, 2, 3]


def test_default_spacing_reads_at_random(tmp_path: Path) -> None:
    path = _save(tmp_path / "big", _ids(20000, width=50), spacing=None, compression="GZIP")
    _, table = _table(path)
    assert len(table.packed) - 1 > 2  # more than one block of 128 KiB
    d = ssnp.load(path)
    idx = np.random.default_rng(5).integers(0, 20000, 2000)
    assert d.get_batch(idx)["i"].tolist() == idx.tolist()
    assert [int(d[int(i)]["i"]) for i in idx[:200]] == idx[:200].tolist()


# ------------------------------------------------------------------ the readers above


@pytest.fixture(scope="module")
def shuffled_sets(tmp_path_factory: Any) -> dict[str, str]:
    base = tmp_path_factory.mktemp("cshuf")
    out = {}
    for c in COMPRESSIONS:
        ids = np.arange(500, dtype=np.int64)
        ds = tf.data.Dataset.from_tensor_slices({"i": ids, "v": np.repeat(ids[:, None], 5, 1)})
        out[c] = _save(base / c, ds, spacing=300, num_shards=3, compression=c)
    return out


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("epoch", [0, 3])
def test_global_shuffle_is_the_permutation(
    shuffled_sets: dict[str, str], compression: str, epoch: int
) -> None:
    ds = superserial.load(shuffled_sets[compression], shuffle=True, seed=SEED, epoch=epoch)
    assert [int(e["i"]) for e in ds] == permutation(500, SEED, epoch).tolist()


def test_windowed_shuffle_is_the_permutation(shuffled_sets: dict[str, str]) -> None:
    ds = superserial.load(
        shuffled_sets["GZIP"], shuffle=True, seed=SEED, epoch=2, shuffle_window=64
    )
    assert [int(e["i"]) for e in ds] == permutation(500, SEED, 2, window=64).tolist()


def test_shuffle_resumes_mid_epoch(shuffled_sets: dict[str, str], tmp_path: Path) -> None:
    def make() -> tf.data.Dataset:
        return superserial.load(shuffled_sets["GZIP"], shuffle=True, seed=SEED, epoch=1)

    it = iter(make())
    first = [int(next(it)["i"]) for _ in range(123)]
    prefix = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt"))
    rest = [int(e["i"]) for e in it]
    assert first + rest == permutation(500, SEED, 1).tolist()
    again = iter(make())
    tf.train.Checkpoint(iterator=again).restore(prefix).assert_consumed()
    assert [int(e["i"]) for e in again] == rest


def test_map_dataset_and_grain_source_read_compressed(shuffled_sets: dict[str, str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("grain")
    from superserial.grain import DataSource
    from superserial.torch import MapDataset

    path = shuffled_sets["ZLIB"]
    m, g = MapDataset(path), DataSource(path)
    assert len(m) == len(g) == 500
    for i in (0, 1, 166, 167, 499, -1):
        assert int(m[i]["i"]) == i % 500
        assert int(g[i]["i"]) == i % 500


def test_show_shuffle_on_gzip(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    images = np.arange(40 * 8 * 8, dtype=np.uint8).reshape(40, 8, 8)
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(40)})
    path = _save(tmp_path / "img", ds, compression="GZIP")
    out = tmp_path / "grid.png"
    proc = subprocess.run(
        [sys.executable, "-m", "superserial", "show", path, "--shuffle", "-n", "8", "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0


# ------------------------------------------------------------------ integrity


@pytest.fixture
def gz(tmp_path: Path) -> str:
    return _save(tmp_path / "gz", _ids(400, width=30), spacing=300, compression="GZIP")


def _flip(file: str, at: int, mask: int = 0xFF) -> None:
    with open(file, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def _records_of_block(table: Restarts, j: int) -> list[int]:
    """The records whose bytes lie wholly inside block ``j``."""
    lo, hi = table.plain[j], table.plain[j + 1]
    return [
        k
        for k in range(len(table.offsets) - 1)
        if lo <= table.offsets[k] and table.offsets[k + 1] <= hi
    ]


@pytest.mark.parametrize("where", [0.2, 0.5, 0.9])
def test_damaged_block_names_file_and_offset_and_others_read(gz: str, where: float) -> None:
    file, table = _table(gz)
    j = 5
    a, b = int(table.packed[j]), int(table.packed[j + 1])
    _flip(file, a + int((b - a) * where))
    lo, hi = table.plain[j], table.plain[j + 1]
    touching = [k for k in range(400) if table.offsets[k] < hi and table.offsets[k + 1] > lo]
    d = ssnp.load(gz)
    pattern = rf"{file}.*compressed byte offset {a}\b"
    with pytest.raises(CorruptDataError, match=pattern):
        d.get_batch([0, *touching, 399])
    failed = 0
    for k in touching:  # one at a time, a read stops where its record ends
        try:
            assert int(ssnp.load(gz)[k]["i"]) == k  # never wrong data
        except CorruptDataError as e:
            assert re.search(pattern, str(e)), str(e)
            failed += 1
    assert failed
    others = [k for k in range(400) if k not in touching]
    assert [int(d[k]["i"]) for k in others] == others  # the shard's other blocks still read
    assert d.get_batch(others)["i"].tolist() == others
    assert not superserial.verify(gz).ok


def test_damaged_block_is_never_wrong_data(gz: str) -> None:
    """Every single-bit flip in one block: an error or the right records, never others."""
    file, table = _table(gz)
    j = 3
    a, b = int(table.packed[j]), int(table.packed[j + 1])
    raw = Path(file).read_bytes()
    inside = _records_of_block(table, j)
    want = [(k, str(k).encode() * (k % 30)) for k in inside]
    for at in range(a, b, max(1, (b - a) // 40)):
        for bit in (0x01, 0x80):
            Path(file).write_bytes(raw)
            _flip(file, at, bit)
            d = ssnp.load(gz)
            try:
                got = [(int(d[k]["i"]), d[k]["s"]) for k in inside]
            except CorruptDataError:
                continue
            assert got == want, (at, bit)


def test_truncated_stream_is_a_clear_error(gz: str) -> None:
    file, table = _table(gz)
    cut = int(table.packed[4]) + 3
    d = ssnp.load(gz)
    last = len(table.offsets) - 2
    assert int(d[last]["i"]) == last  # read (and its block kept) before the cut
    d = ssnp.load(gz)
    os.truncate(file, cut)
    with pytest.raises(CorruptDataError, match=f"{file}.*(ends first|compressed byte offset)"):
        d[last]
    with pytest.raises(CorruptDataError, match=f"{file}"):
        d.get_batch([0, last])
    assert int(d[0]["i"]) == 0  # the blocks before the cut still read
    assert not superserial.verify(gz).ok


def _rewrite_index(path: str, change: Any) -> str:
    """Re-encodes shard 0's index with ``change(table)`` applied, its CRCs and header updated."""
    header = superserial.read_header(path)
    shard = header.shards[0]
    table = read_restarts(path, shard, "GZIP")
    offsets, packed, plain = change(table)
    data = record_index.encode_restarts(offsets, packed, plain, shard.crc32c)
    assert shard.index is not None
    ipath = os.path.join(path, shard.index.file)
    Path(ipath).write_bytes(data)
    hpath = os.path.join(path, layout.HEADER_FILE)
    obj = json.loads(Path(hpath).read_text())
    obj["shards"][0]["index"].update(bytes=len(data), crc32c=f"{record_index.crc32c(data):08x}")
    Path(hpath).write_text(json.dumps(obj))
    return ipath


def _shift_block(table: Restarts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    packed = table.packed.copy()
    packed[4] += 2  # a block that starts inside another
    return table.offsets, packed, table.plain


def _swap_plain(table: Restarts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    plain = table.plain.copy()
    plain[4] -= 7  # a block of the wrong uncompressed length
    return table.offsets, table.packed, plain


@pytest.mark.parametrize("change", [_shift_block, _swap_plain])
def test_index_disagreeing_with_the_stream_is_a_clear_error(gz: str, change: Any) -> None:
    _rewrite_index(gz, change)
    d = ssnp.load(gz)
    assert [int(e["i"]) for e in d] == list(range(400))  # sequential reading ignores the index
    with pytest.raises(CorruptDataError, match=r"compressed byte offset|corrupted|length"):
        d.get_batch(np.arange(400))
    report = superserial.verify(gz)
    assert not report.ok
    assert any("restart points disagree" in p.message for p in report.problems), report.problems


@pytest.mark.parametrize(
    ("damage", "text"),
    [
        (lambda d: d[:-8] + d[-4:], "expected .* bytes"),
        (lambda d: b"SSINDEX\x01" + d[8:], "magic"),
        (lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], "CRC-32C"),
    ],
)
def test_damaged_index_file_is_refused(gz: str, damage: Any, text: str) -> None:
    shard = superserial.read_header(gz).shards[0]
    assert shard.index is not None
    ipath = os.path.join(gz, shard.index.file)
    data = damage(Path(ipath).read_bytes())
    Path(ipath).write_bytes(data)
    hpath = os.path.join(gz, layout.HEADER_FILE)
    obj = json.loads(Path(hpath).read_text())
    obj["shards"][0]["index"].update(bytes=len(data), crc32c=f"{record_index.crc32c(data):08x}")
    Path(hpath).write_text(json.dumps(obj))
    d = ssnp.load(gz)
    with pytest.raises(CorruptDataError, match=text) as e:
        d[0]
    assert "superserial convert" in str(e.value)


def _body(t: Restarts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return t.offsets, t.packed, t.plain


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda t: (t.offsets, t.packed[::-1].copy(), t.plain), "block offsets"),
        (lambda t: (t.offsets, t.packed - 9, t.plain), "block offsets from at least 10"),
        (lambda t: (t.offsets, t.packed, t.plain[::-1].copy()), "blocks from 0|inflate to"),
        (
            lambda t: (t.offsets, t.packed, np.r_[t.plain[:-1], t.plain[-1] + 1]),
            "stream size",
        ),
        (
            lambda t: (
                t.offsets,
                t.packed,
                np.r_[0, np.full(len(t.plain) - 2, t.plain[-1] // 2), t.plain[-1]],
            ),
            "first in block|inflate",
        ),
    ],
)
def test_inconsistent_restart_table_is_refused(gz: str, change: Any, text: str) -> None:
    _rewrite_index(gz, change)
    with pytest.raises(CorruptDataError, match=text):
        ssnp.load(gz).get_batch(np.arange(400))


def test_first_records_are_checked(gz: str) -> None:
    shard = superserial.read_header(gz).shards[0]
    table = read_restarts(gz, shard, "GZIP")
    data = bytearray(
        record_index.encode_restarts(table.offsets, table.packed, table.plain, shard.crc32c)
    )
    m = len(table.packed) - 1
    at = len(data) - 4 - 8 * m + 8  # first[1]
    struct.pack_into("<Q", data, at, int(table.first[1]) + 1)
    struct.pack_into("<I", data, len(data) - 4, record_index.crc32c(bytes(data[:-4])))
    with pytest.raises(CorruptDataError, match="first in block 1"):
        record_index.decode_restarts(bytes(data), shard, "GZIP", "idx", gz)


def test_uncompressed_index_on_a_compressed_shard_is_refused(tmp_path: Path) -> None:
    plain = _save(tmp_path / "p", _ids(20), spacing=None)
    h = json.loads(Path(plain, layout.HEADER_FILE).read_text())
    h["compression"] = "GZIP"
    Path(plain, layout.HEADER_FILE).write_text(json.dumps(h))
    with pytest.raises(CorruptDataError, match="an uncompressed shard"):
        ssnp.load(plain)[0]


def test_old_compressed_dataset_says_what_to_run(tmp_path: Path) -> None:
    path = _save(tmp_path / "old", _ids(30), compression="GZIP", num_shards=2)
    hpath = os.path.join(path, layout.HEADER_FILE)
    obj = json.loads(Path(hpath).read_text())
    for s in obj["shards"]:  # as written before restart points existed
        os.remove(os.path.join(path, s.pop("index")["file"]))
    Path(hpath).write_text(json.dumps(obj))
    d = ssnp.load(path)
    assert [int(e["i"]) for e in d] == list(range(30))
    with pytest.raises(
        UnsupportedError, match=f"superserial convert {path} -o NEW_PATH --compression GZIP"
    ):
        d[0]
    with pytest.raises(UnsupportedError, match="--compression GZIP"):
        superserial.build_index(path)


def test_build_index_keeps_valid_restart_points(gz: str) -> None:
    before = Path(gz, layout.HEADER_FILE).read_bytes()
    header = superserial.build_index(gz)
    assert Path(gz, layout.HEADER_FILE).read_bytes() == before
    assert all(s.index is not None for s in header.shards)


def test_verify_checks_restart_points(gz: str) -> None:
    report = superserial.verify(gz)
    assert report.ok, report.problems
    assert all(s.index_ok for s in report.shards)


def test_records_match_framing(gz: str) -> None:
    """The index's offsets are where the decompressed stream's records start."""
    file, table = _table(gz)
    stream = gzip.decompress(Path(file).read_bytes())
    plain = Path(file).with_suffix(".plain")
    plain.write_bytes(stream)
    np.testing.assert_array_equal(table.offsets, framing.record_offsets(str(plain), len(stream)))


# ------------------------------------------------------- readers starting inside a shard


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_record_ranges_inside_a_shard_read_from_their_block(
    shuffled_sets: dict[str, str], compression: str
) -> None:
    # Every range here starts inside a shard of 167 or 166 records in blocks of 300 bytes,
    # so most begin in a block past the first, some mid-record-run at a block's edge.
    path = shuffled_sets[compression]
    header = superserial.read_header(path)
    files = [os.path.join(path, s.file) for s in header.shards]
    whole = ssnp.load(path)
    for k, start, count in [(0, 1, 5), (0, 100, 67), (1, 37, 129), (2, 165, 1), (2, 0, 80)]:
        part = ssnp.NumpyDataset(path, header, [files[k]], [count], starts=[start])
        first = sum(s.records for s in header.shards[:k]) + start
        got = [int(e["i"]) for e in part]
        assert got == list(range(first, first + count))
        batches = list(part.batches(32))
        assert np.concatenate([b["v"] for b in batches]).tolist() == [
            whole[i]["v"].tolist() for i in range(first, first + count)
        ]


def test_a_damaged_block_past_the_start_is_a_clear_error(tmp_path: Path) -> None:
    ids = np.arange(400, dtype=np.int64)
    path = _save(
        tmp_path / "gz",
        tf.data.Dataset.from_tensor_slices({"i": ids, "v": np.repeat(ids[:, None], 5, 1)}),
        spacing=300,
        compression="GZIP",
    )
    file, table = _table(path)
    raw = bytearray(Path(file).read_bytes())
    j = len(table.packed) // 2
    raw[int(table.packed[j]) + 2] ^= 0xFF
    Path(file).write_bytes(bytes(raw))
    header = superserial.read_header(path)
    start = int(table.first[1])
    part = ssnp.NumpyDataset(path, header, [file], [400 - start], starts=[start])
    with pytest.raises(CorruptDataError, match=re.escape(file)):
        list(part)


@pytest.mark.timeout(180)
def test_torch_workers_split_compressed_shards_by_records(shuffled_sets: dict[str, str]) -> None:
    torch = pytest.importorskip("torch")
    from superserial.torch import TorchDataset, collate

    path = shuffled_sets["ZLIB"]  # 3 shards: rank 1 has one, split between its 2 workers
    assert TorchDataset(path, rank=1, world_size=2).parts_for(1, 2) == [(1, 83, 84)]
    assert TorchDataset(path, rank=0, world_size=4).parts_for(0, 1) == [(0, 0, 125)]
    seen: list[int] = []
    for rank in range(2):
        ds = TorchDataset(path, rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2, collate_fn=collate)
        for b in loader:
            assert (b["v"] == b["i"][:, None]).all()
            seen.extend(b["i"].tolist())
    assert sorted(seen) == list(range(500))

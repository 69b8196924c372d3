"""The numpy encoder of fixed-shape numeric leaves writes the graph encoder's bytes exactly."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from superserial.codec import numpy_encode, tf_records
from superserial.codec.tf_spec import from_element_spec
from superserial.format.framing import frame_records, read_records
from superserial.format.structure import iter_leaves

rng = np.random.default_rng(7)
N = 40

CASES: dict[str, dict[str, Any]] = {
    # every record the same length: the [B, size] layout
    "uniform": {
        "image": rng.random((N, 4, 4, 3), dtype=np.float32),
        "label": rng.integers(0, 10, N).astype(np.int32),
    },
    # varints of every length, negative ints (10 bytes), payloads wider than a scatter
    "varying": {
        "a": rng.integers(-(2**63), 2**63 - 1, (N, 3)),
        "b": rng.integers(-300, 300, N).astype(np.int16),
        "g": rng.integers(0, 2**32 - 1, (N, 2), dtype=np.uint32),
        "h": rng.integers(0, 255, (N, 100), dtype=np.uint8),
        "i": np.full(N, -1, np.int8),
        "wide": rng.integers(0, 2**40, (N, 300)),
    },
    # every raw dtype and bool; NaN payloads kept bit for bit
    "dtypes": {
        "f64": rng.standard_normal((N, 2)),
        "f16": rng.standard_normal(N).astype(np.float16),
        "bf16": rng.standard_normal((N, 3)).astype(ml_dtypes.bfloat16),
        "c64": (rng.standard_normal(N) + 1j).astype(np.complex64),
        "c128": rng.standard_normal((N, 1)) * 1j,
        "u64": rng.integers(0, 2**64 - 1, N, dtype=np.uint64),
        "u16": rng.integers(0, 2**16 - 1, N, dtype=np.uint16),
        "flag": rng.random(N) > 0.5,
        "nan": np.full(N, 0x7FA00001, np.uint32).view(np.float32),  # a signalling NaN
    },
    # strings: empty, with NULs, long (a 2-byte varint length), several per element
    "strings": {
        "id": np.array([b"", b"a\x00", b"x" * 200, *[b"id-%d" % i for i in range(N - 3)]], object),
        "pair": np.array([[b"\x00" * (i % 3), b"q" * i] for i in range(N)], object),
        "none": np.zeros((N, 0), object).astype(bytes),
        "y": rng.integers(0, 1000, N),
    },
    # zero-size leaves of each encoding
    "empty": {
        "f": np.zeros((N, 0), np.float32),
        "i": np.zeros((N, 2, 0), np.int64),
        "r": np.zeros((N, 0), np.float64),
        "x": np.arange(N, dtype=np.int64),
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["padded", "scattered"])
def test_numpy_encoder_bytes_equal_graph_encoder(case: str, layout: str, monkeypatch: Any) -> None:
    if layout == "scattered":
        # No slack for padding: records of varying size are placed one column at a time.
        monkeypatch.setattr(numpy_encode, "_PAD_SLACK", -(1 << 40))
    ds = tf.data.Dataset.from_tensor_slices(CASES[case])
    leaves = tuple(iter_leaves(from_element_spec(ds.element_spec)))
    assert numpy_encode.encodable(leaves)
    graph = b"".join(frame_records(r, s) for r, s in tf_records.record_batches(ds, leaves))
    parts, all_sizes = [], []
    for batch in ds.batch(17):  # batches of 17, 17 and 6
        framed, sizes = numpy_encode.frame_batch(
            leaves, [t.numpy() for t in tf.nest.flatten(batch)]
        )
        parts.append(framed.tobytes())
        all_sizes += sizes.tolist()
    assert b"".join(parts) == graph
    assert sum(all_sizes) + 16 * N == len(graph)
    framed_via_encoder = b"".join(f.tobytes() for f, _ in tf_records.framed_batches(ds, leaves))
    assert framed_via_encoder == graph


def test_not_encodable_leaves_go_through_the_graph(tmp_path: Any) -> None:
    ds = tf.data.Dataset.from_tensor_slices(
        {"s": [b"a", b"bc\x00"], "r": tf.ragged.constant([[1], [2, 3]])}
    )
    leaves = tuple(iter_leaves(from_element_spec(ds.element_spec)))
    assert not numpy_encode.encodable(leaves)
    graph = b"".join(frame_records(r, s) for r, s in tf_records.record_batches(ds, leaves))
    framed = b"".join(f.tobytes() for f, _ in tf_records.framed_batches(ds, leaves))
    assert framed == graph
    path = tmp_path / "f.tfrecord"
    path.write_bytes(framed)
    assert len(list(read_records(str(path)))) == 2

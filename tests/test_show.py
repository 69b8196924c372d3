"""Seeing the data: `superserial show` image grids, `to_pandas`, and the notebook view.

Real datasets saved with TensorFlow; grids decoded back from PNG with Pillow and
their tiles compared pixel for pixel with the saved images.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from PIL import Image

import superserial
import superserial.numpy as ssnp
from conftest import run_without
from superserial.cli.main import cli

RNG = np.random.default_rng(15)
N = 7


def _save(path: Any, data: Any, **kwargs: Any) -> str:
    superserial.save(tf.data.Dataset.from_tensor_slices(data), str(path), progress=False, **kwargs)
    return str(path)


def _png(path: Any) -> Image.Image:
    with open(path, "rb") as f:
        image = Image.open(io.BytesIO(f.read()))
        image.load()
    return image


def _tile(png: Image.Image, box: tuple[int, int, int, int]) -> np.ndarray:
    return np.asarray(png.crop(box))


def _up(a: np.ndarray, k: int) -> np.ndarray:
    return np.repeat(np.repeat(a, k, axis=0), k, axis=1)


def _scaled(images: np.ndarray) -> np.ndarray:
    """What the grid promises for non-uint8 images: min/max of the shown ones -> 0..255."""
    x = images.astype(np.float64)
    lo, hi = x.min(), x.max()
    return np.rint((x - lo) * (255.0 / (hi - lo))).astype(np.uint8)


# (name, images, compression): gray, gray with a channel, RGB, RGBA, float, GZIP.
CASES = {
    "gray": (RNG.integers(0, 256, [N, 8, 6], dtype=np.uint8), None),
    "gray1": (RNG.integers(0, 256, [N, 5, 9, 1], dtype=np.uint8), None),
    "rgb": (RNG.integers(0, 256, [N, 28, 28, 3], dtype=np.uint8), None),
    "rgba": (RNG.integers(0, 256, [N, 4, 4, 4], dtype=np.uint8), "GZIP"),
    "float": (RNG.normal(3.0, 2.0, [N, 8, 8]).astype(np.float32), None),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("show")
    out = {}
    for name, (images, compression) in CASES.items():
        data = {"image": images, "label": np.arange(N, dtype=np.int64) * 10}
        out[name] = _save(root / name, data, compression=compression)
    out["several"] = _save(
        root / "several",
        {"a": CASES["gray"][0], "b": CASES["float"][0], "label": np.arange(N)},
    )
    out["none"] = _save(
        root / "none",
        {
            "counts": RNG.integers(0, 9, [N, 8, 8]),
            "vec": RNG.normal(size=[N, 5]),
            "y": np.arange(N),
        },
    )
    out["empty"] = _save(root / "empty", {"image": np.zeros([0, 8, 8], np.uint8)})
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_grid_tiles_are_the_saved_pixels(saved: dict[str, str], case: str, tmp_path: Any) -> None:
    images, _ = CASES[case]
    grid = superserial.show(saved[case], n=5, columns=3)
    grid.save(tmp_path / "grid.png")
    png = _png(tmp_path / "grid.png")
    assert png.size == grid.image.size
    assert png.mode == {1: "L", 3: "RGB", 4: "RGBA"}[images.shape[3] if images.ndim == 4 else 1]
    h, w = images.shape[1:3]
    k = grid.scale
    assert k == max(1, 64 // max(h, w))
    assert png.size[0] == 4 + 3 * (max(w * k, 48) + 4)  # 3 columns of cells, 4-pixel gaps
    assert grid.indices == [0, 1, 2, 3, 4]
    assert (grid.leaf, grid.label) == ("image", "label")
    want = images[:5] if images.dtype == np.uint8 else _scaled(images[:5])
    if want.ndim == 4 and want.shape[3] == 1:
        want = want[..., 0]
    for i, box in enumerate(grid.boxes):
        assert box[2] - box[0] == w * k and box[3] - box[1] == h * k
        np.testing.assert_array_equal(_tile(png, box), _up(want[i], k), err_msg=f"tile {i}")
    if images.dtype == np.uint8:
        assert grid.scaling is None
    else:
        shown = images[:5].astype(np.float64)
        assert (grid.scaling.low, grid.scaling.high) == (shown.min(), shown.max())


def test_variable_sizes_and_a_named_integer_leaf(tmp_path: Any) -> None:
    sizes = [(3, 5), (6, 2), (4, 4)]
    pics = [RNG.integers(-300, 300, s).astype(np.int16) for s in sizes]
    gen = tf.data.Dataset.from_generator(
        lambda: iter(pics), output_signature=tf.TensorSpec([None, None], tf.int16)
    )
    path = str(tmp_path / "var2")
    superserial.save(gen, path, progress=False)
    with pytest.raises(ValueError, match=r"found none.*value int16\[None, None\].*integer leaf"):
        superserial.show(path)
    grid = superserial.show(path, image="value", scale=3)
    png = grid.image
    lo = min(int(p.min()) for p in pics)
    hi = max(int(p.max()) for p in pics)
    for p, box in zip(pics, grid.boxes, strict=True):
        want = np.rint((p.astype(np.float64) - lo) * (255.0 / (hi - lo))).astype(np.uint8)
        np.testing.assert_array_equal(_tile(png, box), _up(want, 3))
    assert (grid.scaling.dtype, grid.scaling.low, grid.scaling.high) == ("int16", lo, hi)


def test_cli_writes_the_grid_and_prints_the_scaling(saved: dict[str, str], tmp_path: Any) -> None:
    out = tmp_path / "g.png"
    run = CliRunner().invoke(cli, ["show", saved["float"], "-o", str(out), "-n", "4"])
    assert run.exit_code == 0, run.output
    lo, hi = CASES["float"][0][:4].min(), CASES["float"][0][:4].max()
    assert f"scaled float32 [{float(lo):g}, {float(hi):g}] -> uint8 [0, 255]" in run.output
    run = CliRunner().invoke(cli, ["show", saved["rgb"], "-o", str(out), "-n", "2", "--json"])
    assert run.exit_code == 0, run.output
    facts = json.loads(run.output)
    png = _png(out)
    assert facts["size"] == list(png.size) and facts["scaling"] is None
    box = (4, 4, 4 + 28 * facts["scale"], 4 + 28 * facts["scale"])
    np.testing.assert_array_equal(_tile(png, box), _up(CASES["rgb"][0][0], facts["scale"]))


def test_auto_pick_lists_the_candidates(saved: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"found 2: a uint8\[8, 6\], b float32\[8, 8\]; name"):
        superserial.show(saved["several"])
    assert superserial.show(saved["several"], image="b", n=2).leaf == "b"
    with pytest.raises(ValueError, match=r"found none; the leaves: counts int64\[8, 8\], vec "):
        superserial.show(saved["none"])
    run = CliRunner().invoke(cli, ["show", saved["several"], "-o", "x.png"])
    assert run.exit_code == 1 and "found 2: a uint8[8, 6], b float32[8, 8]" in run.output


@pytest.mark.parametrize(
    ("image", "label", "why"),
    [
        ("label", None, r"got 'label' in .*: its shape is \[\], not \[H, W\]"),
        ("vec", None, r"got 'vec' in .*: its shape is \[5\]"),
        ("nope", None, r"expected the image leaf to name a leaf .* got 'nope'; the leaves: counts"),
        ("counts", "vec", r"expected the label leaf to be a dense scalar, got 'vec'"),
    ],
)
def test_a_named_leaf_that_cannot_serve(
    saved: dict[str, str], image: str, label: str | None, why: str
) -> None:
    path = saved["none"] if image != "label" else saved["gray"]
    with pytest.raises(ValueError, match=why):
        superserial.show(path, image=image, label=label)


def test_empty_dataset(saved: dict[str, str], tmp_path: Any) -> None:
    with pytest.raises(ValueError, match=r"expected elements to show, found none: .* 0 elements"):
        superserial.show(saved["empty"])
    run = CliRunner().invoke(cli, ["show", saved["empty"], "-o", str(tmp_path / "x.png")])
    assert run.exit_code == 1 and "0 elements" in run.output
    assert not (tmp_path / "x.png").exists()


def test_shuffle_with_a_seed_repeats(saved: dict[str, str]) -> None:
    path = saved["gray"]
    a = superserial.show(path, n=4, shuffle=True, seed=7)
    b = superserial.show(path, n=4, shuffle=True, seed=7)
    assert a.indices == b.indices == sorted(a.indices) and a.seed == 7
    assert (
        a.indices != list(range(4))
        or superserial.show(path, n=4, shuffle=True, seed=8).indices != a.indices
    )
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
    k = a.scale
    for i, box in zip(a.indices, a.boxes, strict=True):
        np.testing.assert_array_equal(_tile(a.image, box), _up(CASES["gray"][0][i], k))
    drawn = superserial.show(path, n=4, shuffle=True)
    assert isinstance(drawn.seed, int)
    assert superserial.show(path, n=4, shuffle=True, seed=drawn.seed).indices == drawn.indices
    run = CliRunner().invoke(cli, ["show", path, "-o", os.devnull, "-n", "4", "--shuffle"])
    seed = int(run.output.split("shuffled with seed ")[1].split()[0])
    again = superserial.show(path, n=4, shuffle=True, seed=seed)
    assert f"--seed {seed} repeats" in run.output and len(again.indices) == 4
    with pytest.raises(ValueError, match="expected shuffle=True with seed=3"):
        superserial.show(path, seed=3)


# ------------------------------------------------------------------ to_pandas, notebooks


@pytest.fixture(scope="module")
def table(tmp_path_factory: Any) -> tuple[str, dict[str, Any]]:
    n = 5
    src = {
        "image": RNG.integers(0, 256, [n, 6, 6, 3], dtype=np.uint8),
        "label": np.arange(n, dtype=np.int32),
        "score": RNG.normal(size=n).astype(np.float32),
        "meta": {"name": [b"a", b"<script>alert(1)</script>", b"\xff\x00", b"", b"e"]},
        "tokens": [[1, 2, 3], [4], [], [5, 6], [7]],
    }
    data = {**src, "tokens": tf.ragged.constant(src["tokens"], dtype=tf.int64)}
    data["words"] = tf.ragged.constant([[[1], [2, 3]], [], [[4]], [[5, 6], []], [[7]]])
    src["dense"] = RNG.normal(size=[n, 4]).astype(np.float32) * (RNG.random([n, 4]) < 0.4)
    data["sparse"] = tf.sparse.from_dense(src["dense"])
    src["half"] = np.array([0.5, -2, 3.25, 1e30, 0], dtype=tf.bfloat16.as_numpy_dtype)
    data["half"] = tf.constant(src["half"], tf.bfloat16)
    data["flag"] = src["flag"] = np.array([True, False, True, True, False])
    return _save(tmp_path_factory.mktemp("table") / "t", data), src


def test_to_pandas_equals_the_source(table: tuple[str, dict[str, Any]]) -> None:
    path, src = table
    df = ssnp.load(path).to_pandas()
    assert list(df.columns) == [
        *("flag", "half", "image", "label", "meta/name", "score", "sparse", "tokens", "words")
    ]
    assert len(df) == 5 and list(df.index) == [0, 1, 2, 3, 4]
    assert df["label"].dtype == np.int32 and df["label"].tolist() == src["label"].tolist()
    assert df["score"].dtype == np.float32
    assert np.array_equal(df["score"].to_numpy(), src["score"])
    assert df["meta/name"].tolist() == src["meta"]["name"]
    assert df["image"].dtype == object
    for i in range(5):
        assert np.array_equal(df["image"][i], src["image"][i])
        assert df["tokens"][i].tolist() == src["tokens"][i]
    assert [[r.tolist() for r in w.to_list()] for w in df["words"]][3] == [[5, 6], []]
    assert df["flag"].dtype == np.bool_ and df["flag"].tolist() == src["flag"].tolist()
    assert df["half"].dtype == np.float32  # bfloat16 widened exactly: pandas has no bfloat16
    assert df["half"].tolist() == src["half"].astype(np.float32).tolist()
    assert all(isinstance(x, ssnp.Sparse) for x in df["sparse"])
    np.testing.assert_array_equal(np.stack([x.to_dense() for x in df["sparse"]]), src["dense"])


def test_to_pandas_n_and_select(table: tuple[str, dict[str, Any]]) -> None:
    path, src = table
    ds = ssnp.load(path)
    df = ds.to_pandas(n=2, select=["meta", "label"])
    assert list(df.columns) == ["label", "meta/name"] and len(df) == 2
    assert df["meta/name"].tolist() == src["meta"]["name"][:2]
    assert list(ds.to_pandas(n=0).columns) == list(ds.to_pandas(n=99).columns)
    assert len(ds.to_pandas(n=0)) == 0 and len(ds.to_pandas(n=99)) == 5
    with pytest.raises(ValueError, match="expected n >= 0"):
        ds.to_pandas(n=-1)
    with pytest.raises(ValueError, match="nope"):
        ds.to_pandas(select=["nope"])


def test_repr_html_escapes_and_shows_thumbnails(table: tuple[str, dict[str, Any]]) -> None:
    path, _ = table
    page = ssnp.load(path)._repr_html_()
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count('<img src="data:image/png;base64,') == 5
    assert "5 elements" in page and "<td>ragged</td>" in page
    assert [f"<tr><th>{i}</th>" in page for i in range(6)] == [True] * 5 + [False]
    assert "int64[3] [1, 2, 3]" in page and "ragged int32 [[5, 6], []]" in page
    nnz = int(np.count_nonzero(table[1]["dense"][0]))
    assert f"sparse float32[4], {nnz} values" in page


def test_missing_extras_say_what_to_install(
    table: tuple[str, dict[str, Any]], tmp_path: Any
) -> None:
    path, _ = table
    run = run_without(
        ["PIL"],
        f"from superserial.cli.main import main; main(['show', {path!r}, '-o', {str(tmp_path / 'x.png')!r}])",
    )
    assert run.returncode == 1, run.stderr
    assert "pip install 'superserial[viz]'" in run.stderr
    run = run_without(
        ["PIL"],
        "import superserial.numpy as ssnp\n"
        f"page = ssnp.load({path!r})._repr_html_()\n"
        "assert '<img' not in page and 'uint8[6, 6, 3]' in page, page\n"
        "import superserial\n"
        f"superserial.show({path!r})",
    )
    assert "MissingDependencyError" in run.stderr and "superserial[viz]" in run.stderr, run.stderr
    assert "AssertionError" not in run.stderr
    run = run_without(
        ["pandas"], f"import superserial.numpy as ssnp; ssnp.load({path!r}).to_pandas()"
    )
    assert "pip install 'superserial[pandas]'" in run.stderr, run.stderr
    # The control: with Pillow there, the same program draws, without TensorFlow.
    run = run_without(
        ["tensorflow"],
        f"import superserial; superserial.show({path!r}).save({str(tmp_path / 'y.png')!r})",
    )
    assert run.returncode == 0, run.stderr
    assert _png(tmp_path / "y.png").mode == "RGB"


def test_hostile_captions_stay_under_their_tile(tmp_path: Any) -> None:
    # Multi-line and stacked-accent labels must not draw onto the tile below (one column).
    zalgo = "A" + "\u0301\u0308\u030a" * 20
    labels = [b"line\n" * 6, zalgo.encode(), "\u202e<script>".encode(), b"\xff\xfe" * 40]
    path = _save(tmp_path / "h", {"image": np.full([4, 6, 6], 200, np.uint8), "name": labels})
    grid = superserial.show(path, columns=1, scale=2)
    assert grid.label == "name"
    for box in grid.boxes:
        np.testing.assert_array_equal(_tile(grid.image, box), np.full([12, 12], 200, np.uint8))
    pixels = np.asarray(grid.image)
    assert (pixels[:, -4:] == 255).all()  # the margin right of the (truncated) captions
    for box in grid.boxes:  # the gap above each tile, under the caption before it
        assert (pixels[box[1] - 4 : box[1]] == 255).all()


def test_an_integer_and_a_string_scalar_caption_with_the_integer(tmp_path: Any) -> None:
    images = np.full([3, 4, 4], 100, np.uint8)
    names = [b"cat", b"dog", b"emu"]
    path = _save(tmp_path / "two", {"image": images, "label": np.arange(3) * 7, "name": names})
    grid = superserial.show(path)
    assert grid.label == "label"
    named = superserial.show(path, label="label")
    np.testing.assert_array_equal(np.asarray(grid.image), np.asarray(named.image))


def test_ambiguous_labels_are_listed_not_dropped(tmp_path: Any) -> None:
    data = {
        "image": np.full([3, 4, 4], 100, np.uint8),
        "id": np.arange(3),
        "label": np.arange(3) * 7,
        "name": [b"cat", b"dog", b"emu"],
    }
    path = _save(tmp_path / "three", data)
    grid = superserial.show(path)
    assert (grid.label, grid.label_choices) == (None, ["id", "label", "name"])
    run = CliRunner().invoke(cli, ["show", path, "-o", str(tmp_path / "g.png"), "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["label_choices"] == ["id", "label", "name"]
    assert "id, label, name; name one with --label LEAF" in run.stderr

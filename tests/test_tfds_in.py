"""TFDS-prepared directories in: a tiny builder prepared here (TFRecord and ArrayRecord
shards), converted, and compared element for element with what TFDS itself decodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

from click.testing import CliRunner  # noqa: E402

import superserial  # noqa: E402
import superserial.numpy as snp  # noqa: E402
from conftest import assert_same_dataset, run_without  # noqa: E402
from superserial.cli.main import cli  # noqa: E402
from superserial.errors import DatasetNotFoundError  # noqa: E402
from superserial.foreign.convert import detect_format  # noqa: E402
from superserial.foreign.sources.tfds import convert_tfds  # noqa: E402

FORMATS = ("tfrecord", "array_record")
LABELS = ["cat", "dog", "bird"]
TAGS = ["x", "y"]


def _example(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    h, w = 2 + i % 3, 3 + i % 2
    return {
        "image": rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
        "label": i % 3,
        "f16": np.array([i, 0.5], np.float16),
        "f64": i / 7,
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3) * i,
        "u8": 250 + i % 5,
        "b": i % 2 == 0,
        "seq": list(range(i % 4)),
        "seqseq": [[float(j)] * j for j in range(i % 3)],
        "seqdict": {
            "x": list(range(i % 3)),
            "y": [f"s{j}" for j in range(i % 3)],
            "tag": [j % 2 for j in range(i % 3)],
        },
        "text": f"héllo {i}",
        "nested": {"a": -i},
    }


class Tiny(tfds.core.GeneratorBasedBuilder):
    """Every feature kind the docs' table names, two splits."""

    VERSION = tfds.core.Version("1.2.0")
    SPLITS: ClassVar[dict[str, tuple[int, int]]] = {"train": (0, 7), "test": (7, 3)}

    def _info(self) -> Any:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(None, None, 3)),
                    "label": tfds.features.ClassLabel(names=LABELS),
                    "f16": tfds.features.Tensor(shape=(2,), dtype=np.float16),
                    "f64": tfds.features.Tensor(shape=(), dtype=np.float64),
                    "i32": tfds.features.Tensor(shape=(2, 3), dtype=np.int32),
                    "u8": tfds.features.Tensor(shape=(), dtype=np.uint8),
                    "b": tfds.features.Tensor(shape=(), dtype=np.bool_),
                    "seq": tfds.features.Sequence(np.int64),
                    "seqseq": tfds.features.Sequence(tfds.features.Sequence(np.float32)),
                    "seqdict": tfds.features.Sequence(
                        {
                            "x": np.int32,
                            "y": tfds.features.Text(),
                            "tag": tfds.features.ClassLabel(names=TAGS),
                        }
                    ),
                    "text": tfds.features.Text(),
                    "nested": {"a": np.int64},
                }
            ),
        )

    def _split_generators(self, dl_manager: Any) -> Any:
        return {name: self._generate_examples(*span) for name, span in self.SPLITS.items()}

    def _generate_examples(self, start: int, n: int) -> Any:
        for i in range(start, start + n):
            yield i, _example(i)


class TinyOne(Tiny):
    """One split only."""

    SPLITS: ClassVar[dict[str, tuple[int, int]]] = {"train": (0, 3)}


def _prepare(cls: type, root: Path, file_format: str) -> Any:
    builder = cls(data_dir=str(root / file_format))
    builder.download_and_prepare(download_dir=str(root / "downloads"), file_format=file_format)
    return tfds.builder_from_directory(builder.data_dir)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One prepared builder per file format (as read back from its directory)."""
    root = tmp_path_factory.mktemp("tfds")
    return {fmt: _prepare(Tiny, root, fmt) for fmt in FORMATS}


@pytest.fixture(scope="module")
def converted(
    prepared: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Any, str]]:
    """The train split of each format converted: (header, dataset path)."""
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for fmt, builder in prepared.items():
        path = str(root / fmt)
        # Through the dispatcher: an ArrayRecord TFDS directory is TFDS's, not array_record's.
        assert detect_format(builder.data_dir) == "tfds"
        header = superserial.convert(builder.data_dir, path, split="train", progress=False)
        out[fmt] = (header, path)
    return out


def _as_lists(x: Any) -> Any:
    """A value of the numpy reader or of a TFDS data source as plain nested lists."""
    if isinstance(x, dict):
        return {k: _as_lists(v) for k, v in x.items()}
    if isinstance(x, snp.Ragged):
        return _as_lists(x.to_list())
    if isinstance(x, list):
        return [_as_lists(v) for v in x]
    return np.asarray(x).tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_converted_as_tfds_decodes(
    prepared: dict[str, Any], converted: dict[str, tuple[Any, str]], fmt: str
) -> None:
    # TFDS reads only TFRecord shards into tf.data; both formats hold the same examples
    # in the same order, so its TFRecord decoding is the reference for both.
    expected = prepared["tfrecord"].as_dataset(split="train", shuffle_files=False)
    assert_same_dataset(expected, superserial.load(converted[fmt][1]))


def test_array_record_matches_the_data_source(
    prepared: dict[str, Any], converted: dict[str, tuple[Any, str]]
) -> None:
    source = prepared["array_record"].as_data_source(split="train")
    ds = snp.load(converted["array_record"][1])
    assert len(ds) == len(source) == 7
    for i in range(len(source)):
        assert _as_lists(ds[i]) == _as_lists(source[i]), f"element {i}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_metadata_keeps_class_names_and_source(
    converted: dict[str, tuple[Any, str]], fmt: str
) -> None:
    header, path = converted[fmt]
    on_disk = snp.load(path).header.metadata
    assert on_disk == header.metadata
    assert on_disk["class_names"] == {"label": LABELS, "seqdict/tag": TAGS}
    source = dict(on_disk["source"])
    assert source.pop("features")["type"].endswith("FeaturesDict")
    assert source == {
        "format": "tfds",
        "name": "tiny",
        "version": "1.2.0",
        "split": "train",
        "file_format": fmt,
    }
    leaves = {leaf.name: leaf for leaf in header.leaves}
    assert (leaves["image"].dtype, leaves["image"].shape) == ("uint8", (None, None, 3))
    assert (leaves["label"].dtype, leaves["label"].shape) == ("int64", ())
    assert (leaves["seqseq"].kind, leaves["seqseq"].shape) == ("ragged", (None, None))


def test_several_splits_need_split(prepared: dict[str, Any], tmp_path: Path) -> None:
    directory = prepared["tfrecord"].data_dir
    with pytest.raises(ValueError, match=r"expected split= .*'test', 'train'.*got none"):
        convert_tfds(directory, str(tmp_path / "a"))
    with pytest.raises(ValueError, match=r"'test', 'train'.*got 'valid'"):
        convert_tfds(directory, str(tmp_path / "b"), split="valid")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _cli(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_the_cli_takes_a_split(prepared: dict[str, Any], tmp_path: Path) -> None:
    directory = prepared["array_record"].data_dir
    result = _cli("-q", "convert", directory, "-o", tmp_path / "sliced", "--split", "test[:2]")
    assert result.exit_code == 0, result.output
    assert snp.load(str(tmp_path / "sliced")).header.element_count == 2
    result = _cli("convert", directory, "-o", tmp_path / "none", "--json")
    assert result.exit_code == 1, result.output
    assert "'test', 'train'" in json.loads(result.stdout)["error"]["message"]
    result = _cli(
        "convert", directory, "-o", tmp_path / "ar", "--from", "array_record", "--split", "x"
    )
    assert result.exit_code == 2 and "--split only for a hf or tfds source" in result.output
    assert not (tmp_path / "none").exists() and not (tmp_path / "ar").exists()


def test_the_only_split_needs_no_name(tmp_path: Path) -> None:
    one = _prepare(TinyOne, tmp_path, "tfrecord")
    header = convert_tfds(one.data_dir, str(tmp_path / "one"), progress=False)
    assert header.element_count == 3
    assert header.metadata["source"]["split"] == "train"


def test_not_a_tfds_directory(converted: dict[str, tuple[Any, str]], tmp_path: Path) -> None:
    _, superserial_dataset = converted["tfrecord"]
    assert detect_format(superserial_dataset) == "superserial"
    with pytest.raises(DatasetNotFoundError, match=r"features\.json and dataset_info\.json"):
        superserial.convert(superserial_dataset, str(tmp_path / "out"), source_format="tfds")
    assert not (tmp_path / "out").exists()


def test_without_tensorflow_the_tf_extra_is_named(prepared: dict[str, Any], tmp_path: Path) -> None:
    code = (
        "import superserial\n"
        "try:\n"
        "    superserial.convert(sys.argv[1], sys.argv[2], split='train')\n"
        "except superserial.MissingDependencyError as e:\n"
        "    print(e)\n"
    )
    proc = run_without(["tensorflow"], code, prepared["tfrecord"].data_dir, str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'superserial[tf]'" in proc.stdout
    assert not (tmp_path / "o").exists()

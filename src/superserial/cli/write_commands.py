"""The ``superserial`` subcommands that write a dataset: infer, upgrade, convert, append.

Registered on the command group by :mod:`superserial.cli.main`. TensorFlow is
imported inside the commands, so that ``superserial inspect`` stays TF-free, and
after the arguments are checked: a usage error is exit 2 with or without it, and
without it the command exits 1 saying which extra to install.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import numpy as np

from superserial import errors
from superserial.cli.common import (
    COMPRESSION,
    ByteSize,
    compression_arg,
    echo_json,
    global_options,
    handle_errors,
    json_option,
    progress,
    resolve,
)
from superserial.format.header import Header
from superserial.format.layout import check_target

__all__ = ["COMMANDS", "append_cmd", "convert", "infer", "upgrade"]

_GLOB_CHARS = frozenset("*?[")


# ------------------------------------------------------------------ infer


@click.command()
@global_options
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="The dataset directory to create.")
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=None,
    help="Infer from the first N records only (all records are still counted).",
)
@click.option(
    "--compression",
    type=click.Choice(["auto", "none", "GZIP", "ZLIB"], case_sensitive=False),
    default="auto",
    show_default=True,
    help="Compression of the input files.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing dataset at --output.")
@json_option
@handle_errors
def infer(
    inputs: tuple[str, ...],
    output: str,
    sample: int | None,
    compression: str,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Make a dataset of TFRecord files of tf.train.Example written elsewhere.

    Scans the records (all, or the first --sample N) for feature names, kinds
    and lengths, and writes a header: int64_list -> int64, float_list ->
    float32, bytes_list -> string; a length always 1 -> a scalar, always n ->
    shape [n], varying, sometimes missing or always empty -> a ragged leaf of
    shape [None].
    Names with "/" become nested dicts ("a/b" -> {"a": {"b": ...}}).

    The input files are COPIED into the output directory (as
    data-NNNNN-of-NNNNN.tfrecord, in the order given; globs sorted; record
    by record, so uncompressed files byte for byte, compressed ones
    compressed anew) and are never modified. All records are counted, also with --sample. A feature
    that is missing or of another length in a record that was not scanned
    makes loading fail at that record; one first seen there is ignored.
    Run `superserial verify` on the output to check every record.
    """
    from superserial.cli.render import infer_text
    from superserial.foreign.sources.infer import infer as infer_dataset

    if _GLOB_CHARS & set(output):
        raise click.BadParameter("expected a plain directory path", param_hint="--output")
    output = output.rstrip("/") or "/"
    header, report = infer_dataset(
        inputs,
        output,
        sample=sample,
        compression=compression,
        overwrite=overwrite,
        progress=progress(),
        overwrite_hint="--overwrite",
    )
    if as_json:
        echo_json(report.to_obj())
        return
    click.echo("\n".join(infer_text(output, header, report)))
    if report.note:
        click.echo(f"note: {report.note}", err=True)


# ------------------------------------------------------------------ upgrade / convert


def _legacy_pair(paths: tuple[str, ...]) -> tuple[str, str]:
    """(tfrecord, header) from one or two paths."""
    if len(paths) == 2:
        a, b = paths
        if a.endswith(".header") and not b.endswith(".header"):
            a, b = b, a
        return a, b
    if len(paths) == 1:
        p = paths[0]
        if p.endswith(".header"):
            return p[: -len(".header")] + ".tfrecord", p
        if p.endswith(".tfrecord"):
            return p, p[: -len(".tfrecord")] + ".header"
        raise click.BadParameter(
            f"expected NAME.header or NAME.tfrecord (or both), got {p!r}", param_hint="PATHS"
        )
    raise click.BadParameter(f"expected one or two paths, got {len(paths)}", param_hint="PATHS")


def _save_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("-o", "--output", required=True, help="The dataset directory to write."),
            click.option(
                "--num-shards",
                type=click.IntRange(min=1),
                default=None,
                help="Split into this many shard files.",
            ),
            click.option(
                "--shard-size",
                type=ByteSize(),
                default=None,
                help="Or start a new shard after about this many bytes (e.g. 64M).",
            ),
            click.option(
                "--overwrite", is_flag=True, help="Replace an existing dataset at --output."
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _one_split(num_shards: int | None, shard_size: int | None) -> None:
    if num_shards is not None and shard_size is not None:
        raise click.UsageError("expected --num-shards or --shard-size, got both")


_resume_option = click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run after its last complete shard (same arguments).",
)


def _tensorflow(command: str) -> None:
    """Says which extra to install when ``superserial COMMAND`` finds no TensorFlow."""
    errors.require(
        "tensorflow", extra="tf", needed_for=f"superserial {command}", package="TensorFlow"
    )


def _saved(header: Header, output: str, as_json: bool, what: str) -> None:
    from superserial.cli.render import saved_json, saved_text

    if as_json:
        echo_json(saved_json(header, output))
    else:
        click.echo(saved_text(header, output, what))


@click.command()
@global_options
@click.argument("paths", nargs=-1, required=True)
@_save_options
@click.option(
    "--compression",
    type=COMPRESSION,
    default="none",
    show_default=True,
    help="Compression of the new dataset.",
)
@_resume_option
@json_option
@handle_errors
def upgrade(
    paths: tuple[str, ...],
    output: str,
    num_shards: int | None,
    shard_size: int | None,
    overwrite: bool,
    compression: str,
    resume: bool,
    as_json: bool,
) -> None:
    """Turn a super_serial 2.0 pair (NAME.tfrecord + NAME.header) into a dataset.

    PATHS is NAME.header or NAME.tfrecord (the other is found beside it) or
    both. The YAML header is read safely; dtypes are restored from it.
    """
    _one_split(num_shards, shard_size)
    tfrecord, header_path = _legacy_pair(paths)
    _tensorflow("upgrade")
    import tensorflow as tf

    from superserial.tf.legacy import load_legacy
    from superserial.tf.save import save

    check_target(output, overwrite, hint="--overwrite")  # save's own hint is overwrite=True
    ds = load_legacy(tfrecord, header_path)
    count = int(tf.data.TFRecordDataset(tfrecord).reduce(np.int64(0), lambda n, _: n + 1))
    ds = ds.apply(tf.data.experimental.assert_cardinality(count))
    header = save(
        ds,
        output,
        compression=compression_arg(compression),
        num_shards=num_shards,
        shard_size=shard_size,
        overwrite=overwrite,
        progress=progress(),
        resume=resume,
    )
    _saved(header, output, as_json, "upgraded to")


# The sources made of named splits, of which --split picks one.
_SPLIT_FORMATS = ("hf", "tfds")


@click.command()
@global_options
@click.argument("source")
@_save_options
@click.option(
    "--from",
    "source_format",
    default=None,
    metavar="FORMAT",
    help="The source's format, where it is not detected (superserial, parquet, hf, webdataset, ...).",
)
@click.option(
    "--split",
    default=None,
    metavar="NAME",
    help="The split of a Hugging Face DatasetDict directory or a TFDS directory (TFDS: "
    "'train[:10%]' too); needed where it has several.",
)
@click.option(
    "--compression",
    type=click.Choice(["keep", "none", "GZIP", "ZLIB"], case_sensitive=False),
    default="keep",
    show_default=True,
    help="Compression of the new dataset (keep: a superserial source's; others: none).",
)
@_resume_option
@json_option
@handle_errors
def convert(
    source: str,
    output: str,
    num_shards: int | None,
    shard_size: int | None,
    overwrite: bool,
    source_format: str | None,
    split: str | None,
    compression: str,
    resume: bool,
    as_json: bool,
) -> None:
    """Convert SOURCE into a new dataset: Parquet, Hugging Face, WebDataset, TFDS, ArrayRecord...

    The format is detected (a directory with header.json: a superserial
    dataset, re-sharded or re-compressed through TensorFlow; *.parquet files, a
    directory of them or a glob: Parquet; a save_to_disk directory: Hugging
    Face; .tar files, a brace pattern such as 'shards-{000..009}.tar' or a
    directory of them: WebDataset; a TFDS-prepared directory (features.json,
    dataset_info.json): decoded by TFDS, TensorFlow needed; *.array_record files
    of tf.train.Example: inferred and copied as `infer` copies TFRecord files),
    or named with --from; --split names the split of a Hugging Face DatasetDict
    or a TFDS directory. Types are kept exactly or refused: nulls and types superserial
    cannot keep exit 1 naming the column (and row), with nothing written (see
    docs/convert.md). A superserial source keeps its shard count (the records
    split evenly) unless --num-shards or --shard-size is given. The source is
    left untouched; the output cannot be the source itself.
    """
    _one_split(num_shards, shard_size)
    if resolve(source.rstrip("/") or "/") == resolve(output.rstrip("/") or "/"):
        raise click.BadParameter(
            "expected an output directory other than the source", param_hint="--output"
        )
    from superserial.foreign.convert import convert as convert_source
    from superserial.foreign.convert import detect_format, format_names

    if source_format is not None and source_format not in format_names():
        raise click.BadParameter(
            f"expected one of {', '.join(format_names())}, got {source_format!r}",
            param_hint="--from",
        )
    name = source_format or detect_format(source)
    if resume and name != "superserial":
        raise click.UsageError(f"expected --resume only for a superserial source, got {name}")
    if split is not None and name not in _SPLIT_FORMATS:
        raise click.UsageError(
            f"expected --split only for a {' or '.join(_SPLIT_FORMATS)} source, got {name}"
        )
    if name == "superserial":
        _tensorflow("convert")
    check_target(output, overwrite, hint="--overwrite")  # save's own hint is overwrite=True
    options: dict[str, Any] = {
        "num_shards": num_shards,
        "shard_size": shard_size,
        "overwrite": overwrite,
        "progress": progress(),
    }
    if compression.lower() != "keep":
        options["compression"] = compression_arg(compression)
    if split is not None:
        options["split"] = split
    if name == "superserial":
        options["resume"] = resume
    else:
        options["overwrite_hint"] = "--overwrite"
    header = convert_source(source, output, source_format=name, **options)
    _saved(header, output, as_json, "converted to")


# ------------------------------------------------------------------ append


@click.command("append")
@global_options
@click.argument("source")
@click.argument("dest")
@click.option(
    "--num-shards",
    type=click.IntRange(min=1),
    default=None,
    help="Split the new elements into this many shard files.",
)
@click.option(
    "--shard-size",
    type=ByteSize(),
    default=None,
    help="Or start a new shard after about this many bytes (e.g. 64M).",
)
@click.option(
    "--resume", is_flag=True, help="Continue an interrupted append after its last complete shard."
)
@json_option
@handle_errors
def append_cmd(
    source: str,
    dest: str,
    num_shards: int | None,
    shard_size: int | None,
    resume: bool,
    as_json: bool,
) -> None:
    """Append the elements of the dataset SOURCE after those of the dataset DEST.

    SOURCE is loaded and its elements are written as new shards of DEST,
    in DEST's compression; DEST's existing files are not changed, and its
    header.json is replaced last, atomically (an interrupted append leaves
    DEST as it was). The element specs must match: otherwise exit 1, naming
    the first leaf that differs, with nothing changed. SOURCE is not touched.
    """
    _one_split(num_shards, shard_size)
    if resolve(source.rstrip("/") or "/") == resolve(dest.rstrip("/") or "/"):
        raise click.BadParameter("expected a DEST other than SOURCE", param_hint="DEST")
    _tensorflow("append")
    from superserial.cli.render import saved_json, saved_text
    from superserial.format.layout import read_header
    from superserial.tf.append import append, refuse_legacy
    from superserial.tf.load import load

    refuse_legacy(source, "appended from")
    before = read_header(dest).element_count
    header = append(
        load(source),
        dest,
        num_shards=num_shards,
        shard_size=shard_size,
        progress=progress(),
        resume=resume,
    )
    added = header.element_count - before
    if as_json:
        echo_json({"appended": added, "source": source, **saved_json(header, dest)})
    else:
        click.echo(saved_text(header, dest, f"appended {added:,} element(s) from {source} to"))


COMMANDS = (infer, upgrade, convert, append_cmd)

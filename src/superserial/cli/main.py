"""The ``superserial`` command line (also ``python -m superserial``).

Subcommands:

* ``inspect PATH``: the header: structure, leaves, counts, shards. Reads no
  records and does not import TensorFlow.
* ``head PATH -n N``: the first N elements, printed readably.
* ``verify PATH``: reads and decodes everything, checks it against the header.
* ``index PATH``: gives every shard a record index (random access), in place;
  ``--export tfindex`` writes the ``offset length`` indexes other tools read.
* ``export PATH -o OUT``: the dataset as Parquet (``--to webdataset``: tar shards).
* ``show PATH -o grid.png``: a PNG grid of image-like leaves, captioned.
* ``infer FILE_OR_GLOB... -o DIR``: makes a dataset of foreign TFRecord files
  of ``tf.train.Example`` records by scanning them and writing a header.
* ``upgrade OLD.header -o DIR``: a super_serial 2.0 pair to a dataset.
* ``convert PATH -o DIR``: re-shard or re-compress a dataset.
* ``append SOURCE DEST``: adds the elements of one dataset after another's.
* ``stats PATH``: per-leaf statistics in one streaming pass (``--plot`` a PNG).

The reading commands live here, the writing ones (infer, upgrade, convert,
append) in :mod:`superserial.cli.write_commands`, the shared plumbing in
:mod:`superserial.cli.common`.

Every subcommand takes ``--json`` (machine-readable output on stdout) and
``--help``. Exit codes: 0 success, 1 a problem with the data or files
(missing, corrupt, invalid; the message goes to stderr, and with ``--json``
also an ``{"ok": false, "error": ...}`` object to stdout), 2 a usage error.
"""

from __future__ import annotations

import json
import os
import sys

import click
import numpy as np

from superserial._version import __version__
from superserial.cli import write_commands
from superserial.cli.common import (
    ByteSize,
    console,
    echo_json,
    global_options,
    handle_errors,
    json_option,
    progress,
)

__all__ = ["ByteSize", "cli", "main"]


# ------------------------------------------------------------------ group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="superserial")
@global_options
def cli() -> None:
    """Save any tf.data.Dataset to TFRecord files and load it back exactly.

    -q and -v work before or after the subcommand. Exit codes: 0 success,
    1 a problem with the data or files, 2 a usage error.
    """
    # TensorFlow's C++ warnings drown the output; keep errors, which raise anyway.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> None:
    """Runs the command line; the ``superserial`` console script."""
    cli.main(args=argv, prog_name="superserial")


# ------------------------------------------------------------------ inspect

_SHOWN_SHARDS = 20


@cli.command()
@global_options
@click.argument("path")
@click.option(
    "--all-shards",
    is_flag=True,
    help=f"List every shard (default: the first {_SHOWN_SHARDS}).",
)
@json_option
@handle_errors
def inspect(path: str, all_shards: bool, as_json: bool) -> None:
    """Show a dataset's header: structure, leaves, element count, shards.

    Reads only PATH/header.json, no records.
    """
    from superserial.cli import render
    from superserial.format.layout import read_header

    header = read_header(path)
    if as_json:
        obj = json.loads(header.to_json())
        echo_json({"path": path, "total_bytes": header.total_bytes, "header": obj})
        return
    con = console()
    click.echo(render.header_summary(path, header))
    con.print(render.structure_tree(header.structure, "structure"))
    con.print(render.leaves_table(header))
    limit = None if all_shards else _SHOWN_SHARDS
    con.print(render.shards_table(header, limit))
    hidden = len(header.shards[limit:]) if limit is not None else 0
    if hidden:
        click.echo(f"  ... and {hidden} more (--all-shards)")


# ------------------------------------------------------------------ head


@cli.command()
@global_options
@click.argument("path")
@click.option(
    "-n",
    "--num",
    "n",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many elements.",
)
@click.option(
    "--threshold",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Summarize arrays of more values than this (numpy printoptions threshold).",
)
@click.option(
    "--edgeitems",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Values shown at each end of a summarized array.",
)
@json_option
@handle_errors
def head(path: str, n: int, threshold: int, edgeitems: int, as_json: bool) -> None:
    """Print the first N elements of a dataset, leaf by leaf.

    Arrays are summarized with numpy's printoptions; strings print as Python
    bytes literals. With --json, values are given in full as nested lists,
    each leaf value on one line:
    strings that are valid UTF-8 as JSON strings, other strings as
    {"base64": "..."}, non-finite floats as "nan"/"inf"/"-inf", complex
    numbers as [re, im]. Needs no TensorFlow.
    """
    from superserial.cli.render import first_elements, leaf_json, leaf_text
    from superserial.read.opening import open_dataset

    opened = open_dataset(path)
    header = opened.header
    leaves = header.leaves
    out = []
    with np.printoptions(threshold=threshold, edgeitems=edgeitems, linewidth=100):
        for i, flat in enumerate(first_elements(opened.files, header, n)):
            if as_json:
                out.append(
                    {
                        "index": i,
                        "leaves": {
                            leaf.name: leaf_json(leaf, x)
                            for leaf, x in zip(leaves, flat, strict=True)
                        },
                    }
                )
                continue
            click.echo(f"element {i}")
            for leaf, x in zip(leaves, flat, strict=True):
                click.echo(f"  {leaf.name}: {leaf_text(leaf, x, edgeitems)}")
    if as_json:
        echo_json({"path": path, "elements": out})


# ------------------------------------------------------------------ verify


@cli.command("verify")
@global_options
@click.argument("path")
@json_option
@handle_errors
def verify_cmd(path: str, as_json: bool) -> None:
    """Read every record of every shard and check it against the header.

    Checks each shard's size, whole-file CRC-32C, record framing CRCs and
    record count, then decodes every element. Exits 1 if anything is wrong,
    naming the file, and where known the record index and the leaf.
    """
    from superserial.inspect.verify import verify

    report = verify(path, progress=progress())
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(report.summary())
    if not report.ok:
        n = len(report.problems)
        click.echo(
            f"error: {path} failed verification, {n} problem(s); first: {report.problems[0]}",
            err=True,
        )
        sys.exit(1)


# ------------------------------------------------------------------ index


@cli.command("index")
@global_options
@click.argument("path")
@click.option(
    "--export",
    "export_as",
    type=click.Choice(["tfindex"]),
    default=None,
    help="Instead, write an index other tools read: tfindex, the 'offset length' lines of "
    "vahidk/tfrecord and NVIDIA DALI, one .tfindex file per shard.",
)
@click.option(
    "-o",
    "--output",
    default=None,
    help="With --export: the directory for the index files (default: next to the shards).",
)
@json_option
@handle_errors
def index_cmd(path: str, export_as: str | None, output: str | None, as_json: bool) -> None:
    """Give every shard of a dataset a record index (random access), in place.

    For datasets written before indexes existed, or whose index is missing or
    damaged. Reads every shard and checks it against the header first: a
    mismatch exits 1 with nothing changed. Writes the missing indexes, then
    replaces header.json atomically; valid ones are kept, so running it again
    changes nothing. Compressed shards cannot be indexed (exit 1).

    With --export tfindex, writes DATA.tfindex for every shard instead (from the
    shard's record index, or a scan where it has none); the dataset is unchanged.
    """
    if export_as is not None:
        from superserial.foreign.tfindex import export_tfindex

        done = export_tfindex(path, output, progress=progress())
        if as_json:
            echo_json({"ok": True, "path": done.path, "files": list(done.files)})
        else:
            for file in done.files:
                click.echo(f"  wrote {file}")
            click.echo(f"{len(done.files)} tfindex file(s) for {done.path}")
        return
    if output is not None:
        raise click.UsageError("-o/--output goes with --export")
    from superserial.cli.render import index_json, index_text
    from superserial.write.indexes import index_dataset

    result = index_dataset(path, progress=progress())
    if as_json:
        echo_json(index_json(result))
    else:
        click.echo(index_text(result))


# ------------------------------------------------------------------ export


@cli.command("export")
@global_options
@click.argument("path")
@click.option("-o", "--output", required=True, help="The Parquet file or WebDataset directory.")
@click.option(
    "--to",
    "to",
    type=click.Choice(["parquet", "webdataset"]),
    default="parquet",
    show_default=True,
    help="parquet: one file, a row group per batch; webdataset: tar shards in a directory.",
)
@click.option(
    "--select", "select", multiple=True, metavar="LEAF", help="Only this leaf (repeatable)."
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Parquet: rows per row group (default: about 64 MiB of records).",
)
@click.option(
    "--shard-size",
    type=ByteSize(),
    default="1GB",
    show_default=True,
    help="WebDataset: bytes per tar shard, about.",
)
@click.option("--overwrite", is_flag=True, help="Replace what is at --output.")
@json_option
@handle_errors
def export_cmd(
    path: str,
    output: str,
    to: str,
    select: tuple[str, ...],
    batch_size: int | None,
    shard_size: int,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Write a dataset for other tools: one Parquet file, or WebDataset tar shards.

    Parquet columns are the leaves (dicts as structs, arrays as fixed-size lists,
    ragged as lists; the Arrow schema a conversion kept restored). WebDataset: a
    sample per element keyed by its zero-padded index, a member per leaf (.cls
    integer scalars, .bin string scalars, .npy arrays). Written under a temporary
    name and renamed last: a failed export leaves nothing that looks complete.
    Needs no TensorFlow.
    """
    from superserial.foreign.export import export

    done = export(
        path,
        output,
        to=to,
        select=list(select) or None,
        batch_size=batch_size,
        shard_size=shard_size,
        overwrite=overwrite,
        progress=progress(),
    )
    rate = done.bytes / 1e6 / max(done.seconds, 1e-9)
    if as_json:
        echo_json(
            {
                "ok": True,
                "output": done.output,
                "files": list(done.files),
                "elements": done.elements,
                "bytes": done.bytes,
                "seconds": round(done.seconds, 3),
            }
        )
    else:
        click.echo(
            f"exported {done.elements} element(s) to {done.output} ({len(done.files)} file(s), "
            f"{done.bytes / 1e6:,.1f} MB in {done.seconds:.1f} s, {rate:,.1f} MB/s)"
        )


# ------------------------------------------------------------------ show


@cli.command("show")
@global_options
@click.argument("path")
@click.option("-o", "--output", required=True, help="The PNG file to write (path or URL).")
@click.option(
    "-n",
    "--num",
    "n",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="How many images.",
)
@click.option("--image", help="The image leaf (default: the one image-like leaf).")
@click.option(
    "--label",
    help="The caption's label leaf (default: the one int/string scalar, else the one int).",
)
@click.option("--shuffle", is_flag=True, help="A random sample of elements, not the first N.")
@click.option("--seed", type=click.IntRange(min=0), help="The sample's seed (with --shuffle).")
@click.option("--columns", type=click.IntRange(min=1), help="Tiles per row [default: sqrt(N)].")
@click.option("--scale", type=click.IntRange(min=1), help="Upscale tiles by this integer.")
@json_option
@handle_errors
def show_cmd(
    path: str,
    output: str,
    n: int,
    image: str | None,
    label: str | None,
    shuffle: bool,
    seed: int | None,
    columns: int | None,
    scale: int | None,
    as_json: bool,
) -> None:
    """Write a PNG grid of N images of a dataset, captioned "index: label".

    Image-like leaves: dense uint8 or float (integer when named with --image),
    shape [H, W], [H, W, 1], [H, W, 3] or [H, W, 4]. Non-uint8 values are
    scaled from the min/max of the shown images to 0..255 (printed). Tiles are
    exact pixels, upscaled by an integer factor. Needs superserial[viz]
    (Pillow), no TensorFlow.
    """
    from superserial.inspect.grid import show

    if seed is not None and not shuffle:
        raise click.UsageError("--seed needs --shuffle")
    grid = show(
        path,
        n=n,
        image=image,
        label=label,
        shuffle=shuffle,
        seed=seed,
        columns=columns,
        scale=scale,
    )
    grid.save(output)
    if grid.label_choices:
        click.echo(
            f"note: no label picked, {len(grid.label_choices)} leaves could be one: "
            f"{', '.join(grid.label_choices)}; name one with --label LEAF",
            err=True,
        )
    if as_json:
        echo_json({"output": output, **grid.to_dict()})
        return
    width, height = grid.image.size
    click.echo(
        f"wrote {output}: {len(grid.indices)} image(s) of {grid.leaf}, "
        f"labels {grid.label or '(none)'}, {width}x{height} pixels, tiles x{grid.scale}"
    )
    if grid.scaling is not None:
        click.echo(f"scaled {grid.scaling}")
    if grid.seed is not None:
        click.echo(f"shuffled with seed {grid.seed} (--seed {grid.seed} repeats this sample)")


# ------------------------------------------------------------------ stats


@cli.command("stats")
@global_options
@click.argument("path")
@click.option(
    "--select",
    "select",
    multiple=True,
    metavar="LEAF",
    help="Only this leaf or inner node (repeatable; names as inspect prints them).",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Also write a PNG with a small panel per leaf (needs superserial[viz]).",
)
@json_option
@handle_errors
def stats_cmd(path: str, select: tuple[str, ...], plot: str | None, as_json: bool) -> None:
    """Statistics of every leaf, in one streaming pass over every element.

    Numbers: count, min, max, mean, std, NaN/inf/zero counts and an exact
    histogram; integer scalars: value counts (up to 1000 distinct values);
    strings: lengths and the most frequent values (Misra-Gries, marked
    approximate when it is); ragged and varying dimensions: their sizes;
    sparse: stored values per element. Needs no TensorFlow.
    """
    from superserial.inspect.stats import stats
    from superserial.views import viz

    if plot is not None:
        viz.require("matplotlib")  # before the pass, not after it
    result = stats(path, select=list(select) or None)
    if plot is not None:
        result.plot(plot)
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(result.text())
    if plot is not None:
        click.echo(f"plot: {plot}")


for _command in write_commands.COMMANDS:
    cli.add_command(_command)

"""The ``superserial`` command line (also ``python -m superserial``).

Subcommands:

* ``inspect PATH``: the header: structure, leaves, counts, shards. Reads no
  records and does not import TensorFlow.
* ``head PATH -n N``: the first N elements, printed readably.
* ``verify PATH``: reads and decodes everything, checks it against the header.
* ``index PATH``: gives every shard a record index (random access), in place.
* ``infer FILE_OR_GLOB... -o DIR``: makes a dataset of foreign TFRecord files
  of ``tf.train.Example`` records by scanning them and writing a header.
* ``upgrade OLD.header -o DIR``: a super_serial 2.0 pair to a dataset.
* ``convert PATH -o DIR``: re-shard or re-compress a dataset.

Every subcommand takes ``--json`` (machine-readable output on stdout) and
``--help``. Exit codes: 0 success, 1 a problem with the data or files
(missing, corrupt, invalid; the message goes to stderr, and with ``--json``
also an ``{"ok": false, "error": ...}`` object to stdout), 2 a usage error.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click
import numpy as np

from superserial import __version__, fs
from superserial.errors import SuperserialError
from superserial.header import Header
from superserial.layout import check_target
from superserial.render import error_message

__all__ = ["ByteSize", "cli", "main"]

log = logging.getLogger("superserial")

_GLOB_CHARS = frozenset("*?[")


# ------------------------------------------------------------------ plumbing


def _data_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a problem with data or files (exit code 1)."""
    errors: list[type[BaseException]] = [SuperserialError, OSError, ValueError]
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        errors.append(tf.errors.OpError)
    return tuple(errors)


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, ensure_ascii=False))


def _handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turns data problems into exit code 1 with a message (and JSON with --json)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _data_errors() as e:
            log.debug("command failed", exc_info=True)
            message = error_message(e)
            if kwargs.get("as_json"):
                _echo_json({"ok": False, "error": {"type": type(e).__name__, "message": message}})
            raise click.ClickException(message) from e

    return wrapper


_QUIET = "superserial.quiet"
_VERBOSE = "superserial.verbose"
_HANDLER = "superserial.log_handler"


def _progress() -> bool | None:
    """``progress=`` for the library: off with --quiet, else on if stderr is a terminal."""
    return False if click.get_current_context().find_root().meta.get(_QUIET) else None


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_root().meta[_QUIET] = True


def _set_verbose(ctx: click.Context, param: click.Parameter, value: int) -> None:
    """Counts -v before and after the subcommand; logs at the level of the total."""
    root = ctx.find_root()
    total = root.meta[_VERBOSE] = root.meta.get(_VERBOSE, 0) + value
    if not total:
        return
    if _HANDLER not in root.meta:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s superserial: %(message)s"))
        old_level = log.level
        log.addHandler(handler)
        root.meta[_HANDLER] = handler

        def restore() -> None:
            log.removeHandler(handler)
            log.setLevel(old_level)

        # In-process runners call the CLI many times, each with its own stderr.
        root.call_on_close(restore)
    log.setLevel(logging.DEBUG if total > 1 else logging.INFO)


def _global_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-q and -v, accepted before the subcommand (on the group) and after it."""
    fn = click.option(
        "-v",
        "--verbose",
        count=True,
        expose_value=False,
        callback=_set_verbose,
        help="Log what the library does (-v info, -vv debug) on stderr.",
    )(fn)
    return click.option(
        "-q",
        "--quiet",
        is_flag=True,
        expose_value=False,
        callback=_set_quiet,
        help="No progress bars (shown by default when stderr is a terminal).",
    )(fn)


def _console() -> Any:
    from rich.console import Console

    wide = None if sys.stdout.isatty() else 160
    return Console(markup=False, highlight=False, width=wide, soft_wrap=False)


def _json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout."
    )(fn)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ByteSize(click.ParamType):  # type: ignore[type-arg]  # generic only in click >= 8.3; we allow 8.1
    """A byte count: 1000, 64K, 64KB, 64KiB, 128M, 1G (K/M/G are powers of 1024)."""

    name = "bytes"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().upper().removesuffix("B").removesuffix("I")
        unit = text[-1:] if text[-1:] in "KMGT" and text[-1:] else ""
        number = text[: len(text) - len(unit)]
        try:
            n = int(float(number) * _UNITS[unit])
        except ValueError:
            self.fail(f"expected a size like 1000, 64M or 1G, got {value!r}", param, ctx)
        if n < 1:
            self.fail(f"expected a size >= 1 byte, got {value!r}", param, ctx)
        return n


_COMPRESSION = click.Choice(["none", "GZIP", "ZLIB"], case_sensitive=False)


def _compression_arg(value: str | None) -> str | None:
    if value is None or value.lower() == "none":
        return None
    return value.upper()


def _resolve(path: str) -> str:
    return os.path.realpath(path) if fs.is_local(path) else path.rstrip("/")


# ------------------------------------------------------------------ group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="superserial")
@_global_options
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
@_global_options
@click.argument("path")
@click.option(
    "--all-shards",
    is_flag=True,
    help=f"List every shard (default: the first {_SHOWN_SHARDS}).",
)
@_json_option
@_handle_errors
def inspect(path: str, all_shards: bool, as_json: bool) -> None:
    """Show a dataset's header: structure, leaves, element count, shards.

    Reads only PATH/header.json, no records.
    """
    from superserial import render
    from superserial.layout import read_header

    header = read_header(path)
    if as_json:
        obj = json.loads(header.to_json())
        _echo_json({"path": path, "total_bytes": header.total_bytes, "header": obj})
        return
    con = _console()
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
@_global_options
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
@_json_option
@_handle_errors
def head(path: str, n: int, threshold: int, edgeitems: int, as_json: bool) -> None:
    """Print the first N elements of a dataset, leaf by leaf.

    Arrays are summarized with numpy's printoptions; strings print as Python
    bytes literals. With --json, values are given in full as nested lists:
    strings that are valid UTF-8 as JSON strings, other strings as
    {"base64": "..."}, non-finite floats as "nan"/"inf"/"-inf", complex
    numbers as [re, im]. Needs no TensorFlow.
    """
    from superserial.layout import read_header
    from superserial.render import first_elements, leaf_json, leaf_text

    header = read_header(path)
    leaves = header.leaves
    out = []
    with np.printoptions(threshold=threshold, edgeitems=edgeitems, linewidth=100):
        for i, flat in enumerate(first_elements(path, header, n)):
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
        _echo_json({"path": path, "elements": out})


# ------------------------------------------------------------------ verify


@cli.command("verify")
@_global_options
@click.argument("path")
@_json_option
@_handle_errors
def verify_cmd(path: str, as_json: bool) -> None:
    """Read every record of every shard and check it against the header.

    Checks each shard's size, whole-file CRC-32C, record framing CRCs and
    record count, then decodes every element. Exits 1 if anything is wrong,
    naming the file, and where known the record index and the leaf.
    """
    from superserial.verification import verify

    report = verify(path, progress=_progress())
    if as_json:
        _echo_json(report.to_dict())
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
@_global_options
@click.argument("path")
@_json_option
@_handle_errors
def index_cmd(path: str, as_json: bool) -> None:
    """Give every shard of a dataset a record index (random access), in place.

    For datasets written before indexes existed, or whose index is missing or
    damaged. Reads every shard and checks it against the header first: a
    mismatch exits 1 with nothing changed. Writes the missing indexes, then
    replaces header.json atomically; valid ones are kept, so running it again
    changes nothing. Compressed shards cannot be indexed (exit 1).
    """
    from superserial.indexing import index_dataset
    from superserial.render import index_json, index_text

    result = index_dataset(path, progress=_progress())
    if as_json:
        _echo_json(index_json(result))
    else:
        click.echo(index_text(result))


# ------------------------------------------------------------------ infer


@cli.command()
@_global_options
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
@_json_option
@_handle_errors
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
    from superserial.infer import infer as infer_dataset
    from superserial.render import infer_text

    if _GLOB_CHARS & set(output):
        raise click.BadParameter("expected a plain directory path", param_hint="--output")
    output = output.rstrip("/") or "/"
    header, report = infer_dataset(
        inputs,
        output,
        sample=sample,
        compression=compression,
        overwrite=overwrite,
        progress=_progress(),
        overwrite_hint="--overwrite",
    )
    if as_json:
        _echo_json(report.to_obj())
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


def _saved(header: Header, output: str, as_json: bool, what: str) -> None:
    from superserial.render import saved_json, saved_text

    if as_json:
        _echo_json(saved_json(header, output))
    else:
        click.echo(saved_text(header, output, what))


@cli.command()
@_global_options
@click.argument("paths", nargs=-1, required=True)
@_save_options
@click.option(
    "--compression",
    type=_COMPRESSION,
    default="none",
    show_default=True,
    help="Compression of the new dataset.",
)
@_json_option
@_handle_errors
def upgrade(
    paths: tuple[str, ...],
    output: str,
    num_shards: int | None,
    shard_size: int | None,
    overwrite: bool,
    compression: str,
    as_json: bool,
) -> None:
    """Turn a super_serial 2.0 pair (NAME.tfrecord + NAME.header) into a dataset.

    PATHS is NAME.header or NAME.tfrecord (the other is found beside it) or
    both. The YAML header is read safely; dtypes are restored from it.
    """
    import tensorflow as tf

    from superserial.legacy import load_legacy
    from superserial.writer import save

    _one_split(num_shards, shard_size)
    check_target(output, overwrite, hint="--overwrite")  # save's own hint is overwrite=True
    tfrecord, header_path = _legacy_pair(paths)
    ds = load_legacy(tfrecord, header_path)
    count = int(tf.data.TFRecordDataset(tfrecord).reduce(np.int64(0), lambda n, _: n + 1))
    ds = ds.apply(tf.data.experimental.assert_cardinality(count))
    header = save(
        ds,
        output,
        compression=_compression_arg(compression),
        num_shards=num_shards,
        shard_size=shard_size,
        overwrite=overwrite,
        progress=_progress(),
    )
    _saved(header, output, as_json, "upgraded to")


@cli.command()
@_global_options
@click.argument("path")
@_save_options
@click.option(
    "--compression",
    type=click.Choice(["keep", "none", "GZIP", "ZLIB"], case_sensitive=False),
    default="keep",
    show_default=True,
    help="Compression of the new dataset (keep: as the source).",
)
@_json_option
@_handle_errors
def convert(
    path: str,
    output: str,
    num_shards: int | None,
    shard_size: int | None,
    overwrite: bool,
    compression: str,
    as_json: bool,
) -> None:
    """Re-shard or re-compress a dataset into a new directory (load, then save).

    The source is left untouched; the output cannot be the source itself.
    """
    from superserial.layout import read_header
    from superserial.reader import load
    from superserial.writer import save

    _one_split(num_shards, shard_size)
    if _resolve(path.rstrip("/") or "/") == _resolve(output.rstrip("/") or "/"):
        raise click.BadParameter(
            "expected an output directory other than the source", param_hint="--output"
        )
    check_target(output, overwrite, hint="--overwrite")  # save's own hint is overwrite=True
    source = read_header(path)
    comp = source.compression if compression.lower() == "keep" else _compression_arg(compression)
    header = save(
        load(path),
        output,
        compression=comp,
        num_shards=num_shards,
        shard_size=shard_size,
        overwrite=overwrite,
        progress=_progress(),
    )
    _saved(header, output, as_json, "converted to")

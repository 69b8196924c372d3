"""The ``superserial`` command line (also ``python -m superserial``).

Subcommands:

* ``inspect PATH``: the header: structure, leaves, counts, shards. Reads no
  records and does not import TensorFlow.
* ``head PATH -n N``: the first N elements, printed readably.
* ``verify PATH``: reads and decodes everything, checks it against the header.
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

import base64
import functools
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import click
import numpy as np

from superserial import __version__, fs
from superserial.errors import (
    CorruptDataError,
    DatasetNotFoundError,
    HeaderError,
    SuperserialError,
)
from superserial.header import Header, Shard
from superserial.layout import HEADER_FILE, check_target
from superserial.structure import DictNode, Leaf, NamedTupleNode, Node, leaf_name

__all__ = ["cli", "main"]

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


_TF_NOISE = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$")


def _clean(message: str) -> str:
    """The informative line(s) of a TensorFlow error message, without graph noise."""
    lines = []
    for line in message.splitlines():
        line = _TF_NOISE.sub("", line).strip()
        if not line or line.startswith(
            ("File ", "[[", "Graph execution error", "Detected at node")
        ):
            continue
        lines.append(line)
    text = " ".join(lines) if lines else message.strip()
    return text.replace("Name: <unknown>, ", "")


def _message(e: BaseException) -> str:
    text = getattr(e, "message", None)
    if isinstance(text, str) and type(e).__module__.startswith("tensorflow"):
        return f"{type(e).__name__}: {_clean(text)}"
    return str(e)


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
            message = _message(e)
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


class _ByteSize(click.ParamType):
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


def _fmt_shape(shape: tuple[int | None, ...] | list[Any]) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


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


def _tree(node: Node, label: str) -> Any:
    from rich.tree import Tree

    def add(parent: Any, n: Node, text: str) -> None:
        if isinstance(n, Leaf):
            extra = f" ragged_rank={n.ragged_rank}" if n.kind == "ragged" else ""
            parent.add(f"{text}: {n.kind} {n.dtype}{_fmt_shape(n.shape)}{extra}")
            return
        if isinstance(n, DictNode):
            branch = parent.add(f"{text}: dict")
            for k in sorted(n.items):
                add(branch, n.items[k], repr(k))
        elif isinstance(n, NamedTupleNode):
            branch = parent.add(f"{text}: {n.name}({', '.join(n.fields)})")
            for f, v in zip(n.fields, n.items, strict=True):
                add(branch, v, f)
        else:
            branch = parent.add(f"{text}: tuple")
            for i, v in enumerate(n.items):
                add(branch, v, str(i))

    root = Tree(label)
    add(root, node, "element")
    return root


@cli.command()
@_global_options
@click.argument("path")
@click.option("--all-shards", is_flag=True, help="List every shard (default: the first 20).")
@_json_option
@_handle_errors
def inspect(path: str, all_shards: bool, as_json: bool) -> None:
    """Show a dataset's header: structure, leaves, element count, shards.

    Reads only PATH/header.json, no records.
    """
    from rich.table import Table

    from superserial.layout import read_header

    header = read_header(path)
    if as_json:
        obj = json.loads(header.to_json())
        _echo_json({"path": path, "total_bytes": header.total_bytes, "header": obj})
        return
    con = _console()
    click.echo(f"superserial dataset {path}")
    click.echo(
        f"  format_version {header.format_version}, written by {header.writer or '?'}\n"
        f"  {header.element_count:,} elements, {len(header.shards)} shard(s), "
        f"{header.total_bytes:,} bytes, compression {header.compression or 'none'}"
    )
    con.print(_tree(header.structure, "structure"))
    leaves = Table(title="leaves", title_justify="left")
    for col in ("name", "kind", "dtype", "shape", "ragged_rank", "encoding", "features"):
        leaves.add_column(col)
    for leaf in header.leaves:
        leaves.add_row(
            leaf.name,
            leaf.kind,
            leaf.dtype,
            _fmt_shape(leaf.shape),
            "" if leaf.ragged_rank is None else str(leaf.ragged_rank),
            leaf.encoding,
            ", ".join(leaf.feature_names()),
        )
    con.print(leaves)
    shards = Table(title="shards", title_justify="left")
    for col, justify in (
        ("file", "left"),
        ("records", "right"),
        ("bytes", "right"),
        ("crc32c", "left"),
    ):
        shards.add_column(col, justify=justify)  # type: ignore[arg-type]
    shown = header.shards if all_shards else header.shards[:20]
    for s in shown:
        shards.add_row(s.file, f"{s.records:,}", f"{s.bytes:,}", s.crc32c)
    con.print(shards)
    if len(shown) < len(header.shards):
        click.echo(f"  ... and {len(header.shards) - len(shown)} more (--all-shards)")


# ------------------------------------------------------------------ head


def _plain(x: Any) -> Any:
    """Nested Python lists of JSON-able values.

    Strings valid as UTF-8 become JSON strings, other bytes ``{"base64": ...}``;
    non-finite floats become "nan"/"inf"/"-inf"; complex numbers [re, im].
    """
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(x).decode("ascii")}
    if isinstance(x, complex):
        return [_plain(x.real), _plain(x.imag)]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _json_array(a: np.ndarray) -> Any:
    if a.dtype.kind not in "biufcOS":  # bfloat16 and friends
        a = a.astype(np.float32)
    return _plain(a.tolist())


def _rows_json(x: Any) -> Any:
    return [_rows_json(v) for v in x] if isinstance(x, list) else _json_array(x)


def _ragged_shape(x: Any) -> list[int | None]:
    return [len(x), *([None] * x.ragged_rank), *x.flat_values.shape[1:]]


def _leaf_json(leaf: Leaf, x: Any) -> dict[str, Any]:
    from superserial.numpy import Ragged, Sparse

    if isinstance(x, Sparse):
        return {
            "kind": "sparse",
            "dtype": leaf.dtype,
            "dense_shape": np.asarray(x.dense_shape).tolist(),
            "indices": np.asarray(x.indices).tolist(),
            "values": _json_array(np.asarray(x.values)),
        }
    if isinstance(x, Ragged):
        return {
            "kind": "ragged",
            "dtype": leaf.dtype,
            "shape": _ragged_shape(x),
            "value": _rows_json(x.to_list()),
        }
    a = np.asarray(x)
    return {"kind": leaf.kind, "dtype": leaf.dtype, "shape": list(a.shape), "value": _json_array(a)}


def _array_text(a: np.ndarray) -> str:
    if a.ndim == 0:
        v = a.item()
        return repr(v) if isinstance(v, bytes) else np.array2string(a)
    return np.array2string(a, separator=", ")


def _rows_text(x: Any, edge: int) -> str:
    if not isinstance(x, list):
        return _array_text(x)
    n = len(x)
    rows = list(range(n)) if n <= 2 * edge else [*range(edge), -1, *range(n - edge, n)]
    parts = ["..." if i < 0 else _rows_text(x[i], edge) for i in rows]
    return "[" + ", ".join(parts) + "]"


def _leaf_text(leaf: Leaf, x: Any, edge: int) -> str:
    from superserial.numpy import Ragged, Sparse

    if isinstance(x, Sparse):
        shape = np.asarray(x.dense_shape).tolist()
        return (
            f"sparse {leaf.dtype}{_fmt_shape(shape)} nnz={len(x.values)}\n"
            f"      indices={_array_text(np.asarray(x.indices))}\n"
            f"      values={_array_text(np.asarray(x.values))}"
        )
    if isinstance(x, Ragged):
        shape = _fmt_shape(_ragged_shape(x))
        return f"ragged {leaf.dtype}{shape} = {_rows_text(x.to_list(), edge)}"
    a = np.asarray(x)
    kind = "ragged " if leaf.kind == "ragged" else ""
    text = _array_text(a)
    sep = "\n      " if "\n" in text else " "
    return f"{kind}{leaf.dtype}{_fmt_shape(list(a.shape))} ={sep}{text.replace(chr(10), chr(10) + '      ')}"


def _first_elements(path: str, header: Header, n: int) -> list[list[Any]]:
    """The flat leaves of the first ``n`` elements, decoded without TensorFlow."""
    from superserial.layout import shard_paths
    from superserial.numpy import RecordDecoder, read_records

    files = shard_paths(path, header)
    records: list[bytes] = []
    wheres: list[str] = []
    for file in files:
        if len(records) >= n:
            break
        with fs.open_file(file, "rb") as f:
            for i, record in enumerate(read_records(f, header.compression)):
                if len(records) >= n:
                    break
                records.append(record)
                wheres.append(f"{file} record {i}")
    if not records:
        return []
    columns = RecordDecoder(header).decode(records, wheres)
    return [[column[i] for column in columns] for i in range(len(records))]


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

    header = read_header(path)
    leaves = header.leaves
    out = []
    with np.printoptions(threshold=threshold, edgeitems=edgeitems, linewidth=100):
        for i, flat in enumerate(_first_elements(path, header, n)):
            if as_json:
                out.append(
                    {
                        "index": i,
                        "leaves": {
                            leaf.name: _leaf_json(leaf, x)
                            for leaf, x in zip(leaves, flat, strict=True)
                        },
                    }
                )
                continue
            click.echo(f"element {i}")
            for leaf, x in zip(leaves, flat, strict=True):
                click.echo(f"  {leaf.name}: {_leaf_text(leaf, x, edgeitems)}")
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


# ------------------------------------------------------------------ infer


def _expand_inputs(patterns: tuple[str, ...]) -> list[str]:
    import tensorflow as tf

    files: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matches = sorted(tf.io.gfile.glob(pattern))
            if not matches:
                raise DatasetNotFoundError(f"expected files matching {pattern}, found none")
        else:
            if not fs.exists(pattern):
                raise DatasetNotFoundError(f"expected a TFRecord file at {pattern}, found none")
            matches = [pattern]
        for m in matches:
            if fs.isdir(m):
                raise CorruptDataError(f"expected a TFRecord file, got a directory at {m}")
            if m not in files:
                files.append(m)
    return files


def _detect_compression(tf: Any, file: str) -> str:
    """The compression of a TFRecord file: "" (none), "GZIP" or "ZLIB"."""
    with fs.open_file(file, "rb") as f:
        magic = f.read(2)
    if not magic:
        return ""
    if magic == b"\x1f\x8b":
        return "GZIP"
    for candidate in ("", "ZLIB"):
        try:
            for _ in tf.data.TFRecordDataset(file, candidate).take(1):
                pass
            return candidate
        except tf.errors.OpError:
            continue
    raise CorruptDataError(
        f"expected a TFRecord file (uncompressed, GZIP or ZLIB), got unreadable data at {file}"
    )


class _FeatureStats:
    """What the scanned records say about one feature."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.lengths: set[int] = set()
        self.present = 0


def _scan_file(
    tf: Any,
    file: str,
    compression: str,
    limit: int | None,
    stats: dict[str, _FeatureStats],
    bar: Any,
) -> tuple[int, int]:
    """Scans up to ``limit`` records of ``file`` into ``stats``; (scanned, total records)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    records = tf.data.TFRecordDataset(file, compression)
    scanned = 0
    try:
        head = records if limit is None else records.take(limit)
        for batch in head.batch(1024):
            recs = batch.numpy()
            for rec in recs:
                try:
                    ex = example_pb2.Example.FromString(rec)
                except DecodeError as e:
                    raise CorruptDataError(
                        f"expected a tf.train.Example, got unparsable bytes at {file} record {scanned}"
                    ) from e
                for name, feature in ex.features.feature.items():
                    s = stats.get(name)
                    if s is None:
                        s = stats[name] = _FeatureStats()
                    kind = feature.WhichOneof("kind")
                    s.present += 1
                    if kind is None:
                        s.lengths.add(0)
                    else:
                        s.kinds.add(kind)
                        s.lengths.add(len(getattr(feature, kind).value))
                scanned += 1
            bar(len(recs), sum(map(len, recs)))
        total = scanned
        if limit is not None:
            total += int(records.skip(scanned).reduce(np.int64(0), lambda n, _: n + 1))
    except tf.errors.OpError as e:
        raise CorruptDataError(
            f"expected intact TFRecord framing, got {_message(e)} at {file} (after record {scanned})"
        ) from e
    return scanned, total


_DTYPE_OF_KIND = {"int64_list": "int64", "float_list": "float32", "bytes_list": "string"}


def _infer_structure(
    stats: dict[str, _FeatureStats], scanned: int
) -> tuple[DictNode, list[dict[str, Any]]]:
    """The header structure for the scanned features, and a description per leaf."""
    if not stats:
        raise HeaderError("expected records with at least one feature, got none")
    tree: dict[str, Any] = {}
    described = []
    for name in sorted(stats):
        s = stats[name]
        if "~" in name:
            raise HeaderError(
                f"expected feature names without '~' (superserial reserves it), got {name!r}"
            )
        if len(s.kinds) > 1:
            raise HeaderError(
                f"expected one kind per feature, got {' and '.join(sorted(s.kinds))} at {name!r}"
            )
        if not s.kinds:
            raise HeaderError(
                f"expected a feature with a kind (int64_list, float_list, bytes_list), "
                f"got none set in every scanned record at {name!r}"
            )
        kind = next(iter(s.kinds))
        dtype = _DTYPE_OF_KIND[kind]
        # Always empty says nothing about a length: ragged is safe for any.
        fixed = s.present == scanned and len(s.lengths) == 1 and 0 not in s.lengths
        path = tuple(name.split("/"))
        lname = leaf_name(path)
        if fixed:
            n = next(iter(s.lengths))
            leaf = Leaf(lname, "dense", dtype, () if n == 1 else (n,))
            why = None
        else:
            leaf = Leaf(lname, "ragged", dtype, (None,), ragged_rank=0, row_splits_dtype="int64")
            # A ragged leaf of one length puzzles; say what made it ragged.
            if s.present < scanned:
                why = f"missing in {scanned - s.present:,} of {scanned:,} scanned records"
            elif len(s.lengths) > 1:
                why = "lengths vary"
            else:
                why = "always empty"
        node = tree
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise HeaderError(
                    f"expected feature names that form a tree, got {'/'.join(path[: i + 1])!r} "
                    f"both as a feature and as a prefix of {name!r}"
                )
            node = child
        if path[-1] in node:
            raise HeaderError(
                f"expected feature names that form a tree, got {name!r} both as a feature "
                f"and as a prefix of other features"
            )
        node[path[-1]] = leaf
        lengths = sorted(s.lengths)
        described.append(
            {
                "feature": name,
                "kind": kind,
                "dtype": dtype,
                "leaf_kind": leaf.kind,
                "shape": list(leaf.shape),
                "lengths": [lengths[0], lengths[-1]],
                "present_in": s.present,
                "ragged_because": why,
            }
        )

    def build(d: dict[str, Any]) -> DictNode:
        return DictNode({k: v if isinstance(v, Leaf) else build(v) for k, v in sorted(d.items())})

    return build(tree), described


def _copy_with_crc(src: str, dst: str) -> tuple[int, str]:
    import google_crc32c

    crc, size = 0, 0
    with fs.open_file(src, "rb") as fin, fs.open_file(dst, "wb") as fout:
        while chunk := fin.read(8 << 20):
            crc = google_crc32c.extend(crc, chunk)
            size += len(chunk)
            fout.write(chunk)
    return size, f"{crc:08x}"


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
    data-NNNNN-of-NNNNN.tfrecord, in the order given; globs sorted) and are
    never modified. All records are counted, also with --sample. A feature
    that is missing or of another length in a record that was not scanned
    makes loading fail at that record; one first seen there is ignored.
    Run `superserial verify` on the output to check every record.
    """
    import tensorflow as tf

    from superserial.progress import make_progress

    if _GLOB_CHARS & set(output):
        raise click.BadParameter("expected a plain directory path", param_hint="--output")
    output = output.rstrip("/") or "/"
    files = _expand_inputs(inputs)
    check_target(output, overwrite, hint="--overwrite")
    if compression.lower() == "auto":
        # An empty file reads as empty under any compression: it does not vote.
        found = {_detect_compression(tf, f) or "none" for f in files if fs.size(f) > 0}
        if len(found) > 1:
            raise CorruptDataError(
                f"expected input files of one compression, got {' and '.join(sorted(found))}"
            )
        comp = "" if found in (set(), {"none"}) else found.pop()
    else:
        comp = "" if compression.lower() == "none" else compression.upper()

    stats: dict[str, _FeatureStats] = {}
    counts: list[int] = []
    scanned = 0
    bar = make_progress(_progress(), total=sample, desc="infer: scan")
    try:
        for f in files:
            limit = None if sample is None else sample - scanned
            n_scanned, n_total = _scan_file(tf, f, comp, limit, stats, bar)
            scanned += n_scanned
            counts.append(n_total)
    finally:
        bar.close()
    total = sum(counts)
    if scanned == 0:
        raise CorruptDataError(
            f"expected at least one record to infer from, got none in {len(files)} file(s)"
        )
    structure, described = _infer_structure(stats, scanned)

    tmp = fs.temp_sibling(output)
    fs.makedirs(tmp)
    bar = make_progress(_progress(), total=total, desc="infer: copy")
    try:
        shards = []
        for i, (f, n) in enumerate(zip(files, counts, strict=True)):
            name = f"data-{i:05d}-of-{len(files):05d}.tfrecord"
            size, crc = _copy_with_crc(f, fs.join(tmp, name))
            shards.append(Shard(name, n, size, crc))
            bar(n, size)
        header = Header(
            structure, total, comp or None, tuple(shards), writer=f"superserial {__version__} infer"
        )
        text = header.to_json()
        Header.from_json(text, source=f"inferred header for {output}")  # all header checks
        with fs.open_file(fs.join(tmp, HEADER_FILE), "wb") as out:
            out.write(text.encode("utf-8"))
        check_target(output, overwrite, hint="--overwrite")
        old = fs.exchange_or_rename(tmp, output)
    except BaseException:
        fs.rmtree(tmp)
        raise
    finally:
        bar.close()
    if old is not None:
        fs.rmtree(old)
    log.info(
        "inferred %s from %d file(s), %d records (%d scanned)", output, len(files), total, scanned
    )

    note = None
    if scanned < total:
        note = (
            f"inferred from the first {scanned:,} of {total:,} records: a feature missing or of "
            "another length in a later record fails at load; features first seen later are ignored. "
            f"Run `superserial verify {output}` to check every record."
        )
    if as_json:
        _echo_json(
            {
                "path": output,
                "files": files,
                "element_count": total,
                "records_scanned": scanned,
                "compression": comp or None,
                "features": described,
                "note": note,
            }
        )
        return
    click.echo(
        f"wrote {output}: {total:,} elements from {len(files)} file(s) (copied), compression {comp or 'none'}"
    )
    for d in described:
        lo, hi = d["lengths"]
        length = str(lo) if lo == hi else f"{lo}..{hi}"
        shape = _fmt_shape(d["shape"])
        why = f" ({d['ragged_because']})" if d["ragged_because"] else ""
        click.echo(
            f"  {d['feature']}: {d['kind']} length {length} -> "
            f"{d['leaf_kind']} {d['dtype']}{shape}{why}"
        )
    if note:
        click.echo(f"note: {note}", err=True)


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
                type=_ByteSize(),
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
    if as_json:
        _echo_json(
            {
                "path": output,
                "element_count": header.element_count,
                "compression": header.compression,
                "total_bytes": header.total_bytes,
                "shards": [s.to_obj() for s in header.shards],
            }
        )
        return
    click.echo(
        f"{what} {output}: {header.element_count:,} elements, {len(header.shards)} shard(s), "
        f"{header.total_bytes:,} bytes, compression {header.compression or 'none'}"
    )


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

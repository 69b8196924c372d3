"""What every ``superserial`` subcommand shares: error handling, -q/-v, --json, sizes.

The command modules (:mod:`superserial.cli.main`, :mod:`superserial.cli.write_commands`)
build their commands from these pieces; nothing here imports TensorFlow.
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

from superserial.base.sizes import parse_size
from superserial.cli.render import error_message
from superserial.errors import SuperserialError
from superserial.storage import fs

__all__ = [
    "COMPRESSION",
    "ByteSize",
    "compression_arg",
    "console",
    "data_errors",
    "echo_json",
    "global_options",
    "handle_errors",
    "json_option",
    "json_text",
    "progress",
    "resolve",
]

log = logging.getLogger("superserial")


def data_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a problem with data or files (exit code 1)."""
    errors: list[type[BaseException]] = [SuperserialError, OSError, ValueError]
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        errors.append(tf.errors.OpError)
    return tuple(errors)


def _one_line(x: Any) -> bool:
    """Whether a list of values goes on one line: arrays, and ``{"base64": ...}`` strings in them."""
    if isinstance(x, list | tuple):
        return all(_one_line(v) for v in x)
    if isinstance(x, dict):
        return len(x) == 1 and not isinstance(next(iter(x.values())), list | tuple | dict)
    return True


def json_text(obj: Any, level: int = 0) -> str:
    """``obj`` as JSON indented by 2, but every list without objects in it on one line.

    A plain ``indent=2`` puts each number of an array on its own line (5,244
    lines for one 32x32x3 image); an array on one line stays readable and
    greppable, and the output parses to the same value.
    """
    if not isinstance(obj, list | tuple | dict) or not obj:
        return json.dumps(obj, ensure_ascii=False)
    if not isinstance(obj, dict) and _one_line(obj):
        return json.dumps(obj, ensure_ascii=False)
    pad, end = "  " * (level + 1), "  " * level
    if isinstance(obj, dict):
        # json turns non-string keys (int, float, bool, None) into their JSON text.
        items = [
            f"{pad}{json.dumps(k if isinstance(k, str) else json.dumps(k), ensure_ascii=False)}: "
            f"{json_text(v, level + 1)}"
            for k, v in obj.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + json_text(v, level + 1) for v in obj) + "\n" + end + "]"


def echo_json(obj: Any) -> None:
    click.echo(json_text(obj))


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turns data problems into exit code 1 with a message (and JSON with --json)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except data_errors() as e:
            log.debug("command failed", exc_info=True)
            message = error_message(e)
            if kwargs.get("as_json"):
                echo_json({"ok": False, "error": {"type": type(e).__name__, "message": message}})
            raise click.ClickException(message) from e

    return wrapper


_QUIET = "superserial.quiet"
_VERBOSE = "superserial.verbose"
_HANDLER = "superserial.log_handler"


def progress() -> bool | None:
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


def global_options(fn: Callable[..., Any]) -> Callable[..., Any]:
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


def console() -> Any:
    from rich.console import Console

    wide = None if sys.stdout.isatty() else 160
    return Console(markup=False, highlight=False, width=wide, soft_wrap=False)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout."
    )(fn)


class ByteSize(click.ParamType):  # type: ignore[type-arg]  # generic only in click >= 8.3; we allow 8.1
    """A byte count: 1000, 64K, 128M, 1G (powers of 1024), 64MB (1000), 64MiB (1024).

    The rule of :func:`superserial.base.sizes.parse_size`, shared with ``cache_limit=``.
    """

    name = "bytes"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            n = parse_size(str(value), "a size")
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return int(n or 0)


COMPRESSION = click.Choice(["none", "GZIP", "ZLIB"], case_sensitive=False)


def compression_arg(value: str | None) -> str | None:
    if value is None or value.lower() == "none":
        return None
    return value.upper()


def resolve(path: str) -> str:
    return os.path.realpath(path) if fs.is_local(path) else path.rstrip("/")

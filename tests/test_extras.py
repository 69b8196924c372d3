"""Without an optional package, every entry point that needs it names the extra to install.

Each test runs a child python in which the package cannot be imported (as if not
installed); none of the children imports TensorFlow, so they start fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_without

# Runs the command line on the child's arguments, as the installed `superserial` does.
_CLI = "from superserial.cli.main import main\nmain()\n"


@pytest.mark.parametrize("command", ["convert", "append", "upgrade"])
def test_commands_that_need_tensorflow_say_which_extra(command: str, tmp_path: Path) -> None:
    src, dest = str(tmp_path / "src"), str(tmp_path / "dest")
    if command == "convert":  # a superserial source: the one convert needs TensorFlow for
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "header.json").write_text("{}")
    args = {
        "convert": [src, "-o", dest],
        "append": [src, dest],
        "upgrade": [str(tmp_path / "old.header"), "-o", dest],
    }[command]
    proc = run_without(["tensorflow"], _CLI, command, *args)
    assert proc.returncode == 1, proc.stderr
    # One line, no traceback, naming the command and the extra; said before any file is read.
    assert proc.stderr.splitlines() == [
        f"Error: expected TensorFlow for superserial {command}, found it not installed "
        "(import of tensorflow halted; None in sys.modules): pip install 'superserial[tf]'"
    ], proc.stderr
    proc = run_without(["tensorflow"], _CLI, command, *args, "--json")
    error = json.loads(proc.stdout)["error"]
    assert proc.returncode == 1 and error["type"] == "MissingDependencyError", proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["append", "{p}", "{p}"],
        ["append", "{p}", "{p}/"],
        ["convert", "{p}", "-o", "{p}"],
        ["convert", "{p}", "-o", "{q}", "--num-shards", "2", "--shard-size", "1M"],
        ["upgrade", "{p}", "-o", "{q}"],  # neither NAME.header nor NAME.tfrecord
    ],
    ids=["append-same", "append-same-slash", "convert-same", "convert-both-splits", "upgrade-name"],
)
def test_usage_errors_exit_2_without_tensorflow(args: list[str], tmp_path: Path) -> None:
    """The arguments are checked before TensorFlow is wanted: exit 2 as documented."""
    p, q = str(tmp_path / "ds"), str(tmp_path / "other")
    proc = run_without(["tensorflow"], _CLI, *(a.format(p=p, q=q) for a in args))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "TensorFlow" not in proc.stderr, proc.stderr


# (the module hidden, the child's code, what the message names, the extra)
_API = [
    ("tensorflow", "import superserial; superserial.load(PATH)", "superserial.load", "tf"),
    ("tensorflow", "from superserial import save", "superserial.save", "tf"),
    ("tensorflow", "import superserial; superserial.append", "superserial.append", "tf"),
    ("tensorflow", "import superserial; superserial.Writer", "superserial.Writer", "tf"),
    ("tensorflow", "import superserial.tf.load", "superserial's TensorFlow side", "tf"),
    ("torch", "import superserial.torch", "superserial.torch", "torch"),
    (
        "grain",
        "import superserial.grain as g; g.dataset(PATH)",
        "superserial.grain.dataset",
        "grain",
    ),
    ("apache_beam", "import superserial.beam", "superserial.beam", "beam"),
    (
        "tensorflow",
        "import superserial.beam as ssb; ssb.WriteToSuperSerial(PATH, None)",
        "WriteToSuperSerial",
        "tf",
    ),
]

# The error is a ModuleNotFoundError (code catching ImportError keeps working) and a
# SuperserialError; the child prints what it caught.
_CATCH = (
    "import superserial.errors\n"
    "try:\n"
    "    {code}\n"
    "except ModuleNotFoundError as e:\n"
    "    assert isinstance(e, superserial.errors.SuperserialError), repr(e)\n"
    "    print(e.name, e.extra, e, sep='\\n')\n"
)


@pytest.mark.parametrize(("module", "code", "needed_for", "extra"), _API, ids=[a[1] for a in _API])
def test_api_entry_points_say_which_extra(
    module: str, code: str, needed_for: str, extra: str, tmp_path: Path
) -> None:
    proc = run_without([module], _CATCH.format(code=code.replace("PATH", repr(str(tmp_path)))))
    assert proc.returncode == 0, proc.stderr
    name, got_extra, message = proc.stdout.splitlines()
    assert (name, got_extra) == (module, extra)
    assert message.startswith("expected "), message
    assert f" for {needed_for}, found it not installed" in message, message
    assert message.endswith(f"pip install 'superserial[{extra}]'"), message

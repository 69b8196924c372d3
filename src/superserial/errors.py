"""The exception tree of superserial.

Every error raised because of user data or files derives from
:class:`SuperserialError`. Each also derives from the builtin exception that
plain Python code would expect (``ValueError``, ``TypeError``,
``FileNotFoundError``...), so ``except ValueError`` keeps working.

Messages say what was expected, what was found, and where, e.g.
``expected float32, got int64 at image/0``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "ConversionError",
    "CorruptDataError",
    "DatasetExistsError",
    "DatasetLockedError",
    "DatasetNotFoundError",
    "FormatVersionError",
    "HeaderError",
    "IdleReaderWarning",
    "MissingDependencyError",
    "RemoteReadError",
    "ResumeError",
    "SpecMismatchError",
    "SuperserialError",
    "UnsupportedError",
    "require",
]


class SuperserialError(Exception):
    """Base class of every error superserial raises about data or files."""


class HeaderError(SuperserialError, ValueError):
    """A header is malformed, inconsistent, hostile or of an unknown version."""


class FormatVersionError(HeaderError):
    """A header's ``format_version`` is not one this version can read."""


class CorruptDataError(SuperserialError, ValueError):
    """Record files disagree with their header: truncated, corrupted or short.

    Attributes:
        reason: What was expected and what was found, without the place (the
            whole message where the raiser did not give it apart).
        leaf: The leaf at fault, where known.
    """

    def __init__(self, message: str, *, reason: str | None = None, leaf: str | None = None):
        super().__init__(message)
        self.reason = message if reason is None else reason
        self.leaf = leaf


class UnsupportedError(SuperserialError, TypeError):
    """A dataset holds a structure or leaf that superserial cannot store, or is no dataset.

    Also raised for something else given where a ``tf.data.Dataset`` is
    expected (a list, an array), and for an operation a dataset does not
    allow (random access to shards without an index) or a missing optional extra.
    """


class MissingDependencyError(UnsupportedError, ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it.

    A ``ModuleNotFoundError`` (so ``except ImportError`` keeps working) and an
    :class:`UnsupportedError` (what ``show`` and ``to_pandas`` raised for it before).

    Attributes:
        name: The module that could not be imported (as ``ModuleNotFoundError`` has it).
        extra: The superserial extra that installs it (``tf``, ``torch``, ``viz``...).
    """

    def __init__(self, message: str, *, name: str, extra: str):
        super().__init__(message)
        # TypeError's __init__ comes first in the MRO and ignores ImportError's name=.
        self.name = name
        self.extra = extra


def require(module: str, *, extra: str, needed_for: str, package: str | None = None) -> ModuleType:
    """Imports an optional ``module``, or says which superserial extra installs it.

    The one place that words "this needs extra X": every entry point that needs an
    optional package calls it before doing any work.

    Args:
        module: The module to import (``"tensorflow"``, ``"PIL"``, ``"matplotlib.figure"``).
        extra: The extra of ``pyproject.toml`` that installs it (``pip install
            'superserial[extra]'``).
        needed_for: What needs it, as the message names it (``"superserial.load"``).
        package: The package's name where it is not the module's (``"Pillow"`` for ``PIL``).

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: ``module`` cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.partition(".")[0]
        raise MissingDependencyError(
            f"expected {package or top} for {needed_for}, found it not installed ({e}): "
            f"pip install 'superserial[{extra}]'",
            name=top,
            extra=extra,
        ) from e


class DatasetExistsError(SuperserialError, FileExistsError):
    """``save`` was asked to write where a dataset already exists."""


class DatasetNotFoundError(SuperserialError, FileNotFoundError):
    """``load`` or ``read_header`` was given a path that holds no dataset."""


class DatasetLockedError(SuperserialError, BlockingIOError):
    """Another process is saving to the same path right now (local paths), or, on S3,
    replaced the dataset while this save committed (the loser of the race)."""


class RemoteReadError(SuperserialError, OSError):
    """A read from a remote file failed: for good (a 403), or still after retrying
    transient failures (5xx, throttling, dropped connections) for the whole time budget.

    The message names the URL, the byte range, the attempts made and the last error.
    """


class ResumeError(SuperserialError, ValueError):
    """``save(resume=True)`` found an interrupted save of a different dataset."""


class SpecMismatchError(SuperserialError, ValueError):
    """``append`` was given elements of another spec or compression than the saved ones.

    Attributes:
        leaf: The first leaf that differs (its name as ``superserial inspect``
            prints it), or None when the difference is in the structure
            around the leaves or in the compression.
    """

    def __init__(self, message: str, *, leaf: str | None = None):
        super().__init__(message)
        self.leaf = leaf


class ConversionError(SuperserialError, ValueError):
    """A source's values cannot be converted exactly: a null, values of mixed types.

    Nothing is written: the message names the column and the row.

    Attributes:
        column: The column (a path of field names joined with ``.``).
        row: The row of the source, counted from 0, where known.
    """

    def __init__(self, message: str, *, column: str, row: int | None = None):
        super().__init__(message)
        self.column, self.row = column, row


class IdleReaderWarning(UserWarning):
    """A host or DataLoader worker has no records to read: the dataset has too few shards.

    Save with ``num_shards`` a multiple of the number of readers (hosts, or
    ranks x DataLoader workers) to give every reader a share.
    """

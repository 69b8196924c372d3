"""The exception tree of superserial.

Every error raised because of user data or files derives from
:class:`SuperserialError`. Each also derives from the builtin exception that
plain Python code would expect (``ValueError``, ``TypeError``,
``FileNotFoundError``...), so ``except ValueError`` keeps working.

Messages say what was expected, what was found, and where, e.g.
``expected float32, got int64 at image/0``.
"""

from __future__ import annotations

__all__ = [
    "CorruptDataError",
    "DatasetExistsError",
    "DatasetLockedError",
    "DatasetNotFoundError",
    "FormatVersionError",
    "HeaderError",
    "IdleReaderWarning",
    "ResumeError",
    "SpecMismatchError",
    "SuperserialError",
    "UnsupportedError",
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
    allow (random access to compressed shards) or a missing optional extra.
    """


class DatasetExistsError(SuperserialError, FileExistsError):
    """``save`` was asked to write where a dataset already exists."""


class DatasetNotFoundError(SuperserialError, FileNotFoundError):
    """``load`` or ``read_header`` was given a path that holds no dataset."""


class DatasetLockedError(SuperserialError, BlockingIOError):
    """Another process is saving to the same path right now (local paths), or, on S3,
    replaced the dataset while this save committed (the loser of the race)."""


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


class IdleReaderWarning(UserWarning):
    """A host or DataLoader worker has no records to read: the dataset has too few shards.

    Save with ``num_shards`` a multiple of the number of readers (hosts, or
    ranks x DataLoader workers) to give every reader a share.
    """

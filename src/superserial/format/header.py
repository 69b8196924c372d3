"""The dataset header: what is needed to rebuild a dataset from its records.

The header is a JSON file (``header.json``) beside the record files, written
with ``indent=2`` and ``sort_keys=True`` so that it reads well and diffs
cleanly. It never holds pickles or Python-object tags. A header is untrusted
input: :func:`Header.from_json` checks every field, bounds sizes before
anything is allocated, and raises :class:`~superserial.errors.HeaderError`
naming the field at fault.

This module does not import TensorFlow.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from superserial.errors import FormatVersionError, HeaderError
from superserial.format import dtypes
from superserial.format.structure import (
    DictNode,
    Leaf,
    NamedTupleNode,
    Node,
    TupleNode,
    iter_leaves,
    leaf_name,
    node_to_obj,
)

__all__ = [
    "FORMAT_VERSION",
    "LIMITS",
    "Header",
    "IndexFile",
    "Shard",
    "normalize_compression",
]

FORMAT_VERSION = 1

KINDS = ("dense", "ragged", "sparse")
ROW_SPLITS_DTYPES = ("int32", "int64")
COMPRESSIONS = (None, "GZIP", "ZLIB")
# A shard file name is a plain name inside the dataset directory: no
# separators, no "..", nothing absolute, nothing hidden.
_SHARD_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
_CRC_RE = re.compile(r"^[0-9a-f]{8}$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")


@dataclass(frozen=True)
class _Limits:
    """Bounds on hostile headers, checked before anything is allocated."""

    header_bytes: int = 64 << 20
    depth: int = 64
    leaves: int = 10_000
    rank: int = 32
    values_per_leaf: int = (1 << 31) - 1
    name_chars: int = 1_000
    shards: int = 1_000_000
    # Counted in the raw text before parsing, so that a header of many tiny
    # objects or arrays is refused before json builds them (generous: a leaf
    # holds at most 2 objects and 3 arrays, a shard 2 objects with its index).
    json_objects: int = 8 * 10_000 + 2 * 1_000_000 + 64
    json_arrays: int = 16 * 10_000 + 64


LIMITS = _Limits()


def normalize_compression(compression: str | None) -> str | None:
    """``None``, ``"GZIP"`` or ``"ZLIB"`` from any spelling a user may pass.

    Raises:
        ValueError: Any other compression.
    """
    if compression in (None, "", "NONE", "none"):
        return None
    c = str(compression).upper()
    if c not in ("GZIP", "ZLIB"):
        raise ValueError(f"expected compression None, 'GZIP' or 'ZLIB', got {compression!r}")
    return c


@dataclass(frozen=True)
class IndexFile:
    """The index of one shard: the offset of each record (and a compressed one's restart points).

    Attributes:
        file: The index file name, relative to the dataset directory.
        bytes: Its size.
        crc32c: CRC-32C of the whole file, 8 lowercase hex digits.
    """

    file: str
    bytes: int
    crc32c: str

    def to_obj(self) -> dict[str, Any]:
        """Returns the JSON object of this index file."""
        return {"file": self.file, "bytes": self.bytes, "crc32c": self.crc32c}


@dataclass(frozen=True)
class Shard:
    """One record file.

    Attributes:
        file: The file name, relative to the dataset directory.
        records: How many records (elements) it holds.
        bytes: Its size on disk, after compression.
        crc32c: CRC-32C of the whole file as written, 8 lowercase hex digits.
        index: Its index file, or None: a dataset written before indexes
            existed (compressed ones: before restart points existed).
    """

    file: str
    records: int
    bytes: int
    crc32c: str
    index: IndexFile | None = None

    def files(self) -> tuple[tuple[str, int, str], ...]:
        """(file name, bytes, crc32c) of the shard file and of its index file, if any."""
        own = (self.file, self.bytes, self.crc32c)
        if self.index is None:
            return (own,)
        return own, (self.index.file, self.index.bytes, self.index.crc32c)

    def to_obj(self) -> dict[str, Any]:
        """Returns the JSON object of this shard."""
        obj: dict[str, Any] = {
            "file": self.file,
            "records": self.records,
            "bytes": self.bytes,
            "crc32c": self.crc32c,
        }
        if self.index is not None:
            obj["index"] = self.index.to_obj()
        return obj

    @classmethod
    def from_obj(cls, obj: Any, *, source: str = "shard") -> Shard:
        """Validates a parsed shard object (as :meth:`to_obj` makes it).

        Raises:
            HeaderError: The object is not a valid shard.
        """
        return _parse_shard(_Ctx(source), obj, 0)


@dataclass(frozen=True)
class Header:
    """Everything needed to rebuild a dataset, without reading its records.

    Attributes:
        structure: The element structure, leaves included.
        element_count: How many elements the dataset holds.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        shards: The record files, in element order.
        writer: What wrote the dataset (informational).
        format_version: The header format version.
        metadata: Facts about the data that its tensors do not hold, such as the
            class names of a label or the Arrow schema a dataset was converted
            from: a JSON object (string keys, any JSON values), empty by default
            and then left out of ``header.json``. Readers never need it to
            decode the records.
    """

    structure: Node
    element_count: int
    compression: str | None
    shards: tuple[Shard, ...]
    writer: str = ""
    format_version: int = FORMAT_VERSION
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def of_shards(
        cls, structure: Node, compression: str | None, shards: tuple[Shard, ...], *, writer: str
    ) -> Header:
        """The header of ``shards``, its element count their records added up."""
        return cls(structure, sum(s.records for s in shards), compression, shards, writer)

    @property
    def leaves(self) -> tuple[Leaf, ...]:
        """The leaves in ``tf.nest`` flattening order."""
        return tuple(iter_leaves(self.structure))

    @property
    def splittable(self) -> bool:
        """Whether a reader can start inside a shard: uncompressed, or every shard indexed.

        A compressed shard's index holds its restart points, from which a
        record inside it is inflated without the stream before it.
        """
        return not self.compression or all(s.index is not None for s in self.shards)

    @property
    def total_bytes(self) -> int:
        """The size of all record files together."""
        return sum(s.bytes for s in self.shards)

    def structure_json(self) -> str:
        """The structure alone as compact JSON: a key for caches of parsers."""
        return json.dumps(node_to_obj(self.structure), sort_keys=True)

    def to_obj(self) -> dict[str, Any]:
        """Returns the header as a JSON-able object (what ``header.json`` holds)."""
        return {
            "format_version": self.format_version,
            "writer": self.writer,
            "element_count": self.element_count,
            "compression": self.compression,
            "structure": node_to_obj(self.structure),
            "shards": [s.to_obj() for s in self.shards],
            **({"metadata": self.metadata} if self.metadata else {}),
        }

    def with_shards(self, shards: tuple[Shard, ...], *, element_count: int | None = None) -> Header:
        """This header over other shards, everything else (metadata included) kept.

        Args:
            shards: The new shards.
            element_count: The new count; None for the shards' records added up.
        """
        count = sum(s.records for s in shards) if element_count is None else element_count
        return replace(self, shards=shards, element_count=count)

    def to_json(self) -> str:
        """Returns the header as JSON text (``indent=2``, ``sort_keys=True``)."""
        return json.dumps(self.to_obj(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_obj(cls, obj: Any, *, source: str = "header") -> Header:
        """Validates a parsed header object (as :meth:`to_obj` makes it).

        Args:
            obj: The object, e.g. from ``json.loads`` of untrusted text.
            source: Where the object came from, for error messages.

        Raises:
            HeaderError: The object is not a valid header.
            FormatVersionError: The header's format version is unknown.
        """
        return _from_obj(_Ctx(source), obj)

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "header") -> Header:
        """Parses and validates header JSON, bounding its size before parsing.

        Args:
            text: The JSON text.
            source: Where the text came from, for error messages.

        Raises:
            HeaderError: The text is not a valid header.
            FormatVersionError: The header's format version is unknown.
        """
        return _parse(text, source)

    def summary(self) -> str:
        """A few human-readable lines: structure, count, size, shards."""
        lines = [
            f"superserial dataset: {self.element_count:,} elements in {len(self.shards)} "
            f"shard(s), {self.total_bytes:,} bytes, compression={self.compression}",
        ]
        for leaf in self.leaves:
            shape = "[" + ", ".join("None" if d is None else str(d) for d in leaf.shape) + "]"
            extra = f" ragged_rank={leaf.ragged_rank}" if leaf.kind == "ragged" else ""
            lines.append(
                f"  {leaf.name}: {leaf.kind} {leaf.dtype}{shape}{extra} encoding={leaf.encoding}"
            )
        return "\n".join(lines)


# ----------------------------------------------------------------- parsing


class _Ctx:
    def __init__(self, source: str) -> None:
        self.source = source
        self.leaves = 0

    def fail(self, where: str, msg: str) -> HeaderError:
        return HeaderError(f"{self.source}: {msg} at {where}")


def _short(v: Any, n: int = 80) -> str:
    """``repr(v)``, cut to about ``n`` characters: hostile values can be huge."""
    r = (
        repr(v)
        if not isinstance(v, (dict, list)) or len(v) < n
        else f"<{type(v).__name__} of {len(v)}>"
    )
    return r if len(r) <= n else r[: n - 20] + f"...<{len(r)} chars>"


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _want(ctx: _Ctx, obj: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ctx.fail(where, f"expected a field {_short(key)}, found none")
    v = obj[key]
    if typ is int:
        if not _is_int(v):
            raise ctx.fail(f"{where}.{key}", f"expected an integer, got {type(v).__name__}")
    elif not isinstance(v, typ):
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ctx.fail(f"{where}.{key}", f"expected {want}, got {type(v).__name__}")
    return v


def _check_keys(ctx: _Ctx, obj: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise ctx.fail(where, f"unexpected field(s) {_short(extra, 300)}")


def _parse_leaf(ctx: _Ctx, obj: dict[str, Any], path: tuple[str | int, ...], where: str) -> Leaf:
    ctx.leaves += 1
    if ctx.leaves > LIMITS.leaves:
        raise ctx.fail(where, f"expected at most {LIMITS.leaves} leaves, found more")
    allowed = {"type", "name", "kind", "dtype", "shape", "encoding", "features"}
    kind = _want(ctx, obj, "kind", str, where)
    if kind not in KINDS:
        raise ctx.fail(where, f"expected kind in {list(KINDS)}, got {_short(kind)}")
    if kind == "ragged":
        allowed |= {"ragged_rank", "row_splits_dtype"}
    _check_keys(ctx, obj, allowed, where)
    dtype = _want(ctx, obj, "dtype", str, where)
    try:
        entry = dtypes.by_name(dtype)
    except KeyError:
        raise ctx.fail(where, f"expected a supported dtype, got {_short(dtype)}") from None
    shape = _want(ctx, obj, "shape", list, where)
    if len(shape) > LIMITS.rank:
        raise ctx.fail(where, f"expected rank <= {LIMITS.rank}, got {len(shape)}")
    known = 1
    for d in shape:
        if d is not None and (not _is_int(d) or d < 0):
            raise ctx.fail(where, f"expected dimensions >= 0 or null, got {_short(d)}")
        known *= d if d is not None else 1
    if known > LIMITS.values_per_leaf:
        raise ctx.fail(
            where, f"expected at most {LIMITS.values_per_leaf} values per element, shape {shape}"
        )
    ragged_rank = row_splits = None
    if kind == "ragged":
        ragged_rank = _want(ctx, obj, "ragged_rank", int, where)
        if not 0 <= ragged_rank < max(len(shape), 1):
            raise ctx.fail(where, f"expected 0 <= ragged_rank < rank, got {ragged_rank}")
        row_splits = _want(ctx, obj, "row_splits_dtype", str, where)
        if row_splits not in ROW_SPLITS_DTYPES:
            raise ctx.fail(
                where, f"expected row_splits_dtype int32/int64, got {_short(row_splits)}"
            )
        if not shape:
            raise ctx.fail(where, "expected a ragged leaf of rank >= 1, got a scalar")
        if None in shape[ragged_rank + 1 :]:
            raise ctx.fail(where, "expected known dimensions inside the ragged ones")
    if kind == "sparse" and not shape:
        raise ctx.fail(where, "expected a sparse leaf of rank >= 1, got a scalar")
    leaf = Leaf(
        name=leaf_name(path),
        kind=kind,
        dtype=dtype,
        shape=tuple(shape),
        ragged_rank=ragged_rank,
        row_splits_dtype=row_splits,
    )
    name = _want(ctx, obj, "name", str, where)
    if name != leaf.name:
        raise ctx.fail(where, f"expected leaf name {leaf.name!r}, got {_short(name)}")
    encoding = _want(ctx, obj, "encoding", str, where)
    if encoding != entry.stored:
        raise ctx.fail(
            where, f"expected encoding {entry.stored!r} for {dtype}, got {_short(encoding)}"
        )
    features = _want(ctx, obj, "features", dict, where)
    if features != leaf.features:
        raise ctx.fail(where, f"expected features {leaf.features}, got {_short(features, 300)}")
    return leaf


def _parse_node(ctx: _Ctx, obj: Any, path: tuple[str | int, ...], depth: int) -> Node:
    where = "structure" + "".join(f"[{p!r}]" for p in path)
    if depth > LIMITS.depth:
        raise ctx.fail(where, f"expected nesting at most {LIMITS.depth} deep, found deeper")
    if not isinstance(obj, dict):
        raise ctx.fail(where, f"expected an object, got {type(obj).__name__}")
    typ = _want(ctx, obj, "type", str, where)
    if typ == "tensor":
        return _parse_leaf(ctx, obj, path, where)
    if typ == "dict":
        _check_keys(ctx, obj, {"type", "items"}, where)
        items = _want(ctx, obj, "items", dict, where)
        for k in items:
            if len(k) > LIMITS.name_chars:
                raise ctx.fail(
                    where,
                    f"expected dict keys of at most {LIMITS.name_chars} characters, got {len(k)}",
                )
        return DictNode({k: _parse_node(ctx, v, (*path, k), depth + 1) for k, v in items.items()})
    if typ == "tuple":
        _check_keys(ctx, obj, {"type", "items"}, where)
        items = _want(ctx, obj, "items", list, where)
        return TupleNode(
            tuple(_parse_node(ctx, v, (*path, i), depth + 1) for i, v in enumerate(items))
        )
    if typ == "namedtuple":
        _check_keys(ctx, obj, {"type", "name", "fields", "items"}, where)
        name = _want(ctx, obj, "name", str, where)
        fields = _want(ctx, obj, "fields", list, where)
        items = _want(ctx, obj, "items", list, where)
        if not _IDENT_RE.match(name) or not all(
            isinstance(f, str) and _IDENT_RE.match(f) for f in fields
        ):
            raise ctx.fail(where, "expected identifiers for the namedtuple name and fields")
        if len(fields) != len(items) or len(set(fields)) != len(fields):
            raise ctx.fail(
                where, f"expected {len(items)} distinct field names, got {_short(fields, 300)}"
            )
        return NamedTupleNode(
            name,
            tuple(fields),
            tuple(_parse_node(ctx, v, (*path, i), depth + 1) for i, v in enumerate(items)),
        )
    raise ctx.fail(where, f"expected type tensor/dict/tuple/namedtuple, got {_short(typ)}")


def _parse_shard(ctx: _Ctx, obj: Any, i: int) -> Shard:
    where = f"shards[{i}]"
    if not isinstance(obj, dict):
        raise ctx.fail(where, f"expected an object, got {type(obj).__name__}")
    _check_keys(ctx, obj, {"file", "records", "bytes", "crc32c", "index"}, where)
    file, size, crc = _parse_file(ctx, obj, where)
    records = _want(ctx, obj, "records", int, where)
    if records < 0:
        raise ctx.fail(where, f"expected non-negative counts, got records={records}")
    index = None
    if "index" in obj:
        iwhere = f"{where}.index"
        iobj = _want(ctx, obj, "index", dict, where)
        _check_keys(ctx, iobj, {"file", "bytes", "crc32c"}, iwhere)
        index = IndexFile(*_parse_file(ctx, iobj, iwhere))
        if index.file == file:
            raise ctx.fail(iwhere, f"expected an index file other than its shard, got {file!r}")
    return Shard(file, records, size, crc, index)


def _parse_file(ctx: _Ctx, obj: dict[str, Any], where: str) -> tuple[str, int, str]:
    """The checked ``file``, ``bytes`` and ``crc32c`` fields of a shard or index object."""
    file = _want(ctx, obj, "file", str, where)
    if not _SHARD_FILE_RE.match(file) or ".." in file:
        raise ctx.fail(where, f"expected a plain file name inside the dataset, got {_short(file)}")
    size = _want(ctx, obj, "bytes", int, where)
    crc = _want(ctx, obj, "crc32c", str, where)
    if size < 0:
        raise ctx.fail(where, f"expected non-negative counts, got bytes={size}")
    if not _CRC_RE.match(crc):
        raise ctx.fail(where, f"expected 8 lowercase hex digits for crc32c, got {_short(crc)}")
    return file, size, crc


def _parse(text: str | bytes, source: str) -> Header:
    ctx = _Ctx(source)
    if len(text) > LIMITS.header_bytes:
        raise ctx.fail(
            "top", f"expected a header of at most {LIMITS.header_bytes} bytes, got {len(text)}"
        )
    brace, bracket = (b"{", b"[") if isinstance(text, bytes) else ("{", "[")
    # brace and bracket are of text's own type (bytes or str); mypy cannot pair them.
    objects, arrays = text.count(brace), text.count(bracket)  # type: ignore[arg-type]
    if objects > LIMITS.json_objects or arrays > LIMITS.json_arrays:
        raise ctx.fail(
            "top",
            f"expected at most {LIMITS.json_objects} JSON objects and {LIMITS.json_arrays} arrays, "
            f"got {objects} and {arrays}",
        )
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except RecursionError:
        raise ctx.fail(
            "top", "expected JSON nested at most a few dozen levels, found far deeper"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise HeaderError(f"{source}: expected JSON, got unparsable text ({e})") from e
    return _from_obj(ctx, obj)


def _from_obj(ctx: _Ctx, obj: Any) -> Header:
    source = ctx.source
    if not isinstance(obj, dict):
        raise ctx.fail("top", f"expected a JSON object, got {type(obj).__name__}")
    if "format_version" not in obj:
        raise ctx.fail(
            "top", "expected a field 'format_version', found none; not a superserial header"
        )
    version = obj["format_version"]
    if not _is_int(version) or version != FORMAT_VERSION:
        raise FormatVersionError(
            f"{source}: expected format_version {FORMAT_VERSION}, got {_short(version)}; "
            "this header was written by another superserial version"
        )
    _check_keys(
        ctx,
        obj,
        {
            "format_version",
            "writer",
            "element_count",
            "compression",
            "structure",
            "shards",
            "metadata",
        },
        "top",
    )
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ctx.fail("metadata", f"expected a JSON object, got {type(metadata).__name__}")
    writer = _want(ctx, obj, "writer", str, "top")
    count = _want(ctx, obj, "element_count", int, "top")
    if count < 0:
        raise ctx.fail("top", f"expected element_count >= 0, got {count}")
    compression = obj.get("compression")
    if compression not in COMPRESSIONS:
        raise ctx.fail("compression", f"expected null, 'GZIP' or 'ZLIB', got {_short(compression)}")
    structure = _parse_node(ctx, obj.get("structure"), (), 0)
    if ctx.leaves == 0:
        raise ctx.fail("structure", "expected at least one tensor, found none")
    shards_obj = _want(ctx, obj, "shards", list, "top")
    if len(shards_obj) > LIMITS.shards:
        raise ctx.fail("shards", f"expected at most {LIMITS.shards} shards, got {len(shards_obj)}")
    shards = tuple(_parse_shard(ctx, s, i) for i, s in enumerate(shards_obj))
    names_on_disk = [f[0] for s in shards for f in s.files()]
    if len(set(names_on_disk)) != len(names_on_disk):
        raise ctx.fail("shards", "expected distinct file names, found a repeat")
    total = sum(s.records for s in shards)
    if total != count:
        raise ctx.fail(
            "shards", f"expected records adding up to element_count {count}, got {total}"
        )
    names: set[str] = set()
    for leaf in iter_leaves(structure):
        for n in leaf.feature_names():
            if n in names:
                raise ctx.fail(leaf.name, f"expected distinct feature names, {n!r} repeats")
            names.add(n)
    return Header(structure, count, compression, shards, writer, version, metadata)

"""``tf.train.Example`` records, parsed without TensorFlow.

The message classes are built here from a private ``protobuf`` descriptor
pool, so neither TensorFlow nor its generated code is needed, and they work in
a process that has TensorFlow imported too (whose ``tensorflow.Example`` lives
in the default pool: either may be loaded first without a "duplicate symbol"
error).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from superserial.errors import CorruptDataError

__all__ = [
    "EMPTY_FEATURE",
    "TAG_ENTRY_VALUE",
    "TAG_FEATURE",
    "TAG_VALUE",
    "Example",
    "Feature",
    "parse_features",
    "varint",
]

# Protobuf wire-format tags (field number << 3 | 2, length-delimited) of the
# tf.train messages, for the encoders and the batch decoder, which work on the
# record bytes directly.
TAG_VALUE = (
    b"\x0a"  # Int64List/FloatList/BytesList.value, Features.feature, Example.features, Entry.key
)
TAG_ENTRY_VALUE = b"\x12"  # Features.FeatureEntry.value
TAG_FEATURE = {
    "bytes": b"\x0a",
    "raw": b"\x0a",
    "float": b"\x12",
    "int64": b"\x1a",
}  # Feature.*_list


def varint(n: int) -> bytes:
    """The protobuf varint of ``n >= 0``: 7 bits a byte, least significant first."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _message_classes() -> tuple[Any, Any]:
    """``tensorflow.Example`` and ``tensorflow.Feature`` from a private pool."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="superserial/tf_example.proto", package="tensorflow", syntax="proto3"
    )
    for name, typ in (
        ("BytesList", f.TYPE_BYTES),
        ("FloatList", f.TYPE_FLOAT),
        ("Int64List", f.TYPE_INT64),
    ):
        field = fdp.message_type.add(name=name).field.add(
            name="value", number=1, label=f.LABEL_REPEATED, type=typ
        )
        if typ != f.TYPE_BYTES:
            field.options.packed = True
    feature = fdp.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, typ) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), 1
    ):
        feature.field.add(
            name=name, number=number, label=f.LABEL_OPTIONAL, type=f.TYPE_MESSAGE,
            type_name=f".tensorflow.{typ}", oneof_index=0,
        )  # fmt: skip
    features = fdp.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=f.LABEL_OPTIONAL, type=f.TYPE_STRING)
    entry.field.add(
        name="value",
        number=2,
        label=f.LABEL_OPTIONAL,
        type=f.TYPE_MESSAGE,
        type_name=".tensorflow.Feature",
    )
    features.field.add(
        name="feature", number=1, label=f.LABEL_REPEATED, type=f.TYPE_MESSAGE,
        type_name=".tensorflow.Features.FeatureEntry",
    )  # fmt: skip
    example = fdp.message_type.add(name="Example")
    example.field.add(
        name="features",
        number=1,
        label=f.LABEL_OPTIONAL,
        type=f.TYPE_MESSAGE,
        type_name=".tensorflow.Features",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Feature")),
    )


Example, Feature = _message_classes()

# A feature with no list set: what an absent optional feature reads as.
EMPTY_FEATURE = Feature()


def parse_features(record: bytes, where: str) -> Any:
    """The feature map (name -> ``Feature``) of one serialized ``tf.train.Example``.

    Args:
        record: The record's bytes.
        where: Its location (file and record), for the message.

    Raises:
        CorruptDataError: The bytes are not a ``tf.train.Example``.
    """
    try:
        return Example.FromString(record).features.feature
    except DecodeError as e:
        text = f"expected a tf.train.Example, got unparsable bytes ({e})"
        raise CorruptDataError(f"{text} at {where}", reason=text) from e

"""KPL aggregate decoder on the protobuf runtime: its C parser (upb) reads the body, Python only checks and maps.

The AggregatedRecord, Record and Tag messages are described here as a FileDescriptorProto built in code, so neither
`protoc` nor generated `_pb2` files are needed at install or run time. Field numbers and labels follow the KPL's
aggregation format (agent/kpl.py lists them). They live in a private descriptor pool, so a user's own copy of the
KPL schema in the default pool cannot clash with them. The answers (records or BrokenAggregate) are the pure-Python
decoder's (agent/kpl_python.py); tests/agent/test_kpl_decoders.py checks that.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError

from agent.kpl import BrokenAggregate, UserRecord, aggregate_body

_PACKAGE = "shardherd.kpl"
# First bytes of Record's optional fields' tags: explicit_hash_key_index (2, varint) and tags (4, length-delimited),
# in their shortest encoding and as the start of a longer one.
_OPTIONAL_FIELD_MARKERS = (b"\x10", b"\x90", b"\x22", b"\xa2")
_Field = descriptor_pb2.FieldDescriptorProto
_SCHEMA: dict[str, list[tuple[int, str, int, int, str]]] = {
    "Tag": [(1, "key", _Field.LABEL_REQUIRED, _Field.TYPE_STRING, ""),
            (2, "value", _Field.LABEL_OPTIONAL, _Field.TYPE_STRING, "")],
    "Record": [(1, "partition_key_index", _Field.LABEL_REQUIRED, _Field.TYPE_UINT64, ""),
               (2, "explicit_hash_key_index", _Field.LABEL_OPTIONAL, _Field.TYPE_UINT64, ""),
               (3, "data", _Field.LABEL_REQUIRED, _Field.TYPE_BYTES, ""),
               (4, "tags", _Field.LABEL_REPEATED, _Field.TYPE_MESSAGE, "Tag")],
    "AggregatedRecord": [(1, "partition_key_table", _Field.LABEL_REPEATED, _Field.TYPE_STRING, ""),
                         (2, "explicit_hash_key_table", _Field.LABEL_REPEATED, _Field.TYPE_STRING, ""),
                         (3, "records", _Field.LABEL_REPEATED, _Field.TYPE_MESSAGE, "Record")],
}


def implementation() -> str:
    """The protobuf runtime's implementation: "upb" (C), "cpp" or "python"."""
    return str(api_implementation.Type())


def _aggregated_record_class() -> Any:
    """The AggregatedRecord message class, from a file descriptor built in code (proto2: required fields)."""
    file = descriptor_pb2.FileDescriptorProto(name="shardherd/kpl_aggregation.proto", package=_PACKAGE,
                                              syntax="proto2")
    for message_name, fields in _SCHEMA.items():
        message = file.message_type.add(name=message_name)
        for number, name, label, kind, type_name in fields:
            field = message.field.add(name=name, number=number, label=label, type=kind)
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.AggregatedRecord"))


_AggregatedRecord = _aggregated_record_class()


def decode(data: bytes) -> list[UserRecord]:
    """The user records packed in an aggregate, in order; BrokenAggregate if anything about it is wrong."""
    message, partition_keys, hash_keys = _parse(aggregate_body(data))
    return [_user_record(record, partition_keys, hash_keys) for record in message.records]


def decode_columns(data: bytes) -> tuple[list[str], list[bytes]]:
    """The partition keys and payloads of an aggregate's user records, in order, after every check `decode` makes.

    The Spark read path needs only these two columns; building them straight from the parsed message skips a
    Python object per user record, which costs more than the C parse itself. Records can carry an explicit hash key
    index or tags only if the body holds a first byte of those fields' tags (any varint encoding of a tag starts
    with its low 7 bits); when it holds none and the aggregate has no explicit hash keys (text payloads, the usual
    case), those per-record checks cannot fail and are skipped.
    """
    body = aggregate_body(data)
    message, partition_keys, hash_keys = _parse(body)
    records = message.records
    if hash_keys or any(marker in body for marker in _OPTIONAL_FIELD_MARKERS):
        users = [_user_record(record, partition_keys, hash_keys) for record in records]
        return [user.partition_key for user in users], [user.data for user in users]
    key_indexes = [record.partition_key_index for record in records]
    if max(key_indexes) >= len(partition_keys):
        raise BrokenAggregate(f"partition_key_index {max(key_indexes)} is out of range ({len(partition_keys)} keys)")
    return [partition_keys[index] for index in key_indexes], [record.data for record in records]


def _parse(body: bytes) -> tuple[Any, list[str], list[str]]:
    """The parsed, complete AggregatedRecord with at least one record, and its checked key tables."""
    message = _AggregatedRecord()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise BrokenAggregate(f"protobuf body does not parse: {exc}") from exc
    if not message.records:
        raise BrokenAggregate("aggregate holds no records")
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())
        raise BrokenAggregate(f"required fields missing: {missing}")
    return (message, _texts(message.partition_key_table, "partition key"),
            _texts(message.explicit_hash_key_table, "explicit hash key"))


def _user_record(record: Any, partition_keys: list[str], hash_keys: list[str]) -> UserRecord:
    key_index: int = record.partition_key_index
    if key_index >= len(partition_keys):
        raise BrokenAggregate(f"partition_key_index {key_index} is out of range ({len(partition_keys)} keys)")
    explicit = None
    if record.HasField("explicit_hash_key_index"):
        hash_index: int = record.explicit_hash_key_index
        if hash_index >= len(hash_keys):
            raise BrokenAggregate(f"explicit_hash_key_index {hash_index} is out of range ({len(hash_keys)} keys)")
        explicit = hash_keys[hash_index]
    return UserRecord(partition_keys[key_index], record.data, explicit, _tags(record) if record.tags else ())


def _tags(record: Any) -> tuple[tuple[str, str | None], ...]:
    return tuple((_text(tag.key, "tag key"), _text(tag.value, "tag value") if tag.HasField("value") else None)
                 for tag in record.tags)


def _texts(values: Any, what: str) -> list[str]:
    """The strings of a repeated string field; proto2 parsing hands invalid UTF-8 over as bytes."""
    texts = list(values)
    for value in texts:
        _text(value, what)
    return texts


def _text(value: str | bytes, what: str) -> str:
    if not isinstance(value, str):
        raise BrokenAggregate(f"{what} is not valid UTF-8")
    return value

"""KPL aggregate decoder on the protobuf runtime: its C parser (upb) reads and checks the body, Python maps it.

The AggregatedRecord, Record and Tag messages are described here as a FileDescriptorProto built in code, so neither
`protoc` nor generated `_pb2` files are needed at install or run time. Field numbers follow the KPL's aggregation
format (agent/kpl.py lists them). The file uses protobuf editions (2023) rather than proto2 syntax so that the
parser itself rejects strings that are not UTF-8 (proto2 parsing would hand them over as bytes for Python to
check), while KPL's required fields stay required (`LEGACY_REQUIRED`). The messages live in a private descriptor
pool, so a user's own copy of the KPL schema in the default pool cannot clash with them. The answers (records or
BrokenAggregate) are the pure-Python decoder's (agent/kpl_python.py); tests/agent/test_kpl_decoders.py checks that.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError

from shardherd.agent.kpl import BrokenAggregate, UserRecord, aggregate_body

_PACKAGE = "shardherd.kpl"
# First bytes of the tag of Record.explicit_hash_key_index (field 2, varint): its shortest encoding, and the start
# of any longer one (a varint's first byte carries its low 7 bits).
_HASH_INDEX_TAG_STARTS = (b"\x10", b"\x90")
_Field = descriptor_pb2.FieldDescriptorProto
_REQUIRED, _OPTIONAL, _REPEATED = "required", "optional", "repeated"
_SCHEMA: dict[str, list[tuple[int, str, str, int, str]]] = {
    "Tag": [(1, "key", _REQUIRED, _Field.TYPE_STRING, ""),
            (2, "value", _OPTIONAL, _Field.TYPE_STRING, "")],
    "Record": [(1, "partition_key_index", _REQUIRED, _Field.TYPE_UINT64, ""),
               (2, "explicit_hash_key_index", _OPTIONAL, _Field.TYPE_UINT64, ""),
               (3, "data", _REQUIRED, _Field.TYPE_BYTES, ""),
               (4, "tags", _REPEATED, _Field.TYPE_MESSAGE, "Tag")],
    "AggregatedRecord": [(1, "partition_key_table", _REPEATED, _Field.TYPE_STRING, ""),
                         (2, "explicit_hash_key_table", _REPEATED, _Field.TYPE_STRING, ""),
                         (3, "records", _REPEATED, _Field.TYPE_MESSAGE, "Record")],
}


def implementation() -> str:
    """The protobuf runtime's implementation: "upb" (C), "cpp" or "python"."""
    return str(api_implementation.Type())


def _aggregated_record_class() -> Any:
    """The AggregatedRecord message class, from a file descriptor built in code (edition 2023: UTF-8 verified)."""
    file = descriptor_pb2.FileDescriptorProto(name="shardherd/kpl_aggregation.proto", package=_PACKAGE,
                                              syntax="editions", edition=descriptor_pb2.EDITION_2023)
    for message_name, fields in _SCHEMA.items():
        message = file.message_type.add(name=message_name)
        for number, name, cardinality, kind, type_name in fields:
            label = _Field.LABEL_REPEATED if cardinality == _REPEATED else _Field.LABEL_OPTIONAL
            field = message.field.add(name=name, number=number, label=label, type=kind)
            if cardinality == _REQUIRED:
                field.options.features.field_presence = descriptor_pb2.FeatureSet.LEGACY_REQUIRED
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.AggregatedRecord"))


_AggregatedRecord = _aggregated_record_class()


def decode(data: bytes) -> list[UserRecord]:
    """The user records packed in an aggregate, in order; BrokenAggregate if anything about it is wrong."""
    message = _parse(aggregate_body(data))
    partition_keys, hash_keys = list(message.partition_key_table), list(message.explicit_hash_key_table)
    return [_user_record(record, partition_keys, hash_keys) for record in message.records]


def decode_columns(data: bytes) -> tuple[list[str], list[bytes]]:
    """The partition keys and payloads of an aggregate's user records, in order, after every check `decode` makes.

    The Spark read path needs only these two columns; building them straight from the parsed message skips a
    Python object per user record, which costs more than the C parse itself. Without explicit hash keys, a record
    can only be broken by carrying an explicit hash key index, whose tag must then start somewhere in the body:
    when no such byte is there (text payloads), that per-record check cannot fail and is skipped.
    """
    body = aggregate_body(data)
    message = _parse(body)
    records = message.records
    partition_keys, hash_keys = message.partition_key_table, message.explicit_hash_key_table
    key_indexes = [record.partition_key_index for record in records]
    if max(key_indexes) >= len(partition_keys):
        raise BrokenAggregate(f"partition_key_index {max(key_indexes)} is out of range ({len(partition_keys)} keys)")
    if hash_keys:  # an absent index reads 0, which is in range: only present ones can be out of range
        if max(record.explicit_hash_key_index for record in records) >= len(hash_keys):
            raise BrokenAggregate(f"an explicit_hash_key_index is out of range ({len(hash_keys)} keys)")
    elif (any(start in body for start in _HASH_INDEX_TAG_STARTS)
          and any(record.HasField("explicit_hash_key_index") for record in records)):
        raise BrokenAggregate("a record has an explicit_hash_key_index but the aggregate has no explicit hash keys")
    keys = list(partition_keys)
    return [keys[index] for index in key_indexes], [record.data for record in records]


def _parse(body: bytes) -> Any:
    """The parsed, complete AggregatedRecord with at least one record (strings already checked as UTF-8)."""
    message = _AggregatedRecord()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise BrokenAggregate(f"protobuf body does not parse (corrupt, or a string not UTF-8): {exc}") from exc
    if not message.records:
        raise BrokenAggregate("aggregate holds no records")
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())
        raise BrokenAggregate(f"required fields missing: {missing}")
    return message


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
    tags = tuple((tag.key, tag.value if tag.HasField("value") else None) for tag in record.tags) if record.tags else ()
    return UserRecord(partition_keys[key_index], record.data, explicit, tags)

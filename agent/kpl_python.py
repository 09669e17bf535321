"""The pure-Python KPL aggregate decoder: protobuf wire format read by hand, following protobuf's parsing rules.

It is the fallback when the protobuf runtime's C implementation is not installed (agent/kpl_decoding.py chooses),
and it must give the same answer as that runtime for every input, so the agent's driver and its executors agree on
where a Kinesis record's user records end whichever decoder each process uses. Hence the rules below are
protobuf's, not stricter ones: a known field sent with another wire type is an unknown field; unknown fields
(groups included) are skipped; a varint keeps its low 64 bits; a field tag is a varint below 2**32 with a field
number of at least 1; messages and groups nest at most `MAX_DEPTH` deep. tests/agent/test_kpl_decoders.py checks
the agreement on generated and corrupted aggregates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from shardherd.agent.kpl import BrokenAggregate, UserRecord, aggregate_body

_VARINT, _FIXED64, _LENGTH_DELIMITED, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5
_MAX_VARINT_BYTES = 10
_MAX_TAG_BYTES = 5
_UINT64_MASK = 2**64 - 1
MAX_DEPTH = 100  # the protobuf runtime's default nesting limit

_Field = tuple[int, int, int | bytes]  # field number, wire type, value (int for varint and fixed, else bytes)


def decode(data: bytes) -> list[UserRecord]:
    """The user records packed in an aggregate, in order; BrokenAggregate if anything about it is wrong."""
    partition_keys: list[str] = []
    hash_keys: list[str] = []
    raw_records: list[bytes] = []
    for number, wire_type, value in _fields(aggregate_body(data), 0):
        if wire_type != _LENGTH_DELIMITED or not isinstance(value, bytes):
            continue  # a wire type other than the schema's: an unknown field, as protobuf treats it
        if number == 1:
            partition_keys.append(_text(value, "partition key"))
        elif number == 2:
            hash_keys.append(_text(value, "explicit hash key"))
        elif number == 3:
            raw_records.append(value)
    if not raw_records:
        raise BrokenAggregate("aggregate holds no records")
    return [_decode_user_record(raw, partition_keys, hash_keys) for raw in raw_records]


def decode_columns(data: bytes) -> tuple[list[str], list[bytes]]:
    """The partition keys and payloads of an aggregate's user records, in order; BrokenAggregate as `decode`."""
    records = decode(data)
    return [record.partition_key for record in records], [record.data for record in records]


def _decode_user_record(raw: bytes, partition_keys: Sequence[str], hash_keys: Sequence[str]) -> UserRecord:
    key_index: int | None = None
    hash_index: int | None = None
    data: bytes | None = None
    tags: list[tuple[str, str | None]] = []
    for number, wire_type, value in _fields(raw, 1):
        if wire_type == _VARINT and isinstance(value, int):
            if number == 1:
                key_index = value
            elif number == 2:
                hash_index = value
        elif wire_type == _LENGTH_DELIMITED and isinstance(value, bytes):
            if number == 3:
                data = value
            elif number == 4:
                tags.append(_decode_tag(value))
    if key_index is None or data is None:
        raise BrokenAggregate("a record lacks its required partition_key_index or data")
    explicit = None if hash_index is None else _indexed(hash_keys, hash_index, "explicit_hash_key_index")
    return UserRecord(_indexed(partition_keys, key_index, "partition_key_index"), data, explicit, tuple(tags))


def _indexed(keys: Sequence[str], index: int, name: str) -> str:
    """The key a record's `name` field points at in the aggregate's table."""
    if index >= len(keys):
        raise BrokenAggregate(f"{name} {index} is out of range ({len(keys)} keys)")
    return keys[index]


def _decode_tag(raw: bytes) -> tuple[str, str | None]:
    key: str | None = None
    value: str | None = None
    for number, wire_type, field_value in _fields(raw, 2):
        if wire_type == _LENGTH_DELIMITED and isinstance(field_value, bytes):
            if number == 1:
                key = _text(field_value, "tag key")
            elif number == 2:
                value = _text(field_value, "tag value")
    if key is None:
        raise BrokenAggregate("a tag lacks its required key")
    return key, value


def _fields(buffer: bytes, depth: int) -> Iterator[_Field]:
    """The fields of one message nested `depth` deep, in order; groups are checked and skipped."""
    if depth > MAX_DEPTH:
        raise BrokenAggregate(f"protobuf messages nest deeper than {MAX_DEPTH}")
    position, end = 0, len(buffer)
    while position < end:
        number, wire_type, position = _read_tag(buffer, position)
        if wire_type == _END_GROUP:
            raise BrokenAggregate(f"end-group tag of field {number} without its start")
        if wire_type == _START_GROUP:
            position = _skip_group(buffer, position, number, depth + 1)
            continue
        value, position = _read_value(buffer, position, number, wire_type)
        yield number, wire_type, value


def _skip_group(buffer: bytes, position: int, group: int, depth: int) -> int:
    """The position after the end-group tag closing `group` (an unknown field in proto2's group encoding)."""
    if depth > MAX_DEPTH:
        raise BrokenAggregate(f"protobuf groups nest deeper than {MAX_DEPTH}")
    while position < len(buffer):
        number, wire_type, position = _read_tag(buffer, position)
        if wire_type == _END_GROUP:
            if number != group:
                raise BrokenAggregate(f"group {group} is closed by the end-group tag of field {number}")
            return position
        if wire_type == _START_GROUP:
            position = _skip_group(buffer, position, number, depth + 1)
        else:
            position = _read_value(buffer, position, number, wire_type)[1]
    raise BrokenAggregate(f"group {group} is not closed")


def _read_tag(buffer: bytes, position: int) -> tuple[int, int, int]:
    start = position
    key, position = _read_varint(buffer, position)
    if position - start > _MAX_TAG_BYTES or key >= 2**32:
        raise BrokenAggregate("protobuf field tag is longer than 5 bytes or above 2**32")
    number, wire_type = key >> 3, key & 7
    if number == 0:
        raise BrokenAggregate("protobuf field number 0")
    return number, wire_type, position


def _read_value(buffer: bytes, position: int, number: int, wire_type: int) -> tuple[int | bytes, int]:
    end = len(buffer)
    if wire_type == _VARINT:
        return _read_varint(buffer, position)
    if wire_type == _LENGTH_DELIMITED:
        length, position = _read_varint(buffer, position)
        if position + length > end:
            raise BrokenAggregate(f"field {number} claims {length} bytes, only {end - position} left")
        return buffer[position : position + length], position + length
    if wire_type in (_FIXED64, _FIXED32):
        size = 8 if wire_type == _FIXED64 else 4
        if position + size > end:
            raise BrokenAggregate(f"fixed-size field {number} is truncated")
        return int.from_bytes(buffer[position : position + size], "little"), position + size
    raise BrokenAggregate(f"invalid protobuf wire type {wire_type} (field {number})")


def _read_varint(buffer: bytes, position: int) -> tuple[int, int]:
    result = 0
    for shift_index in range(_MAX_VARINT_BYTES):
        if position >= len(buffer):
            raise BrokenAggregate("protobuf varint is truncated")
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << (7 * shift_index)
        if not byte & 0x80:
            return result & _UINT64_MASK, position
    raise BrokenAggregate("protobuf varint is longer than 10 bytes")


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BrokenAggregate(f"{what} is not valid UTF-8") from exc

"""KPL aggregated records: the wire format (magic, protobuf AggregatedRecord, MD5), its checks, encoder and aggregator.

Layout of an aggregated Kinesis record's data: the 4 magic bytes F3 89 9A C2, a protobuf `AggregatedRecord`, then the
16-byte MD5 digest of that protobuf body. The protobuf schema (field numbers on the left):

    AggregatedRecord: 1 repeated string partition_key_table, 2 repeated string explicit_hash_key_table,
                      3 repeated Record records
    Record:           1 required uint64 partition_key_index, 2 optional uint64 explicit_hash_key_index,
                      3 required bytes data, 4 repeated Tag tags
    Tag:              1 required string key, 2 optional string value

Encoding is done here directly (varints and length-delimited fields: the producer side needs no protobuf runtime).
Decoding lives in agent/kpl_decoding.py, which picks the protobuf runtime's C decoder (agent/kpl_protobuf.py) or the
pure-Python one (agent/kpl_python.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shardherd.shared.errors import ShardherdError

# How a process may decode aggregates (agent/kpl_decoding.py): the fastest installed decoder, or pure Python.
KPL_DECODERS = ("auto", "python")
MAGIC = bytes((0xF3, 0x89, 0x9A, 0xC2))
DIGEST_SIZE = 16
# The KPL's default AggregationMaxSize; Kinesis itself takes records of up to 1 MiB.
DEFAULT_MAX_AGGREGATE_BYTES = 51_200
MAX_KINESIS_RECORD_BYTES = 1_048_576

_VARINT, _LENGTH_DELIMITED = 0, 2


class BrokenAggregate(ShardherdError, ValueError):
    """Data starts with the KPL magic bytes but is not a valid aggregate (bad digest, bad protobuf, bad index)."""


@dataclass(frozen=True, slots=True)
class UserRecord:
    """One record as the producer wrote it, before aggregation (or after de-aggregation)."""

    partition_key: str
    data: bytes
    explicit_hash_key: str | None = None
    tags: tuple[tuple[str, str | None], ...] = ()


def is_aggregate(data: bytes) -> bool:
    """True if `data` carries the KPL magic bytes and is long enough to hold a digest."""
    return len(data) >= len(MAGIC) + DIGEST_SIZE and data.startswith(MAGIC)


def aggregate_body(data: bytes) -> bytes:
    """The protobuf body of an aggregate, after checking its magic bytes and MD5 digest (BrokenAggregate if wrong)."""
    if not is_aggregate(data):
        raise BrokenAggregate("data does not start with the KPL magic bytes or is shorter than magic plus digest")
    body = data[len(MAGIC) : -DIGEST_SIZE]
    if hashlib.md5(body, usedforsecurity=False).digest() != data[-DIGEST_SIZE:]:
        raise BrokenAggregate("MD5 digest does not match the protobuf body")
    return body


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer below 2**64."""
    if not 0 <= value < 2**64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | _LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return encode_varint(number << 3 | _VARINT) + encode_varint(value)


class _Tables:
    """Interned partition and explicit hash keys of one aggregate, with the protobuf bytes they add."""

    def __init__(self) -> None:
        self.partition_keys: dict[str, int] = {}
        self.hash_keys: dict[str, int] = {}

    def cost(self, record: UserRecord) -> int:
        """Bytes the key tables grow by if `record` is added."""
        size = 0
        if record.partition_key not in self.partition_keys:
            size += len(_length_delimited(1, record.partition_key.encode()))
        if record.explicit_hash_key is not None and record.explicit_hash_key not in self.hash_keys:
            size += len(_length_delimited(2, record.explicit_hash_key.encode()))
        return size

    def encode_record(self, record: UserRecord) -> bytes:
        """The record's protobuf field (number 3), interning its keys."""
        key_index = self.partition_keys.setdefault(record.partition_key, len(self.partition_keys))
        body = _varint_field(1, key_index)
        if record.explicit_hash_key is not None:
            hash_index = self.hash_keys.setdefault(record.explicit_hash_key, len(self.hash_keys))
            body += _varint_field(2, hash_index)
        body += _length_delimited(3, record.data)
        for key, value in record.tags:
            tag = _length_delimited(1, key.encode()) + (b"" if value is None else _length_delimited(2, value.encode()))
            body += _length_delimited(4, tag)
        return _length_delimited(3, body)

    def encode(self) -> bytes:
        """The key tables' protobuf fields, in index order."""
        return b"".join(_length_delimited(1, key.encode()) for key in self.partition_keys) + b"".join(
            _length_delimited(2, key.encode()) for key in self.hash_keys
        )


def encode_aggregate(records: Sequence[UserRecord]) -> bytes:
    """The Kinesis record data that packs `records` (at least one) in KPL's aggregated format."""
    if not records:
        raise ValueError("an aggregate needs at least one record")
    tables = _Tables()
    encoded = b"".join(tables.encode_record(record) for record in records)
    body = tables.encode() + encoded
    return MAGIC + body + hashlib.md5(body, usedforsecurity=False).digest()


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One Kinesis record to put: the first user record's keys route it, `data` packs all of `records`."""

    partition_key: str
    explicit_hash_key: str | None
    data: bytes
    records: tuple[UserRecord, ...]


class Aggregator:
    """Packs user records, in order, into aggregates no larger than `max_bytes` (magic and digest included).

    All records of one aggregate reach the shard its first record's keys route to, so callers that care about
    routing aggregate per shard (as the KPL does). A record too large to share an aggregate goes alone.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_AGGREGATE_BYTES, max_records: int = 2**32 - 1) -> None:
        if not len(MAGIC) + DIGEST_SIZE < max_bytes <= MAX_KINESIS_RECORD_BYTES or max_records < 1:
            raise ValueError(f"max_bytes must be in (20, {MAX_KINESIS_RECORD_BYTES}] and max_records >= 1")
        self._max_bytes = max_bytes
        self._max_records = max_records
        self._pending: list[UserRecord] = []
        self._tables = _Tables()
        self._size = len(MAGIC) + DIGEST_SIZE

    def add(self, record: UserRecord) -> Aggregate | None:
        """Add `record`; returns the finished aggregate when `record` did not fit into the current one."""
        growth = self._tables.cost(record) + len(self._tables.encode_record(record))
        finished = None
        if self._pending and (self._size + growth > self._max_bytes or len(self._pending) >= self._max_records):
            finished = self.flush()
            growth = self._tables.cost(record) + len(self._tables.encode_record(record))
        self._pending.append(record)
        self._size += growth
        return finished

    def flush(self) -> Aggregate | None:
        """The aggregate of everything added since the last flush, or None if nothing is pending."""
        if not self._pending:
            return None
        records = tuple(self._pending)
        self._pending, self._tables, self._size = [], _Tables(), len(MAGIC) + DIGEST_SIZE
        first = records[0]
        return Aggregate(first.partition_key, first.explicit_hash_key, encode_aggregate(records), records)

    def pack(self, records: Iterable[UserRecord]) -> list[Aggregate]:
        """All of `records` packed into aggregates, flushing at the end."""
        aggregates = [aggregate for record in records if (aggregate := self.add(record)) is not None]
        last = self.flush()
        return [*aggregates, last] if last is not None else aggregates

"""KPL aggregate format: hand-built protobuf bytes, round trips, broken aggregates delivered raw, the aggregator."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardherd.agent.kpl import (
    MAGIC,
    Aggregator,
    BrokenAggregate,
    UserRecord,
    encode_aggregate,
    encode_varint,
    is_aggregate,
)
from shardherd.agent.kpl_decoding import decode_aggregate
from shardherd.agent.records import DeaggregationCounters, records_from_kinesis
from shardherd.shared.checkpoint import Checkpoint

ARRIVAL = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def framed(body: bytes) -> bytes:
    return MAGIC + body + hashlib.md5(body).digest()


def field(number: int, payload: bytes) -> bytes:
    """Length-delimited protobuf field, built by hand (single-byte key and length)."""
    assert number < 16 and len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


# Two records: ("pk", ehk "123", b"hello") and ("pk", no ehk, b"bye", tag k=v).
HAND_BODY = (
    field(1, b"pk")
    + field(2, b"123")
    + field(3, b"\x08\x00" + b"\x10\x00" + field(3, b"hello"))
    + field(3, b"\x08\x00" + field(3, b"bye") + field(4, field(1, b"k") + field(2, b"v")))
)


def kinesis_item(data: bytes, sequence: str = "100", key: str = "outer") -> dict[str, Any]:
    return {"SequenceNumber": sequence, "PartitionKey": key, "Data": data, "ApproximateArrivalTimestamp": ARRIVAL}


def test_decodes_hand_built_protobuf() -> None:
    assert decode_aggregate(framed(HAND_BODY)) == [
        UserRecord("pk", b"hello", "123"),
        UserRecord("pk", b"bye", None, (("k", "v"),)),
    ]


def test_encoder_writes_the_hand_built_bytes() -> None:
    records = [UserRecord("pk", b"hello", "123"), UserRecord("pk", b"bye", None, (("k", "v"),))]
    assert encode_aggregate(records) == framed(HAND_BODY)


def test_unknown_fields_are_skipped() -> None:
    # field 15 varint 300, field 14 fixed32, field 13 fixed64 next to a valid record
    extras = bytes([15 << 3]) + encode_varint(300) + bytes([14 << 3 | 5]) + b"\x01\x02\x03\x04"
    extras += bytes([13 << 3 | 1]) + bytes(8)
    body = field(1, b"a") + extras + field(3, b"\x08\x00" + field(3, b"x") + extras)
    assert decode_aggregate(framed(body)) == [UserRecord("a", b"x")]


def test_varint_encoding_matches_protobuf_examples() -> None:
    assert encode_varint(0) == b"\x00"
    assert encode_varint(1) == b"\x01"
    assert encode_varint(150) == b"\x96\x01"
    assert encode_varint(300) == b"\xac\x02"
    assert encode_varint(2**64 - 1) == b"\xff" * 9 + b"\x01"
    with pytest.raises(ValueError):
        encode_varint(-1)


BROKEN = {
    "md5 mismatch": MAGIC + HAND_BODY + bytes(16),
    "truncated body": framed(HAND_BODY[:-3]),
    "truncated varint": framed(field(1, b"a") + b"\x08\xff"),
    "partition key index out of range": framed(field(1, b"a") + field(3, b"\x08\x01" + field(3, b"x"))),
    "hash key index out of range": framed(field(1, b"a") + field(3, b"\x08\x00\x10\x00" + field(3, b"x"))),
    "record without data": framed(field(1, b"a") + field(3, b"\x08\x00")),
    "no records": framed(field(1, b"a")),
    "group wire type": framed(field(1, b"a") + b"\x1b"),
    "non-utf8 key": framed(field(1, b"\xff\xfe") + field(3, b"\x08\x00" + field(3, b"x"))),
}


@pytest.mark.parametrize("data", BROKEN.values(), ids=BROKEN.keys())
def test_broken_aggregate_is_one_raw_record(data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(BrokenAggregate):
        decode_aggregate(data)
    counters = DeaggregationCounters()
    with caplog.at_level(logging.WARNING, logger="shardherd.agent.records"):
        records = records_from_kinesis("shardId-1", kinesis_item(data), counters)
    assert len(records) == 1
    (record,) = records
    assert (record.data, record.partition_key, record.aggregated, record.sub_sequence_number) == (data, "outer",
                                                                                                   False, 0)
    assert record.checkpoint == Checkpoint("100", 0)
    assert counters.broken_aggregates == 1
    assert "broken KPL aggregate" in caplog.text


def test_plain_and_short_magic_data_are_plain_records() -> None:
    counters = DeaggregationCounters()
    for data in (b"plain", MAGIC + b"short", b""):
        (record,) = records_from_kinesis("s", kinesis_item(data), counters)
        assert record.data == data and not record.aggregated and record.completes_kinesis_record
    assert counters.broken_aggregates == 0
    assert not is_aggregate(MAGIC + bytes(15))


def test_aggregate_expands_with_sub_sequence_numbers() -> None:
    users = [UserRecord(f"k{i % 3}", f"payload-{i}".encode(), str(i) if i % 2 else None) for i in range(5)]
    records = records_from_kinesis("shardId-7", kinesis_item(encode_aggregate(users), "4242"),
                                   DeaggregationCounters())
    assert [(r.sub_sequence_number, r.partition_key, r.explicit_hash_key, r.data) for r in records] == [
        (i, u.partition_key, u.explicit_hash_key, u.data) for i, u in enumerate(users)
    ]
    assert all(r.aggregated and r.sequence_number == "4242" and r.shard_id == "shardId-7" for r in records)
    assert all(r.approximate_arrival_timestamp == ARRIVAL for r in records)
    assert [r.completes_kinesis_record for r in records] == [False] * 4 + [True]
    assert records[2].checkpoint == Checkpoint("4242", 2)


def test_aggregator_respects_size_and_keeps_order() -> None:
    users = [UserRecord(f"key-{i % 7}", bytes([i % 256]) * (50 + i % 300), str(i * 1000) if i % 3 else None)
             for i in range(400)]
    aggregator = Aggregator(max_bytes=4096)
    aggregates = aggregator.pack(users)
    assert len(aggregates) > 5
    assert all(len(a.data) <= 4096 for a in aggregates)
    unpacked = [u for a in aggregates for u in decode_aggregate(a.data)]
    assert unpacked == users
    assert [list(a.records) for a in aggregates] == [decode_aggregate(a.data) for a in aggregates]
    assert all(a.partition_key == a.records[0].partition_key for a in aggregates)


def test_aggregator_fills_aggregates_nearly_full() -> None:
    users = [UserRecord("k", bytes(100)) for _ in range(1000)]
    aggregates = Aggregator(max_bytes=25 * 1024).pack(users)
    # every aggregate but the last has no room for one more 100-byte record (about 104 bytes encoded)
    assert all(25 * 1024 - 110 < len(a.data) <= 25 * 1024 for a in aggregates[:-1])


def test_aggregator_record_count_limit_and_oversized_record() -> None:
    aggregator = Aggregator(max_bytes=200, max_records=3)
    aggregates = aggregator.pack([UserRecord("k", b"x")] * 7 + [UserRecord("k", bytes(500))])
    assert [len(a.records) for a in aggregates] == [3, 3, 1, 1]
    assert decode_aggregate(aggregates[-1].data) == [UserRecord("k", bytes(500))]
    assert aggregator.flush() is None
    with pytest.raises(ValueError):
        Aggregator(max_bytes=10)
    with pytest.raises(ValueError):
        encode_aggregate([])


user_records = st.builds(
    UserRecord,
    partition_key=st.text(min_size=1, max_size=20),
    data=st.binary(max_size=300),
    explicit_hash_key=st.none() | st.integers(0, 2**128 - 1).map(str),
    tags=st.lists(st.tuples(st.text(max_size=5), st.none() | st.text(max_size=5)), max_size=2).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(user_records, min_size=1, max_size=30))
def test_round_trip(records: list[UserRecord]) -> None:
    assert decode_aggregate(encode_aggregate(records)) == records


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_body_with_a_valid_digest_decodes_or_is_broken(body: bytes) -> None:
    """Arbitrary protobuf bodies never crash the decoder, and never lose the Kinesis record."""
    data = framed(body)
    try:
        decoded = decode_aggregate(data)
    except BrokenAggregate:
        decoded = None
    records = records_from_kinesis("s", kinesis_item(data), DeaggregationCounters())
    if decoded is None:
        assert [r.data for r in records] == [data]
    else:
        assert [r.data for r in records] == [u.data for u in decoded]


@settings(max_examples=200, deadline=None)
@given(st.lists(user_records, min_size=1, max_size=10), st.data())
def test_any_single_byte_corruption_is_detected(records: list[UserRecord], data: st.DataObject) -> None:
    encoded = bytearray(encode_aggregate(records))
    index = data.draw(st.integers(len(MAGIC), len(encoded) - 1))
    encoded[index] ^= data.draw(st.integers(1, 255))
    with pytest.raises(BrokenAggregate):
        decode_aggregate(bytes(encoded))

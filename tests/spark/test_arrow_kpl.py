"""Executors' KPL expansion (agent/spark/arrow_read.py) and the driver's probe, under each decoder choice.

Aggregates become their user records with sub-sequence numbers; a broken aggregate is one raw row (nothing lost);
a read resuming inside an aggregate skips exactly the user records its checkpoint covers; the probe's last
sub-sequence agrees with the rows. The same rows whichever decoder the process uses; and a real query's
executors write every user record of aggregates once.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import pytest

from shardherd.agent import kpl_decoding
from shardherd.agent.kpl import MAGIC, UserRecord, encode_aggregate
from shardherd.agent.spark.arrow_read import arrow_batch
from shardherd.agent.spark.kinesis_records import last_sub_sequence
from shardherd.agent.spark.offsets import Caps
from tests.spark.conftest import SparkStack
from tests.support.waiting import wait_for

AGGREGATE = encode_aggregate([UserRecord("k0", b"u0"), UserRecord("k1", b"u1", "7"), UserRecord("k0", b"")])
BROKEN = MAGIC + AGGREGATE[4:-16] + bytes(16)  # right body, wrong digest


@pytest.fixture(params=["auto", "python"])
def decoder(request: pytest.FixtureRequest) -> Iterator[str]:
    before = kpl_decoding.decoder_name()
    name = kpl_decoding.use(request.param)
    assert name == ("protobuf-upb" if request.param == "auto" else "python")
    yield name
    kpl_decoding.use("auto" if before == "protobuf-upb" else "python")


def kinesis_json(payloads: list[bytes]) -> list[dict[str, Any]]:
    return [{"SequenceNumber": str(100 + index), "PartitionKey": f"outer-{index}",
             "Data": base64.b64encode(data).decode(), "ApproximateArrivalTimestamp": 1_700_000_000.5 + index}
            for index, data in enumerate(payloads)]


def rows(batch: Any) -> list[tuple[str, int, str, bytes]]:
    table = batch.to_pydict()
    return list(zip(table["sequence_number"], table["sub_sequence_number"], table["partition_key"], table["data"],
                    strict=True))


@pytest.mark.usefixtures("decoder")
def test_aggregates_expand_and_broken_ones_are_delivered_raw() -> None:
    records = kinesis_json([b"plain", AGGREGATE, BROKEN, AGGREGATE])
    assert rows(arrow_batch("stream", "shardId-0", records, False)) == [
        ("100", 0, "outer-0", b"plain"),
        ("101", 0, "k0", b"u0"), ("101", 1, "k1", b"u1"), ("101", 2, "k0", b""),
        ("102", 0, "outer-2", BROKEN),
        ("103", 0, "k0", b"u0"), ("103", 1, "k1", b"u1"), ("103", 2, "k0", b""),
    ]
    assert [last_sub_sequence(record) for record in records] == [0, 2, 0, 2]


@pytest.mark.usefixtures("decoder")
def test_a_read_resuming_inside_an_aggregate_skips_only_what_the_checkpoint_covers() -> None:
    assert rows(arrow_batch("stream", "s", kinesis_json([AGGREGATE, b"next"]), False, skip_through=0)) == [
        ("100", 1, "k1", b"u1"), ("100", 2, "k0", b""), ("101", 0, "outer-1", b"next")]
    assert rows(arrow_batch("stream", "s", kinesis_json([AGGREGATE, b"next"]), False, skip_through=2)) == [
        ("101", 0, "outer-1", b"next")]
    assert rows(arrow_batch("stream", "s", kinesis_json([BROKEN, b"next"]), False, skip_through=0)) == [
        ("101", 0, "outer-1", b"next")]


def test_spark_executors_expand_aggregates_and_deliver_a_broken_one_raw(spark_stack: SparkStack) -> None:
    """Through a real query: executors (Python workers, protobuf decoder by default) write every user record once."""
    stack = spark_stack
    driver = stack.agent("driver-1", caps=Caps(50))
    wait_for(lambda: len(stack.owners()) == 4 and set(stack.owners().values()) == {"driver-1"}, 30, "owns 4 shards")
    users = [[UserRecord(f"key-{group}-{index}", f"user-{group}-{index}".encode()) for index in range(25)]
             for group in range(12)]
    broken = MAGIC + encode_aggregate(users[0])[4:-16] + bytes(16)
    entries = [{"Data": encode_aggregate(group), "PartitionKey": group[0].partition_key} for group in users]
    entries.append({"Data": broken, "PartitionKey": "broken"})
    response = stack.kinesis.put_records(StreamName=stack.app, Records=entries)
    assert response.get("FailedRecordCount", 0) == 0
    stack.produced.extend([record.data for group in users for record in group] + [broken])
    stack.produce(40, "plain")
    query = driver.run_query(stack.spark, stack.sink.writer("driver-1"), str(stack.tmp / "cp"),
                             processing_time="300 milliseconds")
    wait_for(stack.all_delivered, 120, "every user record and the broken aggregate written")
    query.stop()
    counts = stack.sink.payloads()
    assert set(counts) == set(stack.produced) and max(counts.values()) == 1
    subs = {row[5]: row[4] for row in stack.sink.rows}
    assert all(subs[record.data] == index for group in users for index, record in enumerate(group))
    assert subs[broken] == 0
    assert os.getpid() not in {row[6] for row in stack.sink.rows}  # decoded on executor workers, not the driver

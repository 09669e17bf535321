"""The shardherd streaming source end to end: local Spark, moto server DynamoDB, kinesalite, in-process coordinator."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shardherd.agent.spark.channel import read_ack
from shardherd.agent.spark.offsets import Caps
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from tests.spark.conftest import SparkStack
from tests.support.faulty_proxy import Fault, FaultyProxy
from tests.support.stores import unique_app
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _owned_by(stack: SparkStack, worker: str, count: int) -> bool:
    owners = stack.owners()
    return len(owners) == count and set(owners.values()) == {worker}


def test_every_record_once_read_on_executors_and_a_fresh_checkpoint_resumes_from_the_lease_table(
        spark_stack: SparkStack) -> None:
    stack = spark_stack
    first = stack.agent("driver-1", caps=Caps(40))
    wait_for(lambda: _owned_by(stack, "driver-1", 4), 30, "driver-1 owns 4 shards")
    stack.produce(400, "a")
    query = first.run_query(stack.spark, stack.sink.writer("driver-1"), str(stack.tmp / "cp-1"),
                            processing_time="300 milliseconds")
    assert first.probe_schedule.trigger == 0.3  # Spark's parse of the interval: probe rounds end before triggers
    wait_for(stack.all_delivered, 90, "400 records written")
    counts = stack.sink.payloads()
    assert set(counts) == set(stack.produced) and max(counts.values()) == 1

    rows = list(stack.sink.rows)
    runner = read_ack(first.channel)
    assert runner is not None
    readers = {row[6] for row in rows}
    assert os.getpid() not in readers and runner.pid not in readers  # read by executor workers, not the driver
    per_batch: dict[int, Counter[str]] = defaultdict(Counter)
    partitions: dict[tuple[int, str], set[int]] = defaultdict(set)
    for _, batch, shard, *_rest, part in rows:
        per_batch[batch][shard] += 1
        partitions[(batch, shard)].add(part)
    assert all(len(parts) == 1 for parts in partitions.values())  # each shard read by one task per batch
    cores = stack.spark.sparkContext.defaultParallelism
    for batch in per_batch:
        shards_parts = {next(iter(partitions[(batch, shard)])) for shard in per_batch[batch]}
        assert len(shards_parts) == min(cores, len(per_batch[batch]))  # shards spread over at most the cores
    assert max(max(counter.values()) for counter in per_batch.values()) <= 40  # admission control per shard
    assert len(per_batch) >= 400 // 4 // 40  # so several batches were needed

    def lag_reported() -> bool:  # per-shard lag on each lease, written with its checkpoint as plain agents do
        leases = [lease for lease in first.store.scan_leases().leases if lease.actual_owner == "driver-1"]
        return len(leases) == 4 and all(lease.millis_behind_latest is not None and lease.records_behind is not None
                                        for lease in leases)

    wait_for(lag_reported, 30, "per-shard lag and records behind on driver-1's leases")

    written = Counter(row[2] for row in stack.sink.rows if row[0] == "driver-1")

    def last_batch_counted() -> bool:  # the last checkpoint carries its own batch's figures, not the previous one's
        leases = {lease.shard: lease for lease in first.store.scan_leases().leases}
        return all(leases[shard].records_processed == count and leases[shard].records_behind in (0, None)
                   for shard, count in written.items())

    assert len(written) == 4
    wait_for(last_batch_counted, 10, f"records processed on the leases equal to the rows written {dict(written)}")

    query.stop()  # the query ends -> the agent drains: leases given back with their checkpoints
    wait_for(lambda: set(stack.owners().values()) == {None}, 30, "driver-1 drained")
    assert first.stopped_because == "query stopped"

    stack.produce(200, "b")
    second = stack.agent("driver-2", caps=Caps(200))
    wait_for(lambda: _owned_by(stack, "driver-2", 4), 30, "driver-2 owns 4 shards")
    second.run_query(stack.spark, stack.sink.writer("driver-2"), str(stack.tmp / "cp-fresh"),
                     processing_time="300 milliseconds")
    wait_for(stack.all_delivered, 60, "records after the restart written")
    counts = stack.sink.payloads()
    assert set(counts) == set(stack.produced)
    assert max(counts.values()) == 1  # a fresh Spark checkpoint resumed exactly at the lease checkpoints
    assert {row[5] for row in stack.sink.rows if row[0] == "driver-2"} == {p for p in stack.produced if p[:1] == b"b"}


def test_a_sink_failure_after_the_write_duplicates_at_most_that_batch_and_the_agent_drains(
        spark_stack: SparkStack) -> None:
    stack = spark_stack
    first = stack.agent("driver-1", caps=Caps(30))
    wait_for(lambda: _owned_by(stack, "driver-1", 4), 30, "driver-1 owns 4 shards")
    stack.produce(300, "a")
    query = first.run_query(stack.spark, stack.sink.writer("driver-1", fail_in_batch=1), str(stack.tmp / "cp"),
                            processing_time="300 milliseconds")
    wait_for(lambda: not query.isActive, 60, "the query died in batch 1")
    assert query.exception() is not None
    wait_for(lambda: set(stack.owners().values()) == {None}, 30, "driver-1 drained after its query died")
    assert (first.stopped_because or "").startswith("query failed")
    failed_batch = {row[5] for row in stack.sink.rows if row[1] == 1}
    assert failed_batch

    second = stack.agent("driver-2")  # a restarted driver on the same Spark checkpoint: batch 1 is replayed
    wait_for(lambda: _owned_by(stack, "driver-2", 4), 30, "driver-2 owns 4 shards")
    second.run_query(stack.spark, stack.sink.writer("driver-2"), str(stack.tmp / "cp"),
                     processing_time="300 milliseconds")
    wait_for(stack.all_delivered, 60, "every record written")
    counts = stack.sink.payloads()
    assert set(counts) == set(stack.produced)  # nothing lost
    duplicated = {payload for payload, count in counts.items() if count > 1}
    assert duplicated <= failed_batch and max(counts.values()) <= 2  # at most the unfinished batch again


def test_split_checkpoints_shard_end_so_children_start(spark_stack: SparkStack) -> None:
    stack = spark_stack
    driver = stack.agent("driver-1")
    wait_for(lambda: _owned_by(stack, "driver-1", 4), 30, "driver-1 owns 4 shards")
    stack.produce(100, "before")
    driver.run_query(stack.spark, stack.sink.writer("driver-1"), str(stack.tmp / "cp"),
                     processing_time="300 milliseconds")
    wait_for(stack.all_delivered, 60, "records before the split")
    parent = "shardId-000000000000"
    shards = stack.kinesis.describe_stream(StreamName=stack.app)["StreamDescription"]["Shards"]
    hash_range = next(shard["HashKeyRange"] for shard in shards if shard["ShardId"] == parent)
    middle = (int(hash_range["StartingHashKey"]) + int(hash_range["EndingHashKey"])) // 2
    stack.kinesis.split_shard(StreamName=stack.app, ShardToSplit=parent, NewStartingHashKey=str(middle))
    wait_for(lambda: stack.status() == "ACTIVE", 30, "split done")
    stack.produce(300, "after")
    wait_for(stack.all_delivered, 90, "records after the split, children included")
    assert stack.checkpoints()[parent] == "SHARD_END"
    children = set(stack.owners()) - {f"shardId-00000000000{index}" for index in range(4)}
    assert len(children) == 2
    rows = list(stack.sink.rows)
    child_batches = [row[1] for row in rows if row[2] in children]
    assert child_batches and max(row[1] for row in rows if row[2] == parent) < min(child_batches)
    counts = stack.sink.payloads()
    assert max(counts.values()) == 1 and len(counts) == 400


def test_available_now_catches_up_in_capped_batches_then_finishes(spark_stack: SparkStack) -> None:
    stack = spark_stack
    driver = stack.agent("driver-1", caps=Caps(20))
    wait_for(lambda: _owned_by(stack, "driver-1", 4), 30, "driver-1 owns 4 shards")
    stack.produce(200, "a")
    wait_for(lambda: all(view.pending for view in driver.book.snapshot().shards.values()), 30, "probes saw records")
    query = driver.run_query(stack.spark, stack.sink.writer("driver-1"), str(stack.tmp / "cp"), available_now=True)
    assert driver.probe_schedule.trigger is None  # no trigger grid: rounds follow the probe period
    assert query.awaitTermination(120)
    counts = stack.sink.payloads()
    assert set(counts) == set(stack.produced) and max(counts.values()) == 1
    per_batch: dict[tuple[int, str], int] = Counter((row[1], row[2]) for row in stack.sink.rows)
    assert max(per_batch.values()) <= 20
    assert len({batch for batch, _ in per_batch}) >= 200 // 4 // 20
    wait_for(lambda: set(stack.owners().values()) == {None}, 30, "the finished query drained the agent")


def test_two_drivers_hand_off_gracefully_and_a_driver_that_stops_renewing_stops_its_query_in_time(
        spark_stack: SparkStack) -> None:
    stack = spark_stack
    first = stack.agent("driver-1")
    wait_for(lambda: _owned_by(stack, "driver-1", 4), 30, "driver-1 owns 4 shards")
    first.run_query(stack.spark, stack.sink.writer("driver-1"), str(stack.tmp / "cp-1"),
                    processing_time="300 milliseconds")
    stack.produce(200, "a")
    wait_for(stack.all_delivered, 60, "first records written")

    with FaultyProxy(stack.base["dynamodb_endpoint_url"]) as proxy:
        second = stack.agent("driver-2", dynamodb_endpoint_url=proxy.endpoint_url)
        query = second.run_query(stack.spark, stack.sink.writer("driver-2"), str(stack.tmp / "cp-2"),
                                 processing_time="300 milliseconds")
        wait_for(lambda: list(stack.owners().values()).count("driver-2") == 2, 60, "two shards handed to driver-2")
        moved = {shard for shard, owner in stack.owners().items() if owner == "driver-2"}
        stack.produce(200, "b")
        wait_for(stack.all_delivered, 60, "records after the handoff written")
        counts = stack.sink.payloads()
        assert max(counts.values()) == 1  # handoffs finished and checkpointed before the transfer: no duplicates
        late = [row for row in stack.sink.rows if row[5].startswith(b"b-")]
        assert {row[0] for row in late if row[2] in moved} == {"driver-2"}  # a lost shard is no longer planned
        assert {row[0] for row in late if row[2] not in moved} == {"driver-1"}

        proxy.add([Fault(0)] * 1_000_000)  # driver-2's lease table calls now fail: it can no longer heartbeat
        broken = time.monotonic()
        wait_for(lambda: not query.isActive, 10, "driver-2's query stopped")
        assert time.monotonic() - broken < 4.0  # failover time
        actual = {lease.lease_key: lease.actual_owner for lease in stack.coordinator.store.scan_leases().leases}
        assert {actual[shard] for shard in moved} == {"driver-2"}  # stopped before anyone took over
        # Its executors record batch ends in the same store: the outage may fail the batch before the supervisor
        # sees the lost liveness; either way the query stopped in time and the leases were not used after it.
        wait_for(lambda: second.stopped_because is not None, 5, "driver-2's agent saw why")
        assert second.stopped_because == "agent lost liveness" or str(second.stopped_because).startswith(
            "query failed")

        wait_for(lambda: _owned_by(stack, "driver-1", 4), 60, "driver-1 took the shards back")
        stack.produce(200, "c")
        wait_for(stack.all_delivered, 60, "records after the failover written")
    counts = stack.sink.payloads()
    assert set(counts) == set(stack.produced)
    second_rows = {row[5] for row in stack.sink.rows if row[0] == "driver-2"}
    assert {payload for payload, count in counts.items() if count > 1} <= second_rows  # only its last batch again


def test_a_handoff_waits_only_for_the_write_that_holds_the_shard_not_for_the_batch_in_flight(
        spark_stack: SparkStack) -> None:
    stack = spark_stack
    first = stack.agent("driver-1")
    wait_for(lambda: _owned_by(stack, "driver-1", 4), 30, "driver-1 owns 4 shards")
    written = stack.sink.writer("driver-1")
    blocked, release = threading.Event(), threading.Event()

    def held_after_write(df: DataFrame, batch_id: int) -> None:  # rows written, checkpoint not yet: held in flight
        before = len(stack.sink.rows)
        written(df, batch_id)
        if len(stack.sink.rows) > before and not release.is_set():
            blocked.set()
            release.wait(60)

    first.run_query(stack.spark, held_after_write, str(stack.tmp / "cp-1"), processing_time="300 milliseconds")
    response = stack.kinesis.put_records(StreamName=stack.app, Records=[
        {"Data": f"hot-{index}".encode(), "PartitionKey": "hot"} for index in range(50)])
    stack.produced.extend(f"hot-{index}".encode() for index in range(50))
    hot = response["Records"][0]["ShardId"]  # one partition key: the blocked batch writes this shard only
    wait_for(blocked.is_set, 60, "a batch of the hot shard written and held before its checkpoint")

    second = stack.agent("driver-2")
    second.run_query(stack.spark, stack.sink.writer("driver-2"), str(stack.tmp / "cp-2"),
                     processing_time="300 milliseconds")

    def assigned() -> set[str]:
        return {lease.lease_key for lease in stack.coordinator.store.scan_leases().leases
                if lease.lease_owner == "driver-2"}

    wait_for(lambda: len(assigned()) == 2, 60, "the leader moves two shards to driver-2")
    moved = assigned()
    idle = moved - {hot}
    # Shards the blocked write does not hold are transferred at once, not after the batch (handoff timeout: 10 s).
    wait_for(lambda: all(stack.owners()[key] == "driver-2" for key in idle), 4, "idle shards handed over")
    if hot in moved:  # its rows are written but not checkpointed: the handoff waits for that checkpoint
        assert stack.owners()[hot] is None
    release.set()
    if hot in moved:
        wait_for(lambda: stack.owners()[hot] == "driver-2", 4, "the hot shard handed over after its checkpoint")
    stack.produce(200, "after")
    wait_for(stack.all_delivered, 60, "records after the handoffs written")
    counts = stack.sink.payloads()
    assert max(counts.values()) == 1  # every handoff checkpointed what was written: no duplicates
    late = [row for row in stack.sink.rows if row[5].startswith(b"after-")]
    assert {row[0] for row in late if row[2] in moved} == {"driver-2"}


def test_a_multi_stream_driver_reads_both_streams_and_rows_carry_the_stream(
        moto_server: MotoServer, kinesalite: NodeEmulator, spark: SparkSession, tmp_path: Path) -> None:
    other = unique_app("spark-other")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    kinesis.create_stream(StreamName=other, ShardCount=2)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=other)["StreamDescriptionSummary"][
        "StreamStatus"] == "ACTIVE", 30, "second stream ACTIVE")
    stack = SparkStack(moto_server, kinesalite, spark, 2, tmp_path, extra_streams=(other,))
    try:
        rows: list[tuple[str, str, bytes]] = []

        def write(df: DataFrame, batch_id: int) -> None:
            selected = df.select("stream_name", "shard_id", "data").collect()
            rows.extend((row[0], row[1], bytes(row[2])) for row in selected)

        driver = stack.agent("driver-1")
        wait_for(lambda: _owned_by(stack, "driver-1", 4), 30, "driver-1 owns both streams' 4 shards")
        stack.produce(100, "a")  # the application's first stream
        kinesis.put_records(StreamName=other, Records=[{"Data": f"o-{i}".encode(), "PartitionKey": f"k{i}"}
                                                       for i in range(100)])
        expected = set(stack.produced) | {f"o-{i}".encode() for i in range(100)}
        driver.run_query(stack.spark, write, str(tmp_path / "cp-multi"), processing_time="300 milliseconds")
        wait_for(lambda: {data for *_, data in rows} >= expected, 90, "both streams' records written")
        assert len(rows) == len(expected)  # each once, though shard ids repeat across the streams
        assert {stream for stream, _, data in rows if data.startswith(b"o-")} == {other}
        assert {stream for stream, _, data in rows if data.startswith(b"a-")} == {stack.app}
        assert len({(stream, shard) for stream, shard, _ in rows}) == 4
        wait_for(lambda: all(value not in ("TRIM_HORIZON",) for value in stack.checkpoints().values()), 30,
                 "every lease checkpointed")
        assert all(key.count(":") == 3 for key in stack.checkpoints())  # KCL multi-stream keys
    finally:
        stack.close()
